"""Scoring a closed round's contributions (the torch side of paying for work).

For each accepted update: its held-out gain alone, the gain on its own shard against
others' data (the assigned-data check), the robust rule's verdict, replays of another
update, and its direction against the round's median; :func:`aitbc.core.scoring.score_round`
turns them into flags and a quality in [0, 1]. One ``Score`` row per contract and round;
idempotent. Settlement (:mod:`.settlement`) pays from these rows.

Shape letters: ``n`` accepted updates, ``d`` parameters, ``B`` batch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from torch import Tensor, nn

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import ApiError
from aitbc.coordinator.live.books import books_model, books_shards
from aitbc.coordinator.live.runtime import CODE_CHUNK_ELEMENTS, RunRuntime, runtime
from aitbc.coordinator.live.updates import decoded
from aitbc.coordinator.store.models import Job, RoundRecord, Run, Score, Update
from aitbc.coordinator.store.repository import base_round, prior_chain, row
from aitbc.core.aggregation.pipeline import AggregatorPipeline as Aggregator
from aitbc.core.aggregation.streaming import BLOCK_BYTES, ColumnSource, TensorSource, aggregate_stream, read_row
from aitbc.core.scoring import ScoringConfig, UpdateScore, alignments, copies, relative_gain, score_round
from aitbc.states import ScoreStatus, UpdateStatus
from aitbc.training.checkpoint import flat_params, load_checkpoint, set_flat_params
from aitbc.training.local import eager_start

SCORING = ScoringConfig()
# The fewest samples a sequence model's scoring batch holds, whatever its terms budget: the
# standard errors the flags are judged by come from the spread over a batch's samples.
MIN_SCORE_SAMPLES = 64
# The most bytes of a round's updates the books thread scores from memory (one float32 column
# block). A larger round is read from a spill file, a row or a column block at a time: the
# next round's close may hold its own matrix meanwhile, and the two together (with scoring's
# float64 copies on top) would grow with the workers and the model.
SCORING_MEMORY = BLOCK_BYTES
log = logging.getLogger("aitbc.coordinator")


def score(ctx: Context, run_id: str, r: int) -> None:
    """Score round ``r``'s contributions (idempotent: a scored round is left alone): one row
    per contract, the first of its accepted, rejected and missing rows."""
    with ctx.session() as s:
        run = row(s, Run, run_id)
        if s.scalar(select(func.count()).select_from(Score).where(Score.run_id == run_id, Score.round == r)):
            return
        round_model = row(s, RoundRecord, (run_id, r - 1)).checkpoint_cid  # the checkpoint round r started from
        rec = row(s, RoundRecord, (run_id, r))
        ups = s.execute(
            select(Update, Job)
            .join(Job, Job.id == Update.job_id)
            .where(Update.run_id == run_id, Update.round == r)
            .order_by(Job.shard_index, Update.id)
        ).all()
        answered = {job.worker_id for _, job in ups}
        missing = s.execute(select(Job).where(Job.run_id == run_id, Job.worker_id.in_(rec.stragglers))).scalars().all()
        accepted = [(u, j) for u, j in ups if u.status == UpdateStatus.ACCEPTED]
        if accepted and not rec.skipped:
            rows = _accepted_rows(ctx, s, run, accepted, r, round_model)
        else:  # a skipped round (too few for the rule): nothing applied, but the owner received
            # the accepted updates and could read them: each is paid as delivered
            rows = [_delivered_row(run_id, r, j) for _, j in accepted]
        rows += [_rejected_row(run_id, r, u, j) for u, j in ups if u.status == UpdateStatus.REJECTED]
        rows += [_missing_row(run_id, r, j) for j in missing if j.worker_id not in answered]
        seen: set[str] = set()
        for score_row in rows:
            if score_row.contract_id in seen:
                continue
            seen.add(score_row.contract_id)
            s.add(score_row)
        s.commit()


def _accepted_rows(
    ctx: Context, s: Session, run: Run, accepted: Sequence[tuple[Update, Job]], r: int, round_model: str
) -> list[Score]:
    """The scores of an applied round's accepted updates, each judged against ``round_model``
    (the checkpoint the round started from) or its own start (:func:`_judged_at`)."""
    points = [_judged_at(ctx, s, u, round_model) for u, _ in accepted]
    judged = _judge(ctx, run, runtime(ctx, run), points, accepted, r)
    rows = []
    for (u, j), sc in zip(accepted, judged):
        if u.verification == "passed":  # re-run and matched: paid in full, whatever its gain alone
            sc = verified(sc)
        rows.append(
            Score(
                run_id=run.id,
                round=r,
                contract_id=j.contract_id,
                worker_id=j.worker_id,
                status=ScoreStatus.ACCEPTED,
                gain=_finite(sc.gain),
                own_gain=_finite(sc.own_gain),
                other_gain=_finite(sc.other_gain),
                kept=sc.kept,
                flags=list(sc.flags),
                provable=sc.provable,
                quality=sc.quality,
            )
        )
    return rows


def _delivered_row(run_id: str, r: int, j: Job) -> Score:
    """An accepted update of a skipped round: delivered to the owner, paid in full."""
    return Score(
        run_id=run_id,
        round=r,
        contract_id=j.contract_id,
        worker_id=j.worker_id,
        status=ScoreStatus.ACCEPTED,
        flags=["round_skipped"],
        quality=1.0,
    )


def _rejected_row(run_id: str, r: int, u: Update, j: Job) -> Score:
    """A rejected update: malformed, wrong shape, NaN/Inf, or failed its spot check is
    provable from the blob or the replay; a spot check not answered in time is not (a crash
    is not proof), nor a replay that missed within its drift bound (honest drift could do
    that): unpaid, not slashed."""
    flag = {"failed": "verification_failed", "unanswered": "challenge_unanswered", "drift": "replay_drift"}
    return Score(
        run_id=run_id,
        round=r,
        contract_id=j.contract_id,
        worker_id=j.worker_id,
        status=ScoreStatus.REJECTED,
        flags=[flag.get(u.verification or "", "rejected")],
        provable=u.verification not in ("unanswered", "drift"),
        quality=0.0,
    )


def _missing_row(run_id: str, r: int, j: Job) -> Score:
    """A straggler's job that sent nothing for the round."""
    return Score(
        run_id=run_id,
        round=r,
        contract_id=j.contract_id,
        worker_id=j.worker_id,
        status=ScoreStatus.MISSING,
        flags=["missing"],
        quality=0.0,
    )


