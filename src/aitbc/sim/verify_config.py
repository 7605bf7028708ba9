"""What one simulated verified run is asked to do (:class:`VerifyConfig`, every option
checked on construction), and the cheats a worker may play (``CHEATS``)."""

from __future__ import annotations

from dataclasses import dataclass

from aitbc import run_defaults
from aitbc.errors import UsageError

CHEATS = ("skip", "skip-naive", "wrong-shard", "wrong-random", "copy", "stale", "noise", "zero")


@dataclass(kw_only=True)
class VerifyConfig:
    """One simulated verified run: ``cheaters`` of the ``workers`` cheat with ``cheat``."""

    model: str = "mlp"
    dataset: str = "digits"
    workers: int = 16
    cheat: str | None = None  # one of CHEATS; None: every worker is honest
    cheaters: int = 4
    rate: float = 0.1  # verification rate: expected share of each update's steps re-run
    rounds: int = 50
    local_steps: int = run_defaults.LOCAL_STEPS
    batch_size: int = run_defaults.BATCH_SIZE
    lr: float = run_defaults.LR
    inner_opt: str = run_defaults.INNER_OPT
    compression: str = "int8"  # codec spec NAME[:k=v,...]
    error_feedback: bool = False
    skip_fraction: float = 0.5  # skip: share of the intervals faked (at least one)
    stale_by: int = 2  # stale: rounds behind the global model
    copy_noise: float = 0.01  # copy: noise norm as a share of the copied update's norm
    eval_samples: int = 1024
    seed: int = 0
    stop_when_caught: bool = False  # end the run once every cheater is caught (detection trials)
    worker_threads: int = 1  # torch threads each worker trains on
    verify_threads: int = 1  # torch threads the verifier re-runs on ...
    state_threads: bool = True  # ... unless the commitment states the worker's (then on those: bit-exact)

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise UsageError(f"workers must be at least 2, got {self.workers}")
        if self.rounds < 1 or self.local_steps < 1 or self.batch_size < 1:
            raise UsageError("rounds, local_steps and batch_size must be at least 1")
        if self.cheat is not None and self.cheat not in CHEATS:
            raise UsageError(f"unknown cheat {self.cheat!r}; allowed: {', '.join(CHEATS)}")
        n_cheat = 0 if self.cheat is None else self.cheaters
        if not 0 <= n_cheat < self.workers:
            raise UsageError(f"cheaters must be between 0 and workers-1 ({self.workers - 1}), got {self.cheaters}")
        if not 0 <= self.rate <= 1:
            raise UsageError(f"verification rate must be in [0, 1], got {self.rate}")
        if not 0 < self.skip_fraction <= 1:
            raise UsageError(f"skip_fraction must be in (0, 1], got {self.skip_fraction}")
        if self.stale_by < 1:
            raise UsageError(f"stale_by must be at least 1, got {self.stale_by}")
        if not self.copy_noise >= 0:
            raise UsageError(f"copy_noise must be >= 0, got {self.copy_noise}")
        if self.worker_threads < 1 or self.verify_threads < 1:
            raise UsageError("worker_threads and verify_threads must be at least 1")
