"""A closing round's new global model, before anything is recorded: the round's accepted
updates through the norm bound and the run's robust rule (:mod:`.live.updates`), the outer
step, the divergence check and the checkpoint (:func:`aggregate_round`). No database
writes: :mod:`.commit` records the :class:`RoundResult`.

Shape letters: ``n`` accepted updates, ``d`` parameters.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch
from sqlalchemy.orm import object_session
from torch import Tensor

from aitbc.coordinator.context import Context
from aitbc.coordinator.live.runtime import OUTER_FORMAT, RunRuntime, write_behind
from aitbc.coordinator.live.updates import aggregate_updates
from aitbc.coordinator.rounds.result import RoundResult
from aitbc.coordinator.store.models import Job, Run, Update
from aitbc.coordinator.store.repository import base_round, job_settings
from aitbc.core.outer import build_outer
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.checkpoint import tensors_to_bytes


@dataclass(frozen=True, slots=True)
class _Stepped:
    """The model after a round's outer step, and the outer state it leaves."""

    params: Tensor  # (d,)
    outer_cid: str | None
    outer_state: dict[str, Tensor] | None  # None: the step wrote no new state
    rejected: tuple[tuple[int, str], ...]
    clipped: tuple[int, ...]
    skipped: bool
    writes: tuple[Future[str], ...]


def aggregate_round(
    ctx: Context,
    run: Run,
    rt: RunRuntime,
    accepted: Sequence[tuple[Update, int]],
    r: int,
    *,
    evaluate_now: bool,
    weights: list[float] | None = None,
    counts: Sequence[float] | None = None,
) -> RoundResult:
    """Round ``r``'s new global model from ``accepted`` (update, shard index) pairs: the
    run's robust rule, then its outer step, then the checkpoint blob; evaluated now if
    asked. Writes no rows (:func:`.commit.commit_round` records it). ``weights``: one per
    accepted update (default: the samples it was trained on). ``counts``: what each
    accepted update counts for after the norm bound (the run mode's staleness; default:
    :func:`overlap_count`, a sync run's). Call with ``rt.lock`` held, after ``rt.load``."""
    params = rt.params
    if params is None:
        raise RuntimeError(f"run {run.id}'s runtime holds no model: call RunRuntime.load first")
    before = params
    if accepted:
        if counts is None:
            counts = [overlap_count(run, rt, u) for u, _ in accepted]
        stepped = _step(ctx, run, rt, accepted, r, weights, counts)
    else:
        stepped = _Stepped(params, run.outer_state_cid, None, (), (), True, ())
    params = stepped.params
    diverged, guard = _divergence(run, rt, before, params, r)
    loss = acc = None
    if evaluate_now and diverged is None:
        t0 = time.perf_counter()
        loss, acc = rt.evaluate(params)
        ctx.metrics.round_evaluation.observe(time.perf_counter() - t0)
    cid, size, stored = rt.checkpoint_behind(ctx, run, params, r)  # written while commit_round queries
    if guard is not None:
        rt.guard_cache = (cid, guard)  # the next round's check compares with it
    return RoundResult(
        params=params,
        cid=cid,
        size=size,
        outer_cid=stepped.outer_cid,
        val_loss=loss,
        val_accuracy=acc,
        skipped=stepped.skipped,
        diverged=diverged,
        rejected=stepped.rejected,
        clipped=stepped.clipped,
        outer_state=stepped.outer_state,
        stored=(*stepped.writes, stored),
    )


def _step(
    ctx: Context,
    run: Run,
    rt: RunRuntime,
    accepted: Sequence[tuple[Update, int]],
    r: int,
    weights: list[float] | None,
    counts: Sequence[float],
) -> _Stepped:
    """The norm bound and the rule over ``accepted``, then the outer step from ``rt.params``."""
    params = rt.params
    assert params is not None
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
        counts,
        d=rt.d,
        round_index=r,
        reference=rt.trend(ctx, run.id, r),
    )
    rejected = tuple((accepted[i][0].id, agg.verdict.reasons[i] or "") for i in agg.verdict.rejected)
    clipped = tuple(accepted[i][0].id for i in agg.verdict.clipped)
    if agg.delta is None:
        return _Stepped(params, run.outer_state_cid, None, rejected, clipped, True, ())
    delta = agg.delta  # (d,)
    del agg  # the aggregate is not held past the outer step (a model's size)
    outer = build_outer(rt.outer_name, rt.outer_options)
    if rt.outer_state:
        outer.load_state_dict({k: v.clone() for k, v in rt.outer_state.items()})
    params = outer.step(params, delta)
    del delta
    state = outer.state_dict()
    if not state:
        return _Stepped(params, run.outer_state_cid, None, rejected, clipped, False, ())
    blob = tensors_to_bytes(state, {"format": OUTER_FORMAT, "round": str(r)})  # written behind, as the checkpoint
    outer_cid = cid_of_bytes(blob)
    return _Stepped(params, outer_cid, state, rejected, clipped, False, (write_behind(ctx, outer_cid, blob),))


def overlap_count(run: Run, rt: RunRuntime, u: Update) -> float:
    """What ``u`` counts for in a run whose rounds wait for everyone: 1, or, trained from a
    model before its round's alone (overlap: one or two aggregations late), the run's
    ``overlap_staleness`` rule at that lag (:mod:`aitbc.core.staleness`). One trained ahead
    from that model plus its worker's own previous updates (``prior_cid`` and its chain, an
    eager start) began about where the round's model is: it counts 1
    (bench/overlap_loss.py: the synchronous loss, where the stale start at half weight lags it)."""
    if u.base_cid is None or u.prior_cid is not None:
        return 1.0
    s = object_session(u)
    found = None if s is None else base_round(s, run.id, u.base_cid, before=u.round)
    lag = 1 if found is None else max(1, u.round - 1 - found)  # overlap 2: one or two rounds late
    return rt.overlap_staleness(lag)


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