Start = tuple[str, tuple[str, ...]]  # a checkpoint's CID, less the updates named (newest first)


def _judged_at(ctx: Context, s: Session, u: Update, round_model: str) -> tuple[str, Start | None]:
    """Where update ``u``'s gains are measured: (the model they are measured from, where
    the update began if elsewhere). An update of the round's own model, or one trained from
    an older model (async, or overlap without an eager start): from that model, the update
    applied to it. An eager start (overlap, ``prior_cid``): from the round's model, to the
    point the worker's training reached, its start (its base less its own updates not yet in
    it, as the spot check replays it) less the update. Applied to the round's model instead,
    an honest eager update can raise its own shard's loss (it was trained from elsewhere)
    and go unpaid; measured from its own start, a worker could
    pick a bad start with a worthless update and be paid for leaving it (``r`` then ``-r``).
    The end point against the round's model is neither: what it reached must beat what the
    run has. A chain that no longer resolves (an owner's resend dropped a link) or a blob
    retention has removed falls back to the update applied to the round's model."""
    if u.base_cid is None:
        return round_model, None
    if u.prior_cid is None:
        return u.base_cid, None
    b = base_round(s, u.run_id, u.base_cid, before=u.round - 1)
    try:
        chain = tuple(prior_chain(s, u.job_id, u.round, u.prior_cid, b)) if b is not None else None
    except ApiError:
        chain = None
    if chain is None or not all(ctx.store.has(c) for c in (u.base_cid, *chain)):
        log.warning(
            "round %d: update %s judged at its round's model (its eager start cannot be rebuilt)", u.round, u.cid
        )
        return round_model, None
    return round_model, (u.base_cid, chain)


