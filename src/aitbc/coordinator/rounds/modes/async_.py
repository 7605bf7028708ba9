"""Async: a round is one buffer of updates applied as a version. An update may be trained
from any of the last ``max_staleness`` versions (older ones are refused, flagged
``stale_update``), joins the open buffer whatever round it names, and counts by the run's
``staleness`` rule at its lag. A version is applied when ``buffer`` updates are in, or at
its deadline with at least one; nobody waits at a barrier, so nobody is a straggler.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session, object_session

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import conflict, unprocessable
from aitbc.coordinator.live.runtime import RunRuntime
from aitbc.coordinator.rounds.jobs import refuse_ejected
from aitbc.coordinator.rounds.lifecycle import answers, past_deadline
from aitbc.coordinator.rounds.modes.base import Base, CentralMode, Refuse
from aitbc.coordinator.schemas import UpdateSubmit
from aitbc.coordinator.store.models import Flag, Job, Run, Update
from aitbc.coordinator.store.repository import base_round
from aitbc.coordinator.verification import scoring
from aitbc.coordinator.verification.spot_checks import pending_in_round
from aitbc.core.staleness import async_weight
from aitbc.run_mode import RunMode
from aitbc.states import RunStatus, UpdateStatus


class AsyncMode(CentralMode):
    kind = RunMode.ASYNC

    def round_due(self, ctx: Context, s: Session, run: Run, *, now: float) -> bool:
        """A buffer: every active job answered, ``buffer`` accepted updates, or its time
        bound with at least one."""
        a = answers(s, run)
        if pending_in_round(s, run.id, run.round):
            return False
        if a.everyone:
            return True
        if a.accepted >= (run.cfg.buffer or 1):
            return True
        return bool(past_deadline(run, now=now) and a.accepted)

    def score(self, ctx: Context, run_id: str, r: int) -> None:
        scoring.score(ctx, run_id, r)

    def update_counts(self, run: Run, rt: RunRuntime, accepted: Sequence[tuple[Update, int]]) -> list[float]:
        """The run's staleness rule at the versions applied since each update's base
        (checked against max_staleness when it was accepted)."""
        out = []
        for u, _ in accepted:
            s = object_session(u)
            lag = 0 if s is None else update_staleness(s, run, u)
            w = async_weight(rt.staleness, lag, run.cfg.max_staleness)
            out.append(0.0 if w is None else w)  # None cannot happen: the staleness was checked when it was accepted
        return out

    def gate(self, s: Session, job: Job, run: Run, body: UpdateSubmit, refuse: Refuse) -> None:
        _async_gate(s, job, run, body, refuse)

    def base(self, s: Session, run: Run, body: UpdateSubmit) -> Base:
        return Base(async_base(s, run, body.base_cid), run.round - 1)

    def admit(self, s: Session, job: Job, run: Run, body: UpdateSubmit, base: Base, *, now: float) -> int:
        """Applied with the open buffer (version ``run.round - 1`` is the newest model)."""
        _check_staleness(s, job, run, base.cid, now=now)
        return run.round

    def keeps_base(self, run: Run, round: int, base: Base) -> bool:
        return True


def update_staleness(s: Session, run: Run, u: Update) -> int:
    """Versions applied between the model ``u`` was trained from and the one its round
    applies it to (``u.round - 1 - base``; 0 when its base is its round's own model)."""
    if u.base_cid is None:
        return 0
    b = base_round(s, run.id, u.base_cid, before=u.round)
    return 0 if b is None else u.round - 1 - b


def async_base(s: Session, run: Run, base_cid: str | None) -> str:
    """Async: the version an update was trained from: the newest model (also when
    ``base_cid`` is not given) or any earlier version of this run; else a 422."""
    cid = run.global_cid or ""
    if base_cid is None or base_cid == cid:
        return cid
    if base_round(s, run.id, base_cid, before=run.round) is None:
        raise unprocessable(
            "wrong_base", f"base_cid {base_cid!r} is not a version of run {run.id} (its newest model is {cid})"
        )
    return base_cid


def _check_staleness(s: Session, job: Job, run: Run, base: str, *, now: float) -> None:
    """Async, under the run's lock: refuse (409, nothing recorded but a ``stale_update``
    flag, which costs no reputation: slowness is no fault) an update trained from a
    version more than ``max_staleness`` applications old."""
    b = base_round(s, run.id, base, before=run.round)
    lag = run.round - 1 - (b if b is not None else run.round - 1)
    if async_weight(lambda _: 1.0, lag, run.cfg.max_staleness) is not None:
        return
    reason = (
        f"update trained from version {b} is {lag} versions behind the newest ({run.round - 1}); "
        f"run {run.id} takes at most {run.cfg.max_staleness}"
    )
    s.rollback()
    s.add(
        Flag(
            worker_id=job.worker_id, run_id=run.id, round=run.round, kind="stale_update", reason=reason, created_at=now
        )
    )
    s.commit()
    raise conflict("too_stale", reason)


def _async_gate(s: Session, job: Job, run: Run, body: UpdateSubmit, refuse: Refuse) -> None:
    """Async: an update goes into the open buffer, whatever version it was trained from;
    one per job and buffer (the job view says ``wait`` until that buffer is applied)."""
    dup = select(Update.round).where(Update.job_id == job.id, (Update.cid == body.cid) | (Update.round == run.round))
    if (seen := s.scalar(dup.limit(1))) is not None:
        refuse(conflict("duplicate_update", f"job {job.id} already sent an update to version buffer {seen}"))
    full = run.status == RunStatus.TRAINING and (
        s.scalar(
            select(func.count()).where(
                Update.run_id == run.id, Update.round == run.round, Update.status == UpdateStatus.ACCEPTED
            )
        )
        or 0
    ) >= (run.cfg.buffer or 1)
    if run.status == RunStatus.AGGREGATING or full:  # a moment: the worker sends it again once the next buffer opens
        refuse(conflict("buffer_applying", f"run {run.id} is applying buffer {run.round}; send again in a moment"))
    if run.status != RunStatus.TRAINING:
        refuse(conflict("not_accepting", f"run {run.id} is {run.status}; it accepts updates only while training"))
    if body.round > run.round:  # a version not yet published: no honest worker trained from it
        reason = f"update is for round {body.round}; the open round is {run.round}"
        refuse(conflict("wrong_round", reason), flag=reason)
    refuse_ejected(s, job, refuse)
