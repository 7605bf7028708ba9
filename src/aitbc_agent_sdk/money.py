"""Operations on the agent's wallet and on the ledger the coordinator keeps: the local
faucet, balance, transfers and history; the ledger's head, entries and balances (what
``aitbc ledger verify`` re-checks); a run's payments and refunds. Registered in
:data:`~aitbc_agent_sdk.operations.OPERATIONS` like the rest."""

from __future__ import annotations

from decimal import Decimal

from aitbc.replies.base import Page
from aitbc.replies.money import (
    Balance,
    Balances,
    Entries,
    EntryView,
    Funded,
    LedgerInfo,
    ManualPayment,
    Payments,
    Sent,
)
from aitbc_agent_sdk.errors import Conflict, InvalidArgument, NotFound
from aitbc_agent_sdk.operations import (
    ENDED,
    _amount,
    _wallet,
    list_trainings,
    operation,
    resolve_run,
    run_detail,
)
from aitbc_agent_sdk.protocol import AgentState, Http, Op, Progress, ask
from aitbc_agent_sdk.settling import SETTLE_TIMEOUT, SettleWait, books_settled, payments_now, rounds_settled

# --- the agent's wallet ------------------------------------------------------------------


@operation
def fund_wallet(self: AgentState, amount: int | float | str | Decimal) -> Op[Funded]:
    """Mint ``amount`` AIT into the agent's wallet from the local network's faucet.
    Returns ``{address, amount, entry, balance}``."""
    body = {"amount": _amount(amount, "amount"), "network": self.config.blockchain_network}
    return (yield from ask(Funded, Http("POST", "/wallets/fund", body)))


@operation
def get_balance(self: AgentState) -> Op[Balance]:
    """``{address, network, balance, balance_micro}`` of the agent's wallet."""
    wallet = yield from _wallet(self)
    return (yield from ask(Balance, Http("GET", f"/wallets/{wallet.address}/balance")))


@operation
def transfer_funds(self: AgentState, to: str, amount: int | float | str | Decimal) -> Op[Sent]:
    """Send ``amount`` AIT from the agent's wallet to the address ``to`` (``ait1...``),
    signed by the agent. Returns ``{from, to, amount, entry, balance}`` (``from_`` as an
    attribute). Not
    enough money, or money the hires of the agent's runs not yet distributed hold (it
    stays in the wallet until they distribute, stop or their hires expire):
    :class:`Conflict` (``insufficient_funds``, naming what is held and what is free)."""
    body = {"to": to, "amount": _amount(amount, "amount"), "network": self.config.blockchain_network}
    return (yield from ask(Sent, Http("POST", "/wallets/send", body)))


@operation
def get_wallet_history(self: AgentState, limit: int = 100) -> Op[list[EntryView]]:
    """The most recent ``limit`` ledger entries that moved money into or out of the
    agent's wallet, oldest first: ``[{seq, kind, debit, credit, amount, amount_ait, memo,
    created_at, ...}]``."""
    wallet = yield from _wallet(self)
    res = yield from ask(Page[EntryView], Http("GET", f"/wallets/{wallet.address}/history", params={"limit": limit}))
    return res.data


# --- the ledger (public: a read-only agent can audit it) -----------------------------------------


@operation
def get_ledger_info(self: AgentState) -> Op[LedgerInfo]:
    """``{network, system_key, entries, head, stored}``: the ledger's network, the
    coordinator's public key (it signs settlements), the head it records (entry count and
    hash) and the entries stored."""
    return (yield from ask(LedgerInfo, Http("GET", "/ledger")))


@operation
def get_ledger_entries(self: AgentState, after: int = 0, limit: int = 1000) -> Op[Entries]:
    """One page of ledger entries in chain order, those after sequence number ``after``:
    ``{data: [{seq, kind, debit, credit, amount, key, memo, ...}], count, next}``
    (``next``: the ``after`` of the following page, None at the head)."""
    return (yield from ask(Entries, Http("GET", "/ledger/entries", params={"after": after, "limit": limit})))


@operation
def get_ledger_balances(self: AgentState) -> Op[dict[str, int]]:
    """Every account's balance in micro-AIT, as the coordinator's ledger holds it."""
    res = yield from ask(Balances, Http("GET", "/ledger/balances"))
    return dict(res.data)


