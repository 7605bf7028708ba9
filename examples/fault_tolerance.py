"""The documentation's fault-tolerance loop: while the phase-driven coordinator
(``phase_driven.py``) runs a manual run, four more loops keep it healthy:

* health: ping every working provider; one that stopped heartbeating is marked failed
  and its shard goes to a replacement of the same GPU class if one is free;
* stragglers: a provider far behind the round's first answer gets fewer local steps;
  still behind a round later, half of its shard goes to another provider;
* checkpoints: every update a provider sends is re-hashed and decoded; a bad one is
  dropped and the provider asked to send it again;
* scaling: below the target number of providers (a failure nobody could replace), hire
  a free one.

    (trap 'aitbc down' EXIT; aitbc up --workers 4 && python examples/fault_tolerance.py)

starts a coordinator and four workers (two to hire, two free to replace or help them),
runs the script and stops the stack whatever the script's exit.

Kill a worker while it runs (``kill -9`` one of the pids ``aitbc status`` shows) to see
it replaced. Prints a JSON summary last, with every action taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from typing import Any

from aitbc_agent_sdk import AgentConfig, AgentError, AsyncAgent, Conflict, NotFound
from phase_driven import CONFIG, coordinate, open_run, pay

WORKERS = 2
POLL = 1.0
STRAGGLER_AFTER = 5.0  # s behind the round's first answer, at least, before a provider counts as a straggler
CONFIG_FT = {**CONFIG, "rounds": 6}


class Monitor:
    """The four loops, sharing one record of what they did."""

    def __init__(self, agent: AsyncAgent, training_id: str, *, target: int, poll: float = POLL) -> None:
        self.agent, self.training_id, self.target, self.poll = agent, training_id, target, poll
        self.events: list[dict[str, Any]] = []
        self.done = asyncio.Event()
        self.verified: set[str] = set()
        self.first_answer: dict[int, float] = {}  # round -> when its first update was seen
        self.reduced: dict[str, int] = {}  # worker -> round its workload was reduced

    def record(self, kind: str, **fields: Any) -> None:
        self.events.append({"event": kind, "time": time.time(), **fields})
        print(f"[{kind}] " + ", ".join(f"{k}={v}" for k, v in fields.items()))

    async def every(self, step) -> None:
        while not self.done.is_set():
            try:
                await step()
            except (Conflict, NotFound) as e:  # the run moved on meanwhile (a job ended, a round closed)
                self.record("skipped", step=step.__name__, reason=e.detail)
            except AgentError as e:  # anything else is reported, and the loop keeps watching
                self.record("error", step=step.__name__, code=e.code, reason=e.detail)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), self.poll)

    async def monitor_worker_health(self) -> None:
        for w in await self.agent.get_active_workers(self.training_id):
            health = await self.agent.ping_worker(w.worker_id)
            if health:  # truthy exactly when the worker is alive
                continue
            await self.agent.mark_worker_failed(
                w.worker_id, reason=f"no heartbeat for {health.last_heartbeat_age:.1f} s"
            )
            job = await self.agent.get_worker_job(w.worker_id)
            if job is None:
                continue
            replacement = await self.agent.find_replacement_worker(health.gpu_type)
            if replacement is None:
                self.record("failed", worker=w.worker_id, job=job.job_id, replacement=None)
                continue
            new = await self.agent.reassign_job(job.job_id, replacement.worker_id)
            self.record(
                "replaced",
                worker=w.worker_id,
                job=job.job_id,
                by=replacement.worker_id,
                gpu=replacement.gpu_type,
                new_job=new.job_id,
            )

    async def handle_stragglers(self) -> None:
        status = await self.agent.get_training_status(self.training_id)
        if status.phase != "training":
            return
        rnd, now = status.round, time.time()
        active = [w for w in status.workers if w.job_status == "active"]
        if any(w.this_round for w in active):
            self.first_answer.setdefault(rnd, now)
        first = self.first_answer.get(rnd)
        progress = await self.agent.get_training_progress(self.training_id)
        slow = progress.target_speed is not None and progress.speed < 0.5 * progress.target_speed
        if first is None or (now - first < STRAGGLER_AFTER and not slow):
            return
        for w in active:
            if w.this_round or not await self.agent.ping_worker(w.worker_id):
                continue  # answered, or dead (the health loop's business)
            if w.worker_id not in self.reduced:
                reduced = await self.agent.reduce_worker_workload(w.worker_id, factor=0.5)
                self.reduced[w.worker_id] = rnd
                if reduced:
                    self.record("workload_reduced", worker=w.worker_id, round=rnd, local_steps=reduced.local_steps)
            elif self.reduced[w.worker_id] < rnd:
                split = await self.agent.reassign_partial_work(w.worker_id)
                self.reduced[w.worker_id] = rnd
                if split and split.new_job is not None:  # falsy when nobody was free to take half
                    self.record("work_split", worker=w.worker_id, round=rnd, helper=split.new_job.worker_id)

    async def verify_checkpoints(self) -> None:
        for w in await self.agent.get_active_workers(self.training_id):
            if not w.this_round:
                continue
            try:
                update = await self.agent.collect_checkpoint(w.worker_id, w.job_id)
            except NotFound:
                continue  # dropped meanwhile
            if update.cid in self.verified:
                continue
            check = await self.agent.verify_checkpoint(update)
            if check:  # truthy exactly when valid
                self.verified.add(update.cid)
            else:
                await self.agent.request_checkpoint_resend(w.worker_id)
                self.record("resend_requested", worker=w.worker_id, round=update.round, reason=check.detail)

    async def auto_scale(self) -> None:
        status = await self.agent.get_training_status(self.training_id)
        if status.phase not in ("training", "aggregating"):
            return
        active = [w for w in status.workers if w.job_status == "active"]
        if len(active) < self.target and await self.agent.find_replacement_worker() is not None:
            added = await self.agent.add_worker(training_id=self.training_id)
            self.record("scaled_up", worker=added.worker_id, job=added.job and added.job.job_id)


async def main(workers: int = WORKERS) -> dict[str, Any]:
    config = AgentConfig(name="fault-tolerance", blockchain_network="local", wallet_name="coordinator-wallet")
    async with AsyncAgent(config) as agent:
        training_id = await open_run(agent, workers, budget=40, note="manual control, watched")
        monitor = Monitor(agent, training_id, target=workers)
        loops = [
            asyncio.create_task(monitor.every(step))
            for step in (
                monitor.monitor_worker_health,
                monitor.handle_stragglers,
                monitor.verify_checkpoints,
                monitor.auto_scale,
            )
        ]
        rounds: list[dict] = []
        try:
            final = await coordinate(agent, training_id, workers, config=CONFIG_FT, log=rounds)
        finally:
            monitor.done.set()
            await asyncio.gather(*loops, return_exceptions=True)
        checkpoints = await agent.get_round_checkpoints(training_id)
        verified = await asyncio.gather(*(agent.verify_checkpoint(c) for c in checkpoints))
        print(f"Training {final.phase}: checkpoints verified {sum(map(bool, verified))}/{len(verified)}")
        payments = await pay(agent, training_id)
        await agent.stop()
    return {
        "training_id": training_id,
        "status": final.status,
        "rounds": rounds,
        "events": monitor.events,
        "workers": [w.model_dump(mode="json") for w in final.workers],
        "payments": payments.model_dump(mode="json"),
        "checkpoints": [v.model_dump(mode="json") for v in verified],
    }


if __name__ == "__main__":
    try:
        print(json.dumps(asyncio.run(main())))
    except AgentError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
