"""Verifiable local training: what a worker commits to, and how anyone checks it.

A round's local training (:meth:`LocalTrainer.train_round`) is a pure function of what the
coordinator assigned: the start model (the round's global checkpoint), the optimizer state
the job carried in, the shard, the job's settings and a data-order seed derived from the
job's seed and the round (:func:`data_seed`). Re-run in the same process setup it is
bit-exact; on other hardware or thread counts (kernels sum in other orders) it drifts
slightly, which the checks' tolerance absorbs.

**Commitments.** Every ``every`` steps (``boundaries``: steps 0, k, 2k, ..., H) the worker
records its training state (the parameters and the inner optimizer's state) and commits
to the digests of both (:class:`Commitment`, carried inside the signed update message),
with the digests of its error-feedback residual before and after the round.

**Spot checks** (:func:`check_interval`). A verifier picks intervals at random *after*
the update is in; the worker reveals the states at the interval's two ends; the verifier
checks them against the commitment and re-runs that interval's ``k`` steps. Skipping
steps, training on other data, copying, noise, a stale model or a lazy update leave an
interval that does not replay (or a first state that is not the round's model, which costs
nothing to check: :func:`check_start`), so each checked interval catches a cheat with the
probability that it lands on a faked one.

**Consistency** (:func:`check_update`). The update blob must be exactly what the codec
makes of ``start - final`` plus the committed residual: training honestly and then sending
something else is caught whenever the last state is revealed.

**Disputes are one interval.** Every boundary's digests are in the signed message, so a
failed check is already narrowed to one interval of at most ``MAX_INTERVAL_STEPS`` steps
(rounds up to 2,560 steps), from a committed state: the evidence anyone re-runs. (A
commitment of only a final state or a Merkle root would need a bisection to get there.)
Intervals are checked one by one, never a longer stretch in one go: drift across hardware
grows with the steps re-run.

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
import hashlib
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from aitbc.errors import IntegrityError, UsageError
from aitbc.training.batches import BatchOrder, step_seed
from aitbc.training.checkpoint import bytes_to_tensors, read_metadata, set_flat_params, tensors_to_bytes
from aitbc.training.local import build_inner_optimizer, train_step

PROOF_FORMAT = "aitbc.proof/1"
MIN_INTERVALS = 16  # a round commits at least this many intervals (or one per step, if fewer steps)
MAX_INTERVAL_STEPS = 10  # ... and intervals of at most this many steps, up to MAX_INTERVALS of them
MAX_INTERVALS = 256  # (257 digests of each kind: ~34 KB of JSON in the update's message)
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
MAX_THREADS = 1024  # the most torch threads a commitment may state
# Verdict outcomes (Verdict.outcome)
PASSED = "passed"  # bit-exact, or within the tolerance: the work is paid
DRIFT = "drift"  # a miss honest drift could explain: the update is unpaid; nobody is punished
FAULT = "fault"  # what drift cannot make: proof; the worker's bond is slashed
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def commit_every(steps: int) -> int:
    """Steps between committed states: intervals of at most ``MAX_INTERVAL_STEPS`` steps
    (at least ``MIN_INTERVALS`` of them, at most ``MAX_INTERVALS``; a round of more than
    2,560 steps has longer intervals, whose honest drift across hardware grows)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    intervals = min(MAX_INTERVALS, max(MIN_INTERVALS, math.ceil(steps / MAX_INTERVAL_STEPS)))
    return max(1, math.ceil(steps / intervals))


def boundaries(steps: int, every: int) -> list[int]:
    """The steps at which states are committed: ``0, k, 2k, ..., steps`` (the last
    interval may be shorter)."""
    return [*range(0, steps, every), steps]


# --- digests ---------------------------------------------------------------------------------


def tensor_digest(t: Tensor) -> str:
    """sha256 of a tensor's dtype, shape and little-endian bytes (contiguous, on CPU)."""
    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def tensors_digest(tensors: dict[str, Tensor]) -> str:
    """One digest over named tensors, in name order."""
    h = hashlib.sha256(b"aitbc.tensors/1")
    for name in sorted(tensors):
        h.update(f"|{name}|{tensor_digest(tensors[name])}".encode())
    return h.hexdigest()


