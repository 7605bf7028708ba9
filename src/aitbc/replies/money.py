"""Money: a run's payments to its workers, wallets (fund, send, balance) and the ledger."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from aitbc.replies.base import JsonObject, Page, Reply
from aitbc.states import ContractStatus, Control, RunStatus


class WorkerPay(Reply):
    worker_id: str
    contract_id: str
    price: float = Field(description="AIT per round, a number (price_micro / 1e6)")
    price_micro: int = Field(description="the exact price in micro-AIT")
    status: ContractStatus
    rounds_accepted: int
    rounds_scored: int
    score: float | None
    flags: list[str]
    paid: str
    paid_micro: int
    due: str
    due_micro: int
    bond: str
    slashed: str
    slashed_micro: int
    reputation: float | None


class Payments(Reply):
    training_id: str
    network: str
    control: Control
    escrowed: str
    escrow_balance: str
    settled_round: int
    rounds_closed: int
    finalized: bool
    status: RunStatus = Field(description="the run's state: complete, failed or stopped once it has ended")
    settled: bool = Field(
        description="the run has ended and the coordinator has paid all it pays by itself: every closed round "
        "settled, accepted updates of a round that never closed paid as delivered, honest bonds returned; "
        "until then the amounts may still grow (get_payments and `payments` wait for it)"
    )
    data: list[WorkerPay]
    count: int


class ManualPayment(Reply):
    contract_id: str
    worker_id: str
    amount: str
    amount_micro: int
    entry: int = Field(description="the ledger entry's sequence number")
    escrow_left: str


class Funded(Reply):
    address: str
    amount: str
    entry: int
    balance: str


class Sent(Reply):
    model_config = ConfigDict(populate_by_name=True)

    from_: str = Field(alias="from")
    to: str
    amount: str
    entry: int
    balance: str


class Balance(Reply):
    address: str
    network: str
    balance: str
    balance_micro: int


class EntryView(Reply):
    seq: int
    hash: str
    prev_hash: str
    network: str
    kind: str
    debit: str
    credit: str
    amount: int = Field(description="micro-AIT")
    memo: JsonObject
    key: str | None
    signer: str
    auth: JsonObject
    signature: str
    created_at: float
    amount_ait: str


class Entries(Page[EntryView]):
    next: int | None = Field(description="pass as after= for the next page; null on the last")


class LedgerInfo(Reply):
    network: str
    system_key: str
    entries: int
    head: str | None
    stored: int


class Balances(Reply):
    data: dict[str, int] = Field(description="account name -> micro-AIT (accounts at 0 left out)")
    count: int
