"""Benchmark: the coordinator's memory and time to aggregate one round of a large model,
streamed from disk against in memory (issue 18 part 1).

``n`` = 16 updates of a ``d`` = 100M-parameter model, int8 on the wire (the int8 codec's
blobs, ~100 MB each, in a real blob store). Each measurement is one call of the
coordinator's own ``round_updates.aggregate_updates`` (fetch and verify each blob, decode,
the norm bound, the run's rule) in a fresh Python process, so no two peaks mix:

- ``streamed``: ``aggregation_memory_mb`` at its default (1024, ``--memory-mb``), below the round's 6.4 GB:
  each update decoded piece by piece into a float32 spill file, the rule over column blocks.
- ``in-memory``: the setting above the round: all updates decoded into one ``(n, d)``
  float32 matrix, as before this issue.

Memory: the child's resident set (psutil) just before the call is its baseline (torch
imported, the pipeline built); the peak is the kernel's high-water mark of the resident
set, reset at the baseline (``VmHWM`` after ``5 > /proc/self/clear_refs``: exact, not
sampled; ``ru_maxrss`` where that is refused, which may include the forking parent's),
cross-checked by a 10 ms psutil sampler. Time:
the call's wall time. The load average (``uptime``) and torch's thread count go with
every figure: the machine is shared. The spill file lives on the same disk as the blob
store; the page cache keeps it when it fits (it is not the process's memory).

Needs: 1.6 GB of disk for the blobs (a temporary folder, or ``--keep DIR`` to reuse
them), 6.4 GB more for a streamed run's spill file, and about 14 GB of free memory for
an in-memory run (the ``(n, d)`` matrix and the norm bound's copy of it).

Targets: streamed peak at most 1.5 GB above the baseline; streamed time within 1.5x of
in-memory for mean, trimmed mean and Krum. Misses are reported as they are.

Usage: python bench/aggregation_memory.py [--d 100000000] [--n 16] [--rules mean,...]
       [--modes streamed,in-memory] [--threads N] [--keep DIR]
Writes bench/results/aggregation_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from _common import print_table, write_json
from _sims import machine

RULES = ("mean", "trimmed-mean", "krum", "centered-clip")
F = 3  # the Byzantine count Krum and the aggregator pipeline are built with
GB = 1e9
TARGET_GB = 1.5
TARGET_SLOWDOWN = 1.5
TIMED_RULES = ("mean", "trimmed-mean", "krum")  # the time target covers these


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def build_blobs(home: Path, n: int, d: int) -> list[str]:
    """``n`` int8 blobs of ``d`` values in a blob store at ``home``: a shared direction
    plus each worker's noise, as honest updates look (one at a time: 400 MB each)."""
    from aitbc.core.compression import build_codec
    from aitbc.storage.blobstore import LocalBlobStore

    store = LocalBlobStore(home)
    codec = build_codec("int8", {})
    g = torch.Generator().manual_seed(0)
    base = torch.randn(d, generator=g).mul_(1e-3)  # (d,)
    cids = []
    for i in range(n):
        u = torch.randn(d, generator=g).mul_(3e-4).add_(base)  # (d,)
        cids.append(store.put_bytes(codec.encode(u)))
        del u
        print(f"  blob {i + 1}/{n} written", flush=True)
    return cids


# --- the child: one measurement in a fresh process -------------------------------------


def reset_peak() -> bool:
    """Reset this process's resident-set high-water mark (Linux >= 4.0: ``5`` to
    ``clear_refs``). ``ru_maxrss`` cannot be reset and also keeps the peak of the process
    this one was forked from before ``exec``, so it may hold the parent's memory."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def vm_hwm() -> int:
    """The high-water mark of the resident set since :func:`reset_peak`, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


@dataclass
class _Settings:
    home: Path
    aggregation_memory_mb: float


@dataclass
class _Ctx:  # the two parts of the coordinator's Context that aggregate_updates reads
    settings: _Settings
    store: Any


