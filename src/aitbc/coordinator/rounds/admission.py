"""Admitting an update to a round of one global model that every worker trains from (a
sync run's; the default of :class:`.modes.base.RoundMode`): the model it names as its base
(the round's, or with ``overlap`` one of the ones before), the worker's own previous
updates it started from (an eager start), and the round gate (:func:`barrier_gate`).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from aitbc.coordinator.errors import conflict, unprocessable
from aitbc.coordinator.rounds.jobs import refuse_ejected
from aitbc.coordinator.rounds.lifecycle import sends_ahead
from aitbc.coordinator.schemas import UpdateSubmit
from aitbc.coordinator.store.models import Job, RoundRecord, Run, Update
from aitbc.coordinator.store.repository import prior_chain
from aitbc.states import RunStatus


def update_base(s: Session, run: Run, round: int, base_cid: str | None) -> tuple[str, int]:
    """The global model an update of ``round`` was trained from, and that model's round:
    the round's own (``run.global_cid``, also when ``base_cid`` is not given), or, in a
    run with ``overlap`` k, one of the k checkpoints before it (rounds ``round - 1 - k`` to
    ``round - 2``: the worker began the round before the last ones closed). An update sent
    ahead of its round (overlap 2) names its base, the newest model there is at most.
    Anything else is a 422 naming the models it may be. The update is applied to the
    newest model either way; a spot check re-runs it from this one."""
    cid = run.global_cid or ""
    newest = run.round - 1  # the round whose checkpoint run.global_cid is
    ahead = round > run.round
    if not ahead and (base_cid is None or base_cid == cid):
        return cid, newest
    k = run.cfg.overlap
    oldest = max(0, round - 1 - k) if k else newest
    found = None
    if base_cid == cid and ahead:
        found = newest
    elif base_cid is not None and k:
        found = s.scalar(
            select(RoundRecord.round)
            .where(
                RoundRecord.run_id == run.id,
                RoundRecord.checkpoint_cid == base_cid,
                RoundRecord.round >= oldest,
                RoundRecord.round < newest,
            )
            .order_by(RoundRecord.round.desc())
            .limit(1)
        )
    if found is None:
        allowed = list(
            s.scalars(
                select(RoundRecord.checkpoint_cid)
                .where(RoundRecord.run_id == run.id, RoundRecord.round >= oldest, RoundRecord.round <= newest)
                .order_by(RoundRecord.round.desc())
            ).all()
        )
        if not k:
            allowed = [cid]
        names = " or ".join(dict.fromkeys(allowed)) or cid
        if base_cid is None:
            detail = f"an update sent ahead of its round (round {round}; {run.round} is open) names its base_cid"
        else:
            detail = f"base_cid {base_cid!r} is not a model round {round} may train from" + (
                f" (overlap {k})" if k else ""
            )
        raise unprocessable("wrong_base", f"{detail}: {names}")
    return base_cid or cid, found


def update_prior(s: Session, run: Run, job: Job, body: UpdateSubmit, base_round: int) -> list[str]:
    """The worker's own previous updates that an update trained ahead (overlap) started
    from, on top of its base, newest first (``base - decode(p1) - decode(p2) ...``: where
    its own last round ended, moved by what the global model gained since; an eager start,
    which keeps overlap's loss at the synchronous one: bench/overlap_loss.py), or [].
    ``prior_cid`` must name this job's own update of the round before (stored, whatever
    its verdict); while that one's round is still past the base's, its own ``prior_cid``
    is the next of the chain, down to the round after the base's (overlap 2: two). Only an
    update trained from a model before its round's may name one; anything else is a 422
    that records nothing. The spot check replays such an update from that start."""
    if body.prior_cid is None:
        return []
    if not run.cfg.mode.has_barrier or run.cfg.overlap < 1 or base_round >= body.round - 1:
        raise unprocessable(
            "wrong_prior",
            "prior_cid is only for an update trained ahead in a sync run with overlap 1 or 2 "
            "(its base_cid a model before the round's)",
        )
    return prior_chain(s, job.id, body.round, body.prior_cid, base_round)


def barrier_gate(s: Session, job: Job, run: Run, body: UpdateSubmit, refuse: Callable[..., None]) -> None:
    """Refuse (``refuse``) an update the open round cannot take: a straggler's, one for a
    round not open (one sent ahead: only with overlap 2, after its job's update of the open
    round), or a job's whose earlier update was provably bad."""
    if run.status == RunStatus.AGGREGATING and body.round == run.round:
        refuse(
            conflict("round_closed", f"round {run.round} of {run.id} closed before this update arrived (a straggler)")
        )
    # overlap 2: the next round's update may come while this one is open or closing
    ahead = body.round == run.round + 1 and sends_ahead(run)
    if run.status != RunStatus.TRAINING and not (ahead and run.status == RunStatus.AGGREGATING):
        refuse(conflict("not_accepting", f"run {run.id} is {run.status}; it accepts updates only while training"))
    if body.round < run.round:  # a straggler: the round closed before it arrived
        refuse(conflict("round_closed", f"round {body.round} of {run.id} has closed; the open round is {run.round}"))
    if body.round > run.round and not ahead:  # a round not yet opened: no honest worker can have trained it
        reason = f"update is for round {body.round}; the open round is {run.round}"
        refuse(conflict("wrong_round", reason), flag=reason)
    if ahead and s.scalar(select(Update.id).where(Update.job_id == job.id, Update.round == run.round)) is None:
        refuse(
            conflict(
                "wrong_round",
                f"update is for round {body.round}, sent ahead; job {job.id} sends round {run.round}'s first",
            )
        )
    refuse_ejected(s, job, refuse)
