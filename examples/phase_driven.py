"""The documentation's phase-driven coordinator: the agent, not the coordinator, moves
the run through its phases (manual control), with the asyncio client.

    aitbc up --workers 2          # a coordinator and two workers on this machine
    python examples/phase_driven.py

Each pass of the loop looks at the run's phase and does that phase's work: hire and
shard (initializing), send the jobs (distributing), wait for every worker's update
(training), collect the updates and average them (aggregating), then pay for the
verified work from the run's escrow and refund the rest. It polls every second where
the documentation polls every 30. The coordinator comes from the environment only
(AITBC_COORDINATOR, else the local stack's HOME/stack.json). Prints a JSON summary last.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from aitbc_agent_sdk import AgentConfig, AgentError, AsyncAgent

ROUNDS = 3
POLL = 1.0  # seconds between looks at the run
CONFIG = {"rounds": ROUNDS, "local_steps": 10, "batch_size": 32, "lr": 0.003, "aggregator": "mean"}


async def hire(agent: AsyncAgent, training_id: str, n: int) -> list[dict]:
    """The ``n`` best live, free offers, each hired at its asking price."""
    hired = []
    for worker in await agent.discover_gpu_workers(min_gpu=None, required_workers=n):
        hired.append(await agent.negotiate_worker_contract(worker["worker_id"], training_id, price=worker["price"]))
        print(f"Hired {worker['worker_id']} ({worker['gpu_type']}, reputation {worker['reputation']:.2f}) "
              f"at {worker['price']} AIT/round")
    return hired


async def coordinate(agent: AsyncAgent, training_id: str, workers: int, *, config: dict = CONFIG, poll: float = POLL,
                     log: list[dict] | None = None) -> dict:
    """Drive a manual run to the end with the training ``config``; returns its final
    status. ``log`` collects a line per aggregated round."""
    log = [] if log is None else log
    shards: list[dict] = []
    while True:
        status = await agent.get_training_status(training_id)
        phase = status["phase"]
        if phase == "initializing":
            hired = await hire(agent, training_id, workers)
            shards = await agent.create_data_shards(training_id, num_shards=workers, data_path="digits")
            await agent.update_training_phase(training_id, "distributing", **config)
            status["contracts"] = hired
        elif phase == "distributing":
            hired = [c for c in status["contracts"] if c["status"] == "hired"]
            for contract, shard in zip(hired, shards):
                job = await agent.send_training_job(contract["worker_id"], training_id, shard["shard_id"],
                                                    {"local_steps": config["local_steps"]})
                print(f"Job {job['job_id']}: {contract['worker_id']} trains shard {shard['shard_id'][:16]}...")
            await agent.update_training_phase(training_id, "training")
        elif phase == "training":
            active = await agent.get_active_workers(training_id)
            progress = await asyncio.gather(*(agent.get_worker_progress(w["job_id"]) for w in active))
            sent = [p for p in progress if p["round_update"] is not None]
            if active and len(sent) == len(progress) and any(p["round_update"] == "accepted" for p in sent):
                await agent.update_training_phase(training_id, "aggregating")
        elif phase == "aggregating":
            if status["rounds_completed"] < status["round"]:  # this round is not aggregated yet
                active = await agent.get_active_workers(training_id)
                collected = await asyncio.gather(*(agent.collect_checkpoint(w["worker_id"], w["job_id"])
                                                   for w in active if w["this_round"] == "accepted"))
                checkpoints = [c for c in collected if (await agent.verify_checkpoint(c))["valid"]]
                model = await agent.federated_average(checkpoints, weights=[c["samples"] for c in checkpoints])
                log.append({"round": model["round"], "model": model["model_id"], "loss": model["loss"],
                            "updates": model["updates"]})
                print(f"Round {model['round']}/{status['rounds']}: {model['updates']} updates averaged, "
                      f"validation loss {model['loss']:.4f}")
                if model["round"] >= status["rounds"]:
                    await agent.save_training_results(training_id, model)
                    await agent.update_training_phase(training_id, "complete")
                else:
                    await agent.update_training_phase(training_id, "training")
        elif phase in ("complete", "failed"):
            return status
        await asyncio.sleep(poll)


async def pay(agent: AsyncAgent, training_id: str, timeout: float = 120.0) -> dict:
    """Once every round is scored, pay each contract what its scores earned (price x
    quality per round), then refund what is left in escrow."""
    deadline = time.monotonic() + timeout
    payments = await agent.get_payments(training_id)
    while payments["settled_round"] < payments["rounds_closed"] and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        payments = await agent.get_payments(training_id)
    for row in payments["data"]:
        owed = row["due_micro"] - row["paid_micro"]
        if owed > 0:
            await agent.process_payment(row["worker_id"], row["contract_id"], f"{owed / 1_000_000:.6f}")
            print(f"Paid {owed / 1_000_000:.6f} AIT to {row['worker_id']} (score {row['score']:.3f})")
    return await agent.refund_payments(training_id)


async def main(workers: int = 2) -> dict[str, Any]:
    config = AgentConfig(name="phase-driven", blockchain_network="local", wallet_name="coordinator-wallet")
    async with AsyncAgent(config) as agent:
        info = await agent.start()
        print(f"Agent {info['name']} started: wallet {info['address']} on {info['coordinator']}")
        await agent.fund_wallet(100)
        training = await agent.initialize_distributed_training(model_type="mlp", dataset_size=1, target_workers=workers,
                                                               control="manual", budget=20)
        training_id = training["training_id"]
        print(f"Distributed training: {training_id} (manual control)")
        rounds: list[dict] = []
        final = await coordinate(agent, training_id, workers, log=rounds)
        results = await agent.get_results(training_id)
        checkpoints = await agent.get_all_checkpoints(training_id)
        verified = await asyncio.gather(*(agent.verify_checkpoint(c) for c in checkpoints))
        print(f"Training {final['phase']}: model {results['model_cid']}; "
              f"checkpoints verified {sum(v['valid'] for v in verified)}/{len(verified)}")
        payments = await pay(agent, training_id)
        print(f"Escrow left after refund: {payments['escrow_balance']} AIT")
        await agent.stop()
    return {"training_id": training_id, "status": final["status"], "rounds": rounds, "results": results,
            "payments": payments, "checkpoints": list(verified)}


if __name__ == "__main__":
    try:
        print(json.dumps(asyncio.run(main())))
    except AgentError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
