"""End to end: a run that cannot proceed does not stick. Real coordinator and worker
processes: a cheater is slashed (its shard finds no replacement), then every other worker
is SIGKILLed with no other offer on the market; after ``stuck_seconds`` the run is
``failed`` with the reason, the escrow is refunded, the bonds of the providers not slashed
come back, and ``aitbc ledger verify`` is OK."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]

STUCK = 4.0


def test_run_whose_workers_are_all_gone_fails_and_refunds(stack):
    stack.env["AITBC_STUCK_SECONDS"] = str(STUCK)
    stack.start_coordinator(lease=2.0)
    stack.start_worker("honest0", price="1.00", max_bond="5", funds="10", step_delay=0.03)
    stack.start_worker("honest1", price="1.10", max_bond="5", funds="10", step_delay=0.03)
    stack.start_worker("byz", price="0.50", max_bond="5", funds="10", attack="sign-flip", step_delay=0.03)
    stack.wait_offers(3)
    run_id = stack.init_run("--bond", "2", workers=3)
    stack.start_run(run_id, workers=3, rounds=200, local_steps=20, aggregator="median")
    byz_id = stack.worker_id("byz")

    def byz_slashed(run: dict) -> bool:
        return any(w["worker_id"] == byz_id and w["job_status"] == "failed" for w in run["workers"])

    stack.wait_run(run_id, byz_slashed, timeout=120, what="the cheater ejected")
    run = stack.api(f"/runs/{run_id}")
    assert run["status"] in ("training", "aggregating"), run["error"]
    # Every remaining worker dies at once; nobody else offers to work.
    stack.kill("honest0")
    stack.kill("honest1")
    killed_at = time.monotonic()
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=90, what="the run failing")
    waited = time.monotonic() - killed_at
    assert run["status"] == "failed", run
    assert "stuck" in run["error"] and "no active worker" in run["error"], run["error"]
    assert waited >= STUCK  # the lease (2 s) and then the configured wait

    pay = stack.finalized(run_id)
    rows = {r["worker_id"]: r for r in pay["data"]}
    assert rows[byz_id]["status"] == "slashed" and rows[byz_id]["slashed_micro"] == 2_000_000
    r = stack.cli("ledger", "verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    audit = json.loads(r.stdout)
    balances = stack.api("/ledger/balances")["data"]
    assert balances.get(f"escrow:{run_id}", 0) == 0  # nothing left locked for the run
    assert not any(k.startswith("bond:") and v for k, v in balances.items())  # every bond settled
    for name in ("honest0", "honest1"):
        wid = stack.worker_id(name)
        assert rows[wid]["slashed_micro"] == 0
        assert balances[f"wallet:{wid}"] == 10_000_000 + rows[wid]["paid_micro"]  # bond back, pay kept
    assert balances[f"wallet:{byz_id}"] == 10_000_000 - 2_000_000  # the slashed bond stays lost
    held = sum(v for k, v in balances.items() if not k.startswith("mint:"))
    assert held == audit["minted"]
    # The owner got back everything not paid to providers (and anything slashed into the escrow).
    owner = [k for k in balances if k.startswith("wallet:") and k[7:] not in rows]
    assert len(owner) == 1
    paid = sum(r["paid_micro"] for r in rows.values())
    assert balances[owner[0]] >= 1000_000_000 - paid - 2_000_000
