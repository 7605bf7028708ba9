"""Benchmark: requests/s and latency of a real coordinator under heartbeat and upload load.

Starts ``aitbc coordinator serve`` (a real process, its own SQLite home, a free port),
registers K clients (each its own wallet, ``POST /v1/workers``), then drives load from
separate processes: every request is signed by one of the K wallets, as a worker would.
Scenarios:

* ``health``: ``GET /v1/health`` (unsigned, no database): the framework's floor.
* ``heartbeat``: ``POST /v1/workers/heartbeat`` (signed), closed loop: C connections,
  each sending its next request as soon as the last is answered (the server's capacity).
* ``heartbeat@R``: the same at a fixed offered rate R (open loop, default 1000/s): the
  latency is counted from when each request was due, so a server that falls behind pays
  for its queue (no coordinated omission).
* ``blob``: ``PUT /v1/blobs/{cid}`` of a fresh random 4 KiB blob (signed, stored and
  hash-checked like a worker's update), closed loop.

On a machine with >= 2 cores the server is pinned to core 0 and the load to the others
(``sched_setaffinity``, as ``taskset`` would), and both CPU shares are reported: the
load generator's share shows whether it, rather than the server, was the limit.

The load generator speaks HTTP/1.1 over asyncio streams with keep-alive (``--client
raw``, a few microseconds per request) or through ``httpx.AsyncClient`` (``--client
httpx``, what our SDK uses; several times costlier per request, so on 2 cores it can
become the bottleneck itself).

Server implementations (``--impls``): ``cli`` is ``aitbc coordinator serve`` as shipped
(uvicorn picks httptools + uvloop when they are installed, i.e. with ``uvicorn[standard]``,
else h11 + asyncio); ``h11`` and ``httptools`` start the same app with the same settings
with that HTTP parser and event loop forced (h11 + asyncio is what the declared
dependency ``uvicorn`` alone gives).

Target: >= 1000 heartbeats/s with p99 < 100 ms on this 2-core machine: a ``heartbeat``
row meets it when its req/s >= 1000 (open loop: >= 99% of an offered rate >= 1000) with
p99 < 100 ms and no errors.

Usage: python bench/coordinator_load.py [--quick] [--duration 20] [--clients 200]
       [--concurrency 32] [--rate 1000] [--impls cli,h11] [--client raw|httpx]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import multiprocessing as mp
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from _common import print_table, write_json
from aitbc.client import CoordinatorClient
from aitbc.coordinator.config import Settings
from aitbc.ledger.signing import NonceCache, body_digest, sign_request, verify_request
from aitbc.ledger.wallet import Wallet
from aitbc.storage.cid import cid_of_bytes

TARGET_RPS = 1000.0
TARGET_P99_MS = 100.0

# The app started exactly as `aitbc coordinator serve` starts it, but with the HTTP parser
# and event loop forced (uvicorn's "auto" picks httptools/uvloop when installed).
_LAUNCHER = """
import sys
from pathlib import Path
import uvicorn
from aitbc.coordinator.app import create_app
from aitbc.coordinator.config import Settings
home, port, http, loop = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
app = create_app(Settings(home=Path(home), host="127.0.0.1", port=port))
uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                              timeout_keep_alive=30, http=http, loop=loop)).run()
"""
_FORCED = {"h11": ("h11", "asyncio"), "httptools": ("httptools", "uvloop")}


# --- the coordinator process (also used by live_utilization.py) ---------------------------


def machine_busy_seconds() -> float:
    """CPU seconds all processes on this machine have used (busy time of every core, /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def source_state() -> dict[str, Any]:
    """The commit measured, and whether src/ had uncommitted changes then."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": head, "src_uncommitted": [line[3:] for line in dirty]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def aitbc_exe() -> str:
    exe = Path(sys.executable).parent / "aitbc"
    return str(exe) if exe.exists() else (shutil.which("aitbc") or "aitbc")


def auto_impl() -> str:
    """What uvicorn's ``auto`` picks in this environment (as ``aitbc coordinator serve`` runs it)."""
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return f"{http}+{loop}"


class Coordinator:
    """A coordinator process on a free loopback port, killed (its whole process group) on exit."""

    def __init__(
        self, home: Path, *, impl: str = "cli", cpus: set[int] | None = None, extra: list[str] | None = None
    ) -> None:
        self.home, self.impl, self.cpus = home, impl, cpus
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        if impl == "cli":
            cmd = [
                aitbc_exe(),
                "coordinator",
                "serve",
                "--home",
                str(home),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                *(extra or []),
            ]
        else:
            http, loop = _FORCED[impl]
            cmd = [sys.executable, "-c", _LAUNCHER, str(home), str(self.port), http, loop]
        self.log_path = home.parent / f"coordinator-{self.port}.log"
        self._log = self.log_path.open("wb")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "AITBC_HOME": str(home)}
        preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        t = time.monotonic()
        while time.monotonic() - t < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"coordinator exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                if httpx.get(self.url + "/v1/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"coordinator did not answer within {timeout:g} s: {self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        self._log.flush()
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def cpu_seconds(self) -> float:
        """user + system CPU of the server process (all its threads) so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- the load generator (one process) --------------------------------------------------

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]+)", re.IGNORECASE)


class _RawConn:
    """One keep-alive HTTP/1.1 connection over asyncio streams (responses with content-length)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> int:
        if self.w is None:
            self.r, self.w = await asyncio.open_connection(self.host, self.port)
        try:
            self.w.write(raw)
            head = await self.r.readuntil(b"\r\n\r\n")
            m = _CONTENT_LENGTH.search(head)
            if m and int(m.group(1)):
                await self.r.readexactly(int(m.group(1)))
            if b"\r\nconnection: close" in head.lower():
                self.close()
            return int(head[9:12])
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = None