def verified(sc: UpdateScore) -> UpdateScore:
    """A score whose update passed its spot check: quality 1 (the work was re-run and
    matched), the heuristic's figures kept for the record, its flags replaced by
    ``verified``; except a provable flag of the heuristic (a replay of another update, or
    one that significantly raises held-out loss while pointing against the round), which
    still stands: a spot check re-runs some intervals, and an update steered through a
    state it was not checked on must not be paid as verified (honest runs raise none:
    ``bench/honest_runs.py``)."""
    if sc.provable:
        return sc
    return replace(sc, quality=1.0, flags=("verified",))


def _finite(x: float) -> float | None:
    return x if x == x and abs(x) != float("inf") else None


def _judge(
    ctx: Context,
    run: Run,
    rt: RunRuntime,
    points: list[tuple[str, Start | None]],
    accepted: Sequence[tuple[Update, Job]],
    r: int,
) -> list[UpdateScore]:
    """Load what :func:`judge` needs for the round's accepted updates, then judge them
    (on the books thread's own model: the runtime's lock is held only for the rule's verdict).
    ``points``: where each update is judged (:func:`_judged_at`); an eager start is built
    when its update is judged, so the round never holds one per update."""
    model = books_model(ctx, run.id, rt)
    checkpoints: dict[str, Tensor] = {}

    def checkpoint(cid: str) -> Tensor:  # (d,)
        if cid not in checkpoints:
            load_checkpoint(model, ctx.store.get_bytes(cid))
            checkpoints[cid] = flat_params(model)
        return checkpoints[cid]

    before = [checkpoint(cid) for cid, _ in points]  # judge groups equal ones (one pass per model)

    def start(i: int) -> Tensor | None:
        eager = points[i][1]
        if eager is None:
            return None
        return eager_start(checkpoint(eager[0]), [ctx.store.get_bytes(p) for p in eager[1]])

    # (n, d): in memory while it fits one column block, else from a spill file on disk
    with decoded(ctx, [u.cid for u, _ in accepted], rt.d, limit_bytes=SCORING_MEMORY) as U:
        return _judge_decoded(ctx, run, rt, model, before, U, accepted, r, start)


def _judge_decoded(
    ctx: Context,
    run: Run,
    rt: RunRuntime,
    model: nn.Module,
    before: Tensor | list[Tensor],
    source: ColumnSource,
    accepted: Sequence[tuple[Update, Job]],
    r: int,
    starts: Callable[[int], Tensor | None] | None = None,
) -> list[UpdateScore]:
    U = source.updates if isinstance(source, TensorSource) else source  # in memory: the tensor, as before
    trained = [
        u.shard_index if u.shard_index is not None else j.shard_index for u, j in accepted
    ]  # the shard each trained on
    all_shards = books_shards(ctx, run.id, [e["cid"] for e in run.data_manifest["shards"]])
    split = [("split_into" in e) for e in run.data_manifest["shards"]]  # its samples live on in its halves
    w = torch.tensor([float(u.samples) for u, _ in accepted])  # (n,)
    terms = int(rt.val_y[0].numel()) if len(rt.val_y) else 1  # loss terms a sample carries (its targets)
    with rt.lock:  # the rule is the one the rounds thread aggregates with
        kept = kept_shares(rt.aggregator, U, w, r, rt.trend(ctx, run.id, r))
    return judge(
        model,
        before,
        U,
        trained,
        all_shards,
        split,
        (rt.val_x, rt.val_y),
        kept,
        samples=score_batch(terms, ctx.settings.score_terms, ctx.settings.score_samples),
        seed=run.seed * 1_000_003 + r,
        shares=mean_shares(w),
        starts=starts,
        rows=rt.eval_rows,
    )


