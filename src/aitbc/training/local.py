"""The local training loop a worker runs on its shard each round.

From the global weights, take ``H`` steps of the inner optimizer on shard batches and
return the *pseudo-gradient* ``global - local`` as one flat ``(d,)`` tensor (DiLoCo's
outer gradient). The inner optimizer's state lives on in the :class:`LocalTrainer`
across rounds, as in DiLoCo; batches come from a seeded per-worker generator that walks
the shard in reshuffled epochs, so a run is reproducible from its seed.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aitbc.core.compression import decode as decode_update
from aitbc.core.options import build_config
from aitbc.core.registry import Registry
from aitbc.errors import IntegrityError
from aitbc.training.batches import BatchOrder, data_seed, step_seed
from aitbc.training.checkpoint import flat_params, set_flat_params
from aitbc.training.devices import check_precision
from aitbc.training.group import Group
from aitbc.training.proof import Recorder

# torch's global CPU generator is one per process: a seeded step (fork_rng + manual_seed) and
# anything else that seeds it (the coordinator's build_initial_model, in request threads) take this.
GLOBAL_RNG = threading.RLock()

# Constructors called as ``cls(params, lr=..., weight_decay=..., [momentum=...])``.
INNER_OPTIMIZERS: Registry[Callable[..., torch.optim.Optimizer]] = Registry("inner optimizer")
INNER_OPTIMIZERS.register("sgd")(torch.optim.SGD)
INNER_OPTIMIZERS.register("adamw")(torch.optim.AdamW)
INNER_OPTIMIZERS.register("adam")(torch.optim.Adam)


@dataclass(kw_only=True, slots=True)
class LocalConfig:
    steps: int = 20  # H: inner steps per round
    batch_size: int = 32
    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.0  # sgd only
    grad_clip: float = 0.0  # max global grad norm; 0 disables
    precision: str = "fp32"  # bf16: the forward pass and loss under bfloat16 autocast (CPU and CUDA)

    def __post_init__(self) -> None:
        check_precision(self.precision)
        if self.steps < 1:
            raise ValueError(f"local steps must be >= 1, got {self.steps}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        for name in ("weight_decay", "momentum", "grad_clip"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be >= 0 and finite, got {v}")
        INNER_OPTIMIZERS.get(self.optimizer)  # unknown name -> error listing allowed ones


@dataclass(frozen=True, slots=True)
class LocalResult:
    delta: Tensor  # (d,) global - local
    loss: float  # mean training loss over the round's steps
    steps: int
    samples: int  # samples seen this round
    epoch: float  # passes over the shard so far
    accuracy: float | None = None  # share of the round's training samples predicted right (None: language data)


def eager_start(base: Tensor, prior_blobs: Sequence[bytes]) -> Tensor:
    """(d,) where a round trained ahead (overlap) starts: the newest global model ``base``
    less the worker's own previous updates not yet in it, as their blobs decode (an update
    is ``start - end``; overlap 1: one, overlap 2: up to two), i.e. where its last round
    ended, moved by what the global model gained since (the "eager" start of overlapped
    DiLoCo). The worker and the coordinator's spot check both compute it from the same
    published bytes, in the same order, so it is the same on both sides. A blob that does
    not decode to ``base``'s size is an ``IntegrityError``."""
    d = base.numel()
    start = base
    for blob in prior_blobs:
        step = decode_update(blob, max_numel=d)
        if step.shape != (d,):
            raise IntegrityError(f"a previous update of shape {tuple(step.shape)}, not ({d},)")
        start = start - step.to(torch.float32)
    return start


def epoch_steps(epochs: int, samples: int, batch_size: int) -> int:
    """Local steps for ``epochs`` passes over a shard of ``samples``: ``epochs x (samples //
    batch)``, one step at least per pass, with the batch capped at the shard (a pass is
    every full batch of one reshuffled order, as :class:`~aitbc.training.batches.BatchOrder` draws
    them). The worker trains this many steps; the coordinator bounds it the same way."""
    return epochs * max(1, samples // max(1, min(batch_size, samples)))


def loss_fn(logits: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy for both tasks: (B, C) vs (B,) or (B, T, V) vs (B, T)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1).long())


