"""End to end (issue 16, part 2): Prometheus metrics of a live run.

A real coordinator process, three real worker processes (one serving its own metrics on
``--metrics-port``, one Byzantine whose update of 3e38 per coordinate the norm bound rejects),
the owner's CLI, SQLite (or PostgreSQL). ``/metrics`` and the worker's endpoint are read
with prometheus-client's own parser, and every counter is checked against the run's record:
rounds in ``GET /v1/runs/{id}/rounds``, accepted and rejected updates in its results (and the
rejected ones under their reason code), ledger entries in ``/v1/ledger/entries``, the
training's bytes, the flags; the worker's rounds, steps and bytes against its updates."""

from __future__ import annotations

import socket
import time
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow

ROUNDS, STEPS = 3, 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``{sample name: {sorted labels: value}}``, parsed by prometheus-client's parser."""
    r = httpx.get(url, timeout=10)
    assert r.status_code == 200, r.text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def by(samples: dict[tuple[tuple[str, str], ...], float], label: str) -> dict[str, float]:
    return {dict(k)[label]: v for k, v in samples.items()}


def one(m: dict, name: str) -> float:
    return m[name][()]


def _wait_metrics(url: str, cond, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        if cond(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


@pytest.mark.long  # a minute or more of real processes: make test-long (and test-pg)
def test_metrics_match_the_record_of_a_live_run(stack):
    stack.start_coordinator()
    port = _free_port()
    worker_url = f"http://127.0.0.1:{port}/metrics"
    stack.start_worker("honest0", metrics_port=port)
    stack.start_worker("honest1", price="1.10")
    stack.start_worker("byz", price="0.50", attack="scale:value=3e38")
    stack.wait_offers(3)
    run_id = stack.init_run(workers=3)
    stack.start_run(run_id, workers=3, rounds=ROUNDS, local_steps=STEPS)

    # While the run trains: the worker's endpoint shows its job and steps once a round is in.
    stack.wait_run(run_id, lambda r: r["round"] >= 2 or r["status"] in ("complete", "failed"), what="round 2")
    w = _wait_metrics(worker_url, lambda m: one(m, "aitbc_worker_rounds_total") >= 1)
    assert one(w, "aitbc_worker_rounds_total") >= 1
    assert one(w, "aitbc_worker_steps_total") >= STEPS
    assert one(w, "aitbc_worker_steps_per_second") > 0
    assert by(w["aitbc_worker_bytes_total"], "direction")["down"] > 0
    assert by(w["aitbc_worker_bytes_total"], "direction")["up"] > 0
    jobs = [dict(k) for k in w.get("aitbc_worker_job_info", {})]
    if jobs:  # the job is shown while held (the run may have ended meanwhile: then none)
        assert [j["training_id"] for j in jobs] == [run_id]

    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=180, what="the end")
    assert run["status"] == "complete", run["error"]
    stack.finalized(run_id)
    m = scrape(f"{stack.url}/metrics")

    # Rounds: every closed round of GET /rounds, each closed by the driver (the histogram).
    closed = [r for r in stack.api(f"/runs/{run_id}/rounds")["data"] if r["round"] > 0]
    assert len(closed) == ROUNDS
    rounds = by(m["aitbc_rounds_total"], "outcome")
    assert rounds == {
        "aggregated": ROUNDS - sum(r["skipped"] for r in closed),
        "skipped": sum(r["skipped"] for r in closed),
    }
    assert one(m, "aitbc_round_close_seconds_count") == ROUNDS
    assert one(m, "aitbc_round_close_seconds_sum") > 0

    # Updates: the results' accepted and rejected; the Byzantine ones under norm_bound.
    results = stack.api(f"/runs/{run_id}/results")
    updates = by(m["aitbc_updates"], "status")
    assert updates["accepted"] == results["updates_accepted"] > 0
    assert updates["rejected"] == results["updates_rejected"] >= 1
    reasons = by(m["aitbc_updates_rejected"], "reason")
    assert reasons["norm_bound"] == results["updates_rejected"], reasons
    assert sum(reasons.values()) == updates["rejected"]

    # Ledger entries: /v1/ledger/entries, kind by kind.
    entries = stack.api("/ledger/entries?limit=10000")["data"]
    kinds = Counter(e["kind"] for e in entries)
    ledger = by(m["aitbc_ledger_entries_total"], "kind")
    assert sum(ledger.values()) == len(entries) == stack.api("/ledger")["entries"]
    assert {k: v for k, v in ledger.items() if v} == dict(kinds)

    # Bytes, flags, runs, jobs and workers.
    assert by(m["aitbc_training_bytes_total"], "direction") == {
        "up": results["bytes_up"],
        "down": results["bytes_down"],
    }
    flags = {k: v for k, v in by(m["aitbc_flags_total"], "kind").items() if v}
    assert flags == dict(stack.rows("SELECT kind, COUNT(*) FROM flags GROUP BY kind"))
    assert flags["rejected_update"] >= results["updates_rejected"]
    assert by(m["aitbc_runs"], "status")["complete"] == 1 and one(m, "aitbc_runs_active") == 0
    assert by(m["aitbc_jobs"], "status")["active"] == 0 and one(m, "aitbc_workers_busy") == 0
    assert sum(by(m["aitbc_workers"], "status").values()) == 3
    assert one(m, "aitbc_workers_alive") == 3  # all three still heartbeat
    assert one(m, "aitbc_heartbeats_total") > 0
    http = by({k: v for k, v in m["aitbc_http_bytes_total"].items() if ("kind", "blob") in k}, "direction")
    api = by({k: v for k, v in m["aitbc_http_bytes_total"].items() if ("kind", "api") in k}, "direction")
    # every update blob came in through PUT /v1/blobs, or inside its update message (a small
    # one: base64 in the JSON of POST /v1/jobs/{id}/updates, counted as api bytes)
    assert http["in"] + api["in"] >= results["bytes_up"]

    # The worker's own counters against its updates on record.
    wid = stack.worker_id("honest0")
    ((accepted, sent),) = stack.rows(
        "SELECT SUM(CASE WHEN status = 'accepted' THEN 1 ELSE 0 END), SUM(size) FROM updates WHERE worker_id = :w",
        w=wid,
    )
    w = _wait_metrics(worker_url, lambda m: one(m, "aitbc_worker_round") == 0)
    assert one(w, "aitbc_worker_refusals_total") == 0
    assert one(w, "aitbc_worker_rounds_total") == accepted == ROUNDS
    assert one(w, "aitbc_worker_steps_total") == STEPS * ROUNDS
    assert by(w["aitbc_worker_bytes_total"], "direction")["up"] == sent
    assert one(w, "aitbc_worker_round") == 0 and not w.get("aitbc_worker_job_info")  # the job is over
