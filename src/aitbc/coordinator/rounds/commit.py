"""Recording a closed round (:func:`commit_round`): its result (:class:`.aggregation.RoundResult`)
becomes the run's global model and the round's record in one transaction, with the updates
the norm bound refused rejected and flagged, the stragglers flagged or dropped (a run whose
rounds wait for everyone), and the next round opened or the run completed. A diverged
aggregate records nothing and fails the run. The run's runtime then holds the new model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.live.runtime import RunRuntime
from aitbc.coordinator.rounds.lifecycle import open_round
from aitbc.coordinator.rounds.result import RoundResult
from aitbc.coordinator.store.models import Flag, Job, Offer, RoundRecord, Run, Update
from aitbc.coordinator.store.repository import lock_run
from aitbc.coordinator.workforce.hiring import drop_silent_job, drop_slowest, end_run, missed_deadline
from aitbc.states import Control, JobStatus, RunStatus, UpdateStatus
from aitbc.training.checkpoint import bytes_to_tensors


def commit_round(
    ctx: Context,
    s: Session,
    run: Run,
    rt: RunRuntime,
    res: RoundResult,
    ups: Sequence[tuple[Update, int]],
    accepted: Sequence[tuple[Update, int]],
    *,
    round: int,
    advance: bool = True,
    fenced: bool = False,
) -> bool:
    """Record ``res`` as round ``round``'s result; ``advance``: also open the next round
    or complete the run (a manual run stays ``aggregating`` until its owner moves it).
    Returns False, recording nothing, if the run moved meanwhile (stopped, or that round
    recorded by a concurrent request, or another round now closed), or, ``fenced`` (the
    driver's close), if this replica no longer holds the driver lease."""
    lock_run(s, run)
    if run.status != RunStatus.AGGREGATING or run.round != round or s.get(RoundRecord, (run.id, round)) is not None:
        s.rollback()
        return False
    if fenced and not ctx.lease.fence(s):  # the next driver closes it (the same bytes)
        s.rollback()
        return False
    now = time.time()
    r = run.round
    if res.diverged is not None:  # nothing of this round is recorded, scored, paid or slashed
        end_run(s, run, RunStatus.FAILED, reason=f"diverged: {res.diverged}", now=now)
        s.commit()
        return True
    if res.rejected:
        accepted = _reject(s, run, ups, accepted, dict(res.rejected), r, now=now)
    active = s.scalars(select(Job).where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE)).all()
    stragglers = _stragglers(s, run, active, ups, r, now=now)
    active = [j for j in active if j.status == JobStatus.ACTIVE]  # less those that lost their place
    prev_size = ctx.store.size(run.global_cid) if run.global_cid else 0  # a stat: not a read and hash under the lock
    s.merge(_record(run, res, ups, accepted, stragglers, prev_size, now=now))
    jobs_by_id = {j.id: j for j in active}
    for u, _ in accepted:
        if u.job_id in jobs_by_id:
            jobs_by_id[u.job_id].rounds_done += 1
    run.global_cid, run.outer_state_cid = res.cid, res.outer_cid
    run.bytes_down += prev_size * len(ups)  # each answer began with a download of the model
    if res.val_loss is not None:
        run.val_loss, run.val_accuracy = res.val_loss, res.val_accuracy
    if not advance:
        run.updated_at = now
    elif r >= run.cfg.rounds:
        end_run(s, run, RunStatus.COMPLETE, reason=None, now=now)
    else:
        if run.cfg.mode.has_barrier:
            drop_slowest(s, run, active, ups, now=now)
        open_round(s, run, r + 1, now=now)
    res.wait_stored()  # no row names a checkpoint before it is on disk (an error: nothing recorded)
    s.commit()
    _hold(ctx, rt, res, r)
    return True