def mean_shares(w: Tensor) -> list[float]:
    """Each update's weight in the round's mean: its samples ``w`` ``(n,)`` over the round's
    (equal shares when no update counts a sample)."""
    total = float(w.sum())
    n = w.numel()
    return [float(x) / total for x in w] if total > 0 and math.isfinite(total) else [1.0 / n] * n


def score_batch(terms_per_sample: int, terms: int, cap: int) -> int:
    """Samples in each scoring batch: ``terms`` loss terms' worth of samples that carry
    ``terms_per_sample`` each (a sequence's target positions; 1 for an image), at least
    :data:`MIN_SCORE_SAMPLES` and at most ``cap``. A sequence's loss is the mean over its
    tokens, so fewer of them measure a gain about as closely as 512 images do."""
    return min(cap, max(MIN_SCORE_SAMPLES, terms // max(1, terms_per_sample)))


def kept_shares(
    aggregator: Aggregator, U: Tensor | ColumnSource, w: Tensor, r: int, reference: Tensor | None = None
) -> list[float]:
    """The share of each update ``U`` ``(n, d)`` the run's rule kept (1.0 each when the
    rule keeps everything or has too few updates to judge); ``reference``: the round's
    trend, as the close passed it. A ``ColumnSource`` (a round on disk) is streamed."""
    try:
        if isinstance(U, Tensor):
            _, info = aggregator.with_info(U, w, round_index=r, reference=reference)
        else:
            _, info = aggregate_stream(aggregator, U, w, round_index=r, reference=reference, with_info=True)
    except Exception:  # noqa: BLE001 - too few updates for the rule: no verdict, not an outlier
        return [1.0] * U.shape[0]
    if info.kept_fraction is not None:
        return [float(k) for k in info.kept_fraction]
    if info.selected is not None:
        chosen = {int(i) for i in info.selected}
        return [1.0 if i in chosen else 0.0 for i in range(U.shape[0])]
    return [1.0] * U.shape[0]


def judge(
    model: nn.Module,
    before: Tensor | list[Tensor],
    U: Tensor | ColumnSource,
    trained: Sequence[int],
    shards: Sequence[tuple[Tensor, Tensor]],
    split: Sequence[bool],
    val: tuple[Tensor, Tensor],
    kept: list[float],
    *,
    samples: int,
    seed: int,
    cfg: ScoringConfig = SCORING,
    shares: Sequence[float] | None = None,
    starts: Callable[[int], Tensor | None] | None = None,
    rows: int | None = None,
) -> list[UpdateScore]:
    """The signals for each update ``U[i]`` (trained on shard ``trained[i]``) applied
    alone to ``before`` ``(d,)``, each with the standard error measured from its own batch,
    then :func:`score_round`. ``shares``: each update's weight in the round's mean (its
    samples over the round's); the update applied at that weight is measured again on the
    validation batch and its own shard's, and pay is judged on that (None: at full weight,
    the signals alone). ``starts(i)``, when it gives one, is where update ``i`` began
    if not at ``before`` (an eager start): its gains are then measured from ``before`` to
    that start less the update. ``samples``: batch size ``B`` of each measurement; ``rows``:
    samples a forward pass takes (the runtime's ``eval_rows``, within ``eval_memory_mb``;
    None: :data:`~aitbc.coordinator.live.runtime.CODE_CHUNK_ELEMENTS` input values). Pure (no
    database): the live coordinator and bench/honest_runs.py run exactly this."""
    g = torch.Generator().manual_seed(seed)
    batches = _draw_batches(trained, shards, split, (val[0][:samples], val[1][:samples]), samples, g)
    # One forward pass per model (a per-sample loss does not depend on the batch it is in):
    # each base over the validation batch and the batches of every update trained from it,
    # then each update applied alone over the validation batch and its own two batches.
    base_of = [before[i] if isinstance(before, list) else before for i in range(len(trained))]  # (d,) each
    m = _measure(model, base_of, U, batches, shares, starts, rows)
    return score_round(
        m.gains,
        m.own,
        m.other,
        kept,
        copies(U, cosine=cfg.copy_cosine),
        cfg,
        alignments(U),
        gain_se=m.gain_se,
        own_se=m.own_se,
        other_se=m.other_se,
        **m.at_share(),
    )


Batch = tuple[Tensor, Tensor]  # (x, y): B samples and their labels


@dataclass(frozen=True, slots=True)
class _Batches:
    """What every update is measured on: the validation batch, and per update a batch of
    its own shard and one of the others' data."""

    val: Batch
    own: list[Batch]
    other: list[Batch]


def _draw_batches(
    trained: Sequence[int],
    shards: Sequence[Batch],
    split: Sequence[bool],
    val: Batch,
    samples: int,
    g: torch.Generator,
) -> _Batches:
    """Each update's two batches (its own shard's, then the others'), drawn from ``g`` in
    that order; a shard split into halves is left out of the others' (its samples live on in
    its halves)."""
    own: list[Batch] = []
    other: list[Batch] = []
    rests: dict[int, Batch] = {}  # the others' samples, per shard trained on
    for k in trained:
        ox, oy = shards[k]
        pick = torch.randperm(ox.shape[0], generator=g)[:samples]
        own.append((ox[pick], oy[pick]))
        if k not in rests:
            rest = [sh for m_, sh in enumerate(shards) if m_ != k and not split[m_]] or [shards[k]]
            rests[k] = (torch.cat([sh[0] for sh in rest]), torch.cat([sh[1] for sh in rest]))
        rx, ry = rests[k]
        pick = torch.randperm(rx.shape[0], generator=g)[:samples]
        other.append((rx[pick], ry[pick]))
    return _Batches(val, own, other)


@dataclass(frozen=True, slots=True)
class _Measured:
    """Per update, each relative gain and its standard error: held out (``gains``), on its
    own shard (``own``) and on the others' data (``other``), each of the update alone; and
    of the update at its share of the round's mean, held out and on its own shard
    (``share_*``; empty when no shares were given)."""

    gains: list[float] = field(default_factory=list)
    gain_se: list[float] = field(default_factory=list)
    own: list[float] = field(default_factory=list)
    own_se: list[float] = field(default_factory=list)
    other: list[float] = field(default_factory=list)
    other_se: list[float] = field(default_factory=list)
    share_gains: list[float] = field(default_factory=list)
    share_gain_se: list[float] = field(default_factory=list)
    share_own: list[float] = field(default_factory=list)
    share_own_se: list[float] = field(default_factory=list)

    def at_share(self) -> dict[str, list[float]]:
        """The ``share_*`` lists as :func:`score_round` takes them (none when not measured)."""
        if not self.share_gains:
            return {}
        return dict(
            share_gains=self.share_gains,
            share_gain_se=self.share_gain_se,
            share_own=self.share_own,
            share_own_se=self.share_own_se,
        )


def _measure(
    model: nn.Module,
    base_of: list[Tensor],
    U: Tensor | ColumnSource,
    batches: _Batches,
    shares: Sequence[float] | None,
    starts: Callable[[int], Tensor | None] | None,
    rows: int | None,
) -> _Measured:
    """Each update ``U[i]`` applied alone to ``base_of[i]`` (or to its eager start), its
    losses on its three batches against the base's; with ``shares``, also the point
    ``shares[i]`` of the way from the base to there, on the validation batch and its own
    shard's (one more forward pass an update, over two of its three batches)."""
    # the bases' losses: one pass per distinct base (updates of one model share it)
    groups: dict[int, list[int]] = {}
    for i, b in enumerate(base_of):
        groups.setdefault(id(b), []).append(i)
    base_val: dict[int, Tensor] = {}  # (B,) per distinct base
    base_own: dict[int, Tensor] = {}  # (B,) per update: its base on its own batches
    base_other: dict[int, Tensor] = {}
    for key, ids in groups.items():
        parts = [batches.val] + [bt for i in ids for bt in (batches.own[i], batches.other[i])]
        out = _split(_losses(model, base_of[ids[0]], *_joined(parts), rows=rows), parts)
        base_val[key] = out[0]
        for j, i in enumerate(ids):
            base_own[i], base_other[i] = out[1 + 2 * j], out[2 + 2 * j]
    m = _Measured()
    for i, b in enumerate(base_of):
        began = starts(i) if starts is not None else None
        origin = b if began is None else began
        if isinstance(U, Tensor):
            after = origin - U[i]  # (d,) this update alone applied
        else:  # a fresh row read from disk: the difference is written over it, no second (d,)
            row = read_row(U, i)
            after = torch.sub(origin, row, out=row)
        del began
        parts = [batches.val, batches.own[i], batches.other[i]]
        val_after, own_after, other_after = _split(_losses(model, after, *_joined(parts), rows=rows), parts)
        for (mean, se), means, ses in (
            (_gain(base_val[id(b)], val_after), m.gains, m.gain_se),
            (_gain(base_own[i], own_after), m.own, m.own_se),
            (_gain(base_other[i], other_after), m.other, m.other_se),
        ):
            means.append(mean)
            ses.append(se)
        if shares is None:
            continue
        if shares[i] >= 1:  # the round's only update: its share is the update alone
            m.share_gains.append(m.gains[-1])
            m.share_gain_se.append(m.gain_se[-1])
            m.share_own.append(m.own[-1])
            m.share_own_se.append(m.own_se[-1])
            continue
        at_share = torch.lerp(b, after, float(shares[i]))  # (d,) the update at its weight in the round's mean
        del after
        parts = [batches.val, batches.own[i]]
        val_share, own_share = _split(_losses(model, at_share, *_joined(parts), rows=rows), parts)
        for (mean, se), means, ses in (
            (_gain(base_val[id(b)], val_share), m.share_gains, m.share_gain_se),
            (_gain(base_own[i], own_share), m.share_own, m.share_own_se),
        ):
            means.append(mean)
            ses.append(se)
    return m


def _joined(parts: Sequence[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """The batches ``parts`` as one ``(sum B, ...)``."""
    return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def _split(losses: Tensor, parts: Sequence[tuple[Tensor, Tensor]]) -> list[Tensor]:
    """Per-sample losses of :func:`_joined` batches, back into one ``(B,)`` per batch."""
    return list(torch.split(losses, [x.shape[0] for x, _ in parts]))


@torch.no_grad()
def _losses(model: nn.Module, params: Tensor, x: Tensor, y: Tensor, *, rows: int | None = None) -> Tensor:
    """Per-sample loss ``(B,)`` of ``model`` with ``params`` (a sequence's: its mean over
    tokens), ``rows`` samples a forward pass (None: ``CODE_CHUNK_ELEMENTS`` input values)."""
    set_flat_params(model, params)
    model.eval()
    out = []
    if rows is None:
        rows = max(1, CODE_CHUNK_ELEMENTS // max(1, x[0].numel())) if x.shape[0] else 1
    for i in range(0, x.shape[0], rows):
        xb, yb = x[i : i + rows], y[i : i + rows]
        logits = model(xb)
        per = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1).long(), reduction="none")
        out.append(per.reshape(yb.shape[0], -1).mean(dim=1).to(torch.float64))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def _gain(before: Tensor, after: Tensor) -> tuple[float, float]:
    """Relative gain ``(mean before - mean after) / mean before`` of paired per-sample
    losses ``(B,)``, and its standard error (0 with fewer than 2 samples)."""
    base = float(before.mean()) if before.numel() else 0.0
    gain = relative_gain(base, float(after.mean()) if after.numel() else 0.0)
    if before.numel() < 2 or not (base > 0 and math.isfinite(gain)):
        return gain, 0.0
    diff = before - after  # (B,)
    return gain, float(diff.std() / math.sqrt(diff.numel()) / base)
