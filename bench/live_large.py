"""Benchmark: a large model live (issue 18 part 2), where each round's time goes.

A byte-level transformer of 25.5M parameters (d_model 512, 8 blocks, 8 heads, context 64:
a 100 MB float32 model, and dense 100 MB updates) trained by three ``aitbc worker start``
processes against one ``aitbc coordinator serve`` on loopback, the owner's CLI driving it:
the end-to-end test ``tests/e2e/test_live_large.py`` (its :func:`large_run`), run longer.
Every model, shard and update moves as a file: streamed to disk and hashed as it arrives,
renamed to its CID only when it matches.

Per round and worker (the worker's own timers, from its log line of the round; the same
seconds go to its ``aitbc_worker_round_seconds_total{phase}`` counter):

- download: the round's global model fetched (streamed to disk, CID checked) and loaded
  into the model (0 when it was kept from before: the sender thread of an overlapping run);
- compute: the H local steps;
- encode: the codec (dense: the safetensors bytes), the update's CID;
- upload: the update blob PUT (streamed, checked by the coordinator as it arrives) and the
  signed message naming it.

Per round (the coordinator's Prometheus histograms, sampled every 0.2 s while the run
trains): close (``aitbc_round_close_seconds``: aggregate, outer step, divergence guard,
checkpoint, commit; the last round's includes its evaluation) and evaluation
(``aitbc_round_evaluation_seconds``: the validation loss on ``eval_samples``; the rounds
before the last are evaluated by the books thread after the next round opens). Also the
round's wall time (its ``started_at`` to ``closed_at``) and each process's peak resident
memory (``VmHWM``).

The coordinator's memory against issue 18's bound (at most 1.5 GB above its baseline):
its ``VmRSS`` once the workers have offered and before the run is made is the baseline;
its ``VmHWM`` at the end is the peak; ``VmRSS`` is sampled every 0.05 s while the run
trains, and the most of each round (its ``started_at`` to ``closed_at``; the run's setup
before round 1) is reported too.

Then, with the run over and its coordinator still up, the final model (102 MB) is
downloaded once more by a fresh process each way, its resident-set high-water mark reset
just before (``5 > /proc/self/clear_refs``; ``VmRSS`` then is the baseline): streamed to
disk (``CoordinatorClient.download_blob``, what the worker does) and whole into memory
(``get_blob``, what it did before). The peak above the baseline is what the download
itself held.

The coordinator scores on 8 samples (``--eval-samples``, ``--guard-samples``,
``--score-samples``): a 25M model's forward pass on 512 sequences would be most of a
round on this CPU. The machine is shared: the load average before and after goes with
the figures.

Usage: OMP_NUM_THREADS=1 python bench/live_large.py [--rounds 3] [--local-steps 2]
       [--batch-size 4] [--keep DIR]
Writes bench/results/live_large.json (print to bench/results/live_large.txt with tee).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import print_table, write_json
from _sims import machine
from coordinator_load import source_state

ROOT = Path(__file__).resolve().parent.parent
# One download in a fresh process: argv url, cid, folder, mode (stream | whole); prints JSON.
_PROBE = r"""
import json, sys, time
from pathlib import Path
from aitbc.client import CoordinatorClient
from aitbc.storage.blobstore import LocalBlobStore

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

url, cid, folder, mode = sys.argv[1:5]
with CoordinatorClient(url) as c:
    c.get("/health")
    base = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    t = time.perf_counter()
    if mode == "stream":
        size = c.download_blob(cid, LocalBlobStore(Path(folder)))
    else:
        size = len(c.get_blob(cid))
    took = time.perf_counter() - t
    print(json.dumps({"size": size, "baseline": base, "peak": status("VmHWM"), "seconds": took}))
