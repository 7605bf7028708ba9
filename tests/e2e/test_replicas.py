"""End to end: two coordinator processes on one PostgreSQL database and one blob folder.

Replica A starts first and drives the rounds; B stands by. Workers are given both URLs
(two A first, one B first: B's heartbeats must keep that worker live for A's driver), and
so is the owner's CLI (A first). A run trains; the lease holder (A, unless a stall on a
loaded machine let B take over before) is SIGKILLed mid-run; the other takes the rounds
over and the run completes. Every round is recorded and settled
exactly once, no worker's lease ran out, every request to a live replica was answered
throughout, and the CLI (``ledger verify`` at the end) found B by itself.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import signal
import socket
import threading
import time

import httpx
import pytest
from tests.conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.long]

ROUNDS = 10
DRIVER_LEASE = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Watch(threading.Thread):
    """Reads the run and the health of every replica still meant to be up, every 0.2 s;
    keeps every failure."""

    def __init__(self, urls: dict[str, str], run_id: str) -> None:
        super().__init__(daemon=True)
        self.urls, self.run_id = dict(urls), run_id
        self.failures: list[str] = []
        self.answers = 0
        self.before_drop = 0  # answers before a replica was dropped (killed)
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def drop(self, name: str) -> None:
        with self.lock:
            del self.urls[name]
            self.before_drop = self.answers

    def run(self) -> None:
        while not self.stop.wait(0.2):
            with self.lock:
                urls = dict(self.urls)
            for name, url in urls.items():
                for path in ("/v1/health", f"/v1/runs/{self.run_id}"):
                    try:
                        r = httpx.get(url + path, timeout=10)
                        ok = r.status_code == 200
                    except httpx.TransportError as e:
                        ok, r = False, e
                    with self.lock:
                        if name not in self.urls:
                            continue  # killed while we asked
                        self.answers += 1
                        if not ok:
                            self.failures.append(f"{name} {path}: {r}")


def _health(url: str) -> dict:
    return httpx.get(url + "/v1/health", timeout=5).json()


def test_killed_driver_hands_the_rounds_to_the_other_replica(stack, databases):
    if databases.backend != "postgresql":
        pytest.skip("replicas share a PostgreSQL database: AITBC_TEST_DB=postgresql (make test-pg)")
    urls = {"a": stack.url, "b": f"http://127.0.0.1:{_free_port()}"}
    flags = ("--driver-lease", str(DRIVER_LEASE), "--heartbeat-flush", "0.5")
    stack.start_coordinator(name="a", lease=6.0, extra=flags)
    wait_until(lambda: _health(urls["a"])["driving"], "a driving", 30)
    stack.start_coordinator(name="b", lease=6.0, port=int(urls["b"].rsplit(":", 1)[1]), extra=flags)
    a, b = _health(urls["a"]), _health(urls["b"])
    assert a["driving"] and not b["driving"] and a["replica"] != b["replica"]
    both, both_b_first = f"{urls['a']},{urls['b']}", f"{urls['b']},{urls['a']}"
    stack.url = urls["b"]  # the test's own reads (until the kill: then to the survivor)
    stack.env["AITBC_COORDINATOR"] = both  # the owner's CLI is given both, A first: it fails over after the kill
    stack.start_worker("w0", price="1.00", step_delay=0.03, coordinator=both)
    stack.start_worker("w1", price="1.10", step_delay=0.03, coordinator=both)
    stack.start_worker("w2", price="1.20", step_delay=0.03, coordinator=both_b_first)
    stack.wait_offers(3)
    run_id = stack.init_run()
    stack.start_run(run_id, workers=3, rounds=ROUNDS, local_steps=20)
    watch = Watch(urls, run_id)
    watch.start()

    stack.wait_run(run_id, lambda r: r["rounds_completed"] >= 3, timeout=180, what="round 3")
    # the one that drives now (A, unless a stall of A's on this loaded machine let B take over)
    driving = wait_until(lambda: [n for n, u in urls.items() if _health(u)["driving"]], "a driver", 30)
    assert len(driving) == 1, driving
    killed = driving[0]
    survivor = "b" if killed == "a" else "a"
    stack.url = urls[survivor]  # the test's own reads go to the replica that lives
    wait_until(lambda: watch.answers > 0, "the watcher's first answers", 60)  # it watches both sides of the kill
    watch.drop(killed)
    killed_at = time.monotonic()
    stack.kill(killed, signal.SIGKILL)
    wait_until(lambda: _health(urls[survivor])["driving"], f"{survivor} driving", 20 * DRIVER_LEASE)
    took = time.monotonic() - killed_at
    print(f"takeover: {survivor} drives {took:.2f} s after {killed}'s SIGKILL (driver lease {DRIVER_LEASE:g} s)")
    at_kill = stack.api(f"/runs/{run_id}")["rounds_completed"]
    assert at_kill < ROUNDS  # the kill came mid-run: the survivor has rounds left to drive

    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]
    wait_until(lambda: stack.api(f"/runs/{run_id}/payments")["settled_round"] == ROUNDS, "every round settled", 120)
    watch.stop.set()
    watch.join(timeout=30)
    # it watched on both sides of the kill (how many times depends on the machine's speed)
    assert watch.before_drop > 0 and watch.answers > watch.before_drop and watch.failures == []

    # every round recorded once, by one of the two drivers
    rounds = stack.rows("SELECT round FROM rounds WHERE run_id = :r ORDER BY round", r=run_id)
    assert [r for (r,) in rounds] == list(range(ROUNDS + 1))
    # every scored contract settled exactly once per round, each payment one ledger entry
    scored = stack.rows("SELECT contract_id, round FROM scores WHERE run_id = :r ORDER BY 1, 2", r=run_id)
    settled = stack.rows(
        "SELECT contract_id, round, paid, entry_seq FROM settlements WHERE run_id = :r ORDER BY 1, 2", r=run_id
    )
    assert [(c, r) for c, r, _, _ in settled] == scored
    assert {r for _, r in scored} == set(range(1, ROUNDS + 1))
    keys = stack.rows(
        "SELECT key, amount, seq FROM ledger_entries WHERE kind = 'settle' AND key LIKE 'settle:%' ORDER BY seq"
    )
    assert len({k for k, _, _ in keys}) == len(keys)  # no key twice
    paid = {(f"settle:{c}:{r}", p, seq) for c, r, p, seq in settled if p > 0}
    assert set(keys) == paid
    # no worker was failed: heartbeats to either replica kept each live, across the takeover
    expired = stack.rows("SELECT worker_id, reason FROM flags WHERE kind = 'lease_expired'")
    assert expired == []
    holder = stack.rows("SELECT holder FROM driver_lease WHERE name = 'rounds'")
    assert holder == [(_health(urls[survivor])["replica"],)]
    r = stack.cli("ledger", "verify")
    assert r.returncode == 0, r.stdout + r.stderr


# --- a replica whose wall clock is wrong ----------------------------------------------------

SKEW = 30.0


def _libfaketime() -> str:
    """Debian's libfaketime (``apt-get install faketime``; .ci/run installs it): a skip
    without it, or with ``AITBC_REQUIRE_FAKETIME=1`` (CI) a failure."""
    for pattern in ("/usr/lib/*/faketime/libfaketimeMT.so.1", "/usr/lib/faketime/libfaketimeMT.so.1"):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    why = "libfaketime is not installed (apt-get install faketime)"
    if os.environ.get("AITBC_REQUIRE_FAKETIME") == "1":
        pytest.fail(f"AITBC_REQUIRE_FAKETIME=1 but {why}")
    pytest.skip(f"{why}; AITBC_REQUIRE_FAKETIME=1 makes this a failure")


class DrivingWatch(threading.Thread):
    """Asks one replica every 0.2 s whether it drives; keeps every yes."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.asked, self.drove = url, 0, []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            with contextlib.suppress(httpx.TransportError):
                health = _health(self.url)
                self.asked += 1
                if health["driving"]:
                    self.drove.append(health["time"])


