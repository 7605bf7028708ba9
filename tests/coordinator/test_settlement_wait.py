"""The SDK's payments and refund wait for an ended run's settlement instead of answering
before it (partial payments) or failing (the refund's 409 ``unsettled``). The coordinator's
settlement is held at a gate the test opens, so "asked before settlement caught up" is
certain, not a race: the first answers are taken while it is shut, and the gate opens
from the SDK's progress callback, once the client is seen waiting."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from tests.coordinator.test_control import CONFIG, hire, manual_run, shards, small_update, submit

from aitbc.coordinator.verification import settlement
from aitbc.ledger.wallet import create_wallet
from aitbc_agent_sdk import Agent, AgentConfig, AsyncAgent, Conflict, SettlementTimeout

GATE_BOUND = 60.0  # s the books wait at a shut gate before the test counts as broken


@dataclass
class Gate:
    """Settlement held until :meth:`open`: the books thread waits before settling any round."""

    opened: threading.Event

    def open(self) -> None:
        self.opened.set()


@pytest.fixture
def gate(monkeypatch) -> Iterator[Gate]:
    g = Gate(threading.Event())
    real = settlement.settle

    def held(ctx, run_id: str, r: int) -> None:
        if not g.opened.wait(GATE_BOUND):
            raise RuntimeError("settlement held past the test's bound")
        real(ctx, run_id, r)

    monkeypatch.setattr(settlement, "settle", held)  # the driver looks it up at each tick
    yield g
    g.open()  # never leave the books thread waiting


@dataclass
class Ended:
    home: object
    url: str
    run_id: str
    status: str
    delivered: str  # the provider whose update of the unclosed round 2 was delivered (stop) or ""


def _ended_run(coord, api, tmp_path, *, stop: bool, prefix: str, going: Callable[[Ended], None] | None = None) -> Ended:
    """A manual run of the SDK agent's wallet whose round 1 closed (two accepted updates,
    aggregated); then ``complete``, or (``stop``) round 2 opened, one update delivered in it
    and the run stopped before the round closed. ``going`` is shown the run before it ends."""
    home = tmp_path / "agent"
    wallet = create_wallet(home, "owner")
    owner = coord.client("owner", wallet)
    workers = [api.register_worker(coord, f"{prefix}{i}") for i in range(2)]
    _, run_id = manual_run(coord, owner, target_workers=2)
    api.upload_digits(owner, run_id, 2)
    for w in workers:
        hire(owner, run_id, w)
    p = f"/runs/{run_id}"
    owner.post(f"{p}/phase", {"phase": "distributing", "config": {**CONFIG, "rounds": 2}})
    jobs = [
        owner.post(f"{p}/jobs", {"worker_id": w.wallet.address, "shard_id": s["shard_id"]})["job_id"]
        for w, s in zip(workers, shards(owner, run_id))
    ]
    d = owner.post(f"{p}/phase", {"phase": "training"})["config"]["d"]
    cids = [submit(api, w, j, 1, small_update(d, 40 + i)) for i, (w, j) in enumerate(zip(workers, jobs))]
    owner.post(f"{p}/phase", {"phase": "aggregating"})
    owner.post(f"{p}/aggregate", {"updates": cids})
    if going is not None:
        going(Ended(home, coord.url, run_id, "aggregating", ""))
    if stop:
        owner.post(f"{p}/phase", {"phase": "training"})
        submit(api, workers[0], jobs[0], 2, small_update(d, 70))  # delivered, its round never closes
        return Ended(home, coord.url, run_id, owner.post(f"{p}/stop")["status"], workers[0].wallet.address)
    return Ended(home, coord.url, run_id, owner.post(f"{p}/phase", {"phase": "complete"})["status"], "")


def _agent(run: Ended) -> Agent:
    return Agent(AgentConfig(name="t", wallet_name="owner", coordinator_url=run.url, home=run.home))


def test_payments_and_refund_asked_at_once_wait_for_settlement(new_coordinator, api, tmp_path, gate):
    coord = new_coordinator(heartbeat_flush_seconds=0.05)
    run = _ended_run(coord, api, tmp_path, stop=False, prefix="sw")
    assert run.status == "complete"
    seen: list[tuple[str, int, int]] = []

    def progress(stage: str, done: int, total: int) -> None:
        seen.append((stage, done, total))
        gate.open()  # the client waits: now let the coordinator settle

    with _agent(run) as agent:
        agent.start()
        now = agent.get_payments(run.run_id, wait=False)  # today's answer: partial, and it says so
        assert (now.status, now.settled, now.settled_round, now.rounds_closed) == ("complete", False, 0, 1)
        assert all(r.paid_micro == 0 for r in now.data)
        with pytest.raises(Conflict) as e:  # the raw refund still refuses while rounds are unsettled
            agent.refund_payments(run.run_id, wait=False)
        assert e.value.code == "unsettled"
        with pytest.raises(SettlementTimeout) as t:  # the bound: one line naming the run's state
            agent.get_payments(run.run_id, timeout=0.3)
        assert t.value.code == "unsettled" and "\n" not in str(t.value)
        assert f"run {run.run_id} (complete): its rounds are settled through 0 of 1 after 0.3 s" in str(t.value)

        refund = agent.refund_payments(run.run_id, progress=progress)
    assert seen[0] == ("settle", 0, 1) and seen[-1] == ("settle", 1, 1)
    assert refund.finalized and refund.settled and refund.settled_round == 1 and float(refund.escrow_balance) == 0
    assert len(refund.data) == 2 and all(r.due_micro > 0 and r.paid_micro == r.due_micro for r in refund.data)


def test_async_payments_of_a_stopped_run_wait_for_its_closed_rounds_and_its_end(new_coordinator, api, tmp_path, gate):
    """A stopped run settles the rounds it closed (round 1 here); the round it stopped in
    never closes, and the update delivered in it is paid at the end's booking: the payments
    are final only then."""
    coord = new_coordinator(heartbeat_flush_seconds=0.05)

    def going(run: Ended) -> None:  # a run still going has nothing final to wait for: at once
        with _agent(run) as agent:
            now = agent.get_payments(run.run_id, timeout=0)
        assert (now.status, now.settled, now.settled_round, now.rounds_closed) == ("aggregating", False, 0, 1)

    run = _ended_run(coord, api, tmp_path, stop=True, prefix="ss", going=going)
    assert run.status == "stopped"
    seen: list[tuple[str, int, int]] = []

    def progress(stage: str, done: int, total: int) -> None:
        seen.append((stage, done, total))
        gate.open()

    async def ask():
        async with AsyncAgent(AgentConfig(name="t", wallet_name="owner", coordinator_url=run.url, home=run.home)) as a:
            await a.start()
            first = await a.get_payments(run.run_id, wait=False)
            final = await a.get_payments(run.run_id, progress=progress)
            return first, final, await a.refund_payments(run.run_id)

    first, final, refund = asyncio.run(ask())
    assert (first.status, first.settled, first.settled_round, first.rounds_closed) == ("stopped", False, 0, 1)
    assert seen[0] == ("settle", 0, 1)
    assert final.settled and final.settled_round == 1 and final.rounds_closed == 1 and not final.finalized
    # a manual run's settlement records what each contract is due (its owner pays): round 1
    # for both, and the update delivered in round 2 at its full price
    due = {r.worker_id: r.due_micro for r in final.data}
    other = next(w for w in due if w != run.delivered)
    assert due[other] > 0 and due[run.delivered] >= 1_000_000, due
    round2 = coord.rows("SELECT worker_id, due FROM settlements WHERE run_id = :r AND round = 2", r=run.run_id)
    assert [(x["worker_id"], x["due"]) for x in round2] == [(run.delivered, 1_000_000)]
    assert refund.finalized and all(r.paid_micro == due[r.worker_id] for r in refund.data), refund.data