def _raw_request(method: str, path: str, host: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _maker(scenario: str, wallets: list[Wallet], blob_bytes: int):
    """i -> (method, path, headers, body) of the i-th request: signed now, by wallet i mod K."""
    if scenario == "health":
        return lambda i: ("GET", "/v1/health", {}, b"")
    if scenario == "heartbeat":

        def hb(i: int):
            path = "/v1/workers/heartbeat"
            h = sign_request(wallets[i % len(wallets)], "POST", path, b"{}")
            h["content-type"] = "application/json"
            return "POST", path, h, b"{}"

        return hb
    if scenario == "blob":

        def blob(i: int):
            data = os.urandom(blob_bytes)
            path = f"/v1/blobs/{cid_of_bytes(data)}"
            h = sign_request(wallets[i % len(wallets)], "PUT", path, b"", unsigned_payload=True)
            h["content-type"] = "application/octet-stream"
            return "PUT", path, h, data

        return blob
    raise ValueError(scenario)


async def _drive(spec: dict[str, Any], wallets: list[Wallet]) -> dict[str, Any]:
    t0, t1 = spec["t0"], spec["t0"] + spec["duration"]
    c, k, nproc, idx = spec["concurrency"], spec["clients"], spec["procs"], spec["index"]
    host, port = "127.0.0.1", spec["port"]
    make = _maker(spec["scenario"], wallets, spec["blob_bytes"])
    lat: list[float] = []
    codes: Counter[str] = Counter()
    first_error: list[str] = []
    done_in_window = 0
    cpu: dict[str, float] = {}

    if spec["client"] == "httpx":
        hx = httpx.AsyncClient(
            base_url=f"http://{host}:{port}",
            timeout=30.0,
            limits=httpx.Limits(max_connections=c, max_keepalive_connections=c),
        )

        def sender():
            async def send(i: int) -> int:
                m, p, h, b = make(i)
                return (await hx.request(m, p, headers=h, content=b)).status_code

            return send
    else:
        hx = None

        def sender():
            conn = _RawConn(host, port)

            async def send(i: int) -> int:
                m, p, h, b = make(i)
                return await conn.request(_raw_request(m, p, f"{host}:{port}", h, b))

            return send

    open_loop = spec["mode"] == "open"

    def record(status: int | None, err: BaseException | None, due: float, end: float) -> None:
        nonlocal done_in_window
        if end < t0 or (open_loop and due < t0):  # warm-up
            return
        key = str(status) if err is None else type(err).__name__
        codes[key] += 1
        if err is None and status is not None and status < 400:
            lat.append(end - due)
            if end <= t1:  # answered within the measured window: counts toward req/s
                done_in_window += 1
        elif not first_error:
            first_error.append(key if err is None else f"{key}: {err}")

    async def cpu_clock() -> None:
        await asyncio.sleep(max(0.0, t0 - time.time()))
        ru = resource.getrusage(resource.RUSAGE_SELF)
        cpu["start"] = ru.ru_utime + ru.ru_stime
        await asyncio.sleep(max(0.0, t1 - time.time()))
        ru = resource.getrusage(resource.RUSAGE_SELF)
        cpu["end"] = ru.ru_utime + ru.ru_stime

    # Each process owns the request indices idx, idx + P, ...; connection j of it the
    # indices idx + P*j, idx + P*(j + C), ...: every wallet is used, round robin.
    if spec["mode"] == "closed":

        async def conn_loop(j: int) -> None:
            send, i = sender(), idx + nproc * j
            while (start := time.time()) < t1:
                try:
                    status, err = await send(i), None
                except Exception as e:  # noqa: BLE001 - counted as an error of the run
                    status, err = None, e
                record(status, err, start, time.time())
                i += nproc * c

        await asyncio.gather(cpu_clock(), *(conn_loop(j) for j in range(c)))
        scheduled = None
    else:
        rate_p = spec["rate"] / nproc
        queue: asyncio.Queue = asyncio.Queue()
        warm = spec["warmup"]
        scheduled = 0

        async def schedule() -> None:
            nonlocal scheduled
            n, begin = 0, t0 - warm + idx / spec["rate"]  # processes interleave their arrivals
            while (due := begin + n / rate_p) < t1:
                if (d := due - time.time()) > 0:
                    await asyncio.sleep(d)
                queue.put_nowait((idx + nproc * n, due))
                scheduled += due >= t0
                n += 1
            for _ in range(c):
                queue.put_nowait(None)

        async def conn_loop(j: int) -> None:
            send = sender()
            while (item := await queue.get()) is not None:
                i, due = item
                if time.time() > t1 + spec["drain"]:
                    continue  # not sent: counted below as unanswered
                try:
                    status, err = await send(i), None
                except Exception as e:  # noqa: BLE001
                    status, err = None, e
                record(status, err, due, time.time())

        await asyncio.gather(cpu_clock(), schedule(), *(conn_loop(j) for j in range(c)))
    if hx is not None:
        await hx.aclose()
    answered = sum(codes.values())
    if scheduled is not None and answered < scheduled:
        codes["unanswered"] += scheduled - answered
    return {
        "latencies": lat,
        "codes": dict(codes),
        "done_in_window": done_in_window,
        "scheduled": scheduled,
        "cpu_seconds": cpu.get("end", 0.0) - cpu.get("start", 0.0),
        "first_error": first_error[:1],
        "clients": k,
    }


def _load_process(conn, spec: dict[str, Any], wallets: list[Wallet]) -> None:
    try:
        if spec["cpus"]:
            os.sched_setaffinity(0, set(spec["cpus"]))
        if spec["uvloop"]:
            import uvloop

            uvloop.install()
        out = asyncio.run(_drive(spec, wallets))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the scenario
        out = {"crash": f"{type(e).__name__}: {e}"}
    conn.send_bytes(json.dumps(out).encode())
    conn.close()


# --- one scenario -------------------------------------------------------------------------


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def run_scenario(
    server: Coordinator,
    scenario: str,
    mode: str,
    wallets: list[Wallet],
    args: argparse.Namespace,
    load_cpus: list[int] | None,
) -> dict[str, Any]:
    ctx = mp.get_context("fork")  # the wallets' private keys stay in memory: no pickling
    procs, pipes = [], []
    start_delay = 1.5 + 0.2 * args.procs
    t0 = time.time() + start_delay + args.warmup
    for i in range(args.procs):
        spec = {
            "scenario": scenario,
            "mode": mode,
            "port": server.port,
            "t0": t0,
            "duration": args.duration,
            "warmup": args.warmup,
            "drain": 5.0,
            "concurrency": args.concurrency,
            "procs": args.procs,
            "index": i,
            "rate": args.rate,
            "clients": len(wallets),
            "blob_bytes": args.blob_kib * 1024,
            "client": args.client,
            "cpus": load_cpus,
            "uvloop": args.client_uvloop,
        }
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_load_process, args=(child, spec, wallets), daemon=True)
        p.start()
        child.close()
        procs.append(p)
        pipes.append(parent)
    time.sleep(max(0.0, t0 - time.time()))
    s0, m0 = server.cpu_seconds(), machine_busy_seconds()
    time.sleep(max(0.0, t0 + args.duration - time.time()))
    s1, m1 = server.cpu_seconds(), machine_busy_seconds()
    results = []
    for p, pipe in zip(procs, pipes):
        if not pipe.poll(args.duration + 60):
            p.kill()
            results.append({"crash": "load process did not report"})
        else:
            results.append(json.loads(pipe.recv_bytes()))
        p.join(5)
    crashes = [r["crash"] for r in results if "crash" in r]
    if crashes:
        raise RuntimeError(f"{scenario}: load process failed: {crashes[0]}")
    lat = [x for r in results for x in r["latencies"]]
    codes: Counter[str] = Counter()
    for r in results:
        codes.update(r["codes"])
    ok = sum(n for code, n in codes.items() if code.isdigit() and int(code) < 400)
    errors = sum(codes.values()) - ok
    done = sum(r["done_in_window"] for r in results)
    rps = done / args.duration
    server_cpu = s1 - s0
    row = {
        "impl": server.impl,
        "scenario": scenario if mode == "closed" else f"{scenario}@{args.rate:g}/s",
        "mode": mode,
        "clients": len(wallets),
        "concurrency": args.concurrency * args.procs,
        "load_procs": args.procs,
        "offered_rps": args.rate if mode == "open" else None,
        "rps": rps,
        "requests": ok,
        "errors": errors,
        "codes": dict(codes),
        "first_error": next((r["first_error"][0] for r in results if r["first_error"]), None),
        "p50_ms": None if not lat else 1000 * _pct(lat, 0.50),
        "p90_ms": None if not lat else 1000 * _pct(lat, 0.90),
        "p99_ms": None if not lat else 1000 * _pct(lat, 0.99),
        "max_ms": None if not lat else 1000 * max(lat),
        "mean_ms": None if not lat else 1000 * statistics.fmean(lat),
        "server_cpu_pct": 100 * server_cpu / args.duration,
        "server_cpu_us_per_req": (1e6 * server_cpu / done) if done else None,
        "load_cpu_pct": 100 * sum(r["cpu_seconds"] for r in results) / args.duration,
        # every other process on the machine (another job here competes for the 2 cores)
        "other_cpu_pct": 100 * (m1 - m0 - server_cpu - sum(r["cpu_seconds"] for r in results)) / args.duration,
        "duration_s": args.duration,
    }
    if scenario == "heartbeat":
        row["target"] = f">= {TARGET_RPS:g}/s, p99 < {TARGET_P99_MS:g} ms"
        enough = (rps >= 0.99 * args.rate and args.rate >= TARGET_RPS) if mode == "open" else rps >= TARGET_RPS
        row["met"] = bool(enough and lat and row["p99_ms"] < TARGET_P99_MS and errors == 0)
    else:
        row["target"], row["met"] = None, None
    return row