def optimizer_tensors(opt: torch.optim.Optimizer) -> dict[str, Tensor]:
    """The inner optimizer's state as named tensors, ``"<param index>.<key>"`` (a fresh
    optimizer: none). Numbers (SGD's momentum buffer is a tensor; Adam's step is a
    tensor in torch 2) become 0-d float64 tensors."""
    out: dict[str, Tensor] = {}
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        for key, v in sorted(opt.state.get(p, {}).items()):
            if v is None:
                continue
            t = v if isinstance(v, Tensor) else torch.tensor(float(v), dtype=torch.float64)
            out[f"{i}.{key}"] = t.detach().to("cpu", copy=True)  # host memory, wherever it trains
    return out


_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")  # one per parameter value


def load_optimizer_tensors(opt: torch.optim.Optimizer, tensors: dict[str, Tensor]) -> None:
    """Put :func:`optimizer_tensors`' output back into ``opt``. A revealed state comes from
    someone else: every name, shape and dtype is checked against what this optimizer keeps
    (``IntegrityError`` otherwise), so a re-run never meets a tensor it cannot step with."""
    params = [p for g in opt.param_groups for p in g["params"]]
    opt.state.clear()
    for name, t in tensors.items():
        i_s, _, key = name.partition(".")
        if not i_s.isdigit() or int(i_s) >= len(params) or key not in (*_MOMENTS, "step"):
            raise IntegrityError(f"optimizer state names {name!r}, not '<param index>.<key>' of this model")
        p = params[int(i_s)]
        if key == "step":
            ok = t.dim() == 0 and t.dtype in (torch.float32, torch.float64) and float(t) >= 0 and float(t) % 1 == 0
            if not ok:
                raise IntegrityError(f"optimizer state {name!r} must be a whole number of steps (a 0-d float)")
            t = t.to(torch.float32)
        elif t.shape != p.shape or t.dtype != p.dtype:
            raise IntegrityError(
                f"optimizer state {name!r} is {t.dtype} {tuple(t.shape)}; its parameter is {p.dtype} {tuple(p.shape)}"
            )
        opt.state[p][key] = t.clone() if key == "step" else t.to(p.device, copy=True)


@dataclass(frozen=True, slots=True)
class TrainState:
    """Where training stood at a committed step: the flat parameters and the optimizer."""

    step: int
    params: Tensor  # (d,) float32
    optim: dict[str, Tensor]

    def digests(self) -> tuple[str, str]:
        return tensor_digest(self.params), tensors_digest(self.optim)

    def to_bytes(self) -> bytes:
        """safetensors: ``params`` and ``optim.<name>``, the step in the metadata."""
        tensors = {"params": self.params, **{f"optim.{k}": v for k, v in self.optim.items()}}
        return tensors_to_bytes(tensors, {"format": PROOF_FORMAT, "step": str(self.step)})

    @classmethod
    def from_bytes(cls, data: bytes, *, numel: int) -> TrainState:
        """A revealed state (from a worker: checked, never trusted)."""
        meta = read_metadata(data)
        step = str(meta.get("step", ""))
        if meta.get("format") != PROOF_FORMAT or not (step.isascii() and step.isdigit()):  # "²".isdigit()
            raise IntegrityError(f"not a {PROOF_FORMAT} state blob")
        tensors = bytes_to_tensors(data)
        params = tensors.pop("params", None)
        if params is None or params.dtype != torch.float32 or tuple(params.shape) != (numel,):
            raise IntegrityError(f"a state's params must be float32 of shape ({numel},)")
        if any(not k.startswith("optim.") for k in tensors):
            raise IntegrityError("a state holds only params and optim.* tensors")
        return cls(int(meta["step"]), params, {k.removeprefix("optim."): v for k, v in tensors.items()})


