"""Peer transport: the bytes the coordinator sends per round, with and without it.

One real coordinator process and N real worker processes on loopback (default 8), the
owner's CLI, the same run twice: once with every worker started without ``--listen`` (each
fetches every round's model from the coordinator), once with every worker serving on
``--listen 127.0.0.1:PORT`` (the coordinator hands out the model's holders and seeds in the
job view; workers fetch from each other, CID-checked, the coordinator being the fallback).

Egress is the coordinator's own counter ``aitbc_http_bytes_total{direction="out"}`` read
from its ``/metrics`` (coordinator/observability/metrics.py): ``blob`` (blob bodies it sent: shards and
models) and ``api`` (every other /v1 reply: job views, acknowledgements). Per round is the
run's total over its rounds; "steady" leaves out the shards (each worker fetches its own
shard once, from the coordinator in both modes: nobody else holds it). Target: with peer
transport the coordinator sends at most 1/4 of what it sends without, per round, at 8 workers.
"fetch s" is the mean (max) of the workers' per-round download phase (the model fetched to
disk and loaded, from their logs): what peer transport costs in latency here.

Writes bench/results/peer_transport.json (print to bench/results/peer_transport.txt with tee).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from _common import print_table, write_json
from coordinator_load import Coordinator, aitbc_exe, free_port, source_state

TARGET = 0.25  # peer egress / coordinator-only egress, per round, at most


def egress(url: str) -> dict[str, float]:
    """``{kind: bytes}`` the coordinator has sent, from its /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "aitbc_http_bytes_total" and s.labels.get("direction") == "out":
                out[s.labels["kind"]] = s.value
    return out


def run_mode(peers: bool, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    tmp.mkdir(parents=True)
    coord = Coordinator(tmp / "coordinator", extra=["--lease", "10"])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AITBC_COORDINATOR": coord.url, "AITBC_HOME": str(tmp / "owner")}
    procs: list[subprocess.Popen] = []

    def cli(*a: str) -> str:
        r = subprocess.run([aitbc_exe(), *a], env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"aitbc {' '.join(a)}: {r.stderr.strip()[-2000:]}")
        return r.stdout

    try:
        for i in range(args.workers):
            name = f"w{i}"
            listen = ["--listen", f"127.0.0.1:{free_port()}"] if peers else []
            log = (tmp / f"{name}.log").open("wb")
            cmd = [aitbc_exe(), "worker", "start", "--coordinator", coord.url, "--home", str(tmp / name)]
            cmd += ["--wallet", name, "--heartbeat", "1", "--log-level", "info", *listen]
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 300
        while len(httpx.get(f"{coord.url}/v1/market/offers", timeout=10).json()["data"]) < args.workers:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not all register")
            time.sleep(0.5)
        out = cli(
            "distributed-training", "init", "--wallet", "my-agent-wallet", "--model-type", args.model,
            "--dataset-size", "1GB", "--target-workers", str(args.workers),
        )  # fmt: skip
        run_id = re.search(r"Training ID: (training_\w+)", out).group(1)  # type: ignore[union-attr]
        cli("wallet", "fund", "my-agent-wallet", "100000")
        cli("distributed-training", "upload-data", "--training-id", run_id, "--data-path", args.data)
        cli("distributed-training", "discover-workers", "--training-id", run_id, "--min-gpu", "RTX3090",
            "--required-workers", str(args.workers))  # fmt: skip
        before = egress(coord.url)
        t0 = time.perf_counter()
        cli("distributed-training", "distribute", "--training-id", run_id, "--strategy", "data-parallel",
            f"--rounds={args.rounds}", f"--local-steps={args.local_steps}")  # fmt: skip
        deadline = time.monotonic() + 1200
        while True:
            run = httpx.get(f"{coord.url}/v1/runs/{run_id}", timeout=10).json()
            if run["status"] in ("complete", "failed"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run_id} did not end: {json.dumps(run)[:500]}")
            time.sleep(0.5)
        wall = time.perf_counter() - t0
        after = egress(coord.url)
        if run["status"] != "complete":
            raise RuntimeError(f"run {run_id} {run['status']}")
        rounds = httpx.get(f"{coord.url}/v1/runs/{run_id}/rounds", timeout=10).json()["data"]
        model = int(
            httpx.head(f"{coord.url}/v1/blobs/{rounds[0]['checkpoint_cid']}", timeout=10).headers["content-length"]
        )
        manifest = json.loads(httpx.get(f"{coord.url}/v1/blobs/{run['manifest_cid']}", timeout=10).content)
        shard_bytes = sum(
            int(httpx.head(f"{coord.url}/v1/blobs/{s['cid']}", timeout=10).headers["content-length"])
            for s in manifest["shards"]
        )
        blob = after.get("blob", 0) - before.get("blob", 0)
        api = after.get("api", 0) - before.get("api", 0)
        logs = "".join((tmp / f"w{i}.log").read_text(errors="replace") for i in range(args.workers))
        downloads = [float(x) for x in re.findall(r"download ([0-9.]+) s", logs)]
        return {
            "mode": "peer transport" if peers else "coordinator only",
            "workers": args.workers,
            "rounds": args.rounds,
            "model_bytes": model,
            "shard_bytes": shard_bytes,
            "blob_out": blob,
            "api_out": api,
            "per_round": (blob + api) / args.rounds,
            "steady_per_round": (blob - shard_bytes + api) / args.rounds,
            "models_from_coordinator_per_round": (blob - shard_bytes) / model / args.rounds,
            "peer_fallbacks": logs.count("; next"),
            # a round's "download": the global model fetched to disk and loaded (worker log, per update)
            "download_s_mean": sum(downloads) / max(1, len(downloads)),
            "download_s_max": max(downloads, default=0.0),
            "wall_s": wall,
        }
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        coord.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--data", default="digits")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the processes it started are killed on the way out
    rows = []
    with tempfile.TemporaryDirectory(prefix="aitbc-peer-") as d:
        for peers in (False, True):
            rows.append(run_mode(peers, args, Path(d) / ("peers" if peers else "plain")))
    plain, peer = rows
    ratio = peer["per_round"] / plain["per_round"]
    steady = peer["steady_per_round"] / plain["steady_per_round"]
    print_table(
        f"coordinator egress: {args.workers} worker processes + coordinator on loopback, {args.model} "
        f"({plain['model_bytes']} B model), {args.rounds} rounds",
        ["mode", "blob B", "api B", "B/round", "B/round -shards", "models/round", "fallbacks", "fetch s", "wall s"],
        [
            (
                r["mode"],
                f"{r['blob_out']:.0f}",
                f"{r['api_out']:.0f}",
                f"{r['per_round']:.0f}",
                f"{r['steady_per_round']:.0f}",
                f"{r['models_from_coordinator_per_round']:.2f}",
                r["peer_fallbacks"],
                f"{r['download_s_mean']:.3f} (max {r['download_s_max']:.2f})",
                f"{r['wall_s']:.0f}",
            )
            for r in rows
        ],
    )
    met = ratio <= TARGET
    print(
        f"peer / coordinator-only egress per round: {ratio:.3f} (shards included), {steady:.3f} (without: the "
        f"round's model and JSON); {'meets' if met else 'MISSES'} the {TARGET:g} target"
    )
    from _sims import machine

    write_json(
        "peer_transport",
        {
            "machine": machine(),
            "source": source_state(),
            "args": vars(args),
            "target": TARGET,
            "ratio": ratio,
            "ratio_without_shards": steady,
            "met": met,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
