"""The interface every run mode implements on the coordinator (:class:`RoundMode`): when a
round is due and how it closes, how an update is admitted, what counts as a straggler, what
a worker's progress report does and what a worker is told in its job view.

The defaults are those of a round of one global model that the coordinator aggregates and
every worker trains from (sync): an update names its base among the round's model and the
``overlap`` ones before it, and the job view serves that model. A mode overrides what it
does otherwise. :class:`CentralMode` closes such a round: driver -> mode -> aggregation
(:mod:`..aggregation`, which reads the updates through :mod:`aitbc.coordinator.live.updates`)
-> commit (:mod:`..commit`) -> repository.

The modes hold no per-run state: one object per mode (:data:`..modes.MODES`); what a run's
close needs parsed once (its aggregator, staleness rules) is on the run's
:class:`~aitbc.coordinator.live.runtime.RunRuntime`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import conflict
from aitbc.coordinator.live.runtime import RunRuntime, drop_runtime, runtime
from aitbc.coordinator.rounds import admission
from aitbc.coordinator.rounds.aggregation import aggregate_round
from aitbc.coordinator.rounds.commit import commit_round
from aitbc.coordinator.rounds.jobs import reached
from aitbc.coordinator.schemas import Progress, UpdateSubmit
from aitbc.coordinator.store.models import Job, Run, Update
from aitbc.coordinator.store.repository import lock_run, round_updates
from aitbc.coordinator.store.states import ENDED, transition
from aitbc.replies.jobs import Action
from aitbc.run_mode import RunMode
from aitbc.states import Control, RunStatus, UpdateStatus

Refuse = Callable[..., None]  # rolls back, may flag the job, raises the error it is given


@dataclass(frozen=True, slots=True)
class Turn:
    """What a job's worker is to do now, and its update of the round it answered (if any)."""

    action: Action
    answered: Update | None


@dataclass(frozen=True, slots=True)
class JobView:
    """The mode's part of a job view."""

    turn: Turn
    deadline: float | None  # seconds from the round's start the worker has
    serves_global_model: bool  # the view names peers holding the global model, or carries it inline
    fields: dict[str, Any] = field(default_factory=dict)  # the mode's own fields


@dataclass(frozen=True, slots=True)
class Base:
    """The model an update was trained from, and that model's round."""

    cid: str
    round: int


class RoundMode(ABC):
    kind: ClassVar[RunMode]

    @property
    def has_barrier(self) -> bool:
        """A round waits for every active worker: those missing at its close are stragglers."""
        return self.kind.has_barrier

    # --- a round: when it is due, how it closes, how it is judged ---------------------

    @abstractmethod
    def round_due(self, ctx: Context, s: Session, run: Run, *, now: float) -> bool:
        """Whether the driver closes the run's open round now."""

    @abstractmethod
    def close_round(self, ctx: Context, run_id: str) -> None:
        """Close the run's open round (``training`` -> ``aggregating`` -> next round or end)."""

    @abstractmethod
    def score(self, ctx: Context, run_id: str, r: int) -> None:
        """Round ``r``'s Score rows (idempotent), before it is settled."""

    # --- an update: its base, its round gate, the round it joins -----------------------

    def gate(self, s: Session, job: Job, run: Run, body: UpdateSubmit, refuse: Refuse) -> None:
        """Refuse (``refuse``) an update the open round cannot take now."""
        admission.barrier_gate(s, job, run, body, refuse)

    def base(self, s: Session, run: Run, body: UpdateSubmit) -> Base:
        """The model the update says it was trained from (a 422 if it may not be)."""
        cid, r = admission.update_base(s, run, body.round, body.base_cid)
        return Base(cid, r)

    def admit(self, s: Session, job: Job, run: Run, body: UpdateSubmit, base: Base, *, now: float) -> int:
        """Under the run's lock: the round the update joins (or a refusal)."""
        return body.round

    def keeps_base(self, run: Run, round: int, base: Base) -> bool:
        """Whether the update's row names its base: one sent ahead of its round, or trained
        from a model before the round's (the round's own model is implied)."""
        return round > run.round or base.cid != run.global_cid

    # --- a worker's progress report and its job view ------------------------------------

    def progress(self, run: Run, job: Job, body: Progress, *, now: float) -> bool:
        """Check and note a progress report (a 409 for a round it cannot be of); whether
        the driver is to look at the run again once it is stored."""
        ahead = run.cfg.overlap if run.configured else 0  # overlap 1: the next round may be under way already
        if body.round is not None and body.round > run.round + ahead:
            raise conflict("wrong_round", f"progress for round {body.round}; the open round of {run.id} is {run.round}")
        if body.round == run.round and body.step is not None:  # a late report of a closed round measures nothing
            reached(run, job, body.round, body.step, now=now)
        return False

    def job_view(self, ctx: Context, s: Session, run: Run, job: Job, turn: Turn) -> JobView:
        return JobView(turn=turn, deadline=run.cfg.round_deadline, serves_global_model=True)


class CentralMode(RoundMode):
    """A mode whose rounds the coordinator aggregates into one global model (sync, async)."""

    def update_counts(self, run: Run, rt: RunRuntime, accepted: Sequence[tuple[Update, int]]) -> list[float] | None:
        """What each accepted update counts for after the norm bound (None: the default,
        :func:`..aggregation.overlap_count`)."""
        return None

    def close_round(self, ctx: Context, run_id: str) -> None:
        with ctx.session() as s:
            run = s.get(Run, run_id)
            if run is None or not _to_aggregating(ctx, s, run):
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
                counts = self.update_counts(run, rt, accepted)
                result = aggregate_round(ctx, run, rt, accepted, r, evaluate_now=final, counts=counts)
            if commit_round(ctx, s, run, rt, result, ups, accepted, round=r, fenced=True):
                ctx.metrics.round_close.observe(time.perf_counter() - t0)  # aggregate + commit
            if run.status in ENDED:
                drop_runtime(ctx, run.id)
        ctx.notifier.bump()


def _to_aggregating(ctx: Context, s: Session, run: Run) -> bool:
    """``training`` -> ``aggregating`` under the run's lock and the driver's fence; whether
    the run is (now) aggregating under automatic control, its round the driver's to close."""
    if run.status == RunStatus.TRAINING:
        lock_run(s, run)  # no update commits between this check and the transition
        if run.control != Control.AUTOMATIC:  # its owner took it over meanwhile: theirs to close
            s.rollback()
            return False
        if not ctx.lease.fence(s):  # another replica drives now (this one was paused): its call
            s.rollback()
            return False
        if run.status == RunStatus.TRAINING:
            transition(run, RunStatus.AGGREGATING)
        s.commit()  # no bump: a waiting worker's long poll has nothing new to take until the next round opens
    return run.status == RunStatus.AGGREGATING and run.control == Control.AUTOMATIC