# --- the commitment --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Commitment:
    """What a worker signs with its update: the digests of its state every ``every``
    steps of ``steps``, and of its error-feedback residual before and after the round
    (None without error feedback). ``params[0]`` must be the round's model."""

    steps: int
    every: int
    params: tuple[str, ...]
    optim: tuple[str, ...]
    residual_in: str | None = None
    residual_out: str | None = None
    batch_size: int | None = None  # the settings it trained with (the replay uses them)
    lr: float | None = None
    data_seed: int | None = None  # the round's data-order seed (training.batches.data_seed)
    threads: int | None = None  # the torch threads it trained on (the replay uses as many: bit-exact)

    @property
    def boundaries(self) -> list[int]:
        return boundaries(self.steps, self.every)

    @property
    def intervals(self) -> int:
        return len(self.params) - 1

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PROOF_FORMAT,
            "steps": self.steps,
            "every": self.every,
            "params": list(self.params),
            "optim": list(self.optim),
            "residual_in": self.residual_in,
            "residual_out": self.residual_out,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "data_seed": self.data_seed,
            "threads": self.threads,
        }

    @classmethod
    def from_json(cls, d: Any, *, steps: int) -> Commitment:
        """Parse a worker's commitment for a round of ``steps`` local steps; ``UsageError``
        naming what is wrong (the API answers it as a 422)."""
        if not isinstance(d, dict):
            raise UsageError("proof must be an object")
        if d.get("format") != PROOF_FORMAT:
            raise UsageError(f"proof.format must be {PROOF_FORMAT!r}")
        every = d.get("every")
        if d.get("steps") != steps:
            raise UsageError(f"proof.steps must be the round's {steps} local steps, got {d.get('steps')!r}")
        if not isinstance(every, int) or isinstance(every, bool) or every != commit_every(steps):
            raise UsageError(f"proof.every must be {commit_every(steps)} for {steps} steps, got {every!r}")
        n = len(boundaries(steps, every))
        out: dict[str, Any] = {}
        for key in ("params", "optim"):
            v = d.get(key)
            if not isinstance(v, list) or len(v) != n or not all(isinstance(x, str) and _HEX64.match(x) for x in v):
                raise UsageError(f"proof.{key} must be {n} sha256 hex digests (one per committed step)")
            out[key] = tuple(v)
        for key in ("residual_in", "residual_out"):
            v = d.get(key)
            if v is not None and not (isinstance(v, str) and _HEX64.match(v)):
                raise UsageError(f"proof.{key} must be a sha256 hex digest or null")
            out[key] = v
        if (out["residual_in"] is None) != (out["residual_out"] is None):
            raise UsageError("proof.residual_in and proof.residual_out are both given or both null")
        batch, lr = d.get("batch_size"), d.get("lr")
        if batch is not None and not (isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1):
            raise UsageError(f"proof.batch_size must be an integer >= 1 or null, got {batch!r}")
        if lr is not None and not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and 0 < lr < math.inf):
            raise UsageError(f"proof.lr must be a positive number or null, got {lr!r}")
        seed = d.get("data_seed")
        if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**63):
            raise UsageError(f"proof.data_seed must be an integer in [0, 2**63) or null, got {seed!r}")
        threads = d.get("threads")
        if threads is not None and not (
            isinstance(threads, int) and not isinstance(threads, bool) and 1 <= threads <= MAX_THREADS
        ):
            raise UsageError(f"proof.threads must be an integer in [1, {MAX_THREADS}] or null, got {threads!r}")
        return cls(
            steps,
            every,
            out["params"],
            out["optim"],
            out["residual_in"],
            out["residual_out"],
            batch,
            None if lr is None else float(lr),
            seed,
            threads,
        )


class Recorder:
    """Collects a round's committed states while :class:`LocalTrainer` trains (the worker
    keeps them until the round's spot checks are answered). ``sink``: where each state goes
    instead of memory (a worker with a large model writes them to disk); only their
    digests are kept then."""

    def __init__(
        self, steps: int, every: int | None = None, *, sink: Callable[[TrainState], None] | None = None
    ) -> None:
        self.steps, self.every = steps, every or commit_every(steps)
        self.at = set(boundaries(steps, self.every))
        self.states: dict[int, TrainState] = {}
        self.sink = sink
        self._digests: dict[int, tuple[str, str]] = {}

    def capture(self, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        if step in self.at:
            params = torch.nn.utils.parameters_to_vector(model.parameters()).detach().to("cpu", copy=True)
            state = TrainState(step, params, optimizer_tensors(opt))
            if self.sink is None:
                self.states[step] = state
            else:
                self._digests[step] = state.digests()
                self.sink(state)

    def commitment(
        self,
        residual_in: Tensor | None,
        residual_out: Tensor | None,
        *,
        batch_size: int | None = None,
        lr: float | None = None,
        data_seed: int | None = None,
        threads: int | None = None,
    ) -> Commitment:
        steps = boundaries(self.steps, self.every)
        missing = [s for s in steps if s not in self.states and s not in self._digests]
        if missing:
            raise RuntimeError(f"no state recorded at steps {missing}")
        digests = [self.states[s].digests() if s in self.states else self._digests[s] for s in steps]
        return Commitment(
            self.steps,
            self.every,
            tuple(p for p, _ in digests),
            tuple(o for _, o in digests),
            None if residual_in is None else tensor_digest(residual_in),
            None if residual_out is None else tensor_digest(residual_out),
            batch_size,
            lr,
            data_seed,
            threads,
        )


# --- checks ---------------------------------------------------------------------------------


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
    cfg: Any  # training.local.LocalConfig
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
    from aitbc.core.compression import ErrorFeedback

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
