"""How anyone checks a worker's committed training (:mod:`aitbc.training.proof`).

**Spot checks** (:func:`check_interval`). A verifier picks intervals at random *after*
the update is in; the worker reveals the states at the interval's two ends; the verifier
checks them against the commitment and re-runs that interval's ``k`` steps. Skipping
steps, training on other data, copying, noise, a stale model or a lazy update leave an
interval that does not replay (or a first state that is not the round's model, which costs
nothing to check: :func:`check_start`), so each checked interval catches a cheat with the
probability that it lands on a faked one. Intervals are checked one by one, never a longer
stretch in one go: drift across hardware grows with the steps re-run.

**Consistency** (:func:`check_update`). The update blob must be exactly what the codec
makes of ``start - final`` plus the committed residual: training honestly and then sending
something else is caught whenever the last state is revealed.

**Verdicts accuse only with proof** (:class:`Verdict`, ``outcome``). A re-run is compared
bit for bit first; one that differs is judged by the relative distance of the parameters,
``|replayed - revealed| / |revealed - start|``, and of each kind of optimizer moment
(:func:`optimizer_error`). Within ``tolerance`` (``DEFAULT_TOLERANCE``) it **passes**. A
miss is **drift** when honest drift could explain it: the verifier measures, on that very
interval, how far two honest re-runs land apart (:func:`probe_drift`: one from the start
nudged by rounding-level noise, one on another thread count: what other kernels do to an
interval of this model, optimizer, lr and length), and the interval's drift bound is
``DRIFT_MARGIN`` times that, at least ``BOUND_FLOOR`` (:func:`drift_bound`); a miss within
it costs the update its pay, never its bond. Where the probe shows the interval chaotic
(re-runs already far apart: Adam at lr 1 on a transformer), no distance is proof
(the bound is infinite). A **fault** is what drift cannot make: a revealed state that is not
the committed one, a first state that is not the round's model, an update that is not the
codec's encoding of the committed work, an optimizer state of other tensors or step
counts, or a re-run off by more than the bound. Only a fault is proof (a slash).

Re-runs are bit-exact when both sides use the same kernels and thread count: the
commitment states the worker's torch thread count (``threads``) and the verifier re-runs
on it (:func:`replay_threads`), so on like hardware an honest interval passes exactly at
any lr. Nothing here touches a network: the coordinator and the simulator call these
functions.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from aitbc.core.compression import ErrorFeedback
from aitbc.training.batches import BatchOrder, step_seed
from aitbc.training.checkpoint import set_flat_params
from aitbc.training.local import LocalConfig, build_inner_optimizer, train_step
from aitbc.training.proof import (
    Commitment,
    TrainState,
    load_optimizer_tensors,
    optimizer_tensors,
    tensor_digest,
    tensors_digest,
)

# The relative distance a re-run may land from the revealed state and still pass (parameters,
# and each kind of optimizer moment). Re-runs on other hardware or thread counts are not
# bit-exact: measured honest drift over a 10-step interval is at most ~1e-3 at small lr (cnn,
# 1 vs 2 threads), but grows with the lr under Adam (the transformer at lr 1: ~7e-2 over 2
# steps); leaving out one step of ten moves the state by ~7e-2 or more, forged moments by ~5e-1.
DEFAULT_TOLERANCE = 1e-2
# A miss past the tolerance is a fault (proof) only beyond the interval's drift bound:
# DRIFT_MARGIN x the distance two honest re-runs of it land apart (probe_drift), at least
# BOUND_FLOOR; a probe past BOUND_CHAOS (re-runs that diverge) leaves no distance as proof.
DRIFT_MARGIN = 20.0
BOUND_FLOOR = 0.1
BOUND_CHAOS = 0.05
DRIFT_PROBE = 2.0**-16  # the probe's nudge: each value moved by this share of itself (~500 float32 ulps)
# Verdict outcomes (Verdict.outcome)
PASSED = "passed"  # bit-exact, or within the tolerance: the work is paid
DRIFT = "drift"  # a miss honest drift could explain: the update is unpaid; nobody is punished
FAULT = "fault"  # what drift cannot make: proof; the worker's bond is slashed


@dataclass(frozen=True, slots=True)
class Verdict:
    """One check's outcome: ``outcome`` PASSED, DRIFT (a miss honest drift could explain:
    unpaid, never punished) or FAULT (proof: slashed); ``interval`` the committed interval
    it judged (None: a whole-update check); ``error`` the relative parameter distance (0.0
    bit-exact); ``bound`` the drift bound a miss was judged against; ``detail`` one line
    for people."""

    outcome: str
    check: str
    interval: int | None
    error: float | None
    detail: str
    steps_replayed: int = 0
    bound: float | None = None

    def __post_init__(self) -> None:
        if self.outcome not in (PASSED, DRIFT, FAULT):
            raise ValueError(f"verdict outcome must be {PASSED}, {DRIFT} or {FAULT}, got {self.outcome!r}")

    @property
    def ok(self) -> bool:
        return self.outcome == PASSED

    @property
    def provable(self) -> bool:
        """Misbehaviour drift cannot explain: what a slash needs."""
        return self.outcome == FAULT


def fault(check: str, interval: int | None, detail: str) -> Verdict:
    """A failed check that is proof by itself (no distance judged)."""
    return Verdict(FAULT, check, interval, None, detail)


def check_start(c: Commitment, global_params: Tensor | str) -> Verdict:
    """The first committed state must be the round's model (free: no replay).
    ``global_params``: the model's flat parameters, or their :func:`tensor_digest`."""
    digest = global_params if isinstance(global_params, str) else tensor_digest(global_params)
    if c.params[0] != digest:
        return fault("start", 0, "its first committed state is not the round's model")
    return Verdict(PASSED, "start", 0, None, "started from the round's model")


