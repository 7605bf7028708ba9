"""End to end (issue 15): verification of work on a live run.

A real coordinator process, three honest worker processes and one started with the hidden
test flag ``--cheat skip-half`` (it trains half its local steps and claims them all, with a
commitment that starts at the round's model and ends at the update it sends, so only a
re-run can tell). The owner distributes with ``--verify-rate 0.25``:

- the cheater's update fails its spot check (an interval does not replay) in its first
  round: rejected, never aggregated, its bond burned and the worker ejected;
- every honest update is checked and passes, so the honest workers are paid in full (the
  agreed price for every round), whatever their updates' held-out gain;
- the run's view reports what the checks cost; ``aitbc ledger verify`` passes.

And (issue 33) honest workers on 2 torch threads, re-run by a coordinator on 1 at an lr where
the transformer drifts, are never slashed nor ejected; the skipper still is.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from tests.conftest import TEST_DB

pytestmark = [pytest.mark.slow, pytest.mark.long]

BOND = 2_000_000  # micro-AIT each provider locks (--bond 2)
FUNDS = 10_000_000
PRICE = 1_000_000  # each provider's asking price (1.00 AIT a round)
ROUNDS = 4


def test_a_worker_skipping_half_its_steps_is_caught_slashed_and_ejected(stack):
    stack.start_coordinator()
    honest = stack.start_honest_and_skipper()
    run_id = stack.init_run("--bond", "2", workers=4)
    stack.start_run(run_id, workers=4, rounds=ROUNDS, local_steps=20, verify_rate=0.25)
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]
    assert run["config"]["verify_rate"] == 0.25
    pay = stack.finalized(run_id)

    cheat_id = stack.worker_id("skipper")
    ups = {
        (w, r): (st, v, why)
        for w, r, st, v, why in stack.rows(
            "SELECT worker_id, round, status, verification, verify_detail FROM updates WHERE run_id = :r", r=run_id
        )
    }
    cheats = {k: v for k, v in ups.items() if k[0] == cheat_id}
    # caught in its first round (every interval of its commitment is wrong), then ejected: no more updates
    assert list(cheats) == [(cheat_id, 1)], cheats
    status, verdict, detail = cheats[(cheat_id, 1)]
    assert (status, verdict) == ("rejected", "failed") and "do not replay" in detail, detail

    rows = {r["worker_id"]: r for r in pay["data"]}
    assert rows[cheat_id]["status"] == "slashed" and rows[cheat_id]["slashed_micro"] == BOND
    assert rows[cheat_id]["paid_micro"] == 0
    jobs = {w["worker_id"]: w for w in run["workers"]}
    assert jobs[cheat_id]["job_status"] == "failed" and "ejected" in jobs[cheat_id]["end_reason"]

    for name in honest:
        wid = stack.worker_id(name)
        mine = {k: v for k, v in ups.items() if k[0] == wid}
        assert len(mine) == ROUNDS and all(v[:2] == ("accepted", "passed") for v in mine.values()), mine
        # paid in full: the agreed price for every round
        assert rows[wid]["paid_micro"] == PRICE * ROUNDS and rows[wid]["slashed_micro"] == 0, rows[wid]

    summary = run["verification"]
    assert summary["passed"] == 3 * ROUNDS and summary["failed"] == 1 and summary["unanswered"] == 0
    assert summary["steps_trained"] == 20 * (3 * ROUNDS + 1)
    assert 0 < summary["steps_replayed"] <= summary["steps_trained"]

    spilled = stack.root / "honest0" / "worker-proofs" / "honest0"
    # the last three rounds' (overlap 2: two earlier rounds' spot checks may still be answered)
    assert {p.name for p in spilled.iterdir()} == {str(ROUNDS - 2), str(ROUNDS - 1), str(ROUNDS)}
    assert {p.name for p in (spilled / str(ROUNDS)).iterdir()} == {f"{s}.safetensors" for s in range(0, 21, 2)}

    metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text
    for line in (
        'aitbc_updates_verification{verdict="passed"} 12.0',
        'aitbc_updates_verification{verdict="failed"} 1.0',
        'aitbc_updates_rejected{reason="verification"} 1.0',
        'aitbc_flags_total{kind="verification_failed"} 1.0',
    ):
        assert line in metrics.splitlines(), (line, [m for m in metrics.splitlines() if "verif" in m])

    balances = stack.api("/ledger/balances")["data"]
    assert balances["burn:local"] == BOND  # burned: not the owner's, not another provider's
    assert balances[f"wallet:{cheat_id}"] == FUNDS - BOND
    r = stack.cli("ledger", "verify", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"], r.stdout + r.stderr


HONEST_2T = ("steady0", "steady1")
ROUNDS_2T = 1
STEPS_2T = 100  # 7-step intervals: drift grows with the steps an interval re-runs


TINY_TRANSFORMER = ("--model-opt", "context=32", "--model-opt", "d_model=32", "--model-opt", "n_layers=1")


# The database does not change how a replay drifts: on PostgreSQL (make test-pg) one lr shows
# the verdicts and the money move there; SQLite (make test-long) runs all three.
_ONE_LR_ON_PG = pytest.mark.skipif(TEST_DB == "postgresql", reason="lr0.3 covers the drift verdict on PostgreSQL")


@pytest.mark.parametrize(
    "lr,model_opts",
    [
        pytest.param(0.1, (), marks=_ONE_LR_ON_PG),
        (0.3, ()),
        pytest.param(1.0, TINY_TRANSFORMER, marks=_ONE_LR_ON_PG),  # at lr 1 the default transformer's loss goes NaN
    ],
    ids=["lr0.1", "lr0.3", "lr1"],
)
def test_an_honest_worker_on_two_threads_is_never_slashed_by_replay_drift(stack, lr, model_opts):
    """Issue 33: workers train on 2 torch threads; the coordinator re-runs their intervals on
    1 (``--verify-threads 1``), so kernels sum in other orders and the transformer under AdamW
    at the lr the owner chose drifts (at lr 1, past the old fixed 1e-2 tolerance: the old check
    slashed them). A miss that drift could explain costs the update its pay at most: no
    honest worker is slashed or ejected, at any lr; the skipper's replay is off by far more
    than drift and still is (its intervals commit no-ops: skipped steps)."""
    # re-runs on 1 thread; a wild round (lr 1) is still committed, scored and settled
    stack.start_coordinator(extra=("--verify-threads", "1", "--divergence-factor", "1000000"))
    base_env = stack.env
    stack.env = {**base_env, "OMP_NUM_THREADS": "2"}  # the honest workers' torch threads
    for name in HONEST_2T:
        stack.start_worker(name, max_bond="5", funds="10")
    stack.env = base_env
    stack.start_worker("skipper", max_bond="5", funds="10", cheat="skip-half")
    stack.wait_offers(3)
    run_id = stack.init_run("--bond", "2", *model_opts, model="transformer", workers=3)
    corpus = stack.root / "corpus"
    corpus.mkdir()
    for f in sorted(Path(json.__file__).parent.glob("*.py")):  # any real text: the json package's sources
        (corpus / f.name).write_bytes(f.read_bytes())
    stack.start_run(run_id, workers=3, data=str(corpus), rounds=ROUNDS_2T, local_steps=STEPS_2T, verify_rate=1.0, lr=lr)
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=900, what="the end")
    assert run["status"] == "complete", run["error"]
    pay = stack.finalized(run_id, timeout=300)
    rows = {r["worker_id"]: r for r in pay["data"]}
    jobs = {w["worker_id"]: w for w in run["workers"]}
    ups = stack.rows(
        "SELECT worker_id, round, status, verification, verify_detail FROM updates WHERE run_id = :r", r=run_id
    )
    for name in HONEST_2T:
        wid = stack.worker_id(name)
        mine = [u for u in ups if u[0] == wid]
        assert len(mine) == ROUNDS_2T, mine
        # every interval re-run: passed (within tolerance) or, a drift miss, rejected unpaid; never failed
        assert all(u[3] in ("passed", "drift") for u in mine), mine
        assert all((u[2], u[3]) in (("accepted", "passed"), ("rejected", "drift")) for u in mine), mine
        assert rows[wid]["status"] != "slashed" and rows[wid]["slashed_micro"] == 0, (rows[wid], mine)
        assert jobs[wid]["job_status"] != "failed", (jobs[wid], mine)
        passed = sum(1 for u in mine if u[3] == "passed")
        assert rows[wid]["paid_micro"] == PRICE * passed, (rows[wid], mine)
    flags = stack.rows("SELECT worker_id, kind FROM flags WHERE run_id = :r", r=run_id)
    honest_ids = {stack.worker_id(n) for n in HONEST_2T}
    assert not [f for f in flags if f[0] in honest_ids and f[1] in ("slashed", "verification_failed")], flags

    cheat_id = stack.worker_id("skipper")
    cheats = [u for u in ups if u[0] == cheat_id]
    assert [(u[1], u[2], u[3]) for u in cheats] == [(1, "rejected", "failed")], cheats
    assert rows[cheat_id]["status"] == "slashed" and rows[cheat_id]["slashed_micro"] == BOND
    balances = stack.api("/ledger/balances")["data"]
    assert balances["burn:local"] == BOND  # the cheater's bond only
    r = stack.cli("ledger", "verify", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"], r.stdout + r.stderr
