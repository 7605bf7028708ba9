"""A gossip worker's roster: a replaced worker keeps the positions (same size, same draws);
a worker gone for good, or one more, changes the size and the topology's draws are made
again over the new positions, the same for every worker that reads that roster; a roster
too small for the topology keeps the old draws; a neighbour the coordinator found
equivocating is not mixed again."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from aitbc.core.gossip import RoundNeighbours
from aitbc.replies.gossip import GossipOrder, RosterEntry
from aitbc.replies.jobs import JobOrder
from aitbc.worker.calls import CoordinatorCalls
from aitbc.worker.gossip import GossipLoop
from aitbc.worker.gossip_publish import Publisher


def _entry(k: int) -> RosterEntry:
    return RosterEntry(worker=f"w{k}", job_id=f"job_{k}", public_key=f"key{k}", url=None, samples=10)


def _view(roster: list[RosterEntry], topology: str = "ring", next_round: int = 1) -> JobOrder:
    """A job's view as much as a roster's refresh reads of it (its gossip order)."""
    order = GossipOrder.model_construct(roster=roster, topology=topology, seed=7, next_round=next_round)
    return JobOrder.model_construct(job_id="job_1", gossip=order)


def _loop(me: str, roster: list[RosterEntry], topology: str = "ring") -> GossipLoop:
    loop = GossipLoop.__new__(GossipLoop)
    loop.address = me
    loop.roster = roster
    loop.me = next(i for i, e in enumerate(roster) if e.worker == me)
    loop.neighbours = RoundNeighbours(topology, len(roster), 7)
    loop.next = 1
    return loop


def _peers(loop: GossipLoop, r: int) -> list[str]:
    return [loop.roster[j].worker for j in loop.neighbours.of(r, loop.me)]


def test_a_replaced_worker_keeps_the_positions():
    roster = [_entry(k) for k in range(4)]
    loop = _loop("w1", roster)
    assert _peers(loop, 1) == ["w0", "w2"]
    replaced = [*roster[:2], _entry(9).model_copy(update={"url": "http://10.0.0.9:1"}), roster[3]]
    loop.refresh(_view(replaced, next_round=3))
    assert _peers(loop, 3) == ["w0", "w9"] and loop.next == 3


def test_a_worker_gone_for_good_is_nobodys_neighbour_any_more():
    roster = [_entry(k) for k in range(4)]
    loops = {w: _loop(w, roster) for w in ("w0", "w1", "w3")}
    assert _peers(loops["w3"], 2) == ["w0", "w2"] and _peers(loops["w1"], 2) == ["w0", "w2"]
    smaller = [roster[0], roster[1], roster[3]]  # w2 ejected, its shard not taken over
    for loop in loops.values():
        loop.refresh(_view(smaller, next_round=2))
    assert _peers(loops["w3"], 2) == ["w0", "w1"] and _peers(loops["w1"], 2) == ["w0", "w3"]
    assert _peers(loops["w0"], 2) == ["w1", "w3"]


def test_random_draws_agree_between_workers_after_a_change():
    roster = [_entry(k) for k in range(6)]
    smaller = roster[:5]
    loops = [_loop(f"w{k}", roster, "random:2") for k in range(5)]
    for loop in loops:
        loop.refresh(_view(smaller, "random:2", next_round=4))
    fresh = RoundNeighbours("random:2", 5, 7)
    for k, loop in enumerate(loops):
        assert loop.neighbours.of(4, k) == fresh.of(4, k)  # one draw for everyone who read this roster
        assert "w5" not in _peers(loop, 4)


def test_a_roster_too_small_for_the_topology_keeps_the_old_draws():
    roster = [_entry(k) for k in range(4)]
    loop = _loop("w0", roster, "random:2")
    before = loop.neighbours
    loop.refresh(_view(roster[:2], "random:2"))  # random:2 needs 3 or more workers
    assert loop.neighbours is before and loop.roster is roster


def test_a_roster_without_this_worker_changes_nothing():
    roster = [_entry(k) for k in range(4)]
    loop = _loop("w1", roster)
    loop.refresh(_view([roster[0], roster[2], roster[3]], next_round=5))
    assert loop.roster is roster and loop.me == 1 and loop.next == 1


def test_an_equivocating_neighbour_is_not_mixed_again():
    reply = {
        "data": [
            {"worker": "w2", "job_id": "job_2", "round": 3, "cid": "bafkreia", "verdict": "equivocation"},
            {"worker": "w0", "job_id": "job_0", "round": 3, "cid": "bafkreib", "verdict": "consistent"},
        ],
        "count": 2,
    }
    client = SimpleNamespace(post=lambda path, body, timeout=None: reply)
    publisher = Publisher.__new__(Publisher)
    publisher.calls = CoordinatorCalls(client, stop=threading.Event(), backoff=0.2, max_backoff=5.0)  # type: ignore[arg-type]
    publisher.distrusted = set()
    publisher.report_witnessed(3, [{"record": {}}])
    assert publisher.distrusted == {"w2"}
