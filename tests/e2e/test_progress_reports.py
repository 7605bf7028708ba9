"""End to end: a worker reports progress at most once per ``--progress-seconds`` (its job's
first report at once), whatever the length of its rounds.

A small model's round takes tens of milliseconds; a progress report at the first step of
every round was a request the coordinator served for each worker each round, on the cores
the workers train on. Two real worker processes train the same digits MLP run on loopback:
one with the default (1 s), one with ``--progress-seconds 0`` (as often as its reporter
sends).
Their logs count the progress requests they sent; the coordinator still measures the
rate-limited worker's speed (its first round's report and update)."""

from __future__ import annotations

import re
import time

import pytest

pytestmark = pytest.mark.slow

ROUNDS = 12


def _progress_posts(log: str) -> list[float]:
    """When (seconds, by the log's clock) each progress request of a worker's log was sent."""
    stamps = re.findall(r"^\S+ (\d\d):(\d\d):(\d\d),(\d{3}) INFO httpx: HTTP Request: POST \S+/progress ", log, re.M)
    return [int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000 for h, m, s, ms in stamps]


@pytest.mark.long  # a minute or more on 2 cores: make test-long
def test_short_rounds_report_progress_once_per_progress_seconds_not_every_round(stack):
    stack.start_coordinator()
    stack.start_worker("limited")  # --progress-seconds 1 (the default)
    stack.start_worker("every", extra=("--progress-seconds", "0"))
    stack.wait_offers(2)
    run_id = stack.init_run(workers=2)
    t0 = time.monotonic()
    stack.start_run(run_id, workers=2, rounds=ROUNDS, local_steps=10)
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=180, what="the end")
    assert run["status"] == "complete", run["error"]
    took = time.monotonic() - t0

    every = _progress_posts(stack.log("every"))
    limited = _progress_posts(stack.log("limited"))
    # Unlimited, a report goes out whenever none is in flight (a newer one replaces one waiting).
    assert len(every) > len(limited), (every, limited)
    assert limited, "the job's first report goes out at once"
    gaps = [b - a for a, b in zip(limited, limited[1:])]
    assert all(g >= 0.95 for g in gaps), gaps  # log stamps are to the millisecond; the clock is the worker's
    assert len(limited) <= 1 + took / 1.0, (len(limited), took)
    if took < ROUNDS / 2:  # rounds shorter than half a second: far fewer reports than rounds
        assert len(limited) < ROUNDS, (len(limited), took)

    speeds = {w["worker_id"]: w for w in run["workers"]}
    assert speeds[stack.worker_id("limited")]["speed"] > 0, speeds  # measured from its report and update
