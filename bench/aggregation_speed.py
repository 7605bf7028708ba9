"""Benchmark: milliseconds per aggregation for every rule, ours and Flower's side by side.

``n`` updates of ``d`` float32 parameters (default n=32, d=1M and 10M), the public entry
point (``parse_aggregator(spec)(updates)``: input checks included), the median of
``--repeats`` timed calls after one warm-up call. Torch uses its default thread count.

Targets: each rule within 10x the time of ``mean`` (the coordinate-sort rules median,
trimmed-mean and bulyan within 30x), and at least 3x faster than Flower's implementation
of the same rule (10x for Bulyan). Flower (``pip install flwr``, benchmark only) gets the
same data as one single-layer list per update; where it is missing the column says so.
Flower's Krum and Bulyan compute distances in Python loops; a Flower call predicted (from
the smaller size) to take longer than ``--flower-budget`` seconds is skipped, and slow
calls are repeated only while they fit in that budget (the table says how many ran).
The load average is recorded before and after: other work on the machine slows the
many small parallel ops of the coordinate rules far more than one big matrix product.

Usage: python bench/aggregation_speed.py [--sizes 1e6,1e7] [--n 32] [--repeats 3] [--quick]
Writes bench/results/aggregation_speed.json (aggregation_speed_quick.json with --quick).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from _common import print_table, write_json
from aitbc.core.aggregation import parse_aggregator

# Coordinate sorts (as the final rule) get 30x mean, as the issue sets; the rest 10x.
SORT_RULES = {"median", "trimmed-mean", "bulyan"}


def rules(n: int, f: int, beta: float) -> list[tuple[str, str]]:
    """``(label, spec)`` for every rule; f is valid for Bulyan (n >= 4f+3)."""
    return [
        ("mean", "mean"),
        ("median", "median"),
        ("trimmed-mean", f"trimmed-mean:beta={beta}"),
        ("krum", f"krum:f={f}"),
        ("multi-krum", f"multi-krum:f={f}"),
        ("bulyan", f"bulyan:f={f}"),
        ("centered-clip", "centered-clip:tau=1,iters=3"),
        ("geometric-median", "geometric-median"),
        ("trend+centered-clip", f"trend:f={f}+centered-clip"),
        ("default", f"trend:f={f}+centered-clip:iters=1,norm=1.5"),  # run_defaults.AGGREGATOR
        ("nnm+mean", f"nnm:f={f}+mean"),
        ("bucketing+median", "bucketing:s=2+median"),
    ]


def flower_rules(n: int, f: int, beta: float) -> tuple[dict[str, Callable[[list], list]], str | None, str]:
    """Flower's counterparts by label, its version, and a note (why missing, if it is)."""
    try:
        import flwr
        from flwr.server.strategy import aggregate as fa
    except ImportError as e:
        return {}, None, f"flwr not installed ({e}); `pip install flwr` to compare"
    table = {
        "mean": lambda res: fa.aggregate(res),
        "median": lambda res: fa.aggregate_median(res),
        "trimmed-mean": lambda res: fa.aggregate_trimmed_avg(res, beta),
        "krum": lambda res: fa.aggregate_krum(res, f, 0),
        "multi-krum": lambda res: fa.aggregate_krum(res, f, n - f),
        # aggregate_bulyan pops from the list it is given: hand it a copy.
        "bulyan": lambda res: fa.aggregate_bulyan(list(res), f, fa.aggregate_krum, to_keep=0),
    }
    return table, flwr.__version__, "Flower has no centered-clip, geometric-median, nnm or bucketing in aggregate.py"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def measure(fn: Callable[[], Any], repeats: int, budget_s: float = float("inf")) -> tuple[float, int, Any]:
    """(median seconds, timed calls, last output). A first call under a second is a
    warm-up; a slower one (Flower's Krum and Bulyan) is the first measurement, and further
    calls stop when the next would pass ``budget_s`` in all."""
    first, out = timed(fn)
    times = [first] if first > 1.0 else []
    while len(times) < repeats and (sum(times) + first <= budget_s or not times):
        t, out = timed(fn)
        times.append(t)
    return statistics.median(times), len(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,1e7", help="comma-separated d values, e.g. 1e6,1e7")
    ap.add_argument("--n", type=int, default=32, help="updates per aggregation")
    ap.add_argument("--f", type=int, default=None, help="Byzantine updates for Krum/Bulyan/NNM (default (n-3)//4)")
    ap.add_argument("--beta", type=float, default=0.2, help="trimmed-mean beta (Flower's FedTrimmedAvg default)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: d=1e5, 2 repeats")
    ap.add_argument("--no-flower", action="store_true", help="skip Flower even if installed")
    ap.add_argument("--flower-budget", type=float, default=60.0, help="seconds allowed per Flower rule and size")
    args = ap.parse_args()
    sizes = [100_000] if args.quick else [int(float(s)) for s in args.sizes.split(",")]
    repeats = 2 if args.quick else args.repeats
    n = args.n
    f = (n - 3) // 4 if args.f is None else args.f
    specs = rules(n, f, args.beta)
    if args.no_flower:
        flower, flwr_version, flwr_note = {}, None, "skipped (--no-flower)"
    else:
        flower, flwr_version, flwr_note = flower_rules(n, f, args.beta)
    print(
        f"n={n}, f={f}, sizes={sizes}, repeats={repeats}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), flwr {flwr_version or '-'}: {flwr_note}",
        flush=True,
    )

    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    flower_seconds: dict[str, tuple[int, float]] = {}  # label -> (d, seconds) of the last Flower run
    for d in sizes:
        gen = torch.Generator().manual_seed(0)
        updates = torch.randn(n, d, generator=gen)  # (n, d) float32
        reference = torch.randn(d, generator=gen)  # (d,) the model's last step: trend computes every cosine
        results = [([updates[i].numpy()], 1) for i in range(n)]  # Flower: one single-layer list each
        mean_s = None
        for label, spec in specs:
            agg = parse_aggregator(spec)
            ours_s, _, ours = measure(lambda: agg(updates, reference=reference), repeats)  # noqa: B023, F821 - called at once
            mean_s = ours_s if label == "mean" else mean_s
            ratio = ours_s / mean_s if mean_s else None
            target_ratio = 30 if label.split("+")[-1] in SORT_RULES else 10  # the final rule decides
            row: dict[str, Any] = {
                "rule": label,
                "spec": str(agg),
                "d": d,
                "ms": ours_s * 1e3,
                "ratio_to_mean": ratio,
                "target_ratio": target_ratio,
                "meets_ratio": ratio is not None and ratio <= target_ratio,
                "flwr_ms": None,
                "flwr_runs": 0,
                "speedup": None,
                "target_speedup": None,
                "meets_speedup": None,
                "max_abs_diff": None,
                "coords_differing": None,
                "note": "",
            }
            if label in flower:
                row["target_speedup"] = 10 if label == "bulyan" else 3
                fn = flower[label]
                predicted = None
                if label in flower_seconds:
                    d0, s0 = flower_seconds[label]
                    predicted = s0 * d / d0
                if predicted is not None and predicted > args.flower_budget:
                    row["note"] = f"flwr skipped: ~{predicted:.0f} s predicted > {args.flower_budget:.0f} s budget"
                else:
                    try:
                        fl_s, runs, fl_out = measure(lambda: fn(results), repeats, args.flower_budget)  # noqa: B023, F821 - called at once
                    except (TypeError, ValueError, AttributeError) as e:  # an incompatible flwr version
                        row["note"] = f"flwr failed: {type(e).__name__}: {e}"
                    else:
                        flower_seconds[label] = (d, fl_s)
                        row.update(flwr_ms=fl_s * 1e3, flwr_runs=runs, speedup=fl_s / ours_s)
                        row["meets_speedup"] = fl_s / ours_s >= row["target_speedup"]
                        diff = np.abs(np.asarray(fl_out[0]) - ours.numpy())  # (d,)
                        row["max_abs_diff"] = float(diff.max())
                        row["coords_differing"] = int((diff > 1e-5).sum())
                        if runs < repeats:
                            row["note"] = f"flwr timed {runs}x (budget)"
                        del fl_out
            rows.append(row)
            del ours
            gc.collect()
            print(
                f"  {label:18s} d={d:>9,}  {row['ms']:9.1f} ms"
                + (f"  flwr {row['flwr_ms']:9.1f} ms" if row["flwr_ms"] is not None else ""),
                flush=True,
            )
        del updates, results
        gc.collect()

    def fmt(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    def verdict(ok: bool | None) -> str:
        return "-" if ok is None else ("pass" if ok else "FAIL")

    print_table(
        f"aggregation speed: ms per call, n={n}, f={f}, float32, median of {repeats} after a warm-up",
        [
            "rule",
            "d",
            "ms",
            "x mean",
            "target",
            "",
            "flwr ms",
            "speed-up",
            "target",
            "",
            "max |diff|",
            "coords >1e-5",
            "note",
        ],
        [
            [
                r["rule"],
                f"{r['d']:.0e}",
                fmt(r["ms"], ".1f"),
                fmt(r["ratio_to_mean"], ".1f"),
                f"<={r['target_ratio']}x",
                verdict(r["meets_ratio"]),
                fmt(r["flwr_ms"], ".1f"),
                fmt(r["speedup"], ".1f"),
                "-" if r["target_speedup"] is None else f">={r['target_speedup']}x",
                verdict(r["meets_speedup"]),
                fmt(r["max_abs_diff"], ".1e"),
                r["coords_differing"],
                r["note"],
            ]
            for r in rows
        ],
    )
    load_after = os.getloadavg()
    print(
        f"flwr: {flwr_version or 'not available'}; {flwr_note}. Results are compared coordinate by "
        "coordinate; Bulyan may differ where two values are equally close to the median in float32 "
        "(we keep the smaller, Flower's argpartition either)."
    )
    print(
        f"load average (1, 5, 15 min) before {load_before}, after {load_after} on {os.cpu_count()} CPUs"
        + (
            "  WARNING: other work was running; timings are inflated"
            if max(load_after[:2]) > 1.5 * (os.cpu_count() or 1)
            else ""
        )
    )
    failed = [f"{r['rule']}@{r['d']:.0e}" for r in rows if r["meets_ratio"] is False or r["meets_speedup"] is False]
    print("all targets met" if not failed else f"targets missed: {', '.join(failed)}")
    if args.quick:
        print("(--quick is a smoke run: the targets are meant for d >= 1e6, where fixed costs are amortized)")
    write_json(
        "aggregation_speed_quick" if args.quick else "aggregation_speed",
        {
            "args": vars(args),
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "n": n,
            "f": f,
            "sizes": sizes,
            "repeats": repeats,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "flwr": flwr_version,
            "flwr_note": flwr_note,
            "load_before": load_before,
            "load_after": load_after,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
