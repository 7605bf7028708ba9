"""What one simulation is asked to do: :class:`SimConfig`, every option checked on
construction (a bad option fails before anything is built)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from aitbc import run_defaults
from aitbc.errors import UsageError
from aitbc.run_mode import RunMode
from aitbc.training.local import LocalConfig

MODES = tuple(RunMode)
# The attack that is none: the K workers an attack would take (the same ones, chosen by
# seed) take no part at all, their shards untrained on; the fair reference for an attacked
# run, since data leaves with the attackers (most on label-skewed shards).
ABSENT = "absent"


@dataclass(kw_only=True)
class SimConfig:
    model: str = "mlp"
    model_options: Mapping[str, object] = field(default_factory=dict)  # the model's own (a user model's: any)
    dataset: str = "digits"
    workers: int = 8
    # The training settings a live run shares take their defaults from run_defaults.
    rounds: int = run_defaults.ROUNDS
    local_steps: int = run_defaults.LOCAL_STEPS
    batch_size: int = run_defaults.BATCH_SIZE
    lr: float = run_defaults.LR
    inner_opt: str = run_defaults.INNER_OPT
    outer: str = run_defaults.OUTER
    outer_options: Mapping[str, object] = field(default_factory=dict)
    # spec: NAME[:k=v,...][+NAME[:k=v,...]]; None: run_defaults.default_aggregator(compression)
    aggregator: str | None = None
    compression: str = run_defaults.COMPRESSION  # spec: NAME[:k=v,...]
    error_feedback: bool = run_defaults.ERROR_FEEDBACK
    attack: str | None = None  # spec: NAME[:k=v,...], or ABSENT
    byzantine: int = 0
    mode: str = run_defaults.MODE
    deadline: float | None = None  # sync: virtual seconds a round waits at most
    quorum: int = 1  # sync: updates a round waits for even past the deadline
    norm_clip: float = 3.0  # updates over this x the round's median norm are scaled down (aitbc.core.norms)
    norm_reject: float = 1000.0  # ... over this x are rejected
    max_staleness: int = 4  # async: older updates are dropped
    staleness: str = "polynomial"  # async: down-weighting rule spec
    buffer: int | None = None  # async: updates per aggregation (default: half the workers)
    topology: str = "ring"  # gossip: ring or random:K
    alpha: float | None = None
    seed: int = 0
    speeds: str = "1"
    bandwidth: str = "100"  # Mbit/s per worker
    latency: str = "20"  # ms per transfer
    ref_tflops: float = 25.0  # reference device (speed 1.0) effective throughput
    step_overhead_ms: float = 1.0  # fixed cost of one inner step at speed 1.0
    eval_samples: int = 1024
    eval_every: int = run_defaults.EVAL_EVERY
    max_bytes: int = run_defaults.MAX_CORPUS_BYTES  # language corpora cap
    target_loss: float | None = None
    target_accuracy: float | None = None
    stop_at_target: bool = False  # end the run at the first evaluation that reaches the target

    def __post_init__(self) -> None:
        if self.aggregator is None:
            self.aggregator = run_defaults.default_aggregator(self.compression)
        for name in ("workers", "rounds", "eval_samples", "max_bytes", "eval_every", "quorum"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not self.ref_tflops > 0:
            raise UsageError(f"--ref-tflops must be > 0, got {self.ref_tflops}")
        if not self.step_overhead_ms >= 0:
            raise UsageError(f"--step-overhead-ms must be >= 0, got {self.step_overhead_ms}")
        if self.mode not in MODES:
            raise UsageError(f"unknown --mode {self.mode!r}; allowed: {', '.join(MODES)}")
        if not 0 <= self.byzantine < self.workers:
            raise UsageError(f"--byzantine must be between 0 and workers-1 ({self.workers - 1}), got {self.byzantine}")
        if self.byzantine and not self.attack:
            raise UsageError("--byzantine K needs an --attack (e.g. sign-flip, gaussian, alie, ipm)")
        if self.attack and not self.byzantine:
            raise UsageError(f"--attack {self.attack} needs --byzantine K > 0 attackers")
        if self.attack is not None and self.attack.partition(":")[0].strip() == ABSENT and self.attack != ABSENT:
            raise UsageError(f"--attack {ABSENT} takes no options, got {self.attack!r}")
        if self.quorum > self.present_workers:
            raise UsageError(f"--quorum {self.quorum} exceeds the {self.present_workers} workers taking part")
        if self.deadline is not None and not (self.deadline > 0 and math.isfinite(self.deadline)):
            raise UsageError(f"--deadline must be > 0 seconds, got {self.deadline}")
        if self.max_staleness < 0:
            raise UsageError(f"--max-staleness must be >= 0, got {self.max_staleness}")
        if self.buffer is not None and not 1 <= self.buffer <= self.present_workers:
            raise UsageError(f"--buffer must be between 1 and {self.present_workers}, got {self.buffer}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise UsageError(f"--target-accuracy must be in (0, 1], got {self.target_accuracy}")
        kind, _, k = self.topology.partition(":")
        if not (self.topology == "ring" or (kind == "random" and k.isdigit() and 1 <= int(k) < self.present_workers)):
            raise UsageError(
                f"unknown --topology {self.topology!r}; allowed: ring, random:K with 1 <= K < workers taking part "
                f"({self.present_workers})"
            )
        if self.target_loss is not None and not self.target_loss > 0:
            raise UsageError(f"--target-loss must be > 0, got {self.target_loss}")

    @property
    def absent(self) -> bool:
        """The attackers take no part (``--attack absent``)."""
        return self.attack == ABSENT

    @property
    def present_workers(self) -> int:
        """Workers that train and send: all but the absent ones."""
        return self.workers - self.byzantine if self.absent else self.workers

    @property
    def aggregator_spec(self) -> str:
        """The aggregator spec, the codec's default filled in."""
        return self.aggregator or run_defaults.default_aggregator(self.compression)

    def updates_per_aggregation(self) -> int:
        """How many updates one aggregation sees when nobody is late or rejected."""
        mode, n = RunMode(self.mode), self.present_workers
        if mode.buffered:
            return self.buffer or max(1, n // 2)
        if mode.peer_to_peer:
            kind, _, k = self.topology.partition(":")
            return 1 + (int(k) if kind == "random" else min(2, n - 1))
        return n

    def local_config(self) -> LocalConfig:
        """Each worker's local training settings."""
        try:
            return LocalConfig(steps=self.local_steps, batch_size=self.batch_size, optimizer=self.inner_opt, lr=self.lr)
        except ValueError as e:
            raise UsageError(str(e)) from None
