"""The documentation's quick start, against a local stack.

    (trap 'aitbc down' EXIT; aitbc up --workers 2 && python examples/quickstart.py)

starts a coordinator and two workers on this machine, runs the script, and stops the stack
whatever the script's exit (the line's status is the script's).

The coordinator comes from the environment only: AITBC_COORDINATOR, else the local
stack's HOME/stack.json (HOME: AITBC_HOME or ~/.aitbc). Prints a JSON summary last.

Every method returns a typed model (aitbc.replies, aitbc_agent_sdk.results) whose fields
are attributes a type checker knows (`training.training_id`).
"""

from __future__ import annotations

import json
import sys

from aitbc_agent_sdk import Agent, AgentConfig, AgentError

ROUNDS = 3


def main() -> int:
    config = AgentConfig(name="distributed-training", blockchain_network="local", wallet_name="training-wallet")
    with Agent(config) as agent:
        info = agent.start()
        print(f"Agent {info.name} started: wallet {info.address} on {info.coordinator}")
        agent.fund_wallet(100)
        print(f"Balance: {agent.get_balance().balance} AIT")

        training = agent.initialize_distributed_training(model_type="mlp", dataset_size=1, target_workers=2)
        training_id = training.training_id  # the agent's current run: later calls may leave it out
        print(f"Distributed training: {training_id}")

        shards = agent.create_data_shards(training_id, num_shards=2, data_path="digits")
        print(f"Data shards: {[s.shard_id for s in shards]}")

        hiring = agent.hire_workers(training_id, required_workers=2)  # ranks and hires
        for w in hiring.ranked:
            print(f"Worker {w.worker_id} ({w.gpu_type}, {w.price} AIT/round): {'hired' if w.hired else 'not hired'}")

        agent.start_training(rounds=ROUNDS, local_steps=10)
        run = agent.wait_for_completion(timeout=300)
        results = agent.get_results()
        print(
            f"Training {run.phase}: val loss {results.initial_val_loss:.4f} -> {results.final_val_loss:.4f}, "
            f"model {results.model_cid}"
        )

        checkpoints = agent.get_round_checkpoints()
        verified = [agent.verify_checkpoint(ck) for ck in checkpoints]
        print(f"Checkpoints verified: {sum(map(bool, verified))}/{len(verified)}")

        payments = agent.get_payments()  # waits until the coordinator has settled the run's every round
        for p in payments.data:
            print(f"Paid {p.paid} AIT to {p.worker_id} for {p.rounds_accepted} rounds")
        refund = agent.refund_payments()
        print(f"Escrow left after refund: {refund.escrow_balance} AIT")
        agent.stop()
    print(
        json.dumps(
            {
                "training_id": training_id,
                "status": run.status,
                "results": results.model_dump(mode="json"),
                "payments": payments.model_dump(mode="json"),
                "checkpoints": [v.model_dump(mode="json") for v in verified],
            }
        )
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AgentError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