def test_a_replica_whose_clock_runs_ahead_never_takes_the_rounds(stack, databases):
    """Issue 33: a replica whose clock ran 30 s ahead took the driver lease from the live
    holder at once (it judged the expiry by its own clock), failed every worker's job as
    silent and left the run stuck. B here runs 30 s ahead (libfaketime, its process alone)
    and serves requests; A drives the whole run, which completes with no worker failed."""
    if databases.backend != "postgresql":
        pytest.skip("replicas on several machines share a PostgreSQL database: AITBC_TEST_DB=postgresql (make test-pg)")
    ahead = {"LD_PRELOAD": _libfaketime(), "FAKETIME": f"+{SKEW:g}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    urls = {"a": stack.url, "b": f"http://127.0.0.1:{_free_port()}"}
    flags = ("--driver-lease", str(DRIVER_LEASE), "--heartbeat-flush", "0.5")
    stack.start_coordinator(name="a", lease=6.0, extra=flags)
    wait_until(lambda: _health(urls["a"])["driving"], "a driving", 30)
    stack.start_coordinator(name="b", lease=6.0, port=int(urls["b"].rsplit(":", 1)[1]), extra=flags, env=ahead)
    b = _health(urls["b"])
    assert b["time"] - time.time() > SKEW - 5, "libfaketime did not move B's clock"  # or this proves nothing
    watch = DrivingWatch(urls["b"])
    watch.start()
    # (the workers and the CLI talk to A: B, its clock 30 s ahead, refuses for its first 30 s
    # every request signed before its own start, as it sees it)
    both = f"{urls['a']},{urls['b']}"
    stack.env["AITBC_COORDINATOR"] = both
    for i in range(3):
        stack.start_worker(f"w{i}", price=f"1.{i}0", step_delay=0.03, coordinator=both)
    stack.wait_offers(3)
    run_id = stack.init_run()
    stack.start_run(run_id, workers=3, rounds=ROUNDS, local_steps=20)
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    watch.stop.set()
    watch.join(timeout=30)
    assert run["status"] == "complete", run["error"]
    assert watch.asked > 0 and watch.drove == [], f"B drove at {watch.drove}"
    assert stack.rows("SELECT holder FROM driver_lease WHERE name = 'rounds'") == [(_health(urls["a"])["replica"],)]
    assert stack.rows("SELECT worker_id, reason FROM flags WHERE kind = 'lease_expired'") == []
    assert stack.rows("SELECT count(*) FROM jobs WHERE run_id = :r AND status = 'failed'", r=run_id) == [(0,)]
    wait_until(lambda: stack.api(f"/runs/{run_id}/payments")["settled_round"] == ROUNDS, "every round settled", 120)
    said = re.search(r"clock is \+(\d+\.\d) s from the database's", (stack.root / "b.log").read_text(errors="replace"))
    assert said and abs(float(said[1]) - SKEW) < 5  # B said how far off it is
