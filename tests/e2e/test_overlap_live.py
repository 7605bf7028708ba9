"""End to end: overlapping rounds (``distribute --overlap 1`` and ``2``) on a live run.

A real coordinator process and worker processes on loopback, with spot checks
(``--verify-rate 0.25``) and one worker that skips half its steps (``--cheat skip-half``).
Each worker trains round r+1 from the newest model it has as soon as it has sent round r,
so from round 2 on its updates name the model before the round's as their base (with
overlap 2, one of the two before, and an update may arrive before its round opens); the
coordinator is killed (SIGKILL) and restarted mid-run. Then:

- the run completes with every round closed on the honest workers' updates (none lost);
- every honest update passed its spot check, replayed from the start it named, and at
  least one per worker was trained ahead: its base is round r-2's checkpoint and its
  prior its own round r-1 update (an eager start: base less that update), and it counts
  in full; with overlap 2 a base of round r-3's names round r-2's update too (the
  challenge's ``prior_cids``), and some update does;
- the cheater is still caught by the replay, slashed and ejected;
- each honest worker is paid the agreed price once for every round (nothing settled
  twice across the restart), and ``aitbc ledger verify`` passes.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]

PRICE = 1_000_000  # each provider's asking price (1.00 AIT a round)
ROUNDS = 6


@pytest.mark.parametrize("overlap", [1, 2])
def test_overlapping_rounds_are_verified_paid_once_and_survive_a_coordinator_kill(stack, overlap):
    stack.start_coordinator()
    honest = stack.start_honest_and_skipper()
    run_id = stack.init_run("--bond", "2", workers=4)
    stack.start_run(run_id, workers=4, rounds=ROUNDS, local_steps=200, verify_rate=0.25, overlap=overlap)
    stack.wait_run(run_id, lambda r: r["rounds_completed"] >= 2, timeout=120, what="2 rounds")
    stack.kill("coordinator", signal.SIGKILL)
    stack.start_coordinator()  # same home, same port, same database

    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]
    assert run["config"]["overlap"] == overlap
    rounds = stack.api(f"/runs/{run_id}/rounds")["data"]
    assert [r["round"] for r in rounds] == list(range(ROUNDS + 1))
    assert all(r["accepted"] == 3 for r in rounds[1:]), rounds  # no honest update lost
    ckpt = {r["round"]: r["checkpoint_cid"] for r in rounds}

    ups = stack.rows(
        "SELECT worker_id, round, status, verification, challenge, cid, prior_cid FROM updates WHERE run_id = :r",
        r=run_id,
    )
    ahead: dict[str, int] = {}
    chains = 0  # updates trained from round r-3's model (overlap 2): a chain of two priors
    for name in honest:
        wid = stack.worker_id(name)
        mine = sorted((u for u in ups if u[0] == wid), key=lambda u: u[1])
        assert [u[1] for u in mine] == list(range(1, ROUNDS + 1)), mine
        own = {u[1]: u[5] for u in mine}  # round -> its update's CID
        for _, r, status, verdict, challenge, _, prior in mine:
            assert (status, verdict) == ("accepted", "passed"), (name, r, status, verdict)
            ch = json.loads(challenge) if isinstance(challenge, str) else challenge
            start = ch["start_cid"]
            back = [b for b in range(1, overlap + 2) if r - b >= 0 and start == ckpt[r - b]]
            assert back, (name, r, start)  # its round's model, or one of the overlap's before it
            trained_ahead = r >= 2 and back[0] > 1
            # trained ahead: from its own updates since that model too, and replayed from there
            priors = [own[r - i] for i in range(1, back[0])] if trained_ahead else []
            assert (prior, ch["prior_cid"]) == ((priors[0],) * 2 if priors else (None, None)), (name, r)
            assert ch.get("prior_cids", priors) == priors, (name, r, ch)
            ahead[name] = ahead.get(name, 0) + trained_ahead
            chains += len(priors) == 2
    assert all(ahead.get(n, 0) >= 1 for n in honest), ahead  # trained ahead, replayed from that base
    assert overlap < 2 or chains >= 1, chains

    cheat_id = stack.worker_id("skipper")
    cheats = [(r, st, v) for w, r, st, v, *_ in ups if w == cheat_id]
    assert (1, "rejected", "failed") in cheats and all(st == "rejected" for _, st, _ in cheats), cheats

    deadline = time.monotonic() + 120
    while not (pay := stack.api(f"/runs/{run_id}/payments"))["finalized"]:
        assert time.monotonic() < deadline, pay
        time.sleep(0.2)
    rows = {r["worker_id"]: r for r in pay["data"]}
    for name in honest:
        row = rows[stack.worker_id(name)]
        assert row["paid_micro"] == PRICE * ROUNDS and row["slashed_micro"] == 0, row  # once per round
    assert rows[cheat_id]["status"] == "slashed", rows[cheat_id]
    r = stack.cli("ledger", "verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