def register(url: str, wallets: list[Wallet]) -> float:
    t = time.perf_counter()
    with httpx.Client(base_url=url, timeout=30.0) as http:
        c = CoordinatorClient(url)
        c.http.close()
        c.http = http  # one keep-alive connection for all K registrations
        for w in wallets:
            c.wallet = w
            c.post("/workers", {"gpu": "RTX4090", "price": "1.0", "availability": 0.99, "device": {"name": "load"}})
    return time.perf_counter() - t


def microbench() -> dict[str, float]:
    """In-process costs of the pieces of a heartbeat request (microseconds each)."""
    w = Wallet.generate("m")
    n = 2000
    t = time.perf_counter()
    hs = [sign_request(w, "POST", "/v1/workers/heartbeat", b"{}") for _ in range(n)]
    sign_us = 1e6 * (time.perf_counter() - t) / n
    skew = Settings.model_fields["max_skew_seconds"].default  # the coordinator's, as it verifies
    nonces = NonceCache(2 * skew)
    t = time.perf_counter()
    for h in hs:
        verify_request(
            h, "POST", "/v1/workers/heartbeat", body_digest(b"{}"), now=time.time(), max_skew=skew, nonces=nonces
        )
    verify_us = 1e6 * (time.perf_counter() - t) / n
    return {"sign_request_us": sign_us, "verify_request_us": verify_us}


