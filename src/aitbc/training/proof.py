"""Verifiable local training: what a worker commits to.

A round's local training (:meth:`LocalTrainer.train_round`) is a pure function of what the
coordinator assigned: the start model (the round's global checkpoint), the optimizer state
the job carried in, the shard, the job's settings and a data-order seed derived from the
job's seed and the round (:func:`data_seed`). Re-run in the same process setup it is
bit-exact; on other hardware or thread counts (kernels sum in other orders) it drifts
slightly, which the checks' tolerance absorbs (:mod:`aitbc.training.checks`).

**Commitments.** Every ``every`` steps (``boundaries``: steps 0, k, 2k, ..., H) the worker
records its training state (the parameters and the inner optimizer's state) and commits
to the digests of both (:class:`Commitment`, carried inside the signed update message),
with the digests of its error-feedback residual before and after the round.

**Disputes are one interval.** Every boundary's digests are in the signed message, so a
failed check is already narrowed to one interval of at most ``MAX_INTERVAL_STEPS`` steps
(rounds up to 2,560 steps), from a committed state: the evidence anyone re-runs. (A
commitment of only a final state or a Merkle root would need a bisection to get there.)

The commitment also states the worker's torch thread count (``threads``): a verifier
re-runs on as many, so on like hardware an honest interval replays bit-exact.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

import torch
from torch import Tensor, nn

from aitbc.errors import IntegrityError, UsageError
from aitbc.training.checkpoint import bytes_to_tensors, read_metadata, tensors_to_bytes

PROOF_FORMAT = "aitbc.proof/1"
MIN_INTERVALS = 16  # a round commits at least this many intervals (or one per step, if fewer steps)
MAX_INTERVAL_STEPS = 10  # ... and intervals of at most this many steps, up to MAX_INTERVALS of them
MAX_INTERVALS = 256  # (257 digests of each kind: ~34 KB of JSON in the update's message)
MAX_THREADS = 1024  # the most torch threads a commitment may state
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


class CommitmentJSON(TypedDict):
    """A :class:`Commitment` as an update's ``proof`` carries it."""

    format: str
    steps: int
    every: int
    params: list[str]
    optim: list[str]
    residual_in: str | None
    residual_out: str | None
    batch_size: int | None
    lr: float | None
    data_seed: int | None
    threads: int | None


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

    def to_json(self) -> CommitmentJSON:
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
        params, optim = (_digests(d, key, n) for key in ("params", "optim"))
        residual_in, residual_out = (_digest_or_none(d, key) for key in ("residual_in", "residual_out"))
        if (residual_in is None) != (residual_out is None):
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
            params,
            optim,
            residual_in,
            residual_out,
            batch,
            None if lr is None else float(lr),
            seed,
            threads,
        )


def _digests(d: Mapping[str, object], key: str, n: int) -> tuple[str, ...]:
    v = d.get(key)
    if not isinstance(v, list) or len(v) != n or not all(isinstance(x, str) and _HEX64.match(x) for x in v):
        raise UsageError(f"proof.{key} must be {n} sha256 hex digests (one per committed step)")
    return tuple(str(x) for x in v)


def _digest_or_none(d: Mapping[str, object], key: str) -> str | None:
    v = d.get(key)
    if v is not None and not (isinstance(v, str) and _HEX64.match(v)):
        raise UsageError(f"proof.{key} must be a sha256 hex digest or null")
    return v


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
