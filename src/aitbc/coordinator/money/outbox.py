"""The settlement outbox: the transactions an EVM run owes the chain, written in the books'
own transactions so that nothing the books paid is ever left unsent.

A round settled in the books (:func:`queue_settlement`, in the transaction that moves
``run.settled_round``) queues one ``settle`` row (:class:`~aitbc.coordinator.store.models.ChainTx`)
for all its contracts; a run finalized in the books (:func:`queue_finalize`, called by the
sender) gets the settle rows its finalize paid (updates of rounds that never closed), one
more for slashes no settle carried yet, and, once every settle row is mined, its
``finalize`` row. The rows are unique by (run, kind, round), so a redo after a restart
queues nothing twice; :mod:`.sender` sends them.

A settle row's payload is what the books paid for the round, per provider address (the
contract pays by address): ``providers`` in increasing address order (the contract's
order), ``amounts`` (micro-AIT: 1 token unit), ``slashes`` (burn that provider's bond),
``contracts`` (the books' contract ids of each line, for the record), and ``unpaid``: the
contracts paid in the books that cannot be paid on chain (no bond on chain: should not
happen, an update needs one) and are flagged in the log.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, cast

from eth_utils import to_checksum_address
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from aitbc.chain.evm.contracts import run_key
from aitbc.coordinator.context import Context
from aitbc.coordinator.store.models import ChainTx, Contract, Run, Settlement
from aitbc.json_value import JSONObject, JSONValue
from aitbc.states import ContractStatus

log = logging.getLogger("aitbc.coordinator")

SETTLE, FINALIZE = "settle", "finalize"
QUEUED, SIGNED, SENT, MINED, FINAL, FAILED = "queued", "signed", "sent", "mined", "final", "failed"
STATUSES = (QUEUED, SIGNED, SENT, MINED, FINAL, FAILED)
OPEN = (QUEUED, SIGNED, SENT, MINED)  # the sender still has work on these
LANDED = (MINED, FINAL)  # on chain and succeeded


@dataclass(frozen=True, slots=True)
class Line:
    """One provider's line of a round's settlement."""

    provider: str  # its EVM address, checksummed
    amount: int  # micro-AIT
    slash: bool  # its bond burns
    contracts: list[str]  # the books' contracts paid at this address


@dataclass(frozen=True, slots=True)
class SettlePayload:
    """A settle row's payload: the run's key on chain, its lines in increasing address
    order, and the contracts paid in the books that the chain cannot pay."""

    key: str  # 0x + 64 hex
    lines: list[Line]
    unpaid: list[str]

    def to_json(self) -> JSONObject:
        return {
            "key": self.key,
            "providers": [x.provider for x in self.lines],
            "amounts": [x.amount for x in self.lines],
            "slashes": [x.slash for x in self.lines],
            "contracts": cast(list[JSONValue], [list(x.contracts) for x in self.lines]),
            "unpaid": cast(list[JSONValue], list(self.unpaid)),
        }

    @classmethod
    def of(cls, payload: JSONObject) -> SettlePayload:
        p = cast(dict[str, Any], payload)
        lines = [
            Line(str(a), int(n), bool(x), [str(c) for c in ids])
            for a, n, x, ids in zip(p["providers"], p["amounts"], p["slashes"], p["contracts"], strict=True)
        ]
        return cls(key=str(p["key"]), lines=lines, unpaid=[str(c) for c in p.get("unpaid", [])])


def on_chain(run: Run) -> bool:
    """Whether ``run``'s money is on an EVM chain: its owner named an account and the
    escrow was deposited there (a run that never deposited has nothing on chain to settle)."""
    return run.owner_evm is not None and run.chain_deposited > 0


def chain_key(run: Run) -> bytes:
    """The run's key in the escrow contract (its owner's account and its id)."""
    if run.owner_evm is None:
        raise ValueError(f"run {run.id} has no EVM owner: it is not on a chain")
    return run_key(run.owner_evm, run.id)


def queue_settlement(ctx: Context, s: Session, run: Run, r: int) -> ChainTx | None:
    """Queue round ``r``'s settlement of an EVM run, in the caller's transaction (the one
    that moves ``settled_round``; the caller commits). Once per round; None for a run not
    on chain. A round nobody was paid for is queued too: each settle is also the post that
    keeps the run from timing out on chain."""
    if not on_chain(run):
        return None
    found = _row(s, run.id, SETTLE, r)
    if found is not None:
        return found
    row = ChainTx(
        run_id=run.id,
        kind=SETTLE,
        round=r,
        payload=settlement_payload(s, run, r),
        status=QUEUED,
        created_at=time.time(),
    )
    s.add(row)
    s.flush()
    return row


def settlement_payload(s: Session, run: Run, r: int) -> JSONObject:
    """What the books paid for round ``r`` per provider address, and the bonds to burn:
    contracts slashed whose bond no earlier settle row burned (a contract slashed but not
    paid is listed with 0)."""
    paid: dict[str, int] = {
        cid: int(total)
        for cid, total in s.execute(
            select(Settlement.contract_id, func.sum(Settlement.paid))
            .where(Settlement.run_id == run.id, Settlement.round == r)
            .group_by(Settlement.contract_id)
        ).all()
    }
    burned = _slashes_queued(s, run.id)
    lines: dict[str, dict[str, Any]] = {}
    unpaid: list[str] = []
    contracts = s.scalars(select(Contract).where(Contract.run_id == run.id).order_by(Contract.id)).all()
    for c in contracts:
        amount = paid.get(c.id, 0)
        slash = c.status == ContractStatus.SLASHED and c.id not in burned
        if amount <= 0 and not slash:
            continue
        if c.evm_address is None or not c.chain_bonded:
            if amount > 0:
                unpaid.append(c.id)
                log.warning(
                    "run %s round %d: contract %s was paid %d micro-AIT in the books but has no bond on chain; "
                    "the chain cannot pay it",
                    run.id,
                    r,
                    c.id,
                    amount,
                )
            continue
        line = lines.setdefault(c.evm_address.lower(), {"amount": 0, "slash": False, "contracts": []})
        line["amount"] += amount
        line["slash"] = line["slash"] or slash
        line["contracts"].append(c.id)
    order = sorted(lines, key=lambda a: int(a, 16))
    return SettlePayload(
        key="0x" + chain_key(run).hex(),
        lines=[
            Line(str(to_checksum_address(a)), lines[a]["amount"], lines[a]["slash"], lines[a]["contracts"])
            for a in order
        ],
        unpaid=unpaid,
    ).to_json()


def queue_finalize(ctx: Context, s: Session, run: Run) -> ChainTx | None:
    """What an EVM run finalized in the books still owes the chain, queued in the caller's
    transaction: a settle row for each round its finalize paid (updates of rounds that never
    closed), one at the round after the last for slashes no settle carried, and, once every
    settle row of the run is mined, the ``finalize`` row (returned; None until then, or for
    a run not on chain or not finalized)."""
    if not on_chain(run) or not run.finalized:
        return None
    found = _row(s, run.id, FINALIZE, 0)
    if found is not None:
        return found
    queued = set(s.scalars(select(ChainTx.round).where(ChainTx.run_id == run.id, ChainTx.kind == SETTLE)).all())
    paid_rounds = s.scalars(
        select(Settlement.round).where(Settlement.run_id == run.id).distinct().order_by(Settlement.round)
    ).all()
    for r in paid_rounds:
        if r not in queued:
            queue_settlement(ctx, s, run, r)
            queued.add(r)
    last = max(queued | {run.settled_round})
    if _pending_slashes(s, run):
        queue_settlement(ctx, s, run, last + 1)
    statuses = set(
        s.scalars(select(ChainTx.status).where(ChainTx.run_id == run.id, ChainTx.kind == SETTLE).distinct()).all()
    )
    if not statuses <= set(LANDED):
        return None  # a settle still on its way (or failed: the run then times out on chain)
    row = ChainTx(
        run_id=run.id,
        kind=FINALIZE,
        round=0,
        payload={"key": "0x" + chain_key(run).hex()},
        status=QUEUED,
        created_at=time.time(),
    )
    s.add(row)
    s.flush()
    return row


def runs_to_finalize(s: Session) -> list[str]:
    """EVM runs finalized in the books without a ``finalize`` row yet."""
    done = select(ChainTx.run_id).where(ChainTx.kind == FINALIZE)
    return list(
        s.scalars(
            select(Run.id)
            .where(Run.finalized.is_(True), Run.owner_evm.is_not(None), Run.chain_deposited > 0, Run.id.not_in(done))
            .order_by(Run.created_at)
        ).all()
    )


def run_txs(s: Session, run_id: str) -> list[ChainTx]:
    """The run's queued transactions, in the order they were queued."""
    return list(s.scalars(select(ChainTx).where(ChainTx.run_id == run_id).order_by(ChainTx.id)).all())


def _row(s: Session, run_id: str, kind: str, r: int) -> ChainTx | None:
    return s.scalar(select(ChainTx).where(ChainTx.run_id == run_id, ChainTx.kind == kind, ChainTx.round == r))


def _slashes_queued(s: Session, run_id: str) -> set[str]:
    """Contracts whose bond an earlier settle row of the run burns."""
    out: set[str] = set()
    for payload in s.scalars(select(ChainTx.payload).where(ChainTx.run_id == run_id, ChainTx.kind == SETTLE)).all():
        for line in SettlePayload.of(payload).lines:
            if line.slash:
                out.update(line.contracts)
    return out


def _pending_slashes(s: Session, run: Run) -> bool:
    burned = _slashes_queued(s, run.id)
    slashed = s.scalars(
        select(Contract.id).where(
            Contract.run_id == run.id, Contract.status == ContractStatus.SLASHED, Contract.chain_bonded.is_(True)
        )
    ).all()
    return any(c not in burned for c in slashed)
