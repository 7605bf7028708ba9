"""Money: a run's payments to its workers, wallets (fund, send, balance) and the ledger.

Every amount is :data:`~aitbc.replies.base.Money` (a ``Decimal`` of AIT; a decimal string in
JSON); a ``*_micro`` field is the same amount in integer micro-AIT."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from aitbc.replies.base import JsonObject, MicroAIT, Money, Page, Reply
from aitbc.states import ContractStatus, Control, RunStatus


class WorkerPay(Reply):
    """One contract of the run and what it has earned, is owed and lost so far."""

    worker_id: str = Field(description="the provider's wallet address")
    contract_id: str
    price: Money = Field(description="AIT per round at full quality")
    price_micro: MicroAIT = Field(description="price in micro-AIT")
    status: ContractStatus = Field(description="the contract's state (slashed: its bond was burned)")
    rounds_accepted: int = Field(description="rounds whose update from it was accepted")
    rounds_scored: int = Field(description="of those, rounds settled (scored and paid)")
    score: float | None = Field(description="mean quality over its scored rounds, 0..1; null before the first")
    flags: list[str] = Field(description="its scores' flags (e.g. no_gain, copied)")
    paid: Money = Field(description="AIT paid to it so far: its settled rounds' pay and its owner's manual payments")
    paid_micro: MicroAIT = Field(description="paid in micro-AIT")
    due: Money = Field(description="AIT its settled rounds owed at full quality (price x rounds scored)")
    due_micro: MicroAIT = Field(description="due in micro-AIT")
    bond: Money = Field(description="AIT it posted as bond for this contract")
    slashed: Money = Field(description="AIT burned from its bond for provable misbehaviour")
    slashed_micro: MicroAIT = Field(description="slashed in micro-AIT")
    reputation: float | None = Field(description="the provider's marketplace reputation, 0..5")
    evm_address: str | None = Field(
        None, description="the provider's EVM account, its contract on chain (an EVM run); null on the local ledger"
    )


class ChainTxView(Reply):
    """One transaction the run owes the chain: a round's settlement or the run's finalization."""

    kind: Literal["settle", "finalize"]
    round: int = Field(description="the round it settles (0 for finalize)")
    tx_hash: str | None = Field(description="its transaction's hash; null until signed")
    status: str = Field(
        description="queued, signed (stored before its broadcast), sent, mined, final (confirmed), "
        "failed (the contract refused it: see the coordinator's log)"
    )
    confirmations: int = Field(description="blocks on it, its own counted (0 until mined)")
    gas_used: int | None = Field(description="gas it used; null until mined")


class ChainPayments(Reply):
    """A run's money on an EVM chain: where its escrow is, and the settlement transactions."""

    chain_id: int
    escrow: str = Field(description="the escrow contract's address")
    key: str = Field(description="the run's key in the escrow contract (0x + 64 hex)")
    owner: str = Field(description="the owner's EVM account, which deposited the escrow")
    deposited: MicroAIT = Field(description="micro-AIT deposited on chain and mirrored into the books")
    final: bool = Field(description="every transaction queued so far is final (confirmed)")
    txs: list[ChainTxView] = Field(description="in the order they were queued")


class Payments(Reply):
    """A run's money: its escrow and, per contract, what was paid. Settlement runs behind the
    rounds, so right after the run ends (even after ``wait_for_completion``) its last rounds
    may not be paid yet: ``settled_round`` below ``rounds_closed``, ``settled`` false. Once
    ``settled`` is true the coordinator has paid all it pays by itself."""

    training_id: str
    network: str = Field(description="the ledger's network (local)")
    control: Control = Field(description="automatic or manual (an owner-driven run pays as its owner says)")
    escrowed: Money = Field(description="AIT the owner escrowed for the run, all together")
    escrow_balance: Money = Field(description="AIT left in the escrow now (refunded to the owner once finalized)")
    settled_round: int = Field(description="the last round scored and paid (0: none yet)")
    rounds_closed: int = Field(description="rounds the run has closed; settled_round catches up with it")
    finalized: bool = Field(description="every round settled and the escrow's rest returned: nothing will move")
    status: RunStatus = Field(description="the run's state: complete, failed or stopped once it has ended")
    settled: bool = Field(
        description="the run has ended and the coordinator has paid all it pays by itself: every closed round "
        "settled, accepted updates of a round that never closed paid as delivered, honest bonds returned, "
        "and on an EVM chain every transaction queued final; until then the amounts may still grow "
        "(get_payments and `payments` wait for it)"
    )
    data: list[WorkerPay] = Field(description="one row per contract")
    count: int = Field(description="contracts")
    chain: ChainPayments | None = Field(
        None, description="the run's escrow and transactions on an EVM chain; null on a coordinator's own ledger"
    )


class ManualPayment(Reply):
    """A payment its owner made from a run's escrow (``process_payment``)."""

    contract_id: str
    worker_id: str
    amount: Money = Field(description="AIT paid")
    amount_micro: MicroAIT = Field(description="amount in micro-AIT")
    entry: int = Field(description="the ledger entry's sequence number")
    escrow_left: Money = Field(description="AIT left in the run's escrow")


class Funded(Reply):
    """A faucet mint into a wallet (local network)."""

    address: str
    amount: Money = Field(description="AIT minted")
    entry: int = Field(description="the ledger entry's sequence number")
    balance: Money = Field(description="the wallet's balance after it, AIT")


class Sent(Reply):
    """A transfer from the agent's wallet (``from_`` as an attribute, ``from`` as a key)."""

    model_config = ConfigDict(populate_by_name=True)

    from_: str = Field(alias="from", description="the sender's address")
    to: str = Field(description="the recipient's address")
    amount: Money = Field(description="AIT sent")
    entry: int = Field(description="the ledger entry's sequence number")
    balance: Money = Field(description="the sender's balance after it, AIT")


class Balance(Reply):
    address: str
    network: str
    balance: Money = Field(description="AIT in the wallet")
    balance_micro: MicroAIT = Field(description="balance in micro-AIT")


class EntryView(Reply):
    """One ledger entry: a signed, hash-chained movement of money from ``debit`` to ``credit``."""

    seq: int = Field(description="its sequence number in the chain (1: the first)")
    hash: str = Field(description="its hash, over its fields and prev_hash")
    prev_hash: str
    network: str
    kind: str = Field(description="mint, transfer, escrow, bond, settle, payment, slash, bond_return or refund")
    debit: str = Field(description="the account money leaves (wallet:ADDRESS, escrow:RUN, ...)")
    credit: str = Field(description="the account money enters")
    amount: MicroAIT = Field(description="micro-AIT, as the entry was signed and hashed (amount_ait: in AIT)")
    memo: JsonObject
    key: str | None = Field(description="its idempotency key; null for none")
    signer: str = Field(description="the public key that signed it")
    auth: JsonObject = Field(description="the signed request that authorised it, where one did")
    signature: str
    created_at: float
    amount_ait: Money = Field(description="the amount in AIT")


class Entries(Page[EntryView]):
    next: int | None = Field(description="pass as after= for the next page; null on the last")


class LedgerInfo(Reply):
    network: str
    system_key: str = Field(description="the coordinator's public key (hex); it signs settlements")
    entries: int = Field(description="the head's sequence number")
    head: str | None = Field(description="the head entry's hash; null before the first entry")
    stored: int = Field(description="entries stored")


class Balances(Reply):
    data: dict[str, MicroAIT] = Field(description="account name -> micro-AIT (accounts at 0 left out)")
    count: int
