"""The round lifecycle of a live run, in one place:

1. :func:`start_training` (``distributing`` -> ``training``): the initial model is round 0's
   checkpoint; round 1 opens.
2. :func:`round_due`: every active job answered, or the deadline passed with the quorum.
3. :func:`close_round` (``training`` -> ``aggregating`` -> ``training`` | ``complete``):
   :func:`aggregate_round` (norm bound, robust rule + outer step, divergence check,
   checkpoint; no database writes), then :func:`commit_round` records it and opens the next
   round in one transaction -- or, if the aggregate diverged (non-finite, or a validation
   loss past ``divergence_factor`` x the previous round's), records nothing and fails the
   run ``diverged``: the coordinator's own aggregate is never blamed on a provider, and no
   model a provider receives is one the coordinator did not check.
   Manual control (:mod:`.control`) calls the same two with the owner's choice of updates.
   With ``overlap`` 2 a job's update of the next round may arrive while this one is open
   (:func:`sends_ahead`); :func:`open_round` withdraws those of jobs ended or rejected since.
4. :func:`evaluate_round`: the validation loss of a round's model, after the next round
   is open (so workers never wait for it): the driver's books thread finds the rounds
   due one with :func:`pending_evaluations` (a restart's missed ones too).

Scoring and settlement follow from the driver's books thread (:mod:`.scoring`, :mod:`.settlement`).
Shape letters: ``n`` accepted updates, ``d`` parameters.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch
from sqlalchemy import select
from sqlalchemy.orm import Session, object_session
from torch import Tensor

from aitbc.coordinator.context import Context
from aitbc.coordinator.live.books import books_model
from aitbc.coordinator.live.runtime import OUTER_FORMAT, RunRuntime, drop_runtime, runtime, write_behind
from aitbc.coordinator.live.updates import aggregate_updates
from aitbc.coordinator.store.models import Flag, Job, Offer, RoundRecord, Run, Update
from aitbc.coordinator.store.repository import base_round, job_settings, lock_run, provably_bad, round_updates
from aitbc.coordinator.store.run_config import RunConfig
from aitbc.coordinator.store.states import ENDED, transition
from aitbc.coordinator.verification.spot_checks import pending_in_round
from aitbc.coordinator.workforce.hiring import drop_silent_job, drop_slowest, end_run, missed_deadline
from aitbc.core.options import parse_spec
from aitbc.core.outer import build_outer
from aitbc.core.staleness import async_weight, build_staleness
from aitbc.states import Control, JobStatus, RunStatus, UpdateStatus
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.checkpoint import bytes_to_tensors, flat_params, load_checkpoint, set_flat_params, tensors_to_bytes
from aitbc.training.local import evaluate

log = logging.getLogger("aitbc.coordinator")

# --- opening the first round ----------------------------------------------------------


def start_training(ctx: Context, run_id: str) -> None:
    """``distributing`` -> ``training``: write the initial model (round 0) and open round 1."""
    with ctx.session() as s:
        run = s.get(Run, run_id)
        if run is None or run.status != RunStatus.DISTRIBUTING:
            return
        rt = runtime(ctx, run)
        with rt.lock:
            params = flat_params(rt.model) if rt.params is None else rt.params
            cid, _ = rt.checkpoint(ctx, run, params, 0)
            loss, acc = rt.evaluate(params)
            rt.params, rt.params_cid = params, cid
        lock_run(s, run)
        if run.status != RunStatus.DISTRIBUTING:  # stopped meanwhile
            s.rollback()
            return
        now = time.time()
        s.merge(
            RoundRecord(
                run_id=run.id,
                round=0,
                checkpoint_cid=cid,
                val_loss=loss,
                val_accuracy=acc,
                started_at=now,
                closed_at=now,
            )
        )
        run.global_cid, run.initial_val_loss, run.val_loss, run.val_accuracy = cid, loss, loss, acc
        run.round, run.round_started_at = 1, now
        transition(run, RunStatus.TRAINING, now=now)
        s.commit()
    ctx.notifier.bump()


@dataclass(frozen=True, slots=True)
class RoundResult:
    """An aggregated round, before it is recorded."""

    params: Tensor  # (d,) the new global model
    cid: str  # its checkpoint blob
    size: int  # the checkpoint's bytes
    outer_cid: str | None  # the outer optimizer's state blob, if it keeps one
    val_loss: float | None  # None: evaluated later
    val_accuracy: float | None
    skipped: bool  # too few updates for the rule (or none): the model is unchanged
    diverged: str | None = None  # why the aggregate must not be committed (the run fails)
    rejected: tuple[tuple[int, str], ...] = ()  # (update id, reason): past the norm bound, provable
    clipped: tuple[int, ...] = ()  # update ids scaled down to the norm bound (not punished)
    # the outer optimizer's state stored under outer_cid by this round (None: it wrote none),
    # so recording the round does not read back and hash what it just wrote
    outer_state: dict[str, Tensor] | None = None
    spread: float | None = None  # gossip: the round's models' mean distance to their mean
    # the writes of the checkpoint and the outer state, under way (runtime.write_behind):
    # done before the round is recorded
    stored: tuple[Future[str], ...] = ()

    def wait_stored(self) -> None:
        """Return once the round's blobs are stored (durably); a failed write's error."""
        for f in self.stored:
            f.result()


# --- closing a round -------------------------------------------------------------------


def round_due(ctx: Context, s: Session, run: Run, *, now: float) -> bool:
    """A round closes when every active job has answered it, or at its deadline once the
    quorum of accepted updates is met (the rest are stragglers)."""
    active = s.scalars(select(Job.id).where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE)).all()
    answers = s.execute(
        select(Update.job_id, Update.status).where(Update.run_id == run.id, Update.round == run.round)
    ).all()
    answered = {j for j, _ in answers}
    accepted = sum(st == UpdateStatus.ACCEPTED for _, st in answers)
    if pending_in_round(s, run.id, run.round):
        return False  # a spot check is under way: its update must not be aggregated unjudged
    if active and all(j in answered for j in active):
        return True  # nobody left to wait for (if none was accepted, the round is skipped)
    deadline = run.cfg.round_deadline
    if run.cfg.mode == "async":  # a buffer: K accepted updates, or its time bound with at least one
        if accepted >= (run.cfg.buffer or 1):
            return True
        return bool(deadline and run.round_started_at and now >= run.round_started_at + deadline and accepted)
    if deadline and run.round_started_at and now >= run.round_started_at + deadline:
        return accepted >= run.cfg.quorum
    return False


def sends_ahead(run: Run) -> bool:
    """Whether the run takes a job's update of the round after the open one (``overlap`` 2,
    an automatic sync run, not in its last round): the worker sends it as soon as it has
    trained it, so that round can close as soon as it opens."""
    return (
        run.configured
        and run.cfg.mode == "sync"
        and run.cfg.overlap >= 2
        and run.control == Control.AUTOMATIC
        and run.round < run.cfg.rounds
    )


def open_round(s: Session, run: Run, r: int, *, now: float) -> None:
    """Open round ``r`` (the run goes back to ``training``). Accepted updates sent ahead
    for it (:func:`sends_ahead`) whose job has ended since, or has had an update rejected
    (it is slashed and ejected when that round is settled, and sends nothing more), are
    withdrawn: deleted, never aggregated, scored or paid, their bytes and compute no longer
    counted. An update sent ahead is never in a closed round's books, so nothing else names
    it. A rejected one stays (a failed spot check, a NaN): its round's settlement slashes on
    it, whether or not its job is still there. Only a sync run with overlap 2 sends ahead: a
    gossip worker's record of a later round is its own clock's, and stays."""
    run.round, run.round_started_at = r, now
    transition(run, RunStatus.TRAINING, now=now)
    if run.cfg.overlap < 2:  # nothing is sent ahead (async and gossip runs take overlap 0)
        return
    ahead = s.scalars(select(Update).where(Update.run_id == run.id, Update.round == r)).all()
    if not ahead:
        return
    active = set(s.scalars(select(Job.id).where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE)).all())
    ejecting = set(
        s.scalars(
            select(Update.job_id).where(
                Update.run_id == run.id,
                Update.round < r,
                provably_bad(),
            )
        ).all()
    )
    for u in ahead:
        # a rejected one stays: it is the evidence its round's settlement slashes on
        if u.status != UpdateStatus.ACCEPTED or (u.job_id in active and u.job_id not in ejecting):
            continue
        log.info("run %s: round %d's update from job %s withdrawn (its job ended or was rejected)", run.id, r, u.job_id)
        run.bytes_up -= u.size
        job = s.get(Job, u.job_id)
        if job is not None:
            job.compute_seconds = max(0.0, job.compute_seconds - u.compute_seconds)
        s.delete(u)


def close_round(ctx: Context, run_id: str) -> None:
    """``training`` -> ``aggregating`` -> ``training`` (next round) or ``complete``."""
    with ctx.session() as s:
        run = s.get(Run, run_id)
        if run is None:
            return
        if run.status == RunStatus.TRAINING:
            lock_run(s, run)  # no update commits between this check and the transition
            if run.control != Control.AUTOMATIC:  # its owner took it over meanwhile: theirs to close
                s.rollback()
                return
            if not ctx.lease.fence(s):  # another replica drives now (this one was paused): its call
                s.rollback()
                return
            if run.status == RunStatus.TRAINING:
                transition(run, RunStatus.AGGREGATING)
            s.commit()  # no bump: a waiting worker's long poll has nothing new to take until the next round opens
        if run.status != RunStatus.AGGREGATING or run.control != Control.AUTOMATIC:
            return
        r = run.round
        ups = round_updates(s, run.id, r)
        accepted = [(u, shard) for u, shard in ups if u.status == UpdateStatus.ACCEPTED]
        final = r >= run.cfg.rounds
        rt = runtime(ctx, run)
        t0 = time.perf_counter()
        with rt.lock:
            rt.load(ctx, run)
            # The last round is evaluated before the run completes; the others after the
            # next round is open (the driver's books thread), so workers do not wait for it.
            result = aggregate_round(ctx, run, rt, accepted, r, evaluate_now=final)
        if commit_round(ctx, s, run, rt, result, ups, accepted, round=r, fenced=True):
            ctx.metrics.round_close.observe(time.perf_counter() - t0)  # aggregate + commit
        if run.status in ENDED:
            drop_runtime(ctx, run.id)
    ctx.notifier.bump()


def aggregate_round(
    ctx: Context,
    run: Run,
    rt: RunRuntime,
    accepted: Sequence[tuple[Update, int]],
    r: int,
    *,
    evaluate_now: bool,
    weights: list[float] | None = None,
) -> RoundResult:
    """Round ``r``'s new global model from ``accepted`` (update, shard index) pairs: the
    run's robust rule, then its outer step, then the checkpoint blob; evaluated now if
    asked. Writes no rows (:func:`commit_round` records it). ``weights``: one per
    accepted update (default: the samples it was trained on). Call with ``rt.lock`` held,
    after ``rt.load``."""
    params = rt.params
    if params is None:
        raise RuntimeError(f"run {run.id}'s runtime holds no model: call RunRuntime.load first")
    before = params
    outer_cid = run.outer_state_cid
    outer_state: dict[str, Tensor] | None = None
    skipped = False
    rejected: list[tuple[int, str]] = []
    clipped: list[int] = []
    writes: list[Future[str]] = []  # blobs being written (RoundResult.stored)
    if accepted:
        if weights is None:  # the samples each update was trained on (a shard split since does not change them)
            weights = [float(u.samples) for u, _ in accepted]
        # The norm bound (aitbc.core.norms), against the whole round: grossly large -> rejected, large -> clipped;
        # then the rule, in memory or streamed from disk past aggregation_memory_mb (round_updates).
        agg = aggregate_updates(
            ctx,
            rt.aggregator,
            rt.norm_bound,
            [u.cid for u, _ in accepted],
            weights,
            [_expected_scale(run, u) for u, _ in accepted],
            # overlap: an update trained from the model before the round's counts less
            [_staleness(run, u) for u, _ in accepted],
            d=rt.d,
            round_index=r,
            reference=rt.trend(ctx, run.id, r),
        )
        rejected = [(accepted[i][0].id, agg.verdict.reasons[i] or "") for i in agg.verdict.rejected]
        clipped = [accepted[i][0].id for i in agg.verdict.clipped]
        skipped = agg.delta is None
        if agg.delta is not None:
            delta = agg.delta  # (d,)
            del agg  # the aggregate is not held past the outer step (a model's size)
            outer = build_outer(rt.outer_name, rt.outer_options)
            if rt.outer_state:
                outer.load_state_dict({k: v.clone() for k, v in rt.outer_state.items()})
            params = outer.step(params, delta)
            del delta
            state = outer.state_dict()
            if state:  # written behind, as the checkpoint
                blob = tensors_to_bytes(state, {"format": OUTER_FORMAT, "round": str(r)})
                outer_cid = cid_of_bytes(blob)
                writes.append(write_behind(ctx, outer_cid, blob))
                outer_state = state
    else:
        skipped = True
    diverged, guard = _divergence(run, rt, before, params, r)
    loss = acc = None
    if evaluate_now and diverged is None:
        t0 = time.perf_counter()
        loss, acc = rt.evaluate(params)
        ctx.metrics.round_evaluation.observe(time.perf_counter() - t0)
    cid, size, stored = rt.checkpoint_behind(ctx, run, params, r)  # written while commit_round queries
    writes.append(stored)
    if guard is not None:
        rt.guard_cache = (cid, guard)  # the next round's check compares with it
    return RoundResult(
        params=params,
        cid=cid,
        size=size,
        outer_cid=outer_cid,
        val_loss=loss,
        val_accuracy=acc,
        skipped=skipped,
        diverged=diverged,
        rejected=tuple(rejected),
        clipped=tuple(clipped),
        outer_state=outer_state,
        stored=tuple(writes),
    )


def _staleness(run: Run, u: Update) -> float:
    """What ``u`` counts for: 1, or, trained from a model before its round's alone
    (overlap: one or two aggregations late), the run's staleness rule at that lag
    (:mod:`aitbc.core.staleness`). One trained ahead from that model plus its worker's own
    previous updates (``prior_cid`` and its chain, an eager start) began about where the
    round's model is: it counts 1 (bench/overlap_loss.py: the synchronous loss, where the
    stale start at half weight lags it).
    Async: the run's staleness rule at the versions applied since its base (checked
    against max_staleness when it was accepted)."""
    if run.cfg.mode == "async":
        s = object_session(u)
        lag = 0 if s is None else update_staleness(s, run, u)
        w = async_weight(
            build_staleness(*parse_spec(run.cfg.staleness, what="staleness rule")), lag, run.cfg.max_staleness
        )
        return 0.0 if w is None else w  # None cannot happen: the staleness was checked when it was accepted
    if u.base_cid is None or u.prior_cid is not None:
        return 1.0
    s = object_session(u)
    found = None if s is None else base_round(s, run.id, u.base_cid, before=u.round)
    lag = 1 if found is None else max(1, u.round - 1 - found)  # overlap 2: one or two rounds late
    return build_staleness(*parse_spec(run.cfg.overlap_staleness, what="staleness rule"))(lag)


def update_staleness(s: Session, run: Run, u: Update) -> int:
    """Async: versions applied between the model ``u`` was trained from and the one its
    round applies it to (``u.round - 1 - base``; 0 when its base is its round's own model)."""
    if u.base_cid is None:
        return 0
    b = base_round(s, run.id, u.base_cid, before=u.round)
    return 0 if b is None else u.round - 1 - b


def _expected_scale(run: Run, u: Update) -> float:
    """How large ``u`` may be relative to the run's config: its job's own lr and steps (an
    owner's per-job override) over the run's. A provider is judged by the config it got."""
    s = object_session(u)
    job = s.get(Job, u.job_id) if s is not None else None
    if job is None:
        return 1.0
    cfg, own = run.cfg, job_settings(run, job)  # epochs: the steps its shard gives
    return (own["lr"] / cfg.lr) * (own["local_steps"] / cfg.local_steps)


def _divergence(run: Run, rt: RunRuntime, before: Tensor, after: Tensor, r: int) -> tuple[str | None, float | None]:
    """Why round ``r``'s new model ``after`` must not be committed (or None), and its guard
    loss if measured. Not committed: non-finite
    parameters, or a loss on the guard samples past ``divergence_factor`` x the larger of
    the previous model's and the initial model's (near convergence a small loss may double
    by noise; a diverged model's is many times chance)."""
    if not torch.isfinite(before).all():  # a model committed before this check existed
        return f"the global model before round {r} has non-finite parameters", None
    if not torch.isfinite(after).all():
        return f"round {r}'s aggregate has non-finite parameters", None
    if after is before:
        return None, None  # skipped: the model is unchanged
    new = rt.guard_loss(after)
    old = max(rt.guard_loss(before, rt.params_cid), run.initial_val_loss or 0.0)
    if not math.isfinite(new) or new > rt.divergence_factor * old:
        why = f"round {r}'s validation loss {new:.4g} is more than {rt.divergence_factor:g} x the previous round's {old:.4g}"
        return why, None
    return None, new


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
    answered = {u.job_id for u, _ in ups}
    # async: nobody is waited for, so nobody is late (a slow worker's update lands in a later version)
    is_async = run.cfg.mode in ("async", "gossip")  # gossip: nobody waits at a barrier either
    late = (
        []
        if is_async
        else sorted((j for j in active if j.id not in answered and j.joined_round <= r), key=lambda j: j.worker_id)
    )
    stragglers = [j.worker_id for j in late]
    for j in late:
        # past its own deadline (an automatic sync run): it loses its place, as drop_silent does
        # to a job of a round still open; a manual run's owner decides who stays
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
    active = [j for j in active if j.status == JobStatus.ACTIVE]  # less those that lost their place
    train_losses = [u.train_loss for u, _ in accepted if u.train_loss is not None]
    train_accs = [u.train_accuracy for u, _ in accepted if u.train_accuracy is not None]
    prev_size = ctx.store.size(run.global_cid) if run.global_cid else 0  # a stat: not a read and hash under the lock
    s.merge(
        RoundRecord(
            run_id=run.id,
            round=r,
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
    )
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
        if not is_async:
            drop_slowest(s, run, active, ups, now=now)
        open_round(s, run, r + 1, now=now)
    res.wait_stored()  # no row names a checkpoint before it is on disk (an error: nothing recorded)
    s.commit()
    if rt.params is not None:  # the step just taken is the next round's trend
        rt.remember_step(r + 1, rt.params - res.params)
    rt.params, rt.params_cid = res.params, res.cid
    if res.outer_cid != rt.outer_cid:
        if res.outer_state is not None:  # what this close wrote under res.outer_cid
            rt.outer_state = res.outer_state
        else:
            rt.outer_state = bytes_to_tensors(ctx.store.get_bytes(res.outer_cid)) if res.outer_cid else {}
        rt.outer_cid = res.outer_cid
    return True


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


# --- evaluation --------------------------------------------------------------------------


def evaluate_round(ctx: Context, run_id: str, r: int, params: Tensor | None = None) -> None:
    """Score round ``r``'s global model on the validation split and record it (also how a
    restarted coordinator fills in an evaluation it did not get to)."""
    with ctx.session() as s:
        run = s.get(Run, run_id)
        rec = s.get(RoundRecord, (run_id, r))
        if run is None or rec is None or rec.val_loss is not None:
            return
        rt = runtime(ctx, run)
        model = books_model(ctx, run_id, rt)  # not the runtime's: the next close need not wait
        if params is None:
            load_checkpoint(model, ctx.store.get_bytes(rec.checkpoint_cid))
        else:
            set_flat_params(model, params)
        t0 = time.perf_counter()
        loss, acc = evaluate(model, rt.val_x, rt.val_y, batch_size=rt.eval_rows)
        ctx.metrics.round_evaluation.observe(time.perf_counter() - t0)
        lock_run(s, run)
        s.refresh(rec)
        rec.val_loss, rec.val_accuracy = loss, acc
        later = s.scalar(
            select(RoundRecord.round)
            .where(RoundRecord.run_id == run_id, RoundRecord.round > r, RoundRecord.val_loss.is_not(None))
            .limit(1)
        )
        if later is None:
            run.val_loss, run.val_accuracy = loss, acc
        s.commit()
        if run.status in ENDED:
            drop_runtime(ctx, run_id)


def pending_evaluations(s: Session) -> list[tuple[str, int]]:
    """Rounds whose evaluation is due but missing (the coordinator died before it)."""
    rows = s.execute(
        select(RoundRecord.run_id, RoundRecord.round, Run.config)
        .join(Run, Run.id == RoundRecord.run_id)
        .where(RoundRecord.round > 0, RoundRecord.val_loss.is_(None))
    ).all()
    return [(run_id, r) for run_id, r, cfg in rows if cfg and RunConfig.model_validate(cfg).eval_due(r)]
