"""Which chain a coordinator's database keeps the money of (``store.models.ChainBinding``).

The books of an EVM coordinator mirror what one deployment holds; those of a local one are
the money itself. Started on another chain, either would be spent where it does not exist:
an EVM database restarted with ``--chain local`` would let the mirrored escrows and bonds be
paid out of the local ledger, and a swapped ``chain.json`` (another chain id or escrow, or a
dev node reset and redeployed at the same addresses) would settle runs whose deposits are
not there. So the first start records its chain, and every later start must match it; a
mismatch is one line naming both, before anything is served or written.

A database from before the record is told apart by its entries: money entered from the
chain (``chain-deposit``, ``chain-bond``, a queued transaction) is EVM's; money minted any
other way is the local ledger's. One with neither takes the chain it is started with.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from aitbc.coordinator.store.models import ChainBinding, ChainTx
from aitbc.errors import AitbcError
from aitbc.ledger.book import Entry
from aitbc.ledger.chain import MIRROR_KINDS

if TYPE_CHECKING:
    from aitbc.coordinator.chain_backend import ChainBackend

_ROW = 1


@dataclass(frozen=True, slots=True)
class ChainRecord:
    """Where money is: ``local``, or an EVM deployment (its chain id, escrow, token, and the
    hash of the block it was deployed in)."""

    chain: str
    chain_id: int | None = None
    escrow: str | None = None
    token: str | None = None
    anchor: str | None = None

    def describe(self) -> str:
        if self.chain == "local":
            return "the coordinator's own ledger (--chain local)"
        return f"EVM chain {self.chain_id} (escrow {self.escrow}, token {self.token})"

    def same_deployment(self, other: ChainRecord) -> bool:
        def norm(r: ChainRecord) -> tuple[str, int | None, str, str]:
            return (r.chain, r.chain_id, (r.escrow or "").lower(), (r.token or "").lower())

        return norm(self) == norm(other)


def chain_record(chain: ChainBackend | None) -> ChainRecord:
    """The record of the chain a coordinator was started with (read from its node)."""
    if chain is None:
        return ChainRecord("local")
    d = chain.deployment
    block = chain.client.rpc.call("eth_getBlockByNumber", hex(d.block), False)
    anchor = str(block["hash"]).lower() if isinstance(block, dict) and block.get("hash") else None
    return ChainRecord("evm", d.chain_id, d.escrow, d.token, anchor)


def recorded(s: Session) -> ChainRecord | None:
    row = s.get(ChainBinding, _ROW)
    if row is None:
        return None
    return ChainRecord(row.chain, row.chain_id, row.escrow, row.token, row.anchor)


def bind(sessions: sessionmaker[Session], chain: ChainBackend | None, *, rpc: str = "") -> ChainRecord:
    """Check the database's chain against ``chain`` (recording it on a first start);
    ``AitbcError`` (one line) when they differ."""
    now = chain_record(chain)
    for _ in range(2):  # a replica starting at once may record it first: then it is read back
        with sessions() as s:
            held = recorded(s)
            if held is not None:
                _check(held, now, rpc)
                return held
            _check_unrecorded(s, now)
            s.add(
                ChainBinding(
                    id=_ROW,
                    chain=now.chain,
                    chain_id=now.chain_id,
                    escrow=now.escrow,
                    token=now.token,
                    anchor=now.anchor,
                    created_at=time.time(),
                )
            )
            try:
                s.commit()
            except IntegrityError:
                s.rollback()
                continue
            return now
    raise AitbcError("the database's chain record could not be written nor read")  # pragma: no cover


def _check(held: ChainRecord, now: ChainRecord, rpc: str) -> None:
    if not held.same_deployment(now):
        raise AitbcError(
            f"this database's money is on {held.describe()}, and this start settles on {now.describe()}: "
            f"{_advice(held)}"
        )
    if held.anchor is not None and now.anchor != held.anchor:
        raise AitbcError(
            f"the node at {rpc} is not the chain this database's money is on: the block the contracts were "
            f"deployed in is {now.anchor}, recorded as {held.anchor} (the node was reset and the contracts "
            f"deployed again); start a node with that chain's state, or give the coordinator a new database"
        )


def _advice(held: ChainRecord) -> str:
    if held.chain == "local":
        return "start it with --chain local, or give an EVM coordinator a database of its own (--db or another --home)"
    return (
        "start it with --chain evm and --chain-file naming that deployment, or give this chain a new database "
        "(--db or another --home)"
    )


def _check_unrecorded(s: Session, now: ChainRecord) -> None:
    """A database from before the record: refuse ``now`` when its entries say otherwise."""
    mirrored = s.execute(select(Entry.seq).where(Entry.kind.in_(list(MIRROR_KINDS))).limit(1)).first()
    queued = s.execute(select(ChainTx.id).limit(1)).first()
    minted = s.execute(
        select(Entry.seq).where(Entry.debit.startswith("mint:"), Entry.kind.not_in(list(MIRROR_KINDS))).limit(1)
    ).first()
    if now.chain == "local" and (mirrored or queued):
        raise AitbcError(
            "this database's money is on an EVM chain (its books mirror deposits and bonds from one), and this "
            "start settles on the coordinator's own ledger (--chain local): start it with --chain evm and the "
            "deployment it settled on, or give the local coordinator a new database (--db or another --home)"
        )
    if now.chain == "evm" and minted:
        raise AitbcError(
            f"this database's money is on the coordinator's own ledger (--chain local), and this start settles "
            f"on {now.describe()}: {_advice(ChainRecord('local'))}"
        )