def build_inner_optimizer(cfg: LocalConfig, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    cls = INNER_OPTIMIZERS.get(cfg.optimizer)
    kw: dict[str, float] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
    if cls is torch.optim.SGD:
        kw["momentum"] = cfg.momentum
    return cls(params, **kw)


def train_step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    xb: Tensor,
    yb: Tensor,
    cfg: LocalConfig,
    seed: int | None = None,
    *,
    scale: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """One inner step on a batch: ``(loss, logits)``. ``seed``: the step's own RNG seed
    (dropout), so a verifier re-running it draws the same; None uses the global RNG.
    ``scale``: the loss is multiplied by it before the backward pass (a data-parallel
    rank's share of the global batch, so the ranks' averaged gradient is the batch's)."""
    if seed is None:
        return _step(model, opt, xb, yb, cfg, scale)
    with GLOBAL_RNG, torch.random.fork_rng(devices=[]):
        if xb.device.type == "cpu":
            # The CPU generator alone: the same draws as torch.manual_seed, which also seeds
            # every accelerator's generators and, on a CPU-only build, formats a stack trace
            # for CUDA's lazy seeding each call (~100x the cost; measurable on small models).
            torch.default_generator.manual_seed(seed)
        else:
            torch.manual_seed(seed)
        return _step(model, opt, xb, yb, cfg, scale)


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """The inner step's autocast: bfloat16 where ``precision`` is bf16 (on the CPU too),
    off for fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def _step(
    model: nn.Module, opt: torch.optim.Optimizer, xb: Tensor, yb: Tensor, cfg: LocalConfig, scale: float = 1.0
) -> tuple[Tensor, Tensor]:
    with autocast(xb.device, cfg.precision):
        logits = model(xb)
        loss = loss_fn(logits.float(), yb)
    opt.zero_grad(set_to_none=True)
    (loss * scale if scale != 1.0 else loss).backward()
    if cfg.grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    return loss.detach(), logits.detach()


class LocalTrainer:
    """One worker's model, inner optimizer and batch order, kept across rounds.

    ``device``: where the model trains (the shard stays in host memory, pinned on CUDA, and
    each batch is copied over with ``non_blocking``). ``group``: this process's rank of a
    data-parallel group (:mod:`aitbc.training.parallel`): every rank walks the same global
    batches and trains on its slice of each under ``DistributedDataParallel``, so the ranks
    together take the steps one process would on the whole batch."""

    def __init__(
        self,
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        cfg: LocalConfig,
        *,
        seed: int,
        device: torch.device | None = None,
        group: Group | None = None,
    ) -> None:
        if x.shape[0] == 0 or x.shape[0] != y.shape[0]:
            raise ValueError(f"shard needs matching non-empty x and y, got {tuple(x.shape)} and {tuple(y.shape)}")
        self.device = device if device is not None else torch.device("cpu")
        self.model, self.cfg = model.to(self.device), cfg
        self.x, self.y = self._host(x), self._host(y)
        self.seed = seed
        self.group = group if group is not None and group.world > 1 else None
        self.net: nn.Module = self.model if self.group is None else self.group.wrap(self.model)
        self.opt = build_inner_optimizer(cfg, model.parameters())
        self.gen = torch.Generator().manual_seed(seed)
        self._walk = BatchOrder(x.shape[0], cfg.batch_size, generator=self.gen)  # across rounds (round=None)
        self.samples_seen = 0

    def _host(self, t: Tensor) -> Tensor:
        """The shard in host memory: pinned where batches go to a CUDA device."""
        return t.pin_memory() if self.device.type == "cuda" else t

    def _batch(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        xb, yb = self.x[idx], self.y[idx]
        if self.device.type != "cuda":
            return xb, yb
        # the gathered batch into (cached) pinned memory, then an asynchronous copy to the GPU
        return xb.pin_memory().to(self.device, non_blocking=True), yb.pin_memory().to(self.device, non_blocking=True)

    def reconfigure(self, *, steps: int, batch_size: int, lr: float, data: tuple[Tensor, Tensor] | None = None) -> None:
        """New per-round settings (the owner changed the job), keeping the model and the
        optimizer's state; ``data``: a new shard ``(x, y)`` (a split), with a fresh batch order."""
        self.cfg.steps, self.cfg.batch_size = steps, batch_size
        if lr != self.cfg.lr:
            self.cfg.lr = lr
            for group in self.opt.param_groups:
                group["lr"] = lr
        if data is not None:
            x, y = data
            if x.shape[0] == 0 or x.shape[0] != y.shape[0]:
                raise ValueError(f"shard needs matching non-empty x and y, got {tuple(x.shape)} and {tuple(y.shape)}")
            self.x, self.y = self._host(x), self._host(y)
            self._walk = BatchOrder(x.shape[0], batch_size, generator=self.gen)
        else:
            self._walk.b = min(batch_size, self._walk.n)

    def train_round(
        self,
        global_params: Tensor,
        on_step: Callable[[int, float], None] | None = None,
        *,
        round: int | None = None,
        recorder: Recorder | None = None,
    ) -> LocalResult:
        """Run H steps from ``global_params``. ``on_step(step, loss)`` (1-based), if given,
        is called after each step (a worker reports progress through it).

        ``round``: the batches come from the round's own data seed (:func:`data_seed` of
        the job's seed and the round) with a per-step RNG seed, so any stretch of the
        round can be re-run by a verifier; None walks one batch order across rounds (the
        simulator's default). ``recorder`` collects the states to commit to."""
        set_flat_params(self.model, global_params.to(self.device))
        self.model.train()
        total, start_seen = 0.0, self.samples_seen
        correct, seen = 0, 0
        classify = self.y.dim() == 1  # labels (B,): a classifier; (B, T): language data, no accuracy
        seed = None if round is None else data_seed(self.seed, round)
        walk = self._walk if seed is None else BatchOrder(self.x.shape[0], self.cfg.batch_size, seed)
        if recorder is not None:
            recorder.capture(0, self.model, self.opt)
        for step in range(self.cfg.steps):
            idx = walk.next()  # the global batch: every rank draws the same
            self.samples_seen += idx.numel()
            part, scale, mine = idx, 1.0, idx.numel()
            if self.group is not None:
                part, scale, mine = self.group.share(idx)
            xb, yb = self._batch(part)
            loss, logits = train_step(
                self.net, self.opt, xb, yb, self.cfg, None if seed is None else step_seed(seed, step), scale=scale
            )
            right = int((logits.argmax(dim=-1) == yb).sum()) if classify else 0
            if self.group is not None:  # the global batch's mean loss and hits, summed over the ranks
                loss, right = self.group.batch_stats(loss, right, mine, idx.numel())
            if classify:
                correct += right
                seen += idx.numel()
            if recorder is not None:
                recorder.capture(step + 1, self.model, self.opt)
            total += loss.item()
            if on_step is not None:
                on_step(step + 1, total / (step + 1))
        delta = global_params.cpu() - flat_params(self.model).cpu()  # (d,)
        return LocalResult(
            delta=delta,
            loss=total / self.cfg.steps,
            steps=self.cfg.steps,
            samples=self.samples_seen - start_seen,
            epoch=self.samples_seen / self.x.shape[0],
            accuracy=correct / seen if seen else None,
        )


@torch.no_grad()
def evaluate(model: nn.Module, x: Tensor, y: Tensor, *, batch_size: int = 256) -> tuple[float, float | None]:
    """Mean loss and accuracy (``None`` for language data) over ``(x, y)``."""
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    language = y.dim() > 1
    for i in range(0, x.shape[0], batch_size):
        xb, yb = x[i : i + batch_size], y[i : i + batch_size]
        logits = model(xb)
        loss_sum += loss_fn(logits, yb).item() * yb.numel()
        if not language:
            correct += int((logits.argmax(dim=-1) == yb).sum())
        count += yb.numel()
    return loss_sum / count, (None if language else correct / count)


def local_config(options: dict) -> LocalConfig:
    return build_config(LocalConfig, options, what="local training")
