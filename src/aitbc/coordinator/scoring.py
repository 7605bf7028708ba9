"""Scoring a closed round's contributions (the torch side of paying for work).

For each accepted update: its held-out gain alone, the gain on its own shard against
others' data (the assigned-data check), the robust rule's verdict, replays of another
update, and its direction against the round's median; :func:`aitbc.core.scoring.score_round`
turns them into flags and a quality in [0, 1]. One ``Score`` row per contract and round;
idempotent. Settlement (:mod:`.settlement`) pays from these rows.

Shape letters: ``n`` accepted updates, ``d`` parameters, ``B`` batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from sqlalchemy import func, select
from torch import Tensor

from aitbc.coordinator.context import Context
from aitbc.coordinator.models import Job, RoundRecord, Run, Score, Update
from aitbc.coordinator.repository import row
from aitbc.coordinator.runtime import RunRuntime, runtime
from aitbc.coordinator.states import ScoreStatus, UpdateStatus
from aitbc.core.compression import decode as decode_update
from aitbc.core.scoring import ScoringConfig, UpdateScore, alignments, copies, relative_gain, score_round
from aitbc.training.checkpoint import flat_params, load_checkpoint, load_shard, set_flat_params
from aitbc.training.local import evaluate

SCORING = ScoringConfig()


def score(ctx: Context, run_id: str, r: int) -> None:
    """Score round ``r``'s contributions (idempotent: a scored round is left alone)."""
    with ctx.session() as s:
        run = row(s, Run, run_id)
        if s.scalar(select(func.count()).select_from(Score).where(Score.run_id == run_id, Score.round == r)):
            return
        rec_before = row(s, RoundRecord, (run_id, r - 1))
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
        rows: list[Score] = []
        if accepted and not rec.skipped:
            rt = runtime(ctx, run)
            with rt.lock:
                judged = _judge(ctx, run, rt, rec_before.checkpoint_cid, accepted, r)
                rt.params_cid = None  # the model was used for scoring: reload the run's params next time
            for (_, j), sc in zip(accepted, judged):
                rows.append(
                    Score(
                        run_id=run_id,
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
        else:  # a skipped round: nothing was applied, nothing earned
            for _, j in accepted:
                rows.append(
                    Score(
                        run_id=run_id,
                        round=r,
                        contract_id=j.contract_id,
                        worker_id=j.worker_id,
                        status=ScoreStatus.ACCEPTED,
                        flags=["round_skipped"],
                        quality=0.0,
                    )
                )
        for u, j in ups:
            if u.status == UpdateStatus.REJECTED:  # malformed, wrong shape, NaN/Inf: provable from the blob itself
                rows.append(
                    Score(
                        run_id=run_id,
                        round=r,
                        contract_id=j.contract_id,
                        worker_id=j.worker_id,
                        status=ScoreStatus.REJECTED,
                        flags=["rejected"],
                        provable=True,
                        quality=0.0,
                    )
                )
        for j in missing:
            if j.worker_id not in answered:
                rows.append(
                    Score(
                        run_id=run_id,
                        round=r,
                        contract_id=j.contract_id,
                        worker_id=j.worker_id,
                        status=ScoreStatus.MISSING,
                        flags=["missing"],
                        quality=0.0,
                    )
                )
        seen: set[str] = set()
        for score_row in rows:
            if score_row.contract_id in seen:
                continue
            seen.add(score_row.contract_id)
            s.add(score_row)
        s.commit()


def _finite(x: float) -> float | None:
    return x if x == x and abs(x) != float("inf") else None


def _judge(
    ctx: Context, run: Run, rt: RunRuntime, before_cid: str, accepted: Sequence[tuple[Update, Job]], r: int
) -> list[UpdateScore]:
    """The three signals for each accepted update, then :func:`score_round`."""
    B = ctx.settings.score_samples
    load_checkpoint(rt.model, ctx.store.get_bytes(before_cid))
    before = flat_params(rt.model)  # (d,)
    U = torch.stack(
        [decode_update(ctx.store.get_bytes(u.cid), max_numel=rt.d).to(torch.float32) for u, _ in accepted]
    )  # (n, d)
    trained = [
        u.shard_index if u.shard_index is not None else j.shard_index for u, j in accepted
    ]  # the shard each trained on
    shards = {k: load_shard(ctx.store.get_bytes(run.data_manifest["shards"][k]["cid"])) for k in set(trained)}
    all_shards = [load_shard(ctx.store.get_bytes(e["cid"])) for e in run.data_manifest["shards"]]
    split = [("split_into" in e) for e in run.data_manifest["shards"]]  # its samples live on in its halves
    vx, vy = rt.val_x[:B], rt.val_y[:B]
    g = torch.Generator().manual_seed(run.seed * 1_000_003 + r)

    def loss(params: Tensor, x: Tensor, y: Tensor) -> float:
        set_flat_params(rt.model, params)
        return evaluate(rt.model, x, y)[0]

    w = torch.tensor([float(u.samples) for u, _ in accepted])  # (n,)
    try:
        _, info = rt.aggregator.with_info(U, w, round_index=r)
        if info.kept_fraction is not None:
            kept = [float(k) for k in info.kept_fraction]
        elif info.selected is not None:
            chosen = {int(i) for i in info.selected}
            kept = [1.0 if i in chosen else 0.0 for i in range(U.shape[0])]
        else:
            kept = [1.0] * U.shape[0]
    except Exception:  # noqa: BLE001 - too few updates for the rule: no verdict, not an outlier
        kept = [1.0] * U.shape[0]
    base_val = loss(before, vx, vy)
    gains, own, other = [], [], []
    for i, k in enumerate(trained):
        after = before - U[i]  # (d,) this update alone applied
        gains.append(relative_gain(base_val, loss(after, vx, vy)))
        ox, oy = shards[k]
        pick = torch.randperm(ox.shape[0], generator=g)[:B]
        own.append(relative_gain(loss(before, ox[pick], oy[pick]), loss(after, ox[pick], oy[pick])))
        rest = [sh for m, sh in enumerate(all_shards) if m != k and not split[m]] or [all_shards[k]]
        rx = torch.cat([sh[0] for sh in rest])
        ry = torch.cat([sh[1] for sh in rest])
        pick = torch.randperm(rx.shape[0], generator=g)[:B]
        other.append(relative_gain(loss(before, rx[pick], ry[pick]), loss(after, rx[pick], ry[pick])))
    return score_round(gains, own, other, kept, copies(U, cosine=SCORING.copy_cosine), SCORING, alignments(U))
