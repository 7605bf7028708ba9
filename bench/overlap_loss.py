"""Benchmark: what overlapping rounds (``distribute --overlap 1``) cost in loss.

Synchronous rounds: round r's workers train from the model round r-1 made, and the
aggregate is applied to it. Overlap 1 (one-step delay, as Streaming/Eager DiLoCo overlap
communication with compute): a worker trains round r from the newest model there was when
it began, round r-2's, and the coordinator applies round r's aggregate to round r-1's
model, each such update scaled by ``w``: the run's staleness rule at one round late
(``RunConfig.overlap_staleness``, ``polynomial:a=1``: w = 1/2). Round 1 is never stale.

Why the weight: with long local training (H steps reaching near a local optimum x*) an
update is about ``x* - p_{r-2}``, so ``p_r = p_{r-1} + w (x* - p_{r-2})``; the error
``e_r = e_{r-1} - w e_{r-2}`` has roots of ``z^2 - z + w``: |z| = sqrt(w) for w > 1/4. At
w = 1 it never shrinks (the model circles); w = 1/4 shrinks it fastest (by 1/2 a round);
with short local training (small steps along the gradient) the delay costs little at w = 1.

The eager start (what a live worker does since migration 0011, as "eager updates" for
overlapped DiLoCo): the worker trains round r from round r-2's model less its own round
r-1 update, i.e. where its own last round ended, moved by what the global model gained
since; that start is about round r-1's model, so the update counts in full (w = 1):
``p_r = p_{r-1} + (x* - (p_{r-2} + u_{r-1}))`` with ``u_{r-1} ~ p_{r-1} - p_{r-2}``.

The same simulator code as ``aitbc simulate`` (training, codec, rule, outer step) drives
the rounds in one process: digits MLP, 2 workers, H = 50, mean, fedavg, the live
utilization bench's settings. Prints the validation loss per round for each schedule.

Usage: python bench/overlap_loss.py [--rounds 30] [--local-steps 50] [--workers 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import print_table, write_json
from _sims import machine
from aitbc.sim.config import SimConfig
from aitbc.sim.runner import Simulation


def play(args: argparse.Namespace, weight: float | None, eager: bool = False) -> list[float]:
    """Validation loss after each round; ``weight`` None: synchronous rounds; ``eager``:
    each worker starts from the model before the round's less its own previous update."""
    cfg = SimConfig(
        model="mlp",
        dataset="digits",
        workers=args.workers,
        rounds=args.rounds,
        local_steps=args.local_steps,
        batch_size=32,
        lr=1e-3,
        aggregator="mean",
        outer="fedavg",
        seed=args.seed,
    )
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulation(cfg, home=Path(tmp) / "home", out_dir=Path(tmp) / "run")
        ids = list(range(cfg.workers))
        weights = [float(sim.samples[i]) for i in ids]
        history = [sim.params]  # p_0, p_1, ...: the published models
        losses = [sim.evaluate(sim.params)[0]]
        prior: dict[int, Any] = {}  # worker -> its last update (start - end)
        for r in range(1, cfg.rounds + 1):
            stale = weight is not None and r >= 2
            start = history[-2] if stale else history[-1]
            starts = {i: start - prior[i] if stale and eager else start for i in ids}
            sent = sim.work(ids, starts, 0)
            prior = {s.worker: s.update for s in sent}
            scale = weight if stale else 1.0
            sim.apply([scale * s.update for s in sent], weights)
            history.append(sim.params)
            losses.append(sim.evaluate(sim.params)[0])
        return losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--local-steps", type=int, default=50)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    schedules: dict[str, tuple[float | None, bool]] = {
        "synchronous": (None, False),
        "overlap, eager start, w=1 (live workers)": (1.0, True),
        "overlap, stale start, w=1": (1.0, False),
        "overlap, stale start, w=0.5 (the run's rule for it)": (0.5, False),
        "overlap, stale start, w=0.25": (0.25, False),
    }
    curves = {name: play(args, w, eager) for name, (w, eager) in schedules.items()}
    shown = sorted({1, 2, 3, 5, 10, 15, 20, args.rounds} & set(range(1, args.rounds + 1)))
    print_table(
        f"validation loss per round: digits MLP, {args.workers} workers, H = {args.local_steps}, mean, fedavg",
        ["schedule", *[f"r{r}" for r in shown], "best", "rounds to sync's final"],
        [
            [
                name,
                *[f"{c[r]:.3f}" for r in shown],
                f"{min(c):.3f}",
                next((str(r) for r, v in enumerate(c) if v <= curves["synchronous"][-1]), "-"),
            ]
            for name, c in curves.items()
        ],
    )
    out: dict[str, Any] = {
        "machine": machine(),
        "args": vars(args),
        "curves": curves,
        "wall_s": time.perf_counter() - t0,
    }
    write_json("overlap_loss", out)


if __name__ == "__main__":
    main()
