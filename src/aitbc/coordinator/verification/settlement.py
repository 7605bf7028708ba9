"""Paying for a scored round, exactly once, and punishing provable misbehaviour.

:func:`settle` pays each contract of a round ``price x quality`` from the run's escrow in
its own transaction, keyed ``settle:<contract>:<round>`` (a restart redoes only contracts
without a settlement row); reputations move; :func:`slash` burns a provable cheater's bond
(``burn:<network>``, never the owner's escrow: an owner can make honest work look bad, so
it must not gain from a slash; nor other providers, who could frame a rival) and ejects it. :func:`pending` lists what the driver still has to settle
and finalize. On an EVM chain, the round's settlement transaction is queued
(:mod:`aitbc.coordinator.money.outbox`) in the transaction that records the round settled.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.money.escrow import owner_may_still_pay, pay_as_delivered, settle_round
from aitbc.coordinator.money.outbox import queue_settlement
from aitbc.coordinator.store.models import Contract, Flag, Job, Offer, RoundRecord, Run, Score, Settlement, Update
from aitbc.coordinator.store.repository import lock_run, row
from aitbc.coordinator.store.states import ENDED
from aitbc.coordinator.workforce.hiring import assign_worker, end_job
from aitbc.core.scoring import reputation_update
from aitbc.ledger.chain import bond_account, burn_account
from aitbc.states import ContractStatus, Control, JobStatus, UpdateStatus
from aitbc.units import MICRO

log = logging.getLogger("aitbc.coordinator")


def settle(ctx: Context, run_id: str, r: int) -> None:
    """Pay each contract of round ``r`` price x quality from escrow, exactly once; slash
    provable misbehaviour; update reputations. Each contract in its own transaction."""
    with ctx.session() as s:
        scores = s.scalars(
            select(Score).where(Score.run_id == run_id, Score.round == r).order_by(Score.contract_id)
        ).all()
        ids = [(sc.id, sc.contract_id) for sc in scores]
    for score_id, contract_id in ids:
        with ctx.session() as s:
            if s.scalar(select(Settlement.id).where(Settlement.contract_id == contract_id, Settlement.round == r)):
                continue  # settled before a restart
            _settle_one(ctx, s, row(s, Score, score_id), r)
            s.commit()
        if ctx.settings.settle_delay:
            time.sleep(ctx.settings.settle_delay)
    with ctx.session() as s:
        run = lock_run(s, row(s, Run, run_id))
        _pay_excluded(ctx, s, run, r)
        moved = run.settled_round < r
        run.settled_round = max(run.settled_round, r)
        if moved:  # an EVM run's round is owed to the chain from the moment the books pay it
            queue_settlement(ctx, s, run, r)
        closed = s.scalar(select(RoundRecord.closed_at).where(RoundRecord.run_id == run_id, RoundRecord.round == r))
        s.commit()
    if moved and closed is not None:  # once per round: a redo after a restart is not a second lag
        ctx.metrics.settlement_lag.observe(max(0.0, time.time() - closed))


def _pay_excluded(ctx: Context, s: Session, run: Run, r: int) -> None:
    """A manual run's owner left accepted updates of round ``r`` out of its aggregation: it
    received them (and could read them), so each is paid as delivered (full price,
    :func:`.escrow.pay_as_delivered`), once. Scoring does not judge them (they are not in
    the round's model)."""
    excluded = s.scalars(
        select(Contract)
        .join(Job, Job.contract_id == Contract.id)
        .join(Update, Update.job_id == Job.id)
        .where(
            Update.run_id == run.id,
            Update.round == r,
            Update.status == UpdateStatus.EXCLUDED,
            Contract.status != ContractStatus.SLASHED,
        )
        .order_by(Contract.id)
    ).all()
    for c in excluded:
        pay_as_delivered(ctx, s, run, c, r, why=f"left out of round {r}'s aggregation by the owner")


def _settle_one(ctx: Context, s: Session, sc: Score, r: int) -> None:
    run = lock_run(s, row(s, Run, sc.run_id))
    contract = row(s, Contract, sc.contract_id)
    quality_ppm = round(sc.quality * 1_000_000)
    due = contract.price * quality_ppm // MICRO  # integer micro-AIT, rounded down
    settle_round(ctx, s, run, contract, r, quality=sc.quality, due=due, memo={"quality_ppm": quality_ppm})
    offer = s.get(Offer, contract.worker_id)
    if offer is not None:
        offer.reputation = reputation_update(offer.reputation, sc.quality)
    if sc.provable and contract.status != ContractStatus.SLASHED:
        slash(ctx, s, run, contract, reason=f"round {r}: {', '.join(sc.flags)}")


def slash(ctx: Context, s: Session, run: Run, contract: Contract, *, reason: str) -> None:
    """Provable misbehaviour: the bond is burned (``burn:<network>``: no party that could
    trigger a slash gains from it), and the worker is ejected (its job ends; its shard goes
    to someone else)."""
    held = ctx.ledger.balance(s, bond_account(contract.id))
    if held > 0:
        ctx.ledger.post(
            s,
            kind="slash",
            debit=bond_account(contract.id),
            credit=burn_account(ctx.ledger.network),
            amount=held,
            memo={"run": run.id, "contract": contract.id, "reason": reason},
            key=f"slash:{contract.id}",
        )
    contract.slashed += held
    now = time.time()
    s.add(
        Flag(
            worker_id=contract.worker_id, run_id=run.id, round=run.round, kind="slashed", reason=reason, created_at=now
        )
    )
    job = s.scalar(select(Job).where(Job.contract_id == contract.id, Job.status == JobStatus.ACTIVE))
    contract.status = ContractStatus.SLASHED
    if job is not None:
        end_job(s, job, JobStatus.FAILED, f"ejected for provable misbehaviour ({reason})", now=now)
        contract.status = ContractStatus.SLASHED
        if run.status not in ENDED and run.control == Control.AUTOMATIC:  # a manual run's owner reassigns
            s.flush()
            assign_worker(ctx, s, run, job.shard_index, now=now, replaces=job.id)
    log.info("run %s: slashed %s (%d micro-AIT): %s", run.id, contract.worker_id, held, reason)


def pending(ctx: Context, s: Session, now: float) -> tuple[list[tuple[str, int]], list[str]]:
    """Rounds closed but not yet scored and settled (oldest first), and ended runs to
    finalize: those whose bonds are still out, and manual runs whose owner's time to pay
    and refund is over."""
    todo, ready = [], []
    started_or_ended = or_(
        Run.config.is_not(None), Run.status.in_(tuple(ENDED))
    )  # a run stopped before distribute has bonds too
    for run in s.scalars(select(Run).where(Run.finalized.is_(False), started_or_ended)).all():
        closed = s.scalar(select(func.max(RoundRecord.round)).where(RoundRecord.run_id == run.id)) or 0
        if run.settled_round < closed:
            todo.append((run.id, run.settled_round + 1))
        elif run.status in ENDED and (not run.bonds_returned or not owner_may_still_pay(ctx, run, now)):
            ready.append(run.id)  # a manual run's escrow waits for its owner, for owner_pay_seconds
    return todo, ready
