"""End to end: a run made the documented way (CLI ``init``, automatic) taken over by its owner
and driven phase by phase, with real worker processes honouring the documented job config
``{batch_size, learning_rate, epochs}``: each trains ``epochs`` passes over its own shard
(the steps computed from the shard's size), its job's ``progress`` is that work's percentage,
``status`` becomes ``complete`` when its update is in, and ``loss`` is a number throughout."""

from __future__ import annotations

import math
import time

import pytest

from aitbc.client import CoordinatorClient
from aitbc.ledger.wallet import load_wallet
from aitbc.training.local import epoch_steps

pytestmark = pytest.mark.slow

EPOCHS, BATCH = 2, 32


@pytest.mark.long  # a minute or more of real processes: make test-long (and test-pg)
def test_an_owner_driven_run_with_epochs_on_real_workers(stack):
    stack.start_coordinator()
    stack.start_worker("w0", price="1.00")
    stack.start_worker("w1", price="1.20")
    offers = {o["worker_id"]: o for o in stack.wait_offers(2)}
    run_id = stack.init_run(workers=2)
    r = stack.cli("distributed-training", "upload-data", "--training-id", run_id, "--data-path", "digits")
    assert r.returncode == 0, r.stderr
    owner = CoordinatorClient(stack.url, load_wallet(stack.root / "owner", "my-agent-wallet"))
    p = f"/runs/{run_id}"
    try:
        for wid, o in offers.items():  # negotiate_worker_contract at the asking price (a number)
            assert owner.post(f"{p}/contracts", {"worker_id": wid, "price": o["price"]})["status"] == "hired"
        run = owner.post(f"{p}/phase", {"phase": "distributing", "config": {"rounds": 2, "max_cost": "10"}})
        assert (run["status"], run["control"]) == ("distributing", "manual")
        shards = owner.get(f"{p}/shards")["data"]
        jobs = {}
        for wid, sh in zip(offers, shards):
            config = {"batch_size": BATCH, "learning_rate": 0.001, "epochs": EPOCHS}
            job = owner.post(f"{p}/jobs", {"worker_id": wid, "shard_id": sh["shard_id"], "config": config})
            jobs[job["job_id"]] = epoch_steps(EPOCHS, sh["samples"], BATCH)
        run = owner.post(f"{p}/phase", {"phase": "training"})
        assert run["status"] == "training"

        seen: dict[str, list[float]] = {j: [] for j in jobs}
        deadline = time.monotonic() + 120
        while True:  # monitor_training_progress: poll each job until complete
            views = {j: owner.get(f"/jobs/{j}") for j in jobs}
            for j, v in views.items():
                assert v["loss"] is not None and math.isfinite(v["loss"]), v  # a number once training started
                assert 0.0 <= v["progress"] <= 100.0 and v["epoch"] >= 0.0 and v["gpu_type"] == "RTX3090"
                seen[j].append(v["progress"])
            if all(v["status"] == "complete" for v in views.values()):
                break
            assert time.monotonic() < deadline, (views, stack.log("w0"), stack.log("w1"))
            time.sleep(0.05)
        for j, steps in jobs.items():
            assert seen[j] == sorted(seen[j]) and seen[j][-1] == 100.0  # the job's own work, never backwards
            (step, epoch, speed) = stack.rows("SELECT step, epoch, speed FROM jobs WHERE id = :j", j=j)[0]
            assert step == steps  # epochs over this shard, as the worker computed them
            assert epoch == pytest.approx(EPOCHS, rel=0.1)
            assert speed and speed > 0

        ups = owner.get(f"{p}/updates", params={"round": 1})["data"]
        assert len(ups) == 2 and all(u["status"] == "accepted" for u in ups)
        owner.post(f"{p}/phase", {"phase": "aggregating"})
        agg = owner.post(f"{p}/aggregate", {"updates": [u["cid"] for u in ups]})
        assert agg["loss"] < run["initial_val_loss"]  # two epochs on each shard: the loss falls
        owner.post(f"{p}/result", {"model_cid": agg["model_cid"], "metrics": {"final_loss": agg["loss"]}})
        assert owner.post(f"{p}/phase", {"phase": "complete"})["status"] == "complete"
        r = stack.cli("ledger", "verify")
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        owner.close()
