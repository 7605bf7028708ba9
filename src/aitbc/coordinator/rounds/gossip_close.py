"""Closing a live gossip run's round: its record of the round, not a barrier (workers never
wait for it), and the pay for it (the workers' side and the records: :mod:`.gossip`).

- **Closing a round** (:func:`close_round`, the round driver, when every active job
  published the round or a later one; or ``quorum`` did and each of the others is two or
  more rounds behind or, by its own pace (its signed progress reports), cannot publish
  the round before twice the deadline (:func:`cannot_make_it`); or at the run's deadline with ``quorum`` records):
  the coordinator fetches every published model (its own blob store for workers that
  cannot be reached, else the worker's peer server; CID-checked as it arrives), and
  computes the **consensus**: the run's norm bound and robust rule over the round's models
  (:func:`aitbc.core.gossip.robust_combine`, the rule each worker mixes with). Each model
  is judged against it: a model farther from the consensus than ``OUTLIER`` x the round's
  median distance, or whose validation loss is over ``WORSE`` x the round's median, is an
  outlier (flag ``gossip_outlier``; a sign-flipped model is one or both). A worker whose server answers with bytes that do not hash to the CID it signed is
  flagged ``bad_peer_blob``; a model that cannot be fetched is left out (unpaid, not
  flagged: a crash is no proof). The consensus is the round's model (evaluated: the run's
  validation loss), and the round records the **spread**: the mean L2 distance of the kept
  models to their mean (``monitor`` shows it).
- **Pay** (:func:`score`, then :func:`aitbc.coordinator.verification.settlement.settle`): per round, a
  contract whose published model was fetched, checked and kept is paid its price (quality
  1); an outlier, a corrupt or unfetchable model, or no record is paid nothing. An outlier
  is not slashed: it is a statistical judgment, not a proof. Equivocation is a proof (two
  records under the worker's key): its round is unpaid and its contract slashed, also when
  the proof arrives after the round was paid.

Shape letters: ``n`` models in the round, ``d`` parameters.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Sequence
from functools import lru_cache

import torch
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session
from torch import Tensor

from aitbc.coordinator.context import Context
from aitbc.coordinator.live.runtime import RunRuntime, drop_runtime, runtime
from aitbc.coordinator.rounds.commit import commit_round
from aitbc.coordinator.rounds.gossip import cannot_make_it, equivocated, fetch_model, judge
from aitbc.coordinator.rounds.result import RoundResult
from aitbc.coordinator.store.models import (
    Flag,
    Job,
    Run,
    Score,
    Update,
    Witness,
)
from aitbc.coordinator.store.repository import lock_run, round_updates
from aitbc.coordinator.store.states import transition
from aitbc.coordinator.transfer.peers import warm_peer_http
from aitbc.core.compression import decode as decode_model
from aitbc.core.gossip import model_bytes, near_copies, robust_combine
from aitbc.errors import IntegrityError
from aitbc.states import Control, JobStatus, RunStatus, ScoreStatus, UpdateStatus

log = logging.getLogger("aitbc.coordinator")

OUTLIER = 3.0  # a model this many times the round's median distance from the consensus is an outlier
WORSE = 1.5  # a model whose validation loss is this many times the round's median is an outlier
# A gossip model's blob size, for a run's codec and model: found by encoding a whole model of
# zeros, so worked out once per run, not at every tick that looks for the round's models.
_model_bytes = lru_cache(maxsize=64)(model_bytes)


def round_due(ctx: Context, s: Session, run: Run, *, now: float) -> bool:
    """Every active job published this round or a later one, or ``quorum`` did and each
    of the rest is two or more rounds behind or, by its own pace, cannot publish the round
    in time (:func:`cannot_make_it`), or the deadline passed with
    ``quorum`` records of it; and every published model can be fetched: a worker that
    serves blobs announces where (in memory) after each record, so a restarted coordinator
    waits for that, up to ``2 x lease_seconds`` from its start, before it closes a round
    without a model it could have had."""
    warm_peer_http()
    _fetched(ctx, s, run, later=True)  # records ahead of their round: their models are fetched meanwhile
    if not _due(s, run, now=now):
        return False
    if now - max(ctx.started_at, run.round_started_at or 0.0) < 2 * ctx.settings.lease_seconds:
        cids = s.execute(select(Update.worker_id, Update.cid).where(Update.run_id == run.id, Update.round == run.round))
        if not all(ctx.peers.url(w) is not None or ctx.store.has(cid) for w, cid in cids):
            return False
    return _fetched(ctx, s, run) is not None


def _fetched(ctx: Context, s: Session, run: Run, *, later: bool = False) -> dict[tuple[str, str], str] | None:
    """The verdict (:func:`fetch_model`) on each accepted model of the run's round (with
    ``later``: of the rounds ahead of it too), or None while any is being fetched. The
    fetches run on threads of their own (:class:`~aitbc.coordinator.transfer.peers.PeerFetches`),
    never the round driver's: a round whose model comes slowly waits for it, up to the
    fetch's deadline, while the driver moves every other run; the driver is poked when a
    fetch ends."""
    where = Update.round >= run.round if later else Update.round == run.round
    wanted = [
        (w, cid)
        for w, cid in s.execute(
            select(Update.worker_id, Update.cid).where(
                Update.run_id == run.id, where, Update.status == UpdateStatus.ACCEPTED
            )
        ).all()
    ]
    size = _model_bytes(run.cfg.compression, run.cfg.d)
    return ctx.peers.fetches.verdicts(
        wanted, lambda w, cid: fetch_model(ctx, w, cid, max_bytes=size), ctx.notifier.poke_driver
    )


def _due(s: Session, run: Run, *, now: float) -> bool:
    # a proven equivocator publishes nothing more (publish): not waited for until it is ejected
    proved = equivocated(s, run)
    active = [
        j
        for j in s.scalars(select(Job).where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE)).all()
        if j.worker_id not in proved
    ]
    last = dict(
        s.execute(
            select(Update.job_id, func.max(Update.round)).where(Update.run_id == run.id).group_by(Update.job_id)
        ).all()
    )
    if active and all((last.get(j.id) or 0) >= run.round for j in active):
        return True
    # A worker two or more rounds behind the record is slow, not late: with the quorum in,
    # the record does not wait for it (its own record of this round, if it ever trains it,
    # comes after the close: refused, unpaid, as a straggler's update). One round behind
    # (or none yet: round 1) is waited for up to the deadline unless its own pace says it
    # cannot publish the round before it (with slack): closing at the deadline would leave
    # it out all the same.
    behind = [j for j in active if (last.get(j.id) or 0) < run.round]
    published = len(active) - len(behind)
    if (
        published >= run.cfg.quorum
        and behind
        and all((last.get(j.id) or 0) <= run.round - 2 or cannot_make_it(run, j, last.get(j.id) or 0) for j in behind)
    ):
        return True
    deadline = run.cfg.deadline
    if deadline and run.round_started_at and now >= run.round_started_at + deadline:
        n = s.scalar(select(func.count(Update.id)).where(Update.run_id == run.id, Update.round == run.round)) or 0
        return n >= run.cfg.quorum
    return False


def close_round(ctx: Context, run_id: str) -> None:
    """Record round ``run.round``'s consensus and judge its models (the module's docstring)."""
    with ctx.session() as s:
        run = s.get(Run, run_id)
        if run is None:
            return
        if run.control != Control.AUTOMATIC:  # its owner's to move (gossip is refused for owner-driven runs)
            return
        if run.status not in (RunStatus.TRAINING, RunStatus.AGGREGATING) or _fetched(ctx, s, run) is None:
            return  # its models are still coming: the driver goes on with other runs meanwhile
        if run.status == RunStatus.TRAINING:
            lock_run(s, run)
            if not ctx.lease.fence(s):
                s.rollback()
                return
            if run.status == RunStatus.TRAINING:
                transition(run, RunStatus.AGGREGATING)
            s.commit()
        if run.status != RunStatus.AGGREGATING:
            return
        verdicts = _fetched(ctx, s, run)  # a record may have come before the round stopped taking them
        if verdicts is None:
            return
        r = run.round
        ups = round_updates(s, run.id, r)
        rt = runtime(ctx, run)
        now = time.time()
        models = _models(ctx, s, rt.d, ups, verdicts, r, now=now)
        with rt.lock:
            rt.load(ctx, run)
            res = _consensus(ctx, s, run, rt, models, r, now=now)
        accepted = [(u, shard) for u, shard in ups if u.status == UpdateStatus.ACCEPTED]
        _forget_witnesses(s, run, r)
        commit_round(ctx, s, run, rt, res, ups, accepted, round=r, fenced=True)
        if run.status not in (RunStatus.TRAINING, RunStatus.AGGREGATING):
            drop_runtime(ctx, run.id)
    ctx.peers.fetches.forget(list(verdicts))
    ctx.notifier.bump()


def _models(
    ctx: Context,
    s: Session,
    d: int,
    ups: Sequence[tuple[Update, int]],
    verdicts: dict[tuple[str, str], str],
    r: int,
    *,
    now: float,
) -> list[tuple[Update, int, Tensor]]:
    """The round's accepted models, each fetched (``verdicts``) and decoded; one served
    corrupt is flagged ``bad_peer_blob``, one not a finite model of ``d`` values
    ``rejected_update``, one that could not be fetched left out (excluded, not flagged)."""
    models: list[tuple[Update, int, Tensor]] = []
    for u, shard in ups:
        if u.status != UpdateStatus.ACCEPTED:
            continue
        verdict = verdicts[(u.worker_id, u.cid)]
        if verdict == "bad":
            judge(s, u, r, now, "bad_peer_blob", f"served bytes for its round {r} model {u.cid} that do not hash to it")
            ctx.peers.judge(u.worker_id, u.cid, "bad")
            continue
        if verdict == "gone":
            u.status, u.reason = UpdateStatus.EXCLUDED, "its model could not be fetched (worker unreachable)"
            continue
        blob = ctx.store.get_bytes(u.cid)
        u.size = len(blob)
        model = _decode(blob, d)
        if model is None:
            judge(s, u, r, now, "rejected_update", f"round {r} model {u.cid} is not a finite model of {d} values")
            continue
        models.append((u, shard, model))
    return models


def _consensus(
    ctx: Context, s: Session, run: Run, rt: RunRuntime, models: list[tuple[Update, int, Tensor]], r: int, *, now: float
) -> RoundResult:
    """The round's consensus over ``models`` (copies and outliers flagged and left out of
    the spread), evaluated and checkpointed. Call with ``rt.lock`` held, after ``rt.load``."""
    before = rt.params
    assert before is not None
    consensus, spread = before, None
    models = _copies(ctx, s, run, r, models, before, now)
    if models:
        combined = robust_combine(
            [m for *_, m in models],
            [float(u.samples) for u, _, _ in models],
            aggregator=rt.aggregator,
            norm_bound=rt.norm_bound,
            round_index=r,
        )
        if combined.result is not None:
            consensus = combined.result.to(before.dtype)
        for u, _, m in models:
            u.val_loss = rt.evaluate(m)[0]
        kept = _outliers(s, models, consensus, r, now)
        if kept:
            stack = torch.stack([m for *_, m in kept])  # (n, d)
            spread = float((stack - stack.mean(dim=0)).norm(dim=1).mean())
    loss, acc = rt.evaluate(consensus)
    cid, size = rt.checkpoint(ctx, run, consensus, r)
    return RoundResult(
        params=consensus,
        cid=cid,
        size=size,
        outer_cid=run.outer_state_cid,
        val_loss=loss,
        val_accuracy=acc,
        skipped=consensus is before,
        spread=spread,
    )


def _forget_witnesses(s: Session, run: Run, r: int) -> None:
    """Reported records of round ``r`` or older, kept to compare with records that can no
    longer come, go with the close; a proof of equivocation stays (the signed record)."""
    proof = (
        select(Flag.id)
        .where(
            Flag.run_id == Witness.run_id,
            Flag.worker_id == Witness.worker_id,
            Flag.round == Witness.round,
            Flag.kind == "equivocation",
        )
        .exists()
    )
    s.execute(delete(Witness).where(Witness.run_id == run.id, Witness.round <= r, ~proof))


def _copies(
    ctx: Context, s: Session, run: Run, r: int, models: list[tuple[Update, int, Tensor]], before: Tensor, now: float
) -> list[tuple[Update, int, Tensor]]:
    """Flag ``gossip_copy`` (rejected, unpaid) each of the round's models that is another
    worker's with small noise (:func:`aitbc.core.gossip.near_copies`: far nearer another's
    model of this round or the last, or the last consensus ``before``, than honest training
    ever puts two models); of two of this round too near each other, the one signed later
    (a worker with a server claims its record before it serves it). The models kept."""
    prev: list[Tensor] = []
    prev_owners: list[str] = []
    if r > 1:
        for worker, cid in s.execute(
            select(Update.worker_id, Update.cid).where(Update.run_id == run.id, Update.round == r - 1)
        ).all():
            blob = ctx.store.get_bytes(cid) if ctx.store.has(cid) else None
            m = _decode(blob, run.cfg.d) if blob is not None else None
            if m is not None:
                prev.append(m)
                prev_owners.append(worker)
    found = near_copies(
        [m for *_, m in models],
        [u.worker_id for u, _, _ in models],
        before=prev,
        before_owners=prev_owners,
        reference=before.to(torch.float32),
    )
    copiers: dict[int, str] = {}
    for near in found:
        kind, j = near.other
        i = near.i
        if kind == "now":  # the later of the two signed records copied the earlier
            a, b = models[i][0], models[j][0]
            i, j = (i, j) if a.created_at > b.created_at else (j, i)
            what = f"job {models[j][0].job_id}'s round {r} model {models[j][0].cid}"
        elif kind == "before":
            what = f"{prev_owners[j]}'s round {r - 1} model"
        else:
            what = f"the round {r - 1} consensus"
        copiers.setdefault(i, f"round {r} model is {near.ratio:.3g}x the round's median distance from {what}")
    for i, why in copiers.items():
        judge(s, models[i][0], r, now, "gossip_copy", why)
    return [m for i, m in enumerate(models) if i not in copiers]


def _decode(blob: bytes, d: int) -> Tensor | None:
    try:
        m = decode_model(blob, max_numel=d)
    except (IntegrityError, ValueError):
        return None
    if m.shape != (d,) or not torch.isfinite(m).all():
        return None
    return m.to(torch.float32)


def _outliers(
    s: Session, models: list[tuple[Update, int, Tensor]], consensus: Tensor, r: int, now: float
) -> list[tuple[Update, int, Tensor]]:
    """Judge each model against the consensus and the round's other models (each
    ``u.val_loss`` evaluated); flag the outliers; the models kept. A direction test (the
    model's step against the consensus step) was tried and dropped: a worker's own drift
    from the consensus (the spread) dominates one round's step, so an honest worker cut off
    from its neighbours for a while (an outage) pointed "against" it."""
    dists = [float((m - consensus).norm()) for *_, m in models]
    median = statistics.median(dists)
    losses = [u.val_loss for u, _, _ in models if u.val_loss is not None and math.isfinite(u.val_loss)]
    typical = statistics.median(losses) if losses else None
    kept = []
    for (u, shard, m), dist in zip(models, dists):
        why = None
        if median > 0 and dist > OUTLIER * median:
            why = f"round {r} model is {dist / median:.1f}x the median distance from the consensus"
        elif typical is not None and (
            u.val_loss is None or not math.isfinite(u.val_loss) or u.val_loss > WORSE * typical
        ):
            why = f"round {r} model's validation loss {u.val_loss} is over {WORSE:g}x the round's median {typical:.4g}"
        if why is not None:
            judge(s, u, r, now, "gossip_outlier", why)
        else:
            kept.append((u, shard, m))
    return kept


def score(ctx: Context, run_id: str, r: int) -> None:
    """Round ``r``'s Score rows: quality 1 for a kept model, 0 otherwise (idempotent)."""
    with ctx.session() as s:
        if s.scalar(select(func.count()).select_from(Score).where(Score.run_id == run_id, Score.round == r)):
            return
        jobs = s.scalars(select(Job).where(Job.run_id == run_id, Job.joined_round <= r)).all()
        ups = {u.job_id: u for u in s.scalars(select(Update).where(Update.run_id == run_id, Update.round == r))}
        equivocated = set(
            s.scalars(select(Flag.worker_id).where(Flag.run_id == run_id, Flag.round == r, Flag.kind == "equivocation"))
        )
        seen: set[str] = set()
        for j in jobs:
            if j.contract_id in seen:
                continue
            u = ups.get(j.id)
            if u is None and j.status != JobStatus.ACTIVE:
                continue  # a job that ended before publishing this round: nothing due
            seen.add(j.contract_id)
            provable = j.worker_id in equivocated  # two records of the round under its key: slashed
            if provable:
                status, flags, quality = ScoreStatus.REJECTED, ["equivocation"], 0.0
            elif u is None:
                status, flags, quality = ScoreStatus.MISSING, ["missing"], 0.0
            elif u.status == UpdateStatus.ACCEPTED:
                status, flags, quality = ScoreStatus.ACCEPTED, [], 1.0
            elif u.status == UpdateStatus.EXCLUDED:
                status, flags, quality = ScoreStatus.MISSING, ["unfetchable"], 0.0
            else:
                status, flags, quality = ScoreStatus.REJECTED, ["rejected"], 0.0
            s.add(
                Score(
                    run_id=run_id,
                    round=r,
                    contract_id=j.contract_id,
                    worker_id=j.worker_id,
                    status=status,
                    flags=flags,
                    provable=provable,
                    quality=quality,
                )
            )
        s.commit()
