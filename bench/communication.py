"""Benchmark: bytes each worker sends to reach the dense baseline's validation loss.

The dense baseline is synchronous data parallelism: one local step per round
(``local_steps=1``), fp32 updates, every step. Every other configuration (DiLoCo at
several H, each codec with and without error feedback) runs on the same seed and data
until its validation loss is within 2% of the baseline's final loss, or until it has
taken ``max_factor`` times the baseline's inner steps. Reported: bytes sent per worker
to reach the target, and the reduction against the baseline (target: >= 1000x).

Usage: python bench/communication.py [--quick] [--tasks digits,transformer]
"""

from __future__ import annotations

import argparse
import math
import time

from _common import print_table, write_json
from _sims import machine, simulate

TASKS = {
    # name: (shared options, baseline steps, inner lr)
    "digits": (
        dict(model="mlp", dataset="digits", workers=8, batch_size=32, lr=1e-3, seed=0),
        600,
    ),
    "transformer": (
        dict(
            model="transformer",
            dataset="stdlib",
            workers=4,
            batch_size=16,
            lr=3e-3,
            seed=0,
            model_options={"context": 32, "d_model": 64, "n_layers": 2, "n_heads": 4},
            max_bytes=1 << 20,
            eval_samples=128,
        ),
        300,
    ),
}

CODECS = ["none", "fp16", "int8", "int4", "topk:ratio=0.01", "topk-int8:ratio=0.01", "sign", "powersgd:rank=2"]


def configs(quick: bool) -> list[dict]:
    out = [dict(label=f"diloco H={h}, none", local_steps=h, outer="diloco", compression="none") for h in (10, 50, 100)]
    for codec in ("int8", "int4", "sign"):  # the longest H with the cheapest value codecs
        out.append(dict(label=f"diloco H=100, {codec}", local_steps=100, outer="diloco", compression=codec))
    h = 50
    for codec in CODECS[1:] if not quick else ["int8", "topk-int8:ratio=0.01", "sign"]:
        for ef in (False, True):
            out.append(
                dict(
                    label=f"diloco H={h}, {codec}{' +EF' if ef else ''}",
                    local_steps=h,
                    outer="diloco",
                    compression=codec,
                    error_feedback=ef,
                )
            )
    return out


def run_task(name: str, quick: bool, max_factor: float) -> list[dict]:
    shared, base_steps = TASKS[name]
    if quick:
        base_steps //= 4
    t = time.perf_counter()
    base = simulate(**shared, local_steps=1, rounds=base_steps, outer="fedavg", compression="none")
    target = base.final_val_loss * 1.02
    per_worker = base.bytes_up / shared["workers"]
    rows = [
        dict(
            task=name,
            config=f"dense baseline (H=1, fp32, {base_steps} steps)",
            steps=base_steps,
            reached=True,
            val_loss=base.final_val_loss,
            bytes_per_worker=per_worker,
            reduction=1.0,
            compression_ratio=base.compression_ratio,
            wall_s=time.perf_counter() - t,
        )
    ]
    for c in configs(quick):
        label = c.pop("label")
        rounds = max(1, math.ceil(max_factor * base_steps / c["local_steps"]))
        t = time.perf_counter()
        r = simulate(**shared, **c, rounds=rounds, target_loss=target, stop_at_target=True)
        reached = r.bytes_to_target is not None
        sent = (r.bytes_to_target if reached else r.bytes_up) / shared["workers"]
        rows.append(
            dict(
                task=name,
                config=label,
                steps=r.rounds * c["local_steps"],
                reached=reached,
                val_loss=r.final_val_loss,
                bytes_per_worker=sent,
                reduction=per_worker / sent if reached else None,
                compression_ratio=r.compression_ratio,
                wall_s=time.perf_counter() - t,
            )
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs and fewer codecs (smoke test)")
    ap.add_argument("--tasks", default="digits,transformer")
    ap.add_argument("--max-factor", type=float, default=3.0, help="step budget relative to the baseline")
    args = ap.parse_args()
    rows = []
    for task in args.tasks.split(","):
        rows += run_task(task, args.quick, args.max_factor)
    table = [
        [
            r["task"],
            r["config"],
            r["steps"],
            f"{r['val_loss']:.4f}",
            "yes" if r["reached"] else "no",
            f"{r['bytes_per_worker'] / 2**20:.3f}",
            f"{r['compression_ratio']:.1f}x",
            "-" if r["reduction"] is None else f"{r['reduction']:.0f}x",
            f"{r['wall_s']:.0f}",
        ]
        for r in rows
    ]
    print_table(
        "communication: bytes per worker to reach the dense baseline's loss (+2%)",
        [
            "task",
            "configuration",
            "inner steps",
            "val loss",
            "reached",
            "MiB sent/worker",
            "codec ratio",
            "reduction",
            "wall s",
        ],
        table,
    )
    best = {}
    for r in rows:
        if r["config"].startswith("dense baseline"):
            continue
        if r["reduction"] is not None and r["reduction"] > best.get(r["task"], {"reduction": 0})["reduction"]:
            best[r["task"]] = r
    for task in dict.fromkeys(r["task"] for r in rows):
        r = best.get(task)
        if r is None:
            print(
                f"{task}: no configuration reached the baseline's loss within {args.max_factor:g}x its steps "
                "(MISSES the 1000x target)"
            )
            continue
        verdict = "meets" if r["reduction"] >= 1000 else "MISSES"
        print(f"{task}: best {r['config']}: {r['reduction']:.0f}x fewer bytes ({verdict} the 1000x target)")
    write_json(
        "communication",
        {"machine": machine(), "args": vars(args), "rows": rows, "best": {k: v["config"] for k, v in best.items()}},
    )


if __name__ == "__main__":
    main()