def check_revealed(c: Commitment, index: int, state: TrainState) -> Verdict | None:
    """A revealed state matches the commitment at boundary ``index`` (None), else a
    failed verdict: the worker revealed something it did not commit to."""
    step = c.boundaries[index]
    p, o = state.digests()
    if state.step != step or p != c.params[index] or o != c.optim[index]:
        return fault("reveal", index, f"the state revealed for step {step} is not the one committed")
    return None


@dataclass(frozen=True, slots=True)
class Replay:
    """What re-running a stretch needs, beyond the states: the model, the job's local
    config, its shard and the round's data seed."""

    model: nn.Module
    x: Tensor
    y: Tensor
    cfg: LocalConfig
    seed: int  # data_seed(job seed, round)


def replay(r: Replay, start: TrainState, steps: int) -> TrainState:
    """Re-run ``steps`` steps from ``start`` exactly as :meth:`LocalTrainer.train_round`
    does (the same step function, batch walk and per-step RNG)."""
    set_flat_params(r.model, start.params)
    r.model.train()
    opt = build_inner_optimizer(r.cfg, r.model.parameters())
    load_optimizer_tensors(opt, start.optim)
    order = BatchOrder(r.x.shape[0], r.cfg.batch_size, r.seed)
    order.skip(start.step)
    for s in range(start.step, start.step + steps):
        idx = order.next()
        train_step(r.model, opt, r.x[idx], r.y[idx], r.cfg, step_seed(r.seed, s))
    params = torch.nn.utils.parameters_to_vector(r.model.parameters()).detach().clone()
    return TrainState(start.step + steps, params, optimizer_tensors(opt))


def relative_error(replayed: Tensor, revealed: Tensor, start: Tensor) -> float:
    """``|replayed - revealed| / |revealed - start|``: 0.0 when bit-exact."""
    if torch.equal(replayed, revealed):
        return 0.0
    moved = float(torch.linalg.vector_norm(revealed.double() - start.double()))
    return float(torch.linalg.vector_norm(replayed.double() - revealed.double())) / max(moved, 1e-12)


@contextlib.contextmanager
def replay_threads(n: int | None, cap: int | None = None) -> Iterator[int]:
    """Run the body on ``n`` torch threads (the count a commitment states; None: as now),
    at most ``cap`` (None: the CPUs this process may run on), and restore the count after.
    Yields the count used."""
    before = torch.get_num_threads()
    most = cap or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()) or 1
    want = before if n is None else max(1, min(int(n), most))
    if want != before:
        torch.set_num_threads(want)
    try:
        yield want
    finally:
        if want != before:
            torch.set_num_threads(before)


