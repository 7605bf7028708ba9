"""How long the rounds go undriven when the coordinator that drives them is SIGKILLed.

Two ``aitbc coordinator serve`` processes share one PostgreSQL database and one home (blob
folder and wallet). Each trial SIGKILLs the replica that holds the driver lease and times,
from the kill, until the other one's ``/v1/health`` says ``driving`` (polled every 10 ms);
the killed one is started again as the new standby. Figures per driver lease period
(``--driver-lease``): the takeover's min / median / max in seconds and in lease periods.
The expected takeover is at most one period (what was left of the lease, renewed each
quarter) plus the standby's next try (every eighth of a period, at most 1 s).

PostgreSQL: ``AITBC_TEST_PG_URL`` (a server's maintenance database) where set, else a
throwaway server started with ``.ci/postgres start`` and stopped after.

    python bench/replica_takeover.py [--trials 5] [--leases 2,5]
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from sqlalchemy import create_engine, make_url, text

from _common import print_table, write_json
from _sims import machine

ROOT = Path(__file__).resolve().parent.parent
AITBC = Path(sys.executable).parent / "aitbc"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(url: str) -> dict | None:
    try:
        return httpx.get(url + "/v1/health", timeout=2).json()
    except httpx.TransportError:
        return None


def wait(cond, timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if cond():
            return time.monotonic() - start
        time.sleep(0.01)
    raise RuntimeError(f"{what} not reached in {timeout} s")


class Replica:
    def __init__(self, work: Path, name: str, db: str, lease: float) -> None:
        self.work, self.name, self.db, self.lease = work, name, db, lease
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = (self.work / f"{self.name}.log").open("ab")
        args = ["coordinator", "serve", "--home", str(self.work / "home"), "--port", str(self.port)]
        args += ["--db", self.db, "--driver-lease", str(self.lease), "--log-level", "warning"]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([str(AITBC), *args], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait(lambda: health(self.url) is not None, 180, f"{self.name} up")
        except RuntimeError:
            log_tail = (self.work / f"{self.name}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} did not start:\n{log_tail}") from None

    def driving(self) -> bool:
        h = health(self.url)
        return bool(h and h["driving"])

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


def trials(work: Path, db: str, lease: float, n: int) -> list[float]:
    a, b = Replica(work, "a", db, lease), Replica(work, "b", db, lease)
    replicas = [a, b]
    a.start()
    wait(a.driving, 30, "a driving")
    b.start()
    out = []
    try:
        driver, standby = a, b
        for _ in range(n):
            time.sleep(lease * 0.6)  # the kill falls anywhere in a renewal period
            assert driver.driving() and not standby.driving()
            t0 = time.monotonic()
            driver.kill()
            wait(standby.driving, 30 * lease, "takeover")
            out.append(time.monotonic() - t0)
            back = Replica(work, driver.name, db, lease)  # back as the standby (a new port)
            back.start()
            driver, standby = standby, back
            replicas.append(back)
    finally:
        for r in replicas:
            if r.proc and r.proc.poll() is None:
                r.kill()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--leases", default="2,5", help="driver lease periods to measure, seconds, comma-separated")
    args = ap.parse_args()
    leases = [float(x) for x in args.leases.split(",")]
    pg_dir, server = None, os.environ.get("AITBC_TEST_PG_URL")
    if not server:
        pg_dir = tempfile.mkdtemp(prefix="aitbc-pg-")
        line = subprocess.run([str(ROOT / ".ci" / "postgres"), "start", pg_dir], capture_output=True, text=True)
        if line.returncode != 0:
            sys.exit(f"could not start PostgreSQL (.ci/postgres start): {line.stderr.strip()}")
        server = line.stdout.strip().split("=", 1)[1]
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    rows, results = [], {}
    try:
        for lease in leases:
            name = f"aitbc_bench_{secrets.token_hex(4)}"
            with admin.connect() as c:
                c.execute(text(f'CREATE DATABASE "{name}"'))
            db = make_url(server).set(database=name).render_as_string(hide_password=False)
            with tempfile.TemporaryDirectory() as work:
                took = trials(Path(work), db, lease, args.trials)
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
            med = statistics.median(took)
            results[str(lease)] = took
            rows.append(
                (
                    f"{lease:g} s",
                    len(took),
                    f"{min(took):.2f}",
                    f"{med:.2f}",
                    f"{max(took):.2f}",
                    f"{med / lease:.2f}",
                    f"{max(took) / lease:.2f}",
                )
            )
    finally:
        admin.dispose()
        if pg_dir:
            subprocess.run([str(ROOT / ".ci" / "postgres"), "stop", pg_dir], capture_output=True)
    print_table(
        "Takeover after SIGKILL of the driving coordinator (2 replicas, PostgreSQL, loopback)",
        ["driver lease", "kills", "min s", "median s", "max s", "median / lease", "max / lease"],
        rows,
    )
    write_json(
        "replica_takeover",
        {
            "takeover_seconds": results,
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()