# --- payments -----------------------------------------------------------------------------


@operation
def get_payments(
    self: AgentState,
    training_id: str | None = None,
    *,
    wait: bool = True,
    timeout: float = SETTLE_TIMEOUT,
    progress: Progress | None = None,
) -> Op[Payments]:
    """The run's escrow and, per contract, rounds accepted, score, paid, due, bond, slashed
    and reputation. The coordinator scores and pays each closed round behind the training
    (minutes behind on a loaded machine), so an ended run's payments are final only once
    ``settled``: every closed round paid, the end booked (updates of a round that never
    closed paid as delivered, honest bonds returned). For an ended run this waits for that
    (``wait=False``: the payments so far, at once, ``settled`` false while they may still
    grow), at most ``timeout`` seconds (default 600), then raises :class:`SettlementTimeout`
    (``unsettled``, naming the run's state and how far it got). A run still going answers
    at once. ``progress`` (a :data:`Progress`) is told ``("settle", rounds settled, rounds
    closed)`` while it waits."""
    training_id = yield from resolve_run(self, training_id)
    pay = yield from payments_now(training_id)
    if not wait or pay.status not in ENDED:
        return pay
    return (yield from SettleWait(training_id, timeout, progress).until(books_settled, pay))


@operation
def process_payment(
    self: AgentState,
    worker_id: str,
    contract_id: str,
    amount: int | float | str | Decimal,
    training_id: str | None = None,
) -> Op[ManualPayment]:
    """Pay ``amount`` AIT from a run's escrow to the worker holding ``contract_id`` (the
    run's owner only). The run is found among the agent's runs from the contract (which
    must be that worker's), or given as ``training_id``. Returns ``{contract_id, worker_id,
    amount, amount_micro, entry, escrow_left}``."""
    amount_text = _amount(amount, "amount")
    if worker_id.startswith("training_") and training_id is None:  # the earlier (training_id, contract_id, amount) form
        worker_id, training_id = "", worker_id
    if training_id is None:
        training_id = yield from _run_of_contract(self, contract_id, worker_id=worker_id)
    elif worker_id:
        run = yield from run_detail(training_id)
        holder = next((c.worker_id for c in run.contracts if c.contract_id == contract_id), worker_id)
        if holder != worker_id:  # checked before paying (an unknown contract is the server's 404)
            raise InvalidArgument("bad_argument", f"contract {contract_id} is with {holder}, not {worker_id}")
    body = {"contract_id": contract_id, "amount": amount_text}
    return (yield from ask(ManualPayment, Http("POST", f"/runs/{training_id}/payments", body)))


def _run_of_contract(self: AgentState, contract_id: str, *, worker_id: str) -> Op[str]:
    wallet = yield from _wallet(self)
    runs = yield from list_trainings(self, owner=wallet.address)
    for r in runs:
        detail = yield from run_detail(r.training_id)
        for c in detail.contracts:
            if c.contract_id == contract_id:
                if c.worker_id != worker_id:
                    raise InvalidArgument(
                        "bad_argument", f"contract {contract_id} is with {c.worker_id}, not {worker_id}"
                    )
                return r.training_id
    raise NotFound("unknown_contract", f"no run of {wallet.address} has contract {contract_id!r}")


@operation
def refund_payments(
    self: AgentState,
    training_id: str | None = None,
    *,
    wait: bool = True,
    timeout: float = SETTLE_TIMEOUT,
    progress: Progress | None = None,
) -> Op[Payments]:
    """Return an ended run's unspent escrow to the agent (a manual run's contracts first
    paid what their scores earned; honest providers' bonds returned); returns the
    payments view, final (``finalized``). The coordinator refunds only once every closed
    round is settled: this waits for that as :meth:`get_payments` does (``timeout``,
    ``progress``; past the timeout :class:`SettlementTimeout`); ``wait=False``
    asks once, and a run still settling is a :class:`Conflict` (``unsettled``). A run
    still going: :class:`Conflict` (``bad_state``)."""
    training_id = yield from resolve_run(self, training_id)
    waiting = SettleWait(training_id, timeout, progress)
    while True:
        try:
            return (yield from ask(Payments, Http("POST", f"/runs/{training_id}/refund")))
        except Conflict as e:
            if not wait or e.code != "unsettled":
                raise
        yield from waiting.until(rounds_settled)