# --- main -----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 s per scenario, 20 clients, the shipped server only")
    ap.add_argument("--duration", type=float, default=20.0, help="measured seconds per scenario")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of load before measuring")
    ap.add_argument("--clients", type=int, default=200, help="registered clients (wallets) signing the requests")
    ap.add_argument("--concurrency", type=int, default=32, help="connections (requests in flight) per load process")
    ap.add_argument("--procs", type=int, default=1, help="load generator processes")
    ap.add_argument("--rate", type=float, default=TARGET_RPS, help="offered heartbeats/s of the open-loop scenario")
    ap.add_argument("--blob-kib", type=int, default=4)
    ap.add_argument("--scenarios", default="health,heartbeat,heartbeat@rate,blob")
    ap.add_argument(
        "--impls",
        default=None,
        help="servers, comma-separated: cli (aitbc coordinator serve as shipped), h11, httptools "
        "(default: cli,h11; --quick: cli)",
    )
    ap.add_argument("--client", choices=["raw", "httpx"], default="raw")
    ap.add_argument("--no-pin", action="store_true", help="do not pin server and load to separate cores")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.clients, args.warmup = 2.0, 20, 0.5
    if args.impls is None:
        args.impls = "cli" if args.quick else "cli,h11"
    args.client_uvloop = importlib.util.find_spec("uvloop") is not None
    impls = [s.strip() for s in args.impls.split(",") if s.strip()]
    for impl in impls:
        if impl not in ("cli", *_FORCED):
            ap.error(f"unknown --impls entry {impl!r} (cli, h11, httptools)")
    ncpu = len(os.sched_getaffinity(0))
    pin = not args.no_pin and ncpu >= 2
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus, load_cpus = ({cpus[0]}, cpus[1:]) if pin else (None, None)
    auto = auto_impl()
    micro = microbench()

    rows = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="aitbc-load-") as tmp:
        for impl in impls:
            wallets = [Wallet.generate(f"c{i}") for i in range(args.clients)]
            with Coordinator(Path(tmp) / impl / "home", impl=impl, cpus=server_cpus) as server:
                reg_s = register(server.url, wallets)
                for sc in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
                    scenario, _, mode = sc.partition("@")
                    row = run_scenario(server, scenario, "open" if mode else "closed", wallets, args, load_cpus)
                    row["impl_resolved"] = auto if impl == "cli" else "+".join(_FORCED[impl])
                    row["register_s"] = reg_s
                    rows.append(row)
                    print(
                        f"  {impl:9s} {row['scenario']:18s} {row['rps']:8.0f} req/s  p99 "
                        f"{row['p99_ms'] or float('nan'):7.1f} ms  errors {row['errors']}",
                        flush=True,
                    )
                log = server.log_tail()
            if "Traceback" in log or "ERROR" in log:
                print(f"  coordinator ({impl}) logged errors:\n{log}")

    def fmt(v: float | None, spec: str = ".1f") -> str:
        return "-" if v is None else format(v, spec)

    print_table(
        f"coordinator load: {args.duration:g} s per scenario, server pinned to core {cpus[0] if pin else '-'}, "
        f"load ({args.client} client, {args.procs} process) on {load_cpus if pin else 'any core'}",
        [
            "server",
            "scenario",
            "clients",
            "conc.",
            "req/s",
            "p50 ms",
            "p99 ms",
            "errors",
            "server CPU %",
            "server µs/req",
            "load CPU %",
            "others CPU %",
            "target",
            "verdict",
        ],
        [
            [
                f"{r['impl']} ({r['impl_resolved']})",
                r["scenario"],
                r["clients"],
                r["concurrency"],
                f"{r['rps']:.0f}",
                fmt(r["p50_ms"], ".2f"),
                fmt(r["p99_ms"], ".2f"),
                r["errors"],
                f"{r['server_cpu_pct']:.0f}",
                fmt(r["server_cpu_us_per_req"], ".0f"),
                f"{r['load_cpu_pct']:.0f}",
                f"{max(0.0, r['other_cpu_pct']):.0f}",
                r["target"] or "-",
                "-" if r["met"] is None else ("MET" if r["met"] else "MISSED"),
            ]
            for r in rows
        ],
    )
    print(
        f"in-process: sign_request {micro['sign_request_us']:.0f} µs, verify_request {micro['verify_request_us']:.0f} µs "
        f"per heartbeat; `aitbc coordinator serve` here runs {auto}"
    )
    for r in rows:
        if r["met"] is not None:
            print(
                f"{r['impl']} ({r['impl_resolved']}) {r['scenario']}: {r['rps']:.0f} req/s, p99 {fmt(r['p99_ms'])} ms "
                f"({'meets' if r['met'] else 'MISSES'} the target)"
            )
    from _sims import machine  # imports torch: only after the load processes are gone

    write_json(
        "coordinator_load",
        {
            "machine": {**machine(), "cores": ncpu},
            "source": source_state(),
            "args": vars(args),
            "pinned": pin,
            "server_cpus": sorted(server_cpus) if pin else None,
            "load_cpus": load_cpus,
            "auto_impl": auto,
            "microbench": micro,
            "rows": rows,
            "wall_s": time.perf_counter() - t_all,
        },
    )


if __name__ == "__main__":
    main()
