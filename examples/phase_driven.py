"""The documentation's phase-driven coordinator: the agent, not the coordinator, moves
the run through its phases (manual control), with the asyncio client.

    (trap 'aitbc down' EXIT; aitbc up --workers 2 && python examples/phase_driven.py)

starts a coordinator and two workers on this machine, runs the script (options: --wallet
NAME, --rounds N, --workers N) and stops the stack whatever the script's exit.

Each pass of the loop looks at the run's phase and does that phase's work: hire and
shard (initializing), send the jobs (distributing), wait for every worker's update
(training), collect the updates and average them (aggregating), then pay for the
verified work from the run's escrow and refund the rest. It polls every second where
the documentation polls every 30. The coordinator comes from the environment only
(AITBC_COORDINATOR, else the local stack's HOME/stack.json). Prints a JSON summary last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from aitbc.replies.money import Payments
from aitbc.replies.runs import ContractView
from aitbc_agent_sdk import AgentConfig, AgentError, AsyncAgent, Conflict
from aitbc_agent_sdk.results import TrainingStatus

ROUNDS = 3
POLL = 1.0  # seconds between looks at the run
ROUND_TIMEOUT = 60.0  # seconds a round waits for its last provider
CONFIG = {"rounds": ROUNDS, "local_steps": 10, "batch_size": 32, "lr": 0.003, "aggregator": "mean"}


async def hire(agent: AsyncAgent, training_id: str, n: int) -> list[ContractView]:
    """The ``n`` best live, free offers, each hired at its asking price."""
    hired = []
    for worker in await agent.discover_gpu_workers(min_gpu=None, required_workers=n):
        hired.append(await agent.negotiate_worker_contract(worker.worker_id, training_id, price=worker.price))
        print(
            f"Hired {worker.worker_id} ({worker.gpu_type}, reputation {worker.reputation:.2f}) "
            f"at {worker.price} AIT/round"
        )
    return hired


async def coordinate(
    agent: AsyncAgent,
    training_id: str,
    workers: int,
    *,
    config: dict = CONFIG,
    poll: float = POLL,
    round_timeout: float = ROUND_TIMEOUT,
    log: list[dict] | None = None,
) -> TrainingStatus:
    """Drive a manual run to the end with the training ``config``; returns its final
    status. A round waits for every working provider, at most ``round_timeout`` seconds
    (then it is aggregated without the late ones, or skipped if nobody sent a good
    update). ``log`` collects a line per aggregated round. If this loop fails, it stops
    the run: a run must not outlive its coordinator (the providers' bonds come back)."""
    log = [] if log is None else log
    opened: dict[int, float] = {}  # round -> when this loop first saw it open
    try:
        while True:
            status = await agent.get_training_status(training_id)
            if status.phase in ("complete", "failed"):
                return status
            try:
                await _step(agent, training_id, status, workers, config, opened, round_timeout, log)
            except Conflict as e:  # the run moved under us (a job failed, a worker was taken): look again
                print(f"[retry] {e.code}: {e.detail}")
            await asyncio.sleep(poll)
    except BaseException:
        await agent.stop_training(training_id)
        raise


async def _step(
    agent: AsyncAgent,
    training_id: str,
    status: TrainingStatus,
    workers: int,
    config: dict,
    opened: dict[int, float],
    round_timeout: float,
    log: list[dict],
) -> None:
    """One phase's work."""
    phase = status.phase
    if phase == "initializing":
        if not [c for c in status.contracts if c.status == "hired"]:
            await hire(agent, training_id, workers)
        if not status.manifest_cid:
            await agent.create_data_shards(training_id, num_shards=workers, data_path="digits")
        await agent.update_training_phase(training_id, "distributing", **config)
    elif phase == "distributing":
        hired = [c for c in status.contracts if c.status == "hired"]
        waiting = [s for s in await agent.get_shards(training_id) if not s.jobs]  # one job per shard
        for contract, shard in zip(hired, waiting):
            job = await agent.send_training_job(
                contract.worker_id, training_id, shard.shard_id, {"local_steps": config["local_steps"]}
            )
            print(f"Job {job.job_id}: {contract.worker_id} trains shard {shard.shard_id[:16]}...")
        await agent.update_training_phase(training_id, "training")
    elif phase == "training":
        active = await agent.get_active_workers(training_id)
        progress = await asyncio.gather(*(agent.get_worker_progress(w.job_id) for w in active))
        sent = [p for p in progress if p.round_update is not None]
        late = time.monotonic() - opened.setdefault(status.round, time.monotonic()) > round_timeout
        everyone = bool(active) and len(sent) == len(progress) and any(p.round_update == "accepted" for p in sent)
        if everyone or late:
            await agent.update_training_phase(training_id, "aggregating")
    elif phase == "aggregating":
        model_cid = status.global_model_cid  # aggregated already (this loop restarted): keep that checkpoint
        metrics: dict = {}
        rounds = status.rounds or 0
        if status.rounds_completed < status.round:  # this round is not aggregated yet
            active = await agent.get_active_workers(training_id)
            collected = await asyncio.gather(
                *(agent.collect_checkpoint(w.worker_id, w.job_id) for w in active if w.this_round == "accepted")
            )
            checkpoints = [c for c in collected if await agent.verify_checkpoint(c)]  # truthy when valid
            model = await agent.federated_average(
                checkpoints, weights=[c.samples for c in checkpoints], training_id=training_id
            )
            log.append({"round": model.round, "model": model.model_id, "loss": model.loss, "updates": model.updates})
            print(
                f"Round {model.round}/{rounds}: {model.updates} updates averaged"
                f"{' (none: round skipped)' if model.skipped else ''}, validation loss {model.loss:.4f}"
            )
            if status.round >= rounds:  # the last round: keep the model itself, as documented
                model_cid = await agent.upload_to_ipfs(data=model.model, pin=True)
                metrics = {"final_loss": model.loss, "workers": workers, "rounds": rounds}
        if status.round >= rounds:
            await agent.save_training_results(training_id=training_id, model_cid=model_cid, metrics=metrics)
            await agent.update_training_phase(training_id=training_id, phase="complete")
        else:
            await agent.update_training_phase(training_id=training_id, phase="training")


async def pay(agent: AsyncAgent, training_id: str) -> Payments:
    """Once every round is scored, pay each contract what its scores earned (price x
    quality per round), then refund what is left in escrow."""
    payments = await agent.get_payments(training_id)  # waits until the coordinator has settled every round
    for row in payments.data:
        owed = row.due_micro - row.paid_micro
        if owed > 0:
            await agent.process_payment(row.worker_id, row.contract_id, f"{owed / 1_000_000:.6f}")
            print(f"Paid {owed / 1_000_000:.6f} AIT to {row.worker_id} (score {row.score:.3f})")
    return await agent.refund_payments(training_id)


async def open_run(agent: AsyncAgent, workers: int, *, budget: int, note: str = "manual control") -> str:
    """Start the agent, fund its wallet, and create a manual run with ``budget`` AIT in escrow."""
    info = await agent.start()
    print(f"Agent {info.name} started: wallet {info.address} on {info.coordinator}")
    await agent.fund_wallet(max(100, budget))
    training = await agent.initialize_distributed_training(
        model_type="mlp", dataset_size=1, target_workers=workers, control="manual", budget=budget
    )
    print(f"Distributed training: {training.training_id} ({note})", flush=True)
    return training.training_id


async def main(workers: int = 2, rounds_n: int = ROUNDS, wallet: str = "coordinator-wallet") -> dict[str, Any]:
    config = AgentConfig(name="phase-driven", blockchain_network="local", wallet_name=wallet)
    async with AsyncAgent(config) as agent:
        # at most 2.50 AIT per worker and round on the local stack
        training_id = await open_run(agent, workers, budget=max(20, int(2.5 * workers * rounds_n) + 1))
        rounds: list[dict] = []
        final = await coordinate(agent, training_id, workers, config={**CONFIG, "rounds": rounds_n}, log=rounds)
        results = await agent.get_results(training_id)
        checkpoints = await agent.get_round_checkpoints(training_id)
        verified = await asyncio.gather(*(agent.verify_checkpoint(c) for c in checkpoints))
        print(
            f"Training {final.phase}: model {results.model_cid}; "
            f"checkpoints verified {sum(map(bool, verified))}/{len(verified)}"
        )
        payments = await pay(agent, training_id)
        print(f"Escrow left after refund: {payments.escrow_balance} AIT")
        await agent.stop()
    return {
        "training_id": training_id,
        "status": final.status,
        "rounds": rounds,
        "results": results.model_dump(mode="json"),
        "payments": payments.model_dump(mode="json"),
        "checkpoints": [v.model_dump(mode="json") for v in verified],
    }


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--wallet", default="coordinator-wallet", help="the owner's wallet (created and funded)")
    cli.add_argument("--rounds", type=int, default=ROUNDS)
    cli.add_argument("--workers", type=int, default=2)
    args = cli.parse_args()
    try:
        print(json.dumps(asyncio.run(main(args.workers, args.rounds, args.wallet))))
    except AgentError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