def _nudged(state: TrainState, gen: torch.Generator) -> TrainState:
    """``state`` with every parameter and moment moved by ``DRIFT_PROBE`` of itself, signs
    at random: the size of difference other kernels leave in a state (a few hundred ulps)."""

    def nudge(t: Tensor) -> Tensor:
        if not t.is_floating_point() or t.dim() == 0:  # step counts stay
            return t.clone()
        sign = torch.randint(0, 2, t.shape, generator=gen).to(t.dtype) * 2 - 1
        return t + t * sign * DRIFT_PROBE

    return TrainState(state.step, nudge(state.params), {k: nudge(v) for k, v in state.optim.items()})


def probe_drift(r: Replay, start: TrainState, steps: int, got: TrainState) -> tuple[float, int]:
    """How far apart two honest re-runs of this interval land, measured: the move of the
    re-run ``got`` against the move of one from ``start`` nudged by rounding-level noise
    (:func:`_nudged`) and, where the verifier has more than one thread, of one on a single
    thread (other kernels' order of summation). The larger relative distance, of parameters or any kind of moment: the
    interval's own sensitivity, for this model, optimizer, lr, data and length; and the
    number of re-runs it took."""
    gen = torch.Generator().manual_seed(start.step * 1_000_003 + steps)
    nudged = _nudged(start, gen)
    probes = [(nudged, replay(r, nudged, steps))]
    if torch.get_num_threads() > 1:
        with replay_threads(1):
            probes.append((start, replay(r, start, steps)))
    moved = got.params.double() - start.params.double()
    scale = max(float(torch.linalg.vector_norm(moved)), 1e-12)
    out = 0.0
    for s, p in probes:  # the moves compared, not the ends: the nudge itself is no drift
        off = float(torch.linalg.vector_norm(p.params.double() - s.params.double() - moved)) / scale
        out = max(out, off, optimizer_error(p.optim, got.optim))
    return out, len(probes)


def drift_bound(probe: float) -> float:
    """The distance past which a miss cannot be drift: ``DRIFT_MARGIN x probe``, at least
    ``BOUND_FLOOR``; infinite where the probe shows re-runs that diverge (past
    ``BOUND_CHAOS``): there no distance is proof."""
    if not probe <= BOUND_CHAOS:  # NaN too
        return math.inf
    return max(BOUND_FLOOR, DRIFT_MARGIN * probe)


def check_interval(
    c: Commitment,
    index: int,
    start: TrainState,
    end: TrainState,
    r: Replay,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    max_threads: int | None = None,
) -> Verdict:
    """Spot-check interval ``index`` (boundaries ``index`` to ``index + 1``): the revealed
    ``start`` and ``end`` must be the committed ones (else a fault), and re-running the
    interval from ``start``, on the threads the commitment states, must land on ``end``:
    bit-exact or within ``tolerance`` passes; a miss is a fault only if it cannot be drift
    (other tensors or step counts in the optimizer state, or a distance past the
    interval's measured drift bound: :func:`probe_drift`, :func:`drift_bound`), else drift.
    ``max_threads``: the most threads the verifier gives a re-run."""
    if not 0 <= index < c.intervals:
        raise ValueError(f"interval {index} out of range 0..{c.intervals - 1}")
    for i, s in ((index, start), (index + 1, end)):
        bad = check_revealed(c, i, s)
        if bad is not None:
            return bad
    steps = end.step - start.step
    span = f"steps {start.step}-{end.step}"
    with replay_threads(c.threads, max_threads):
        got = replay(r, start, steps)
        err = relative_error(got.params, end.params, start.params)
        if err == 0.0 and tensors_digest(got.optim) == c.optim[index + 1]:
            return Verdict(PASSED, "interval", index, 0.0, f"{span} replay bit-exact", steps)
        bad_optim = optimizer_error(got.optim, end.optim)
        if err <= tolerance and bad_optim <= tolerance:
            detail = f"{span} replay within tolerance ({max(err, bad_optim):.2e} <= {tolerance:g})"
            return Verdict(PASSED, "interval", index, err, detail, steps)
        if bad_optim == math.inf:  # no kernel changes which tensors a step keeps, or how many steps
            detail = (
                f"{span} do not replay: the optimizer state committed at step {end.step} holds other tensors or steps"
            )
            return Verdict(FAULT, "interval", index, err, detail, steps)
        probe, reruns = probe_drift(r, start, steps, got)
    bound = drift_bound(probe)
    miss = max(err, bad_optim)
    what = f"the optimizer state committed at step {end.step}" if bad_optim > err else "the parameters"
    steps *= 1 + reruns  # the probe re-ran it
    if miss > bound:
        detail = (
            f"{span} do not replay: {what} off by {miss:.3g}, past the drift bound {bound:.3g} "
            f"(honest re-runs land {probe:.2g} apart)"
        )
        return Verdict(FAULT, "interval", index, err, detail, steps, bound)
    detail = (
        f"{span} replay off by {miss:.3g} ({what}): past the tolerance {tolerance:g}, within the drift bound "
        f"{bound:.3g} (honest re-runs land {probe:.2g} apart): could be drift, not proof"
    )
    return Verdict(DRIFT, "interval", index, err, detail, steps, bound)


