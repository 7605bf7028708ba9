"""End to end: money in a live run. A Byzantine worker is scored near zero, slashed and
loses reputation while honest workers are paid; settlement is exactly once across a
coordinator SIGKILL; the ledger verifies and conserves the supply."""

from __future__ import annotations

import json
import signal
import time

import pytest

pytestmark = pytest.mark.slow


def _verify(stack) -> dict:
    r = stack.cli("ledger", "verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


@pytest.mark.long  # a minute or more on 2 cores: make test-long
def test_byzantine_worker_is_slashed_and_honest_workers_are_paid(stack):
    stack.start_coordinator()
    for i in range(3):
        stack.start_worker(f"honest{i}", price=f"1.{i}0", max_bond="5", funds="10")
    stack.start_worker("byz", price="0.50", max_bond="5", funds="10", attack="sign-flip")
    stack.wait_offers(4)
    run_id = stack.init_run("--bond", "2", workers=4)
    stack.start_run(run_id, workers=4, rounds=6, local_steps=20, aggregator="trimmed-mean:beta=0.25")
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=180, what="the end")
    assert run["status"] == "complete", run["error"]
    pay = stack.finalized(run_id)

    byz_id = stack.worker_id("byz")
    rows = {r["worker_id"]: r for r in pay["data"]}
    byz = rows.pop(byz_id)
    assert byz["status"] == "slashed" and byz["slashed_micro"] == 2_000_000
    assert byz["score"] < 0.1 and "harmful" in byz["flags"]
    assert byz["paid_micro"] == 0
    assert len(rows) == 3
    for honest in rows.values():
        assert honest["status"] == "released" and honest["slashed_micro"] == 0
        assert honest["reputation"] > byz["reputation"]
        price = honest["price_micro"]
        assert honest["paid_micro"] >= 0.7 * price * honest["rounds_accepted"], honest
    # Honest rounds of full quality were paid exactly the agreed price.
    settled = stack.rows(
        "SELECT s.worker_id, s.quality, s.paid, c.price FROM settlements s "
        "JOIN contracts c ON c.id = s.contract_id WHERE s.run_id = :r",
        r=run_id,
    )
    full = [(paid, price) for w, q, paid, price in settled if w != byz_id and q == 1.0]
    assert full and all(paid == price for paid, price in full)
    # The attacker's shard went on without it (ejected at its first settlement).
    byz_jobs = [w for w in run["workers"] if w["worker_id"] == byz_id]
    assert byz_jobs[0]["job_status"] == "failed" and "ejected" in byz_jobs[0]["end_reason"]

    # Money: conservation, refunds, bonds back to honest providers, and a clean audit.
    audit = _verify(stack)
    balances = stack.api("/ledger/balances")["data"]
    held = sum(v for k, v in balances.items() if not k.startswith("mint:"))
    assert held == audit["minted"] == 1000_000_000 + 4 * 10_000_000
    assert balances.get(f"escrow:{run_id}", 0) == 0
    assert not any(k.startswith("bond:") and v for k, v in balances.items())
    for name in ("honest0", "honest1", "honest2"):
        wid = stack.worker_id(name)
        assert balances[f"wallet:{wid}"] == 10_000_000 + rows[wid]["paid_micro"]
    assert balances[f"wallet:{byz_id}"] == 10_000_000 - 2_000_000

    r = stack.cli("distributed-training", "payments", "--training-id", run_id)
    assert r.returncode == 0 and "slashed" in r.stdout
    # Scores are shown by monitor and results too.
    snap = json.loads(stack.cli("distributed-training", "monitor", "--training-id", run_id, "--once", "--json").stdout)
    shown = {w["worker_id"]: w for w in snap["workers"]}
    assert shown[byz_id]["score"] < 0.1 and "harmful" in shown[byz_id]["score_flags"]
    res = json.loads(stack.cli("distributed-training", "results", "--training-id", run_id, "--json").stdout)
    scores = {w["worker_id"]: w["score"] for w in res["workers"]}
    assert scores[byz_id] < 0.1 and all(scores[w] > 0.5 for w in rows)


@pytest.mark.long  # a minute or more of real processes: make test-long (and test-pg)
def test_settlement_is_exactly_once_across_a_coordinator_kill(stack):
    stack.start_coordinator(settle_delay=4.0)  # a wide gap between two settlements (a loaded machine polls slowly)
    for i in range(3):
        stack.start_worker(f"w{i}", price=f"1.{i}0")
    stack.wait_offers(3)
    run_id = stack.init_run()
    stack.start_run(run_id, workers=3, rounds=3, local_steps=20)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        n = stack.rows("SELECT count(*) FROM settlements WHERE run_id = :r", r=run_id)[0][0]
        if n >= 1:
            break
        time.sleep(0.05)
    # killed between two settlements of round 1 (its 3 contracts are settled 4 s apart; a
    # loaded machine may poll late, after the second)
    assert 1 <= n < 3, n
    stack.kill("coordinator", signal.SIGKILL)
    stack.start_coordinator()

    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=180, what="the end")
    assert run["status"] == "complete", run["error"]
    stack.finalized(run_id)
    settled = stack.rows("SELECT contract_id, round, paid, entry_seq FROM settlements WHERE run_id = :r", r=run_id)
    assert len(settled) == 9 and len({(c, r) for c, r, _, _ in settled}) == 9
    entries = stack.rows("SELECT key, amount FROM ledger_entries WHERE kind = 'settle'")
    assert len(entries) == sum(1 for *_, paid, seq in settled if paid > 0)
    assert len({k for k, _ in entries}) == len(entries)
    assert sum(a for _, a in entries) == sum(paid for *_, paid, _ in settled)
    _verify(stack)
