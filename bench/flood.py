"""Benchmark: heartbeat latency and coordinator RSS under a flood of oversized bodies.

Starts ``aitbc coordinator serve`` (a real process, its own SQLite home, a free port, default
limits: 1 MiB JSON bodies), registers one worker, then floods the coordinator from
``--procs`` client processes x ``--threads`` threads, each sending oversized bodies
(``--min-mb``..``--max-mb`` MiB each, random) in a loop, alternating:

* unsigned, with a Content-Length declaring the whole size (refused 413 from the headers);
* chunked (no declared size), with well-formed signature headers for another body, so the
  header pre-check passes and the body is counted as it is read (refused 413 past 1 MiB);
* chunked and unsigned (refused 401 before a byte of the body is read).

Each sender streams its body in 1 MiB chunks until the server answers or drops the
connection. Meanwhile the main process sends a signed heartbeat every 50 ms and samples
the coordinator's RSS (psutil) every 100 ms. Target: heartbeat p99 < 250 ms and RSS < 1 GiB
throughout. Prints a table and writes bench/results/flood.json.

    .venv/bin/python bench/flood.py --seconds 20
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_json
from aitbc.client import ApiError, CoordinatorClient, Unreachable
from aitbc.ledger.signing import sign_request
from aitbc.ledger.wallet import Wallet

MIB = 1 << 20
AITBC = Path(sys.executable).parent / "aitbc"
PATH = "/v1/workers/heartbeat"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _send(port: int, size: int, mode: str, block: bytes) -> tuple[int, int]:
    """One oversized request; (bytes sent, status or 0 if dropped)."""
    head = [f"POST {PATH} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if mode == "declared":
        head.append(f"Content-Length: {size}")
    else:
        head.append("Transfer-Encoding: chunked")
        if mode == "signed":
            head += [f"{k}: {v}" for k, v in sign_request(Wallet.generate("flood"), "POST", PATH, b"{}").items()]
    sent = 0
    data = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
            frame = block if mode == "declared" else f"{len(block):x}\r\n".encode() + block + b"\r\n"
            while sent < size:
                if select.select([s], [], [], 0)[0]:
                    break
                s.sendall(frame)
                sent += len(block)
            data = s.recv(4096)
    except OSError:
        pass
    status = int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return sent, status


def _flooder(port: int, threads: int, lo: int, hi: int, stop: mp.Event, out: mp.Queue) -> None:  # type: ignore[type-arg]
    block = b"x" * MIB
    counts: dict[str, int] = {}
    sent_total = [0]
    lock = threading.Lock()

    def loop(i: int) -> None:
        rng = random.Random(os.getpid() * 100 + i)
        modes = ("declared", "signed", "unsigned")
        k = i
        while not stop.is_set():
            mode = modes[k % 3]
            k += 1
            sent, status = _send(port, rng.randint(lo, hi) * MIB, mode, block)
            with lock:
                key = f"{mode}:{status}"
                counts[key] = counts.get(key, 0) + 1
                sent_total[0] += sent

    ts = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put((counts, sent_total[0]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--min-mb", type=int, default=64)
    ap.add_argument("--max-mb", type=int, default=512)
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="aitbc-flood-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (home / "coordinator.log").open("ab")
    server = subprocess.Popen(
        [str(AITBC), "coordinator", "serve", "--home", str(home / "c"), "--port", str(port), "--lease", "600"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("coordinator did not start")
            time.sleep(0.1)
        proc = psutil.Process(server.pid)
        worker = CoordinatorClient(url, Wallet.generate("bench-worker"))
        worker.post("/workers", {"gpu": "RTX3090", "price": "1"})
        rss_idle = proc.memory_info().rss

        stop = mp.Event()
        out: mp.Queue = mp.Queue()  # type: ignore[type-arg]
        flooders = [
            mp.Process(target=_flooder, args=(port, args.threads, args.min_mb, args.max_mb, stop, out))
            for _ in range(args.procs)
        ]
        for p in flooders:
            p.start()
        rss: list[int] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                rss.append(proc.memory_info().rss)
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        time.sleep(1.0)  # let the flood start
        lat: list[float] = []
        failed = 0
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                worker.post("/workers/heartbeat", timeout=10)
                lat.append(time.monotonic() - t0)
            except (ApiError, Unreachable):  # a heartbeat that fails counts as a miss
                failed += 1
            time.sleep(max(0.0, 0.05 - (time.monotonic() - t0)))
        stop.set()
        counts: dict[str, int] = {}
        offered = 0
        for _ in flooders:
            c, s = out.get(timeout=60)
            offered += s
            for k, v in c.items():
                counts[k] = counts.get(k, 0) + v
        for p in flooders:
            p.join(30)
        sampling.set()
        sampler.join()
        worker.close()
    finally:
        server.terminate()
        server.wait(30)

    lat.sort()
    p50 = statistics.median(lat) * 1000 if lat else float("nan")
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000 if lat else float("nan")
    rss_max = max(rss) if rss else 0
    ok = failed == 0 and p99 < 250 and rss_max < 1 << 30
    rows = [
        ("heartbeats answered", f"{len(lat)} ({failed} failed)"),
        ("heartbeat p50 ms", f"{p50:.1f}"),
        ("heartbeat p99 ms", f"{p99:.1f}"),
        ("heartbeat max ms", f"{lat[-1] * 1000:.1f}" if lat else "-"),
        ("RSS idle MiB", f"{rss_idle / MIB:.0f}"),
        ("RSS max MiB", f"{rss_max / MIB:.0f}"),
        ("flood requests", str(sum(counts.values()))),
        ("flood bytes offered (sent before refusal) MiB", f"{offered / MIB:.0f}"),
        *((f"flood {k}", str(v)) for k, v in sorted(counts.items())),
        ("target (p99 < 250 ms, RSS < 1 GiB, no failed heartbeat)", "met" if ok else "MISSED"),
    ]
    print_table(
        f"flood: {args.procs} procs x {args.threads} threads, {args.min_mb}-{args.max_mb} MiB bodies, "
        f"{args.seconds:g} s",
        ("measure", "value"),
        rows,
    )
    write_json(
        "flood",
        {
            "args": vars(args),
            "heartbeats": len(lat),
            "heartbeats_failed": failed,
            "heartbeat_p50_ms": p50,
            "heartbeat_p99_ms": p99,
            "rss_idle_bytes": rss_idle,
            "rss_max_bytes": rss_max,
            "flood_counts": counts,
            "flood_bytes_sent": offered,
            "target_met": ok,
        },
    )


if __name__ == "__main__":
    main()
