"""End to end (issue 33, parts 2 and 5): fair exchange between an owner and providers who do
not trust each other, on real coordinator and worker processes (SQLite, and PostgreSQL in
``make test-pg``):

- the free-riding owner hires two honest providers and a silent one (it heartbeats and
  never sends), reads the honest updates' bytes, and stops the run before round 1 can
  close: each delivered update is paid its contract's full price, the silent provider
  nothing, and the owner gets back exactly the rest;
- a silent provider loses its place at the round's deadline (failed, flagged), and the run
  goes on without it;
- an owner with no money hires nobody (the CLI exits non-zero naming the shortfall; no
  contract, no bond locked);
- hires of a run that never distributes expire and the providers' bonds come back.

Every case ends with ``aitbc ledger verify`` OK.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]

SILENT = "100000"  # seconds per inner step: the worker heartbeats and never sends an update


def _verify(stack) -> None:
    r = stack.cli("ledger", "verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["ok"]


def _balance(stack, name: str) -> int:
    return stack.api(f"/wallets/{stack.worker_id(name)}/balance")["balance_micro"]


def _owner_balance(stack) -> int:
    r = stack.cli("wallet", "balance", "my-agent-wallet", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["balance_micro"]


def test_an_owner_who_reads_the_updates_and_stops_before_round_1_closes_pays_each_one(stack):
    stack.start_coordinator()
    stack.start_worker("honest0", price="1.00", max_bond="5", funds="10")
    stack.start_worker("honest1", price="1.10", max_bond="5", funds="10")
    stack.start_worker("sybil", price="0.50", max_bond="5", funds="10", step_delay=float(SILENT))
    stack.wait_offers(3)
    run_id = stack.init_run("--bond", "2", workers=3)
    stack.start_run(run_id, workers=3, rounds=5, local_steps=20)  # no --deadline: the default
    honest = {stack.worker_id("honest0"), stack.worker_id("honest1")}

    def delivered(run: dict) -> bool:
        return sum(w["worker_id"] in honest and w["this_round"] == "accepted" for w in run["workers"]) == 2

    run = stack.wait_run(run_id, delivered, timeout=120, what="both honest updates of round 1")
    assert run["round"] == 1 and run["rounds_completed"] == 0  # the sybil holds the round open
    cids = [r[0] for r in stack.rows("SELECT cid FROM updates WHERE run_id = :r AND round = 1", r=run_id)]
    assert len(cids) == 2
    for cid in cids:  # the free rider reads the honest work ...
        got = httpx.get(f"{stack.url}/v1/blobs/{cid}", timeout=30)
        assert got.status_code == 200 and len(got.content) > 0
    owner_before = _owner_balance(stack)
    before = {name: _balance(stack, name) for name in ("honest0", "honest1", "sybil")}
    r = stack.cli("distributed-training", "stop", "--training-id", run_id)  # ... and stops before the close
    assert r.returncode == 0, r.stderr
    pay = stack.finalized(run_id)
    assert pay["rounds_closed"] == 0
    paid = {row["worker_id"]: row["paid_micro"] for row in pay["data"]}
    assert paid[stack.worker_id("honest0")] == 1_000_000 and paid[stack.worker_id("honest1")] == 1_100_000
    assert paid[stack.worker_id("sybil")] == 0
    # bonds (2 AIT each) came back on top of the pay; the silent one was not slashed either
    assert _balance(stack, "honest0") == before["honest0"] + 1_000_000 + 2_000_000
    assert _balance(stack, "honest1") == before["honest1"] + 1_100_000 + 2_000_000
    assert _balance(stack, "sybil") == before["sybil"] + 2_000_000
    escrowed = int(round(float(pay["escrowed"]) * 1_000_000))
    assert _owner_balance(stack) == owner_before + escrowed - 2_100_000
    keys = [k for (k,) in stack.rows("SELECT key FROM ledger_entries WHERE kind = 'settle'")]
    assert len(keys) == len(set(keys)) == 2 and all(re.fullmatch(r"settle:contract_\w+:1", k) for k in keys)
    _verify(stack)


def test_a_silent_provider_loses_its_place_at_the_deadline(stack):
    stack.start_coordinator()
    stack.start_worker("honest0", price="1.00", max_bond="5", funds="10")
    stack.start_worker("sybil", price="0.50", max_bond="5", funds="10", step_delay=float(SILENT))
    stack.wait_offers(2)
    run_id = stack.init_run("--bond", "2", workers=2)
    # a deadline the honest worker meets on a loaded machine (missing it would cost its place too)
    stack.start_run(run_id, workers=2, rounds=3, local_steps=20, deadline=10, quorum=2)
    sybil = stack.worker_id("sybil")
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=180, what="the end")
    assert run["status"] == "complete", run["error"]
    job = next(w for w in run["workers"] if w["worker_id"] == sybil)
    assert job["job_status"] == "failed" and "within its deadline of 10 s: lost its place" in job["end_reason"]
    flags = stack.rows("SELECT kind, round FROM flags WHERE worker_id = :w", w=sybil)
    assert [tuple(f) for f in flags] == [("straggler", 1)]
    pay = stack.finalized(run_id)
    row = next(r for r in pay["data"] if r["worker_id"] == sybil)
    assert row["paid_micro"] == 0 and row["slashed"] == "0"
    assert _balance(stack, "sybil") == 10_000_000  # its bond came back: silence is not provable
    _verify(stack)


def test_an_owner_with_no_money_hires_nobody_and_unused_hires_expire(stack):
    stack.start_coordinator(extra=("--hire-expiry", "3"))
    stack.start_worker("p0", price="1.00", max_bond="5", funds="10")
    stack.start_worker("p1", price="1.00", max_bond="5", funds="10")
    stack.wait_offers(2)
    r = stack.cli(
        "distributed-training",
        "init",
        "--wallet",
        "my-agent-wallet",
        "--model-type",
        "mlp",
        "--dataset-size",
        "1GB",
        "--target-workers",
        "2",
        "--bond",
        "2",
    )
    assert r.returncode == 0, r.stderr
    run_id = re.search(r"Training ID: (training_\w+)", r.stdout).group(1)
    r = stack.cli("distributed-training", "upload-data", "--training-id", run_id, "--data-path", "digits")
    assert r.returncode == 0, r.stderr
    hire = ("distributed-training", "discover-workers", "--training-id", run_id, "--required-workers", "2")
    r = stack.cli(*hire)
    assert r.returncode != 0
    err = " ".join(r.stderr.split())
    assert "needs 20 AIT" in err and "holds 0 AIT" in err and "short by 20 AIT" in err, r.stderr
    assert stack.rows("SELECT id FROM contracts") == []
    assert [_balance(stack, p) for p in ("p0", "p1")] == [10_000_000, 10_000_000]  # no bond locked
    offers = stack.api("/market/offers")["data"]
    assert len(offers) == 2 and not any(o.get("busy") for o in offers)
    # funded, it hires; it never distributes, and the hires expire with the bonds returned
    stack.fund_owner("20")
    r = stack.cli(*hire)
    assert r.returncode == 0, r.stderr
    assert [_balance(stack, p) for p in ("p0", "p1")] == [8_000_000, 8_000_000]
    stack.wait_run(
        run_id,
        lambda run: all(c["status"] == "released" for c in run["contracts"]),
        timeout=60,
        what="the hires to expire",
    )
    assert [_balance(stack, p) for p in ("p0", "p1")] == [10_000_000, 10_000_000]
    assert stack.api(f"/runs/{run_id}")["status"] == "initializing"
    _verify(stack)