"""
PHASES = ("download", "compute", "encode", "upload")


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _probe(url: str, cid: str, folder: Path, mode: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, url, cid, str(folder), mode], capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise RuntimeError(f"download probe ({mode}) failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


TARGET_ABOVE = 1.5e9  # bytes: issue 18's bound on the coordinator's memory above its baseline


def coordinator_memory(got: dict[str, Any]) -> dict[str, Any]:
    """The coordinator's peak above its baseline (VmHWM, bytes), against the target, and
    the most sampled in each round (``setup``: before round 1 opened)."""
    base = got["coordinator_baseline_rss"]
    peak = got["peak_rss_bytes"]["coordinator"]
    per: dict[str, int] = {}
    spans = [("setup", 0.0, got["rounds"][0]["started_at"])] + [
        (str(r["round"]), r["started_at"], r["closed_at"]) for r in got["rounds"]
    ]
    for name, lo, hi in spans:
        seen = [b for t, b in got["coordinator_rss_samples"] if lo <= t <= hi]
        if seen:
            per[name] = max(seen) - base
    return {
        "baseline_bytes": base,
        "peak_bytes": peak,
        "peak_above_bytes": peak - base,
        "target_above_bytes": TARGET_ABOVE,
        "met": peak - base <= TARGET_ABOVE,
        "per_round_above_bytes": per,
        "samples": len(got["coordinator_rss_samples"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-steps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--keep", type=Path, help="run in this folder and keep it (logs, stores)")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    stack_mod = _load("e2e_stack", ROOT / "tests" / "e2e" / "conftest.py")
    large = _load("e2e_live_large", ROOT / "tests" / "e2e" / "test_live_large.py")

    tmp = None
    if args.keep is None:
        tmp = tempfile.TemporaryDirectory(prefix="aitbc-live-large-")
        root = Path(tmp.name)
    else:
        root = args.keep
        root.mkdir(parents=True, exist_ok=False)
    (root / "coordinator").mkdir()
    stack = stack_mod.Stack(root, f"sqlite:///{root / 'coordinator' / 'coordinator.db'}")
    load_before = os.getloadavg()
    t0 = time.time()
    try:
        got = large.large_run(
            stack, root, rounds=args.rounds, local_steps=args.local_steps, batch_size=args.batch_size, timeout=3600
        )
        params = large.model_params(stack, got["rounds"][-1]["checkpoint_cid"], root)
        probes = {
            mode: _probe(stack.url, got["rounds"][-1]["checkpoint_cid"], root / f"probe-{mode}", mode)
            for mode in ("stream", "whole")
        }
    finally:
        stack.close()
    load_after = os.getloadavg()
    run = got["run"]
    if run["status"] != "complete":
        raise SystemExit(f"run ended {run['status']}: {run}")

    rows, per_round = [], []
    closes, evals = got["closes"]["close"], got["closes"]["evaluation"]
    for i, r in enumerate(got["rounds"]):
        n = r["round"]
        phases = {w: got["workers"][w][n] for w in sorted(got["workers"])}
        for w, p in phases.items():
            rows.append([f"{n} {w}", *(f"{p[k]:.2f}" for k in PHASES), f"{p['total']:.2f}", None, None, None])
        close = closes[i] if i < len(closes) else None
        ev = evals[i] if i < len(evals) else None
        wall = r["closed_at"] - r["started_at"]
        means = {k: statistics.mean(p[k] for p in phases.values()) for k in (*PHASES, "total")}
        rows.append(
            [
                f"{n} mean",
                *(f"{means[k]:.2f}" for k in PHASES),
                f"{means['total']:.2f}",
                None if close is None else f"{close:.2f}",
                None if ev is None else f"{ev:.2f}",
                f"{wall:.2f}",
            ]
        )
        per_round.append({"round": n, "workers": phases, "close": close, "evaluation": ev, "wall": wall})
    cols = ["round, worker", *(f"{k} s" for k in PHASES), "worker total s", "close s", "evaluation s", "round wall s"]
    title = (
        f"A {params / 1e6:.1f}M-parameter transformer live: 3 workers, {args.rounds} rounds of "
        f"{args.local_steps} steps x batch {args.batch_size} x 64 bytes, dense updates "
        f"({per_round[0]['workers']['w0']['update_bytes'] / 1e6:.1f} MB)"
    )
    print_table(title, cols, rows)
    mem = [[name, f"{(b or 0) / 2**20:.0f}"] for name, b in sorted(got["peak_rss_bytes"].items())]
    print_table("Peak resident memory (VmHWM)", ["process", "MiB"], mem)
    coord = coordinator_memory(got)
    print_table(
        f"Coordinator resident memory above its baseline ({coord['baseline_bytes'] / 2**20:.0f} MiB; "
        f"target at most {TARGET_ABOVE / 1e9:.1f} GB)",
        ["span", "most above baseline MB", "target met"],
        [
            ["whole run (VmHWM)", f"{coord['peak_above_bytes'] / 1e6:.0f}", "yes" if coord["met"] else "NO"],
            *([f"round {k} (sampled)", f"{v / 1e6:.0f}", None] for k, v in coord["per_round_above_bytes"].items()),
        ],
    )
    print_table(
        "One download of the final model in a fresh process: peak resident memory above its baseline",
        ["mode", "blob MB", "peak above baseline MiB", "seconds"],
        [
            [m, f"{p['size'] / 1e6:.1f}", f"{(p['peak'] - p['baseline']) / 2**20:.1f}", f"{p['seconds']:.2f}"]
            for m, p in (("streamed to disk (download_blob)", probes["stream"]), ("whole (get_blob)", probes["whole"]))
        ],
    )
    print(
        f"run wall {got['wall_seconds']:.1f} s (distribute to complete); load average before "
        f"{load_before[0]:.2f}, after {load_after[0]:.2f} (1 min); {os.cpu_count()} cores; "
        f"{got['merged_samples']} metric samples merged"
    )
    write_json(
        "live_large",
        {
            "machine": {**machine(), "cores": os.cpu_count()},
            "source": source_state(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t0)),
            "parameters": params,
            "model_options": large.LARGE,
            "rounds": args.rounds,
            "local_steps": args.local_steps,
            "batch_size": args.batch_size,
            "coordinator_samples": large.SMALL_EVAL,
            "per_round": per_round,
            "peak_rss_bytes": got["peak_rss_bytes"],
            "coordinator_memory": coord,
            "download_probe": probes,
            "run_wall_seconds": got["wall_seconds"],
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
    )
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