def child(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    from aitbc.coordinator.live.updates import aggregate_updates, streams
    from aitbc.core.aggregation import parse_aggregator
    from aitbc.core.norms import NormBound
    from aitbc.storage.blobstore import LocalBlobStore

    cids = json.loads(Path(args.cids).read_text())
    n, d = len(cids), args.d
    mb = args.memory_mb if args.mode == "streamed" else 1e9
    ctx = _Ctx(_Settings(Path(args.home), mb), LocalBlobStore(Path(args.home)))
    pipeline = parse_aggregator(args.rule, default_f=F)
    assert streams(ctx, n, d) == (args.mode == "streamed")  # type: ignore[arg-type]
    proc = psutil.Process()
    reset = reset_peak()
    base = proc.memory_info().rss
    sampled = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            sampled.append(proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    agg = aggregate_updates(
        ctx,  # type: ignore[arg-type]
        pipeline,
        NormBound(),
        cids,
        [1.0] * n,  # weights
        [1.0] * n,  # expected scales
        [1.0] * n,  # counts (no stale update)
        d=d,
        round_index=1,
        reference=None,
    )
    seconds = time.perf_counter() - t0
    stop.set()
    sampler.join()
    peak = vm_hwm() if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    assert agg.delta is not None and agg.streamed == (args.mode == "streamed")
    print(
        json.dumps(
            {
                "seconds": seconds,
                "baseline_bytes": base,
                "peak_bytes": peak,
                "above_baseline_bytes": peak - base,
                "sampled_above_baseline_bytes": max(sampled) - base,
                "peak_source": "VmHWM reset at the baseline" if reset else "ru_maxrss",
                "result_norm": float(agg.delta.norm()),
                "kept": len(agg.keep),
            }
        )
    )


# --- the parent: blobs once, then one child per measurement ----------------------------


def measure(
    script: Path, home: Path, cids: Path, rule: str, mode: str, d: int, threads: int, memory_mb: float
) -> dict[str, Any]:
    before = load()
    cmd = [sys.executable, str(script), "--child", "--home", str(home), "--cids", str(cids)]
    cmd += ["--rule", rule, "--mode", mode, "--d", str(d), "--threads", str(threads), "--memory-mb", str(memory_mb)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{rule} {mode} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return {"rule": rule, "mode": mode, "threads": threads, "load_before": before, "load_after": load(), **res}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=100_000_000)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--rules", default=",".join(RULES))
    p.add_argument("--modes", default="streamed,in-memory")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--memory-mb", type=float, default=1024.0, help="aggregation_memory_mb of the streamed runs")
    p.add_argument("--keep", type=Path, default=None, help="build the blobs here and keep them (reused when present)")
    p.add_argument("--name", default="aggregation_memory")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--home", help=argparse.SUPPRESS)
    p.add_argument("--cids", help=argparse.SUPPRESS)
    p.add_argument("--rule", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return

    rules = args.rules.split(",")
    modes = args.modes.split(",")
    with tempfile.TemporaryDirectory(prefix="aggmem-") as tmp:
        home = args.keep or Path(tmp)
        cids_file = home / f"cids-{args.n}x{args.d}.json"
        if not cids_file.exists():
            print(f"writing {args.n} int8 blobs of {args.d:,} values to {home} ...", flush=True)
            t0 = time.perf_counter()
            cids_file.parent.mkdir(parents=True, exist_ok=True)
            cids_file.write_text(json.dumps(build_blobs(home, args.n, args.d)))
            print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
        rows = []
        for rule in rules:
            for mode in modes:
                print(f"{rule} {mode} (load {load()}) ...", flush=True)
                rows.append(
                    measure(Path(__file__).resolve(), home, cids_file, rule, mode, args.d, args.threads, args.memory_mb)
                )
                r = rows[-1]
                print(f"  {r['seconds']:.1f} s, {r['above_baseline_bytes'] / GB:.2f} GB above baseline", flush=True)

    by = {(r["rule"], r["mode"]): r for r in rows}
    table, verdicts = [], {}
    for rule in rules:
        s, m = by.get((rule, "streamed")), by.get((rule, "in-memory"))
        ratio = s["seconds"] / m["seconds"] if s and m else None
        mem_ok = s["above_baseline_bytes"] <= TARGET_GB * GB if s else None
        time_ok = (ratio <= TARGET_SLOWDOWN if ratio is not None else None) if rule in TIMED_RULES else None
        verdicts[rule] = {"memory_ok": mem_ok, "time_ok": time_ok, "slowdown": ratio}
        table.append(
            [
                rule,
                f"{s['above_baseline_bytes'] / GB:.2f}" if s else None,
                f"{m['above_baseline_bytes'] / GB:.2f}" if m else None,
                f"{s['seconds']:.1f}" if s else None,
                f"{m['seconds']:.1f}" if m else None,
                f"{ratio:.2f}x" if ratio is not None else None,
                "met" if mem_ok else ("MISSED" if mem_ok is not None else None),
                "met" if time_ok else ("MISSED" if time_ok is not None else "-"),
                f"{s['load_before']} / {s['load_after']}" if s else None,
            ]
        )
    print_table(
        f"Aggregating {args.n} int8 updates of {args.d:,} parameters ({args.threads} torch threads): "
        f"peak RSS above baseline (GB) and wall time (s)",
        [
            "rule",
            "streamed GB",
            "in-memory GB",
            "streamed s",
            "in-memory s",
            "slowdown",
            f"<= {TARGET_GB} GB",
            f"<= {TARGET_SLOWDOWN}x",
            "load (streamed: before / after)",
        ],
        table,
    )
    write_json(
        args.name,
        {
            "n": args.n,
            "d": args.d,
            "codec": "int8",
            "f": F,
            "threads": args.threads,
            "aggregation_memory_mb": args.memory_mb,
            "machine": {**machine(), "threads": args.threads, "cores": os.cpu_count()},
            "targets": {"above_baseline_gb": TARGET_GB, "slowdown": TARGET_SLOWDOWN, "timed_rules": TIMED_RULES},
            "results": rows,
            "verdicts": verdicts,
        },
    )


if __name__ == "__main__":
    main()
