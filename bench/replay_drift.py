"""Benchmark: how far an honest re-run drifts on another thread count, against what cheats move.

A worker trains a round with one torch thread and commits its states (training/proof.py);
a verifier re-runs every committed interval with 2 and 8 threads. Kernels then sum in
another order, so the states are not bit-exact: the table gives the largest relative
distance over the round's intervals, of the parameters (``|replayed - revealed| /
|revealed - start|``) and of the optimizer moments (``proof.optimizer_error``), next to
what leaving out one step of an interval and forging Adam's moments (x1.5) move them, and
the drift bound the check measures for the interval (issue 33: ``proof.drift_bound`` of
``proof.probe_drift``; the smallest over the round's intervals). An honest miss past the
tolerance (``proof.DEFAULT_TOLERANCE``) but within the bound is drift (unpaid, not slashed);
only past the bound is it a fault. The bound must sit above every honest drift; cheats
past it are proved (the optimizer's step count proves a left-out step under Adam anyway).

Models: the built-in cnn (28x28 images), transformer (the live default, 64 tokens) and an
mlp (hidden 512), on random data; H = 20 (2-step intervals) and H = 160 (10-step ones).

Usage: python bench/replay_drift.py
"""

from __future__ import annotations

import copy
import time

import torch

from _common import print_table, write_json
from _sims import machine
from aitbc.training.batches import data_seed
from aitbc.training.checkpoint import flat_params
from aitbc.training.checks import (
    DEFAULT_TOLERANCE,
    Replay,
    drift_bound,
    optimizer_error,
    probe_drift,
    relative_error,
    replay,
)
from aitbc.training.data_spec import DataSpec
from aitbc.training.local import LocalConfig, LocalTrainer
from aitbc.training.models import build_model
from aitbc.training.proof import Recorder, TrainState


def problem(kind: str):
    torch.manual_seed(0)
    if kind == "cnn":
        spec, x = DataSpec("classification", (1, 28, 28), 10), torch.randn(256, 1, 28, 28)
        y, opts = torch.randint(0, 10, (256,)), {}
    elif kind == "transformer":
        spec, x = DataSpec("language", (64,), 256), torch.randint(0, 256, (256, 64))
        y, opts = x.roll(-1, 1), {}
    else:
        spec, x = DataSpec("classification", (784,), 10), torch.randn(512, 784)
        y, opts = torch.randint(0, 10, (512,)), {"hidden": 512}
    torch.manual_seed(1)
    return build_model(kind, spec, opts), x, y


def measure(kind: str, steps: int, threads: int) -> dict:
    torch.set_num_threads(1)
    model, x, y = problem(kind)
    cfg = LocalConfig(steps=steps, batch_size=64, lr=1e-3)
    tr = LocalTrainer(copy.deepcopy(model), x, y, copy.deepcopy(cfg), seed=5)
    start = flat_params(model)
    tr.train_round(start, round=1)  # a round first: Adam carries state into the recorded one
    rec = Recorder(steps)
    tr.train_round(start, round=2, recorder=rec)
    b = sorted(rec.states)
    torch.set_num_threads(threads)
    r = Replay(copy.deepcopy(model), x, y, copy.deepcopy(cfg), data_seed(5, 2))
    params = optim = 0.0
    bound = float("inf")
    t0 = time.perf_counter()
    for i in range(len(b) - 1):
        got = replay(r, rec.states[b[i]], b[i + 1] - b[i])
        params = max(params, relative_error(got.params, rec.states[b[i + 1]].params, rec.states[b[i]].params))
        optim = max(optim, optimizer_error(got.optim, rec.states[b[i + 1]].optim))
        bound = min(bound, drift_bound(probe_drift(r, rec.states[b[i]], b[i + 1] - b[i], got)[0]))
    seconds = time.perf_counter() - t0
    s, e = rec.states[b[3]], rec.states[b[4]]
    short = replay(r, s, b[4] - b[3] - 1)
    forged = TrainState(e.step, e.params, {k: v * 1.5 if "exp_avg" in k else v for k, v in e.optim.items()})
    return {
        "model": kind,
        "steps": steps,
        "interval_steps": b[1],
        "threads": threads,
        "honest_params": params,
        "honest_optim": optim,
        "skip_one_step": relative_error(short.params, e.params, s.params),
        "forged_moments": optimizer_error(forged.optim, e.optim),
        "drift_bound": bound,
        "replay_seconds": seconds,
    }


def main() -> None:
    rows = [measure(k, h, t) for k in ("cnn", "transformer", "mlp") for h in (20, 160) for t in (2, 8)]
    print_table(
        f"replay drift: trained with 1 thread, re-run with 2 or 8 (tolerance {DEFAULT_TOLERANCE:g})",
        [
            "model",
            "H",
            "k",
            "threads",
            "honest params",
            "honest optim",
            "drift bound",
            "one step left out",
            "moments x1.5",
        ],
        [
            [
                r["model"],
                r["steps"],
                r["interval_steps"],
                r["threads"],
                f"{r['honest_params']:.1e}",
                f"{r['honest_optim']:.1e}",
                f"{r['drift_bound']:.2g}",
                f"{r['skip_one_step']:.1e}",
                f"{r['forged_moments']:.1e}",
            ]
            for r in rows
        ],
    )
    honest = max(max(r["honest_params"], r["honest_optim"]) for r in rows)
    cheat = min(min(r["skip_one_step"], r["forged_moments"]) for r in rows)
    ok = all(max(r["honest_params"], r["honest_optim"]) < r["drift_bound"] for r in rows)
    print(
        f"largest honest drift {honest:.1e}, smallest cheat {cheat:.1e}; every honest drift "
        f"{'within' if ok else 'NOT within'} its interval's drift bound (no false accusation), "
        f"smallest bound {min(r['drift_bound'] for r in rows):.2g}; tolerance for pay {DEFAULT_TOLERANCE:g}"
    )
    write_json(
        "replay_drift",
        {"machine": machine(), "tolerance": DEFAULT_TOLERANCE, "separates": ok, "rows": rows},
    )


if __name__ == "__main__":
    main()
