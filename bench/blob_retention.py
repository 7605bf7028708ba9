"""Disk used by a live run, with and without blob retention (issue 12, part 9).

A real local deployment (one coordinator, two workers, the owner's CLI, all as
processes on 127.0.0.1) trains ``--rounds`` rounds on digits. The coordinator runs
retention every 2 s with a 5 s grace period (``--keep`` checkpoints); each worker's cache
is capped (``--cache-mb``). Sampled every 0.25 s: the coordinator's blob bytes (peak), and
every distinct blob ever seen (what the run wrote: the disk used with no retention). At
the end, after settlement, ``aitbc coordinator gc --gc-grace 0`` runs once more.

    .venv/bin/python bench/blob_retention.py [--rounds 20] [--model mlp]
    .venv/bin/python bench/blob_retention.py --model transformer --data stdlib --cache-mb 8 --max-minutes 90
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_json

AITBC = Path(sys.executable).parent / "aitbc"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _files(d: Path) -> dict[str, int]:
    if not d.is_dir():
        return {}
    out = {}
    for p in d.rglob("*"):
        try:
            if p.is_file() and not p.name.startswith("."):
                out[str(p.relative_to(d))] = p.stat().st_size
        except FileNotFoundError:
            continue
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--data", default="digits", help="digits, stdlib (text, for the transformer), a path")
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--cache-mb", type=float, default=0.5)
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument("--max-minutes", type=float, default=30.0, help="give up on the run after this long")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="aitbc-retention-"))
    port = _port()
    url = f"http://127.0.0.1:{port}"
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        AITBC_COORDINATOR=url,
        AITBC_HOME=str(root / "owner"),
        AITBC_KEEP_CHECKPOINTS=str(args.keep),
        AITBC_GC_GRACE_SECONDS="5",
        AITBC_GC_INTERVAL_SECONDS="2",
    )
    procs: list[subprocess.Popen] = []

    def spawn(name: str, *a: str) -> None:
        log = (root / f"{name}.log").open("ab")
        procs.append(
            subprocess.Popen([str(AITBC), *a], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        )

    def cli(*a: str) -> str:
        r = subprocess.run([str(AITBC), *a], capture_output=True, text=True, env=env, timeout=600)
        if r.returncode:
            raise RuntimeError(f"aitbc {' '.join(a)}: {r.stderr}")
        return r.stdout

    coord_blobs = root / "coordinator" / "blobs"
    try:
        spawn(
            "coordinator",
            "coordinator",
            "serve",
            "--home",
            str(root / "coordinator"),
            "--port",
            str(port),
            "--log-level",
            "warning",
        )
        for i in range(2):
            spawn(
                f"w{i}",
                "worker",
                "start",
                "--home",
                str(root / f"w{i}"),
                "--wallet",
                f"w{i}",
                "--heartbeat",
                "0.5",
                "--cache-mb",
                str(args.cache_mb),
            )
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/v1/market/offers", timeout=2).json()["count"] >= 2:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not register")
            time.sleep(0.2)
        out = cli(
            "distributed-training",
            "init",
            "--wallet",
            "owner",
            "--model-type",
            args.model,
            "--dataset-size",
            "1MB",
            "--target-workers",
            "2",
        )
        run_id = re.search(r"Training ID: (training_\w+)", out).group(1)
        cli("wallet", "fund", "owner", "1000")
        cli("distributed-training", "upload-data", "--training-id", run_id, "--data-path", args.data)
        cli("distributed-training", "discover-workers", "--training-id", run_id, "--required-workers", "2")
        cli(
            "distributed-training",
            "distribute",
            "--training-id",
            run_id,
            "--strategy",
            "data-parallel",
            f"--rounds={args.rounds}",
            f"--local-steps={args.local_steps}",
        )
        seen: dict[str, int] = {}
        wseen: dict[str, int] = {}
        peak = wpeak = 0
        t0 = time.monotonic()
        while True:
            now = _files(coord_blobs)
            seen.update(now)
            peak = max(peak, sum(now.values()))
            for i in range(2):
                wnow = _files(root / f"w{i}" / "worker-cache")
                wseen.update({f"w{i}/{k}": v for k, v in wnow.items()})
                wpeak = max(wpeak, sum(wnow.values()))
            pay = httpx.get(f"{url}/v1/runs/{run_id}/payments", timeout=5).json()
            if pay.get("finalized"):
                break
            if time.monotonic() - t0 > args.max_minutes * 60:
                raise RuntimeError(f"run did not finish in {args.max_minutes:g} min")
            time.sleep(0.25)
        wall = time.monotonic() - t0
        before = sum(_files(coord_blobs).values())
        gc = json.loads(cli("coordinator", "gc", "--home", str(root / "coordinator"), "--gc-grace", "0", "--json"))
        after = sum(_files(coord_blobs).values())
        status = httpx.get(f"{url}/v1/runs/{run_id}", timeout=5).json()["status"]
        verify = json.loads(cli("distributed-training", "verify", "--training-id", run_id, "--json"))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    mb = 1e6
    rows = [
        ("coordinator: written by the run (no retention)", f"{sum(seen.values()) / mb:.2f}", len(seen)),
        ("coordinator: peak during the run (retention)", f"{peak / mb:.2f}", None),
        ("coordinator: at the end, before gc", f"{before / mb:.2f}", None),
        ("coordinator: after 'aitbc coordinator gc'", f"{after / mb:.2f}", gc["kept"]),
        ("workers: fetched into caches (no cap)", f"{sum(wseen.values()) / mb:.2f}", len(wseen)),
        (f"workers: peak, both caches (cap {args.cache_mb:g} MiB each)", f"{wpeak / mb:.2f}", None),
    ]
    print_table(
        f"Blob disk, {args.rounds}-round {args.data} run ({args.model}, 2 workers, keep {args.keep}; run {status}, {wall:.0f} s)",
        ["what", "MB", "blobs"],
        rows,
    )
    pruned = verify["pruned"]
    print(f"verify: ok={verify['ok']}, {pruned} pruned, {len(verify['checkpoints']) - pruned} verified")
    write_json(
        "blob_retention" if args.model == "mlp" else f"blob_retention_{args.model}",
        {
            "command": " ".join(["bench/blob_retention.py", *sys.argv[1:]]),
            "rounds": args.rounds,
            "model": args.model,
            "data": args.data,
            "keep_checkpoints": args.keep,
            "cache_mb": args.cache_mb,
            "status": status,
            "wall_seconds": round(wall, 1),
            "coordinator_written_bytes": sum(seen.values()),
            "coordinator_peak_bytes": peak,
            "coordinator_end_bytes_before_gc": before,
            "coordinator_bytes_after_gc": after,
            "gc": gc,
            "workers_fetched_bytes": sum(wseen.values()),
            "workers_peak_bytes": wpeak,
            "verify_ok": verify["ok"],
            "verify_pruned": pruned,
        },
    )


if __name__ == "__main__":
    main()
