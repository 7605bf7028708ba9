"""Benchmark: sparse, low-bit updates under attack, at equal loss.

The communication bench's equal-loss measure (bytes each worker sends to reach the dense
baseline's validation loss + 2%: synchronous data parallelism, H=1, fp32, 600 steps on
digits) for SparseLoCo (H=30, 2% chunk-wise top-k, 2-bit, decayed error feedback 0.95,
``fedavg``) with 2 of 8 workers (25%) attacking: sign-flip, IPM, ALIE, gaussian and
scaled updates (attackers send through the plain codec: no error feedback), and without
attackers. The aggregator is the run's default for a sparse codec (none is named:
``run_defaults.default_aggregator``), after the norm bound. Each seed has its own dense
baseline (its own target); a run that does not reach the target within 5x the baseline's
steps (100 rounds on digits, 30 on the transformer) is a miss, and the most inner steps a run
took against dense's is printed. Reported per attack: the median and the worst seed's
reduction against dense, and the rounds.

Target: >= 1000x fewer bytes than dense under every attack (issue: "sparse + robust").

``--task transformer``: the communication bench's transformer task (4 workers, 1 attacking;
SparseLoCo H=50, 1%, outer lr 2, chosen on seeds 5-6), target 3000x; its JSON is ``sparse_robust_transformer.json``.

``--rules`` adds rows for other rules (e.g. ``trend+centered-clip``, the dense default).

``--seeds`` takes ``0-4`` (the default), ``0,2`` or ``3``; ``--out PATH`` writes the JSON there
instead of ``bench/results/`` (a smoke run's).

Usage: python bench/sparse_robust.py [--task digits|transformer] [--seeds 0-4] [--attacks ...] [--rules SPEC;...]
       [--out PATH]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from _common import parse_seeds, print_table, spread, write_json
from _sims import machine
from aitbc import run_defaults
from communication import TASKS, run, sparseloco

ATTACKS = ["none", "sign-flip", "ipm", "alie", "gaussian", "scale"]
# task: (H, density, target reduction, outer lr); each the communication bench's best SparseLoCo
# setting. The transformer's outer lr 2 was chosen on seeds 5 and 6 (1, 2 and 3 tried: 2 reached
# the target in 19-20 rounds against 23 at 1), the digits' 1 likewise (2 diverged on seed 6): the
# reported seeds 0-4 played no part in the choice.
PLANS = {"digits": (30, 0.02, 1000, 1.0), "transformer": (50, 0.01, 3000, 2.0)}
# A run that has not reached the target within MAX_FACTOR x the dense baseline's inner steps is a
# miss; each row keeps the inner steps it took against dense's (``steps_factor``): the compute
# paid for the bytes saved.
MAX_FACTOR = 5.0


def attackers(task: str) -> int:
    return TASKS[task][0]["workers"] // 4  # 25%


def baseline(seed: int, task: str, steps: int) -> tuple[float, float, float]:
    """The dense run's final loss after ``steps`` steps, its bytes per worker, and its wall seconds."""
    shared, _ = TASKS[task]
    t = time.perf_counter()
    base, _, _ = run(dict(**{**shared, "seed": seed}, local_steps=1, rounds=steps, outer="fedavg", compression="none"))
    return base.final_val_loss, base.bytes_up / shared["workers"], time.perf_counter() - t


def attacked(
    seed: int, attack: str, rule: str | None, target: float, dense_bytes: float, task: str, steps: int
) -> dict[str, Any]:
    """One SparseLoCo run under ``attack`` until ``target``, within MAX_FACTOR x ``steps``
    inner steps (the dense baseline's)."""
    shared, _ = TASKS[task]
    h, density, _, outer_lr = PLANS[task]
    c = sparseloco(h, density=density, outer_lr=outer_lr)
    c.pop("label")
    opts = {**shared, "seed": seed, "aggregator": rule, **c}
    opts["rounds"] = max(1, int(MAX_FACTOR * steps / c["local_steps"]))
    if attack != "none":
        opts.update(attack=attack, byzantine=attackers(task))
    t = time.perf_counter()
    r, metrics, _ = run(dict(**opts, target_loss=target, stop_at_target=True))
    reached = r.bytes_to_target is not None
    workers = shared["workers"]
    return dict(
        seed=seed,
        attack=attack,
        rule=r.config.aggregator,
        reached=reached,
        rounds=r.rounds_to_target if reached else r.rounds,
        val_loss=r.final_val_loss,
        best_loss=min(m["val_loss"] for m in metrics),
        target=target,
        bytes_per_worker=(r.bytes_to_target if reached else r.bytes_up) / workers,
        reduction=dense_bytes / (r.bytes_to_target / workers) if reached else None,
        steps_factor=(r.rounds_to_target if reached else r.rounds) * h / steps,
        wall_s=time.perf_counter() - t,
    )


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rule and attack: median and worst reduction over the seeds (a miss counts as 0),
    the seed that gave the worst, and the rounds' median and worst."""
    out = []
    for key in dict.fromkeys((r["rule"], r["attack"]) for r in rows):
        mine = [r for r in rows if (r["rule"], r["attack"]) == key]
        red = spread({r["seed"]: r["reduction"] or 0.0 for r in mine})
        rounds = spread({r["seed"]: float(r["rounds"]) for r in mine}, higher_is_better=False)
        assert red is not None and rounds is not None  # each key has a row
        out.append(
            dict(
                rule=key[0],
                attack=key[1],
                seeds=len(mine),
                reached=sum(r["reached"] for r in mine),
                median=red.median,
                worst=red.worst,
                worst_seed=red.worst_seed,
                rounds_median=rounds.median,
                rounds_worst=int(rounds.worst),
            )
        )
    return out