def _stragglers(
    s: Session, run: Run, active: Sequence[Job], ups: Sequence[tuple[Update, int]], r: int, *, now: float
) -> list[str]:
    """The workers of ``active`` jobs with no update of round ``r`` by its close, in a run
    whose rounds wait for everyone (async and gossip: nobody waits at a barrier, so nobody
    is late; a slow worker's update lands in a later version). Each is flagged
    ``straggler``, or, past its own deadline in an automatic run, loses its place (as
    ``drop_silent`` does to a job of a round still open; a manual run's owner decides who
    stays)."""
    if not run.cfg.mode.has_barrier:
        return []
    answered = {u.job_id for u, _ in ups}
    late = sorted((j for j in active if j.id not in answered and j.joined_round <= r), key=lambda j: j.worker_id)
    for j in late:
        if run.control == Control.AUTOMATIC and missed_deadline(run, j, now=now):
            drop_silent_job(s, run, j, now=now)
            continue
        s.add(
            Flag(
                worker_id=j.worker_id,
                run_id=run.id,
                round=r,
                kind="straggler",
                reason=f"no update for round {r} by its close",
                created_at=now,
            )
        )
    return [j.worker_id for j in late]


def _record(
    run: Run,
    res: RoundResult,
    ups: Sequence[tuple[Update, int]],
    accepted: Sequence[tuple[Update, int]],
    stragglers: list[str],
    prev_size: int,
    *,
    now: float,
) -> RoundRecord:
    train_losses = [u.train_loss for u, _ in accepted if u.train_loss is not None]
    train_accs = [u.train_accuracy for u, _ in accepted if u.train_accuracy is not None]
    return RoundRecord(
        run_id=run.id,
        round=run.round,
        checkpoint_cid=res.cid,
        outer_state_cid=res.outer_cid,
        val_loss=res.val_loss,
        val_accuracy=res.val_accuracy,
        train_loss=sum(train_losses) / len(train_losses) if train_losses else None,
        train_accuracy=sum(train_accs) / len(train_accs) if train_accs else None,
        accepted=len(accepted),
        rejected=sum(u.status == UpdateStatus.REJECTED for u, _ in ups),
        stragglers=stragglers,
        skipped=res.skipped,
        bytes_up=sum(u.size for u, _ in ups),
        bytes_down=prev_size * len(ups),
        started_at=run.round_started_at or now,
        closed_at=now,
        spread=res.spread,
    )


def _hold(ctx: Context, rt: RunRuntime, res: RoundResult, r: int) -> None:
    """The runtime holds round ``r``'s committed model and outer state."""
    if rt.params is not None:  # the step just taken is the next round's trend
        rt.remember_step(r + 1, rt.params - res.params)
    rt.params, rt.params_cid = res.params, res.cid
    if res.outer_cid != rt.outer_cid:
        if res.outer_state is not None:  # what this close wrote under res.outer_cid
            rt.outer_state = res.outer_state
        else:
            rt.outer_state = bytes_to_tensors(ctx.store.get_bytes(res.outer_cid)) if res.outer_cid else {}
        rt.outer_cid = res.outer_cid


def _reject(
    s: Session,
    run: Run,
    ups: Sequence[tuple[Update, int]],
    accepted: Sequence[tuple[Update, int]],
    reasons: dict[int, str],
    r: int,
    *,
    now: float,
) -> list[tuple[Update, int]]:
    """Updates the norm bound refused at aggregation: recorded as rejected (scoring then
    treats them as any rejected update: provable, slashed) and flagged."""
    for u, _ in ups:
        if u.id in reasons:
            u.status, u.reason = UpdateStatus.REJECTED, reasons[u.id]
            s.add(
                Flag(
                    worker_id=u.worker_id,
                    run_id=run.id,
                    round=r,
                    kind="rejected_update",
                    reason=reasons[u.id],
                    created_at=now,
                )
            )
            offer = s.get(Offer, u.worker_id)
            if offer is not None:
                offer.flags += 1
    return [(u, shard) for u, shard in accepted if u.id not in reasons]
