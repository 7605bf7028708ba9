"""Honest drift across configurations: what a replay on other threads makes of honest work.

One honest worker and one cheater training on random data of the shard's shape each train
a round; a verifier re-runs every interval of both (:func:`~aitbc.training.checks.check_interval`)
and counts the outcomes: where honest drift ends and a cheat begins, for one model,
optimizer, lr and pair of thread counts (what ``bench/verification.py`` sweeps).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Literal, TypedDict

import torch
from torch import Tensor

from aitbc import run_defaults
from aitbc.errors import UsageError
from aitbc.json_value import JSONObject
from aitbc.training.batches import data_seed
from aitbc.training.checkpoint import flat_params
from aitbc.training.checks import Replay, check_interval, replay_threads
from aitbc.training.data_spec import DataSpec
from aitbc.training.local import LocalConfig, LocalTrainer
from aitbc.training.models import build_model
from aitbc.training.proof import Recorder

Task = Literal["classification", "language"]
# model: (task, one sample's shape, classes or vocabulary, options) in two sizes: "small" (a
# benchmark's default, seconds a trial on 2 cores) and "large" (the built-in defaults, or near:
# kernels that split across threads, so other thread counts sum in other orders)
DRIFT_MODELS: dict[str, dict[str, tuple[Task, tuple[int, ...], int, Mapping[str, object]]]] = {
    "small": {
        "mlp": ("classification", (64,), 10, {"hidden": [64]}),
        "cnn": ("classification", (1, 16, 16), 10, {"channels": [8, 16], "hidden": 32}),
        "transformer": ("language", (32,), 64, {"context": 32, "d_model": 32, "n_layers": 1, "n_heads": 2}),
    },
    "large": {
        "mlp": ("classification", (784,), 10, {"hidden": [256]}),
        "cnn": ("classification", (1, 28, 28), 10, {}),
        "transformer": ("language", (64,), 256, {}),
    },
}


@dataclass(kw_only=True)
class DriftConfig:
    """One honest worker on ``worker_threads`` threads and a cheater training on random data
    of the shard's shape, each re-run interval by interval by a verifier on
    ``verify_threads`` (or, with ``state_threads``, on the count the commitment states)."""

    model: str = "mlp"
    optimizer: str = run_defaults.INNER_OPT
    lr: float = run_defaults.LR
    worker_threads: int = 2
    verify_threads: int = 1
    state_threads: bool = False
    local_steps: int = 20
    batch_size: int = 32
    samples: int = 128
    size: str = "small"  # DRIFT_MODELS' sizes
    seed: int = 0

    def __post_init__(self) -> None:
        if self.size not in DRIFT_MODELS:
            raise UsageError(f"unknown size {self.size!r}; allowed: {', '.join(DRIFT_MODELS)}")
        if self.model not in DRIFT_MODELS[self.size]:
            raise UsageError(f"unknown model {self.model!r}; allowed: {', '.join(DRIFT_MODELS[self.size])}")
        if self.worker_threads < 1 or self.verify_threads < 1:
            raise UsageError("worker_threads and verify_threads must be at least 1")


def _drift_problem(cfg: DriftConfig) -> tuple[torch.nn.Module, Tensor, Tensor]:
    task, shape, classes, opts = DRIFT_MODELS[cfg.size][cfg.model]
    gen = torch.Generator().manual_seed(cfg.seed)
    if task == "language":
        x = torch.randint(0, classes, (cfg.samples, *shape), generator=gen)
        y = x.roll(-1, 1)
    else:
        x = torch.randn((cfg.samples, *shape), generator=gen)
        y = torch.randint(0, classes, (cfg.samples,), generator=gen)
    torch.manual_seed(cfg.seed + 1)
    return build_model(cfg.model, DataSpec(task, shape, classes), opts), x, y


class Judged(TypedDict):
    """One round's intervals, judged: how many of each outcome, and the distances."""

    passed: int
    drift: int
    fault: int
    intervals: int
    max_error: float  # the largest interval distance (0.0: every interval bit-exact)
    min_error: float  # the smallest (inf: no interval, or none with a distance)


class DriftTrial(TypedDict):
    config: JSONObject  # the DriftConfig
    honest: Judged
    cheat: Judged
    seconds: float


def drift_trial(cfg: DriftConfig) -> DriftTrial:
    """Every interval of one honest round (after a round that gives the optimizer state)
    and of one wrong-data cheater's round, judged: counts of each outcome, the largest
    honest miss and the smallest cheat distance."""
    t0 = time.perf_counter()
    model, x, y = _drift_problem(cfg)
    local = LocalConfig(steps=cfg.local_steps, batch_size=cfg.batch_size, optimizer=cfg.optimizer, lr=cfg.lr)
    start = flat_params(model)
    judged: dict[str, Judged] = {}
    junk = torch.Generator().manual_seed(cfg.seed + 7)
    classes = DRIFT_MODELS[cfg.size][cfg.model][2]
    if x.is_floating_point():
        fake_x = torch.randn(x.shape, generator=junk)
    else:
        fake_x = torch.randint(0, classes, x.shape, generator=junk)
    for who, tx in (("honest", x), ("cheat", fake_x)):
        trainer = LocalTrainer(copy.deepcopy(model), tx, y, copy.deepcopy(local), seed=5)
        rec = Recorder(cfg.local_steps)
        with replay_threads(cfg.worker_threads):
            trainer.train_round(start, round=1)
            trainer.train_round(start, round=2, recorder=rec)
        c = rec.commitment(None, None, threads=cfg.worker_threads if cfg.state_threads else None)
        b = sorted(rec.states)
        r = Replay(copy.deepcopy(model), x, y, copy.deepcopy(local), data_seed(5, 2))
        counts = {"passed": 0, "drift": 0, "fault": 0}
        worst = 0.0
        least = float("inf")
        with replay_threads(cfg.verify_threads):
            for i in range(len(b) - 1):
                v = check_interval(c, i, rec.states[b[i]], rec.states[b[i + 1]], r)
                counts[v.outcome] += 1
                err = v.error if v.error is not None else float("inf")
                worst, least = max(worst, err), min(least, err)
        judged[who] = {
            "passed": counts["passed"],
            "drift": counts["drift"],
            "fault": counts["fault"],
            "intervals": len(b) - 1,
            "max_error": worst,
            "min_error": least,
        }
    return {
        "config": asdict(cfg),
        "honest": judged["honest"],
        "cheat": judged["cheat"],
        "seconds": time.perf_counter() - t0,
    }