def fmt(x: float) -> str:
    return "miss" if x == 0 else f"{x:.0f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-4", help="e.g. 0-4 (the default), 0,2 or 3")
    ap.add_argument("--task", default="digits", choices=sorted(PLANS))
    ap.add_argument("--attacks", default=",".join(ATTACKS))
    ap.add_argument("--rules", default="", help="rules beside the sparse default, ';'-separated")
    ap.add_argument("--steps", type=int, help="the dense baseline's steps (default the task's: digits 600)")
    ap.add_argument("--out", type=Path, help="write the JSON here, not under bench/results/")
    args = ap.parse_args()
    steps = args.steps or TASKS[args.task][1]
    if steps < 1:
        ap.error(f"--steps must be at least 1, got {steps}")
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as e:
        ap.error(str(e))
    torch.manual_seed(0)
    rules: list[str | None] = [None, *(r for r in args.rules.split(";") if r)]
    rows: list[dict[str, Any]] = []
    bases = []
    for seed in seeds:
        loss, dense_bytes, wall = baseline(seed, args.task, steps)
        bases.append(dict(seed=seed, loss=loss, bytes_per_worker=dense_bytes, wall_s=wall))
        print(f"seed {seed}: dense baseline loss {loss:.4f} (target {1.02 * loss:.4f}), {wall:.0f} s", flush=True)
        for rule in rules:
            for attack in args.attacks.split(","):
                row = attacked(seed, attack, rule, 1.02 * loss, dense_bytes, args.task, steps)
                rows.append(row)
                print(
                    f"  {row['rule']:24s} {attack:10s} rounds {row['rounds']:3d} loss {row['val_loss']:.4f} "
                    f"{'reached' if row['reached'] else 'MISSED'} {fmt(row['reduction'] or 0)} ({row['wall_s']:.0f} s)",
                    flush=True,
                )
        report(rows, bases, args)


def report(rows: list[dict[str, Any]], bases: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The summary table and verdict over the seeds done so far, and the JSON (rewritten
    after every seed, so a run cut short still leaves its finished seeds)."""
    seeds = ",".join(str(b["seed"]) for b in bases)
    table = summary(rows)
    h, density, goal, outer_lr = PLANS[args.task]
    workers = TASKS[args.task][0]["workers"]
    print_table(
        f"sparse + robust: SparseLoCo H={h}, {density:.0%}, 2-bit, outer lr {outer_lr:g} on {args.task}, "
        f"{attackers(args.task)} of "
        f"{workers} attacking, seeds {seeds}",
        ["rule", "attack", "reached", "reduction median", "reduction worst (seed)", "rounds median", "rounds worst"],
        [
            [s["rule"], s["attack"], f"{s['reached']}/{s['seeds']}", fmt(s["median"])]
            + [f"{fmt(s['worst'])} (s{s['worst_seed']})", s["rounds_median"], s["rounds_worst"]]
            for s in table
        ],
    )
    default = run_defaults.default_aggregator(sparseloco(h)["compression"])
    steps = max((r["steps_factor"] for r in rows if r["reached"]), default=None)
    if steps is not None:
        print(f"inner steps to the target: at most {steps:.1f}x the dense baseline's (over every reached run)")
    mine = [s for s in table if s["rule"] == default and s["attack"] != "none"]
    ok = all(s["median"] >= goal for s in mine)
    worst = min(mine, key=lambda s: s["worst"], default=None)
    print(
        f"default for sparse codecs ({default}): median >= {goal}x under every attack: "
        f"{'met' if ok else 'MISSED'}; worst seed over all attacks "
        + ("-" if worst is None else f"{fmt(worst['worst'])} ({worst['attack']}, seed {worst['worst_seed']})")
    )
    name = "sparse_robust" if args.task == "digits" else f"sparse_robust_{args.task}"
    payload = {"machine": machine(), "args": vars(args), "baselines": bases, "rows": rows, "summary": table}
    write_json(name, payload, path=args.out)


if __name__ == "__main__":
    main()
