"""Benchmark: one of 8 workers 10x slower; virtual time to a target accuracy.

Compares, on the same seed and data: all workers fast (the reference), plain sync with
the straggler (everyone waits: ~10x when compute dominates), deadline sync (the round
closes after 1.1x a fast worker's round time -- a coordinator would set this from the
round times it observes; late updates are dropped), and buffered async (aggregate every
4 updates, polynomial staleness weights, drop updates more than 4 aggregations stale;
also shown without down-weighting). Target: deadline sync and async within 1.25x of the all-fast time.

Usage: python bench/stragglers.py [--quick] [--target 0.9]
"""

from __future__ import annotations

import argparse
import time

from _common import print_table, write_json
from _sims import machine, simulate
from aitbc.sim.network import WorkerProfile, step_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--target", type=float, default=0.95, help="validation accuracy to reach")
    args = ap.parse_args()
    # A network fast enough that compute dominates a round, as on real GPU providers
    # training a model much larger than this one.
    shared = dict(
        model="mlp",
        dataset="digits",
        workers=8,
        local_steps=50,
        seed=0,
        bandwidth="1000",
        latency="5",
        step_overhead_ms=5.0,
        target_accuracy=args.target,
        stop_at_target=True,
        rounds=10 if args.quick else 60,
    )
    slow = "1,1,1,1,1,1,1,0.1"
    fast_round = 2 * WorkerProfile(1.0, 1000.0, 5.0).transfer_seconds(70_000) + 50 * step_seconds(17_226, 32, 25.0, 5.0)
    runs = [
        ("all fast, sync", dict(speeds="1", mode="sync")),
        ("1 slow, sync", dict(speeds=slow, mode="sync")),
        ("1 slow, deadline sync", dict(speeds=slow, mode="sync", deadline=round(1.1 * fast_round, 4))),
        (
            "1 slow, async (buffer 4)",
            dict(
                speeds=slow,
                mode="async",
                buffer=4,
                max_staleness=4,
                staleness="polynomial",
                rounds=2 * shared["rounds"],
            ),
        ),
        (
            "1 slow, async (buffer 4, no down-weighting)",
            dict(
                speeds=slow, mode="async", buffer=4, max_staleness=4, staleness="constant", rounds=2 * shared["rounds"]
            ),
        ),
    ]
    rows = []
    for label, opts in runs:
        t = time.perf_counter()
        r = simulate(**{**shared, **opts})
        rows.append(
            dict(
                config=label,
                seconds_to_target=r.virtual_seconds_to_target,
                rounds=r.rounds_to_target,
                final_accuracy=r.final_val_accuracy,
                dropped=r.dropped_updates,
                wall_s=time.perf_counter() - t,
                options=opts,
            )
        )
    ref = rows[0]["seconds_to_target"]
    for row in rows:
        s = row["seconds_to_target"]
        row["vs_all_fast"] = (s / ref) if (s is not None and ref) else None
    print_table(
        f"stragglers: virtual seconds to {args.target:.0%} accuracy, 8 workers, one 10x slower",
        ["configuration", "virtual s to target", "rounds", "vs all fast", "dropped updates", "wall s"],
        [
            [
                r["config"],
                "not reached" if r["seconds_to_target"] is None else f"{r['seconds_to_target']:.2f}",
                r["rounds"] or "-",
                "-" if r["vs_all_fast"] is None else f"{r['vs_all_fast']:.2f}x",
                r["dropped"],
                f"{r['wall_s']:.0f}",
            ]
            for r in rows
        ],
    )
    for r in rows[2:4]:
        v = r["vs_all_fast"]
        ok = v is not None and v <= 1.25
        print(f"{r['config']}: {'-' if v is None else f'{v:.2f}x'} ({'meets' if ok else 'MISSES'} the 1.25x target)")
    write_json("stragglers", {"machine": machine(), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
