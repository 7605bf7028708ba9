"""Benchmark: final accuracy for every attack x aggregator, 25% Byzantine, compressed.

12 workers of which 3 are Byzantine (chosen by seed), MLP on digits, updates sent with
a compressing codec (int8 by default). One clean run per aggregator gives the reference;
the target is that for every attack the best aggregator keeps >= 95% of the clean
run's accuracy, while ``mean`` collapses under at least sign-flip and gaussian.

The scaled-update provider (``scale:factor=F``: its honest update times F, a correctly
shaped update of huge but finite values) runs at 1e3, 1e10 and 3e38 under every rule,
``mean`` included: the norm bound (``aitbc.core.norms``, before any rule) clips or
rejects it, so each rule keeps its clean accuracy. ``--scaled`` runs only those (and the
clean reference) under every rule.

Usage: python bench/robustness.py [--quick] [--scaled] [--compression int8]
"""

from __future__ import annotations

import argparse
import time

from _common import print_table, write_json
from _sims import machine, simulate
from aitbc.errors import UsageError

ATTACKS = ["sign-flip", "gaussian", "label-flip", "alie", "ipm", "free-rider"]
SCALED = ["scale:factor=1e3", "scale:factor=1e10", "scale:factor=3e38"]  # times an honest update
AGGREGATORS = [
    "mean",
    "median",
    "trimmed-mean:beta=0.25",
    "krum",
    "multi-krum:m=6",
    "bulyan",
    "centered-clip",
    "geometric-median",
    "nnm+centered-clip",
    "nnm+trimmed-mean:beta=0.25",
    "bucketing:s=2+median",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds, aggregators and attacks")
    ap.add_argument("--scaled", action="store_true", help="only the scaled-update provider, under every rule")
    ap.add_argument("--compression", default="int8")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--byzantine", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    aggregators = AGGREGATORS[:4] if args.quick and not args.scaled else AGGREGATORS
    attacks = [] if args.scaled else ATTACKS[:2] if args.quick else ATTACKS
    attacks = [*attacks, *SCALED]
    rounds = 5 if args.quick else args.rounds
    shared = dict(
        model="mlp",
        dataset="digits",
        workers=args.workers,
        rounds=rounds,
        local_steps=20,
        compression=args.compression,
        seed=0,
    )

    results: dict[str, dict[str, float | str]] = {}
    for agg in aggregators:
        results[agg] = {}
        for attack in [None, *attacks]:
            t = time.perf_counter()
            try:
                r = simulate(**shared, aggregator=agg, attack=attack, byzantine=args.byzantine if attack else 0)
                acc: float | str = r.final_val_accuracy
            except UsageError as e:  # e.g. bulyan needs n >= 4f+3
                acc = f"n/a: {e}"
            results[agg][attack or "clean"] = acc
            print(
                f"  {agg:28s} {attack or 'clean':11s} {acc if isinstance(acc, str) else f'{acc:.3f}'}"
                f"  ({time.perf_counter() - t:.0f} s)",
                flush=True,
            )

    cols = ["clean", *attacks]
    rows = [
        [
            agg,
            *[
                (
                    v
                    if isinstance(v := results[agg][c], str) and len(v) < 12
                    else "n/a"
                    if isinstance(v, str)
                    else f"{v:.3f}"
                )
                for c in cols
            ],
        ]
        for agg in aggregators
    ]
    print_table(
        f"robustness: final accuracy, {args.byzantine} of {args.workers} Byzantine, compression {args.compression}",
        ["aggregator", *cols],
        rows,
    )

    verdicts = {}
    for attack in attacks:
        best_agg, best_keep = None, -1.0
        for agg in aggregators:
            clean, hit = results[agg]["clean"], results[agg][attack]
            if isinstance(clean, float) and isinstance(hit, float) and clean > 0 and hit / clean > best_keep:
                best_agg, best_keep = agg, hit / clean
        verdicts[attack] = {"best": best_agg, "kept": best_keep, "meets": best_keep >= 0.95}
        print(
            f"{attack}: best {best_agg} keeps {best_keep:.1%} of its clean accuracy "
            f"({'meets' if best_keep >= 0.95 else 'MISSES'} the 95% target)"
        )
    for attack in ("sign-flip", "gaussian"):
        if attack in attacks and "mean" in results:
            acc = results["mean"][attack]
            print(f"mean under {attack}: {acc:.3f} ({'collapses' if acc < 0.5 else 'does NOT collapse'})")
    for attack in SCALED:
        if "mean" in results and isinstance(results["mean"]["clean"], float):
            hit = results["mean"][attack]
            kept = hit / results["mean"]["clean"] if isinstance(hit, float) else 0.0
            print(f"mean under {attack}: {hit if isinstance(hit, str) else f'{hit:.3f}'} ({kept:.1%} of clean)")
    name = "robustness_scaled" if args.scaled else "robustness"
    write_json(name, {"machine": machine(), "args": vars(args), "accuracy": results, "verdicts": verdicts})


if __name__ == "__main__":
    main()
