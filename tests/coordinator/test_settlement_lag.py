"""Settlement keeps up with the rounds: each round's close-to-settlement lag is recorded
(``aitbc_settlement_lag_seconds``), and the books never fall more than ``settle_within_rounds``
closed rounds or ``settle_within_seconds`` behind, whichever is longer: a thread at the
coordinator's priority catches them up, and the driver does not close a run's round past
that bound (:mod:`aitbc.coordinator.rounds.catch_up`)."""

from __future__ import annotations

import os
import re
import sys
import threading

import pytest
import torch

from aitbc.coordinator.rounds.catch_up import Backlog, SettleBound
from aitbc.coordinator.verification import settlement

from .conftest import wait_for


def _backlog(oldest: int, newest: int, age: float, *, training: bool = True) -> Backlog:
    return Backlog("run", oldest, newest, 100.0 - age, training)


def test_the_bound_is_rounds_or_seconds_whichever_is_longer():
    bound = SettleBound(rounds=2, seconds=10.0)
    now = 100.0
    # two rounds behind: one more close would pass the rounds, but not past the 10 s
    assert not bound.holds(_backlog(1, 2, age=9.0), now)
    assert bound.holds(_backlog(1, 2, age=11.0), now)  # both past: the close waits
    assert not bound.holds(_backlog(1, 1, age=60.0), now)  # one round behind: within the rounds, however old
    assert not bound.holds(None, now)  # level
    # the catch-up thread starts half-way, in time, once as many rounds behind as allowed ...
    assert bound.urgent(_backlog(1, 2, age=5.0), now) and not bound.urgent(_backlog(1, 2, age=4.0), now)
    assert not bound.urgent(_backlog(1, 1, age=60.0), now)
    # ... and a run that closes no more rounds (ended, paused) by time alone: its tail too
    assert bound.urgent(_backlog(5, 5, age=5.0, training=False), now)
    with pytest.raises(ValueError, match="settle_within_rounds must be at least 1, got 0"):
        SettleBound(rounds=0, seconds=1.0)


def _behind(coord, run_id: str) -> int:
    """Closed rounds not yet settled, read in one statement (both from one moment)."""
    (row,) = coord.rows(
        "SELECT (SELECT COALESCE(MAX(x.round), 0) FROM rounds x WHERE x.run_id = r.id) - r.settled_round AS n "
        "FROM runs r WHERE r.id = :r",
        r=run_id,
    )
    return row["n"]


def test_with_settlement_held_back_the_driver_does_not_close_past_the_bound(new_coordinator, api, monkeypatch):
    # Settlement held back until the test lets it go; with no seconds' allowance the bound
    # is 2 rounds: rounds 1 and 2 close unsettled, round 3's close waits for round 1's pay.
    release = threading.Event()
    real_settle, real_holds = settlement.settle, SettleBound.holds
    verdicts: list[bool] = []

    def held_settle(ctx, run_id, r):
        assert release.wait(60), "settlement never released"
        real_settle(ctx, run_id, r)

    def spied_holds(self, b, now):  # what the driver decided, so the test waits on it, not on time
        verdict = real_holds(self, b, now)
        verdicts.append(verdict)
        return verdict

    monkeypatch.setattr(settlement, "settle", held_settle)
    monkeypatch.setattr(SettleBound, "holds", spied_holds)
    # The books thread at the process's priority: on a machine whose cores are full (tests
    # beside it), a niced one would take its time over the rounds after the release.
    coord = new_coordinator(settle_within_seconds=0, books_nice=0)
    rounds = 4
    t = api.start_training_run(coord, 2, rounds=rounds)
    run = f"/runs/{t.run_id}"
    sign = torch.tensor([1.0, -1.0]).repeat((t.d + 1) // 2)[: t.d]

    def send(r: int) -> None:  # two different updates (equal ones: the second is a copy, flagged)
        for i, w in enumerate(t.workers):
            cid = api.put_update(w, 1e-3 * r * (1 + 0.5 * (-1) ** i * sign))
            w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", api.update_body(r, cid))

    def closed(r: int) -> None:
        wait_for(f"round {r} closed", lambda: t.owner.get(run), lambda v: v["round"] > r or v["status"] == "complete")

    try:
        send(1)
        closed(1)
        send(2)
        closed(2)
        assert _behind(coord, t.run_id) == 2  # held back: two closed rounds unsettled, as the bound allows
        send(3)
        wait_for("the driver holding round 3's close", lambda: any(verdicts), lambda held: held)
        view = t.owner.get(run)
        assert (view["round"], view["status"]) == (3, "training")  # round 3 stays open: settlement first
        assert _behind(coord, t.run_id) == 2
    finally:
        release.set()
    closed(3)
    assert _behind(coord, t.run_id) <= 2  # round 1 was paid before round 3 closed
    send(4)
    wait_for("all settled", lambda: t.owner.get(f"{run}/payments")["settled_round"], lambda s: s == rounds, 60)
    settled = coord.rows("SELECT round, COUNT(*) AS n FROM settlements WHERE run_id = :r GROUP BY round", r=t.run_id)
    assert sorted((s["round"], s["n"]) for s in settled) == [(r, 2) for r in range(1, rounds + 1)]  # once each
    with coord.http() as http:
        text = http.get("/metrics").text
    count = re.search(r"^aitbc_settlement_lag_seconds_count (\S+)$", text, re.M)
    assert count and float(count.group(1)) == rounds, text  # one lag a round, observed as it settled


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_the_catch_up_thread_keeps_the_coordinators_priority(new_coordinator):
    coord = new_coordinator(books_nice=7)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    threads = {th.name: th for th in threading.enumerate()}
    books = [th for name, th in threads.items() if name == "books"]
    catch_up = [th for name, th in threads.items() if name == "books-catch-up"]
    assert books and catch_up and coord.url
    wait_for(
        "a books thread lowered",
        lambda: [os.getpriority(os.PRIO_PROCESS, th.native_id) for th in books],
        lambda ns: min(base + 7, 19) in ns,
    )
    assert all(os.getpriority(os.PRIO_PROCESS, th.native_id) == base for th in catch_up)