def optimizer_error(replayed: dict[str, Tensor], revealed: dict[str, Tensor]) -> float:
    """How far two optimizer states are apart: for each kind of moment (``exp_avg``,
    ``exp_avg_sq``, ...), the distance over all parameters relative to the revealed
    moments' norm, the largest of them; step counts must be equal (else inf), as must
    the tensors held. 0.0 when bit-exact. (Tensor by tensor would be noise: a bias whose
    gradients are ~0 has moments that re-runs on other hardware do not reproduce closely.)"""
    if set(replayed) != set(revealed):
        return math.inf
    diff: dict[str, float] = {}
    norm: dict[str, float] = {}
    for name, a in replayed.items():
        b = revealed[name]
        if a.shape != b.shape:
            return math.inf
        kind = name.partition(".")[2]
        if kind == "step":
            if not torch.equal(a, b):
                return math.inf
            continue
        diff[kind] = diff.get(kind, 0.0) + float(torch.sum((a.double() - b.double()) ** 2))
        norm[kind] = norm.get(kind, 0.0) + float(torch.sum(b.double() ** 2))
    return max((math.sqrt(diff[k]) / max(math.sqrt(norm[k]), 1e-30) for k in diff), default=0.0)


def check_update(
    c: Commitment,
    blob: bytes,
    start_params: Tensor,
    final: TrainState,
    residual_in: Tensor | None,
    codec: Any,
) -> Verdict:
    """The update blob is the codec's encoding of ``start - final`` (plus the committed
    residual under error feedback), byte for byte: the update is the work committed."""
    last = c.intervals
    bad = check_revealed(c, last, final)
    if bad is not None:
        return bad
    if (residual_in is None) != (c.residual_in is None):
        return fault("update", None, "the residual revealed does not match the commitment")
    if residual_in is not None and tensor_digest(residual_in) != c.residual_in:
        return fault("update", None, "the residual revealed is not the one committed")
    delta = start_params - final.params  # (d,)
    if isinstance(codec, ErrorFeedback):
        codec.residual = None if residual_in is None else residual_in.clone()
    expected = codec.encode(delta)
    if expected != blob:
        return fault("update", None, "the update sent is not the codec's encoding of the work committed")
    left = codec.residual if isinstance(codec, ErrorFeedback) else None
    if c.residual_out is not None and (left is None or tensor_digest(left) != c.residual_out):
        return fault("update", None, "the residual committed after the round is not the one left")
    return Verdict(PASSED, "update", None, 0.0, "the update is the encoding of the committed work")


def null_intervals(c: Commitment) -> list[int]:
    """Intervals whose committed end is their start, parameters and optimizer state alike,
    though the interval has steps: training leaves no such state (a step moves the
    optimizer's step count or moments, and the parameters unless the lr is below their
    precision), skipping does. Free to find from the digests; the verifier re-runs them all
    besides the random draw, so a worker skipping any share of its intervals this way is
    caught in the round it does."""
    return [i for i in range(c.intervals) if c.params[i] == c.params[i + 1] and c.optim[i] == c.optim[i + 1]]


def choose_intervals(intervals: int, rate: float, gen: torch.Generator) -> list[int]:
    """The intervals to spot-check in one update at verification rate ``rate`` (the
    expected share of its steps re-run): ``rate x intervals`` of them, rounded at random
    so the expectation is exact, distinct, drawn from ``gen``."""
    if not 0 <= rate <= 1:
        raise ValueError(f"verification rate must be in [0, 1], got {rate}")
    want = rate * intervals
    k = int(want)
    if torch.rand((), generator=gen).item() < want - k:
        k += 1
    if k == 0:
        return []
    return sorted(int(i) for i in torch.randperm(intervals, generator=gen)[:k])
