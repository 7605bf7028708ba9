"""What ``payments`` shows of a run's money on an EVM chain: where its escrow is, what was
deposited, and each settlement transaction's state (:mod:`aitbc.coordinator.money.outbox`)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.money import outbox
from aitbc.coordinator.store.models import Run
from aitbc.replies.money import ChainPayments, ChainTxView


def chain_payments(ctx: Context, s: Session, run: Run) -> ChainPayments | None:
    """The run's chain section; None on a coordinator's own ledger (or a run with no EVM owner)."""
    if ctx.chain is None or run.owner_evm is None:
        return None
    txs = outbox.run_txs(s, run.id)
    return ChainPayments(
        chain_id=ctx.chain.deployment.chain_id,
        escrow=ctx.chain.deployment.escrow,
        key="0x" + outbox.chain_key(run).hex(),
        owner=run.owner_evm,
        deposited=run.chain_deposited,
        final=all(t.status == outbox.FINAL for t in txs),
        txs=[
            ChainTxView(
                kind="finalize" if t.kind == outbox.FINALIZE else "settle",
                round=t.round,
                tx_hash=t.tx_hash,
                status=t.status,
                confirmations=t.confirmations,
                gas_used=t.gas_used,
            )
            for t in txs
        ],
    )


def chain_final(ctx: Context, s: Session, run: Run) -> bool:
    """Whether everything the run owes the chain is final: every queued transaction, and,
    for a run on chain finalized in the books, its finalize transaction too (queued by
    the sender after the books' finalize). True on a coordinator's own ledger."""
    if ctx.chain is None or not outbox.on_chain(run):
        return True
    txs = outbox.run_txs(s, run.id)
    if run.finalized and not any(t.kind == outbox.FINALIZE for t in txs):
        return False
    return all(t.status == outbox.FINAL for t in txs)
