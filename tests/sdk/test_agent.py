"""The SDK against a real local stack (``aitbc up --workers 2``): the quick start end to
end, the async client, and the error hierarchy."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from aitbc_agent_sdk import Agent, AgentConfig, AsyncAgent, Conflict, InvalidArgument, NotFound

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, start_stack):
    with start_stack(tmp_path_factory.mktemp("sdk") / "home", workers=2) as (home, env, _):
        yield home, env


def _config(home: Path, wallet: str = "sdk-test") -> AgentConfig:
    # the coordinator comes from HOME/stack.json, as for a user of the local stack
    return AgentConfig(name="test", wallet_name=wallet, home=home)


def test_quickstart_example(stack):
    home, env = stack
    p = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["status"] == "complete"
    assert summary["results"]["rounds_completed"] == summary["results"]["rounds"] == 3
    assert summary["results"]["final_val_loss"] < summary["results"]["initial_val_loss"]
    rows = summary["payments"]["data"]
    assert len(rows) == 2 and all(r["paid_micro"] > 0 for r in rows), rows
    assert summary["payments"]["finalized"]
    cks = summary["checkpoints"]
    assert len(cks) == 4 and all(c["valid"] for c in cks), cks
    assert [c["round"] for c in cks] == [0, 1, 2, 3]
    # Each worker's job of that run, and its progress by job id alone (as documented).
    with Agent(_config(home, "sdk-observer")) as agent:
        agent.start()
        for row in rows:
            job = agent.get_worker_job(row["worker_id"])
            assert job["training_id"] == summary["training_id"] and job["job_status"] == "released"
            progress = agent.get_worker_progress(job["job_id"])
            assert progress["progress"] == 100.0 and progress["rounds_done"] == 3 and progress["epoch"] > 0
            assert {"progress", "loss", "epoch", "status"} <= progress.keys()
        with pytest.raises(NotFound) as e:
            agent.get_worker_progress("job_doesnotexist")
        assert e.value.code == "unknown_job"
        assert agent.get_worker_job("ait1" + "0" * 40) is None


def test_async_agent(stack):
    home, _ = stack

    async def go():
        async with AsyncAgent(_config(home, "sdk-async")) as agent:
            info = await agent.start()
            offers = await agent.get_available_workers()
            runs_ck = []
            run = await agent.initialize_distributed_training("mlp", 1, 2)
            runs_ck = await agent.get_round_checkpoints(run["training_id"])
            ping = await agent.ping_worker(offers[0]["worker_id"])
            bad = await agent.verify_checkpoint("bafkreiam6cjmeb3qr6dnv7uht4rolsd73yzmltu35ot6tezvnnjac4wrp5")
            with pytest.raises(NotFound) as e:
                await agent.get_training_status("training_doesnotexist")
            stopped = await agent.stop()
            return info, offers, run, runs_ck, ping, bad, e.value, stopped

    info, offers, run, cks, ping, bad, err, stopped = asyncio.run(go())
    assert info["status"] == "started" and info["address"].startswith("ait1") and info["network"] == "local"
    assert len(offers) == 2 and {"worker_id", "gpu_type", "price"} <= offers[0].keys()
    assert run["training_id"].startswith("training_") and run["phase"] == "initializing"
    assert cks == []
    assert ping["alive"] is True and ping["last_heartbeat_age"] >= 0
    assert bad["valid"] is False
    assert err.status == 404 and err.code == "unknown_run"
    assert stopped["status"] == "stopped"


def test_errors_and_blobs(stack):
    home, _ = stack
    with Agent(_config(home)) as agent:
        agent.start()
        with pytest.raises(NotFound) as e:
            agent.get_training_status("training_nope")
        assert (e.value.status, e.value.code) == (404, "unknown_run")
        assert "training_nope" in e.value.detail
        cid = agent.upload_to_ipfs(data=b"hello agents", pin=True)
        assert agent.verify_checkpoint(cid)["valid"] is False  # stored and hashes, but not a checkpoint
        run = agent.initialize_distributed_training("mlp", "10MB", 2)
        with pytest.raises(InvalidArgument, match="num_shards must be 2"):
            agent.create_data_shards(run["training_id"], num_shards=3)
        with pytest.raises(InvalidArgument, match="control must be 'automatic' or 'manual'"):
            agent.initialize_distributed_training("mlp", 1, 2, control="remote")
        with pytest.raises(NotFound) as e:  # the documentation's form: a worker address first
            agent.process_payment("ait1" + "0" * 40, "contract_nope", 1)
        assert e.value.code == "unknown_contract"
        bal = agent.fund_wallet("20.5")  # hiring needs price x 10 rounds in hand (issue 33)
        assert agent.get_balance()["balance"] == bal["balance"]
        # Hiring one named provider: below its ask is refused; at its ask, a contract.
        w = agent.get_available_workers()[0]
        with pytest.raises(Conflict) as e:
            agent.negotiate_worker_contract(w["worker_id"], run["training_id"], "0.01")
        assert e.value.code == "price_rejected"
        c = agent.negotiate_worker_contract(w["worker_id"], run["training_id"], w["price"])
        assert (c["status"], c["price"], c["worker_id"]) == ("hired", w["price"], w["worker_id"])
        with pytest.raises(InvalidArgument, match="is with"):  # the wrong payee is refused before any payment
            agent.process_payment("ait1" + "0" * 40, c["contract_id"], 1, training_id=run["training_id"])
        agent.stop_training(run["training_id"])  # releases the provider again
