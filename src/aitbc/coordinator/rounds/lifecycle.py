"""A live run's rounds opening and their models evaluated; what every mode shares:

1. :func:`start_training` (``distributing`` -> ``training``): the initial model is round 0's
   checkpoint; round 1 opens.
2. :func:`answers`, :func:`past_deadline`: what a mode's ``round_due`` reads of the open round.
3. The close is the run mode's (:mod:`.modes`): a global model's round is aggregated
   (:mod:`.aggregation`: norm bound, robust rule + outer step, divergence check,
   checkpoint; no database writes) and recorded (:mod:`.commit`), which opens the next
   round with :func:`open_round` -- or, if the aggregate diverged (non-finite, or a
   validation loss past ``divergence_factor`` x the previous round's), records nothing and
   fails the run ``diverged``: the coordinator's own aggregate is never blamed on a
   provider, and no model a provider receives is one the coordinator did not check.
   Manual control (:mod:`.control`) calls the same two with the owner's choice of updates.
   With ``overlap`` 2 a job's update of the next round may arrive while this one is open
   (:func:`sends_ahead`); :func:`open_round` withdraws those of jobs ended or rejected since.
4. :func:`evaluate_round`: the validation loss of a round's model, after the next round
   is open (so workers never wait for it): the driver's books thread finds the rounds
   due one with :func:`pending_evaluations` (a restart's missed ones too).

Scoring and settlement follow from the driver's books thread (:mod:`.scoring`, :mod:`.settlement`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session
from torch import Tensor

from aitbc.coordinator.context import Context
from aitbc.coordinator.live.books import books_model
from aitbc.coordinator.live.runtime import drop_runtime, runtime
from aitbc.coordinator.store.models import Job, RoundRecord, Run, Update
from aitbc.coordinator.store.repository import lock_run, provably_bad
from aitbc.coordinator.store.run_config import RunConfig
from aitbc.coordinator.store.states import ENDED, transition
from aitbc.states import Control, JobStatus, RunStatus, UpdateStatus
from aitbc.training.checkpoint import flat_params, load_checkpoint, set_flat_params
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
class Answers:
    """Who has answered the run's open round so far."""

    active: frozenset[str]  # the run's active jobs
    answered: frozenset[str]  # jobs with an update of the round (accepted or not)
    accepted: int  # accepted updates of the round

    @property
    def everyone(self) -> bool:
        """Every active job answered: nobody left to wait for."""
        return bool(self.active) and self.active <= self.answered


def answers(s: Session, run: Run) -> Answers:
    active = s.scalars(select(Job.id).where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE)).all()
    rows = s.execute(
        select(Update.job_id, Update.status).where(Update.run_id == run.id, Update.round == run.round)
    ).all()
    return Answers(
        active=frozenset(active),
        answered=frozenset(j for j, _ in rows),
        accepted=sum(st == UpdateStatus.ACCEPTED for _, st in rows),
    )


def past_deadline(run: Run, *, now: float) -> bool:
    """The open round's deadline (``round_deadline``) has passed."""
    deadline = run.cfg.round_deadline
    return bool(deadline and run.round_started_at and now >= run.round_started_at + deadline)


def sends_ahead(run: Run) -> bool:
    """Whether the run takes a job's update of the round after the open one (``overlap`` 2,
    an automatic sync run, not in its last round): the worker sends it as soon as it has
    trained it, so that round can close as soon as it opens."""
    return (
        run.configured
        and run.cfg.mode.has_barrier
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
