"""Manual control of a run and the owner's job controls, through the API of a real
coordinator (uvicorn, SQLite, the round driver) with signed clients acting as the owner and
as the workers.

A manual run (``control: "manual"``) is moved by its owner: ``POST /runs/{id}/phase``
(distributing with the config, training, aggregating, complete), ``POST /runs/{id}/jobs``,
``POST /runs/{id}/aggregate`` and ``POST /runs/{id}/result``; the round driver leaves it
where the owner put it. Job controls (end, reassign, split, per-job config, resend) work on
any run the signer owns. Every refusal is the JSON error shape and changes nothing: neither
the database, nor the blob store, nor what the API shows of the run and its jobs.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

import pytest
import torch

from aitbc.client import ApiError
from aitbc.ledger.chain import audit, escrow_account, wallet_account
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.checkpoint import flat_params, load_checkpoint, load_shard
from aitbc.training.data_spec import DataSpec
from aitbc.training.models import build_model
from aitbc.units import format_price

MODEL_OPTIONS = {"hidden": [8]}
RUN_BODY = {"model_type": "mlp", "model_options": MODEL_OPTIONS, "dataset_size": "1GB", "target_workers": 2}
CONFIG = {"rounds": 2, "local_steps": 1, "batch_size": 8}
IDLE = 0.4  # seconds = 8 ticks of the driver (tick_seconds 0.05): long enough for it to move a run it would move


@pytest.fixture(scope="module")
def coord(new_coordinator):
    """One coordinator for the tests whose marketplace does not matter (every worker they
    use is named). Heartbeats are flushed at once: no flush is still pending when a test
    reads or snapshots the offers."""
    return new_coordinator(heartbeat_flush_seconds=0.05)


# --- helpers -----------------------------------------------------------------------------


def manual_run(coord, owner=None, *, budget: str | None = "100", fund: str = "1000", **body) -> tuple:
    owner = owner or coord.client("owner")
    owner.post("/wallets/fund", {"amount": fund})
    req = {**RUN_BODY, "control": "manual", **body}
    if budget is not None:
        req["budget"] = budget
    run = owner.post("/runs", req)
    assert run["control"] == "manual" and run["status"] == "initializing", run
    return owner, run["training_id"]


def hire(owner, run_id: str, worker, price: str = "1") -> dict:
    c = owner.post(f"/runs/{run_id}/contracts", {"worker_id": worker.wallet.address, "price": price})
    assert c["status"] == "hired", c
    return c


def shards(client, run_id: str) -> list[dict]:
    view = client.get(f"/runs/{run_id}/shards")
    assert view["count"] == len(view["data"])
    return view["data"]


def job_payload(worker) -> dict | None:
    """What the worker is told to do (GET /v1/workers/{id}/job)."""
    return worker.get(f"/workers/{worker.wallet.address}/job", sign=True)["job"]


def small_update(d: int, seed: int) -> torch.Tensor:
    """A small random update: changes the model, but never harmful or a copy when scored."""
    return torch.randn(d, generator=torch.Generator().manual_seed(seed)) * 1e-3


def submit(api, worker, job_id: str, round: int, t: torch.Tensor) -> str:
    cid = api.put_update(worker, t)
    res = worker.post(f"/jobs/{job_id}/updates", api.update_body(round, cid))
    assert res["status"] == "accepted", res
    return cid


def run_state(client, run_id: str) -> dict:
    """What the API shows of a run and its jobs, less what moves with the clock."""
    run = client.get(f"/runs/{run_id}")
    for moving in ("time", "speed", "target_speed"):  # rounds per second: the clock moves them
        run.pop(moving)
    for j in run["workers"]:
        j.pop("last_heartbeat_age")
    return {"run": run, "shards": shards(client, run_id), "rounds": client.get(f"/runs/{run_id}/rounds")["data"]}


def refused(
    coord, api, client, path: str, body, status: int, code: str, *detail: str, run_id: str | None = None
) -> None:
    """POST ``path`` is refused with ``status``/``code`` (the JSON error shape), and nothing
    changed: the database, the blob store and the run's view (if ``run_id``).
    """
    coord.settled()
    before = coord.snapshot()
    view = run_state(client, run_id) if run_id else None
    with coord.http() as h:
        r = api.signed_post(h, client.wallet, "/v1" + path, body)
    api.assert_error(r, status, code, *detail)
    after = coord.snapshot()
    assert after == before
    if run_id:
        assert run_state(client, run_id) == view


def posted(coord, api, client, path: str, body, status: int = 200) -> dict:
    """POST ``path`` signed by ``client``; the reply must be ``status``."""
    with coord.http() as h:
        r = api.signed_post(h, client.wallet, "/v1" + path, body)
    assert r.status_code == status, (r.status_code, r.text)
    return r.json()


def stays(client, run_id: str, status: str, round: int) -> dict:
    """The driver does not move a manual run: after several ticks it is where it was."""
    time.sleep(IDLE)
    run = client.get(f"/runs/{run_id}")
    assert (run["status"], run["round"]) == (status, round), (run["status"], run["round"])
    return run


def model_params(client, manifest_cid: str, model_cid: str) -> torch.Tensor:
    """A checkpoint's parameters as one (d,) vector, in the order updates use."""
    spec = json.loads(client.get_blob(manifest_cid))["spec"]
    model = build_model(
        "mlp", DataSpec(spec["task"], tuple(spec["input_shape"]), int(spec["num_classes"])), MODEL_OPTIONS
    )
    load_checkpoint(model, client.get_blob(model_cid))
    return flat_params(model)


@dataclass
class Manual:
    """A manual run in ``training`` (round 1 open); worker i trains shard i."""

    coord: object
    owner: object
    run_id: str
    workers: list
    jobs: list[str]
    shards: list[dict]
    d: int


def manual_training(coord, api, n: int = 2, *, prefix: str = "w", config: dict = CONFIG, seed: int = 0) -> Manual:
    workers = [api.register_worker(coord, f"{prefix}{i}") for i in range(n)]
    owner, run_id = manual_run(coord, target_workers=n)
    api.upload_digits(owner, run_id, n, seed=seed)
    for w in workers:
        hire(owner, run_id, w)
    owner.post(f"/runs/{run_id}/phase", {"phase": "distributing", "config": config})
    sh = shards(owner, run_id)
    jobs = [
        owner.post(f"/runs/{run_id}/jobs", {"worker_id": w.wallet.address, "shard_id": s["shard_id"]})["job_id"]
        for w, s in zip(workers, sh)
    ]
    run = owner.post(f"/runs/{run_id}/phase", {"phase": "training"})
    assert (run["status"], run["round"]) == ("training", 1), run
    return Manual(coord, owner, run_id, workers, jobs, sh, run["config"]["d"])


# --- 1. a manual run from start to end ---------------------------------------------------------


def test_manual_run_through_every_phase(coord, api):
    w0, w1 = (api.register_worker(coord, f"flow{i}") for i in range(2))
    owner, run_id = manual_run(coord)
    assert owner.get(f"/runs/{run_id}")["control"] == "manual"
    assert [r["control"] for r in owner.get("/runs", params={"owner": owner.wallet.address})["data"]] == ["manual"]
    manifest_cid = api.upload_digits(owner, run_id, 2)
    for w in (w0, w1):
        hire(owner, run_id, w)

    run = owner.post(f"/runs/{run_id}/phase", {"phase": "distributing", "config": CONFIG})
    assert run["status"] == "distributing" and run["control"] == "manual"
    assert (run["config"]["rounds"], run["config"]["local_steps"], run["config"]["batch_size"]) == (2, 1, 8)
    assert run["workers"] == []  # the owner sends the jobs, not the coordinator
    stays(owner, run_id, "distributing", 0)  # an automatic run would open round 1 at the next tick
    sh = shards(owner, run_id)
    assert [(s["shard_index"], s["split_from"], s["split_into"], s["jobs"]) for s in sh] == [
        (0, None, None, []),
        (1, None, None, []),
    ]
    assert all(s["samples"] > 0 for s in sh)

    j0 = posted(
        coord, api, owner, f"/runs/{run_id}/jobs", {"worker_id": w0.wallet.address, "shard_id": sh[0]["shard_id"]}, 201
    )
    j1 = posted(
        coord,
        api,
        owner,
        f"/runs/{run_id}/jobs",
        {"worker_id": w1.wallet.address, "shard_id": sh[1]["shard_id"], "config": {"local_steps": 3}},
        201,
    )
    assert (j0["worker_id"], j0["shard_index"], j0["shard_cid"], j0["job_status"], j0["config"]) == (
        w0.wallet.address,
        0,
        sh[0]["shard_id"],
        "active",
        {},
    )
    assert (j1["worker_id"], j1["shard_index"], j1["shard_cid"], j1["config"]) == (
        w1.wallet.address,
        1,
        sh[1]["shard_id"],
        {"local_steps": 3},
    )
    assert [s["jobs"] for s in shards(owner, run_id)] == [[j0["job_id"]], [j1["job_id"]]]
    p0 = job_payload(w0)
    assert (p0["job_id"], p0["action"], p0["run_status"]) == (j0["job_id"], "wait", "distributing")

    run = owner.post(f"/runs/{run_id}/phase", {"phase": "training"})
    assert (run["status"], run["round"]) == ("training", 1)
    rounds = owner.get(f"/runs/{run_id}/rounds")["data"]
    assert [r["round"] for r in rounds] == [0] and rounds[0]["checkpoint_cid"] == run["global_model_cid"]
    initial = run["global_model_cid"]
    p0, p1 = job_payload(w0), job_payload(w1)
    assert (p0["action"], p0["round"], p0["global_model_cid"], p0["shard_cid"], p0["local_steps"]) == (
        "train",
        1,
        initial,
        sh[0]["shard_id"],
        1,
    )
    assert (p1["action"], p1["round"], p1["shard_cid"], p1["local_steps"], p1["batch_size"]) == (
        "train",
        1,
        sh[1]["shard_id"],
        3,
        8,
    )

    d = run["config"]["d"]
    u0 = submit(api, w0, j0["job_id"], 1, small_update(d, 1))
    u1 = submit(api, w1, j1["job_id"], 1, small_update(d, 2))
    # Every job answered: an automatic run's round would close now. This one waits for its owner.
    stays(owner, run_id, "training", 1)
    assert [r["round"] for r in owner.get(f"/runs/{run_id}/rounds")["data"]] == [0]
    assert job_payload(w0)["action"] == "wait"

    run = owner.post(f"/runs/{run_id}/phase", {"phase": "aggregating"})
    assert (run["status"], run["round"]) == ("aggregating", 1)
    with pytest.raises(ApiError) as e:  # w0 sent round 1's update already: told so first, whatever the phase
        w0.post(f"/jobs/{j0['job_id']}/updates", api.update_body(1, api.put_update(w0, small_update(d, 3))))
    api.assert_api_error(e, 409, "duplicate_update")
    stays(owner, run_id, "aggregating", 1)  # not aggregated by the driver either
    assert [r["round"] for r in owner.get(f"/runs/{run_id}/rounds")["data"]] == [0]

    agg1 = owner.post(f"/runs/{run_id}/aggregate", {"updates": [u0]})
    assert (agg1["training_id"], agg1["round"], agg1["updates"], agg1["skipped"]) == (run_id, 1, 1, False)
    assert agg1["model_id"] == agg1["model_cid"] != initial
    assert agg1["weights"] == [float(sh[0]["samples"])]
    assert math.isfinite(agg1["loss"]) and 0 <= agg1["accuracy"] <= 1
    # The new model is the old one minus the one chosen update (fedavg, mean of one).
    before, after = model_params(owner, manifest_cid, initial), model_params(owner, manifest_cid, agg1["model_cid"])
    torch.testing.assert_close(after, before - small_update(d, 1), rtol=0, atol=1e-6)
    up0 = owner.get(f"/jobs/{j0['job_id']}/updates")["data"]
    up1 = owner.get(f"/jobs/{j1['job_id']}/updates")["data"]
    assert [(u["cid"], u["round"], u["status"]) for u in up0] == [(u0, 1, "accepted")]
    assert [(u["cid"], u["round"], u["status"], u["worker_id"]) for u in up1] == [
        (u1, 1, "excluded", w1.wallet.address)
    ]
    assert "left out of round 1" in up1[0]["reason"]
    r1 = owner.get(f"/runs/{run_id}/rounds")["data"][1]
    assert (
        r1["round"],
        r1["checkpoint_cid"],
        r1["val_loss"],
        r1["val_accuracy"],
        r1["accepted"],
        r1["skipped"],
        r1["stragglers"],
    ) == (1, agg1["model_cid"], agg1["loss"], agg1["accuracy"], 1, False, [])
    assert r1["train_loss"] == 0.5  # the chosen update's reported loss only
    run = stays(owner, run_id, "aggregating", 1)  # aggregated, yet round 2 does not open by itself
    assert (run["global_model_cid"], run["rounds_completed"], run["val_loss"]) == (agg1["model_cid"], 1, agg1["loss"])
    assert job_payload(w0)["action"] == "wait"

    run = owner.post(f"/runs/{run_id}/phase", {"phase": "training"})
    assert (run["status"], run["round"], run["global_model_cid"]) == ("training", 2, agg1["model_cid"])
    p0, p1 = job_payload(w0), job_payload(w1)
    assert (p0["action"], p0["round"], p0["global_model_cid"]) == ("train", 2, agg1["model_cid"])
    assert (p1["action"], p1["round"]) == ("train", 2)
    v0 = submit(api, w0, j0["job_id"], 2, small_update(d, 4))
    v1 = submit(api, w1, j1["job_id"], 2, small_update(d, 5))
    stays(owner, run_id, "training", 2)
    owner.post(f"/runs/{run_id}/phase", {"phase": "aggregating"})
    # Updates of another round, excluded or not, are not this round's.
    refused(
        coord,
        api,
        owner,
        f"/runs/{run_id}/aggregate",
        {"updates": [v0, u0]},
        422,
        "unknown_update",
        u0,
        "round 2",
        run_id=run_id,
    )
    refused(coord, api, owner, f"/runs/{run_id}/aggregate", {"updates": [u1]}, 422, "unknown_update", u1, run_id=run_id)
    agg2 = owner.post(f"/runs/{run_id}/aggregate", {"updates": [v0, v1], "weights": [1.0, 3.0]})
    assert (agg2["round"], agg2["updates"], agg2["weights"]) == (2, 2, [1.0, 3.0])
    expected = model_params(owner, manifest_cid, agg1["model_cid"]) - (small_update(d, 4) + 3 * small_update(d, 5)) / 4
    torch.testing.assert_close(model_params(owner, manifest_cid, agg2["model_cid"]), expected, rtol=0, atol=1e-6)
    assert [u["status"] for u in owner.get(f"/jobs/{j1['job_id']}/updates")["data"]] == [
        "accepted",
        "excluded",
    ]  # newest first
    refused(
        coord,
        api,
        owner,
        f"/runs/{run_id}/aggregate",
        {"updates": [v0]},
        409,
        "already_aggregated",
        "round 2",
        run_id=run_id,
    )
    refused(
        coord,
        api,
        owner,
        f"/runs/{run_id}/phase",
        {"phase": "training"},
        409,
        "rounds_done",
        "all 2 rounds",
        run_id=run_id,
    )

    run = owner.post(f"/runs/{run_id}/phase", {"phase": "complete"})
    assert (run["status"], run["round"], run["rounds_completed"]) == ("complete", 2, 2)
    assert run["finished_at"] is not None
    assert {j["job_status"] for j in run["workers"]} == {"released"}
    assert {c["status"] for c in run["contracts"]} == {"released"}
    assert job_payload(w0) is None and job_payload(w1) is None
    assert owner.get(f"/runs/{run_id}/results")["model_cid"] == agg2["model_cid"]  # the last round, until one is chosen

    saved = owner.post(f"/runs/{run_id}/result", {"model_cid": agg1["model_cid"]})
    assert (saved["model_cid"], saved["round"], saved["status"]) == (agg1["model_cid"], 1, "complete")
    results = owner.get(f"/runs/{run_id}/results")
    assert (results["model_cid"], results["rounds_completed"], results["rounds"]) == (agg1["model_cid"], 2, 2)
    assert [(c["round"], c["cid"]) for c in results["checkpoints"]] == [
        (0, initial),
        (1, agg1["model_cid"]),
        (2, agg2["model_cid"]),
    ]
    assert results["updates_accepted"] == 3
    stays(owner, run_id, "complete", 2)


# --- 2. refusals ---------------------------------------------------------------------------------


def test_phase_job_and_aggregation_refusals_change_nothing(coord, api):
    a, b = api.register_worker(coord, "ra"), api.register_worker(coord, "rb")
    stranger = coord.client("stranger")
    owner, run_id = manual_run(coord)
    p = f"/runs/{run_id}"
    dist = {"phase": "distributing", "config": {**CONFIG, "rounds": 1}}

    def no(path, body, status, code, *detail, who=owner):
        refused(coord, api, who, path, body, status, code, *detail, run_id=run_id)

    # initializing, no data, nobody hired
    no(f"{p}/phase", {"phase": "distributing"}, 409, "no_data", run_id)  # no config: the defaults
    no(f"{p}/phase", dist, 409, "no_data", run_id)
    no(f"{p}/phase", {"phase": "training", "config": CONFIG}, 422, "bad_config", "distributing only")
    no(f"{p}/phase", {"phase": "complete", "config": CONFIG}, 422, "bad_config")
    no(f"{p}/phase", {"phase": "training"}, 409, "bad_state", "initializing")
    no(f"{p}/phase", {"phase": "aggregating"}, 409, "bad_state", "close the round")
    no(f"{p}/phase", {"phase": "complete"}, 409, "bad_state", "initializing")
    no(f"{p}/phase", {"phase": "paused"}, 422, "invalid_request", "phase")
    no(f"{p}/phase", {}, 422, "invalid_request", "phase")
    no(f"{p}/phase", {"phase": "distributing", "config": {"rounds": 0}}, 422, "invalid_request", "rounds")
    no(f"{p}/phase", dist, 403, "forbidden", who=stranger)
    no(f"{p}/jobs", {"worker_id": a.wallet.address, "shard_id": cid_of_bytes(b"x")}, 409, "bad_state", "send a job")
    with pytest.raises(ApiError) as e:
        owner.post("/runs/training_nope/phase", dist)
    api.assert_api_error(e, 404, "unknown_run")

    api.upload_digits(owner, run_id, 2)
    no(f"{p}/phase", dist, 409, "no_workers", run_id)
    hire(owner, run_id, a)
    no(f"{p}/phase", {"phase": "distributing", "config": {**CONFIG, "aggregator": "bogus"}}, 422, "bad_config")
    run = owner.post(f"{p}/phase", dist)
    assert run["status"] == "distributing"
    sh = [s["shard_id"] for s in shards(owner, run_id)]

    # distributing: no jobs yet
    no(f"{p}/phase", dist, 409, "bad_state", "distribute")
    no(f"{p}/phase", {"phase": "training"}, 409, "no_jobs", "send some first")
    no(f"{p}/phase", {"phase": "aggregating"}, 409, "bad_state", "distributing")
    no(f"{p}/phase", {"phase": "complete"}, 409, "bad_state", "distributing")
    no(f"{p}/aggregate", {"updates": [cid_of_bytes(b"u")]}, 409, "bad_state", "aggregating")
    no(f"{p}/result", {"model_cid": cid_of_bytes(b"m")}, 422, "unknown_model")
    no(
        f"{p}/jobs",
        {"worker_id": a.wallet.address, "shard_id": cid_of_bytes(b"not a shard")},
        422,
        "unknown_shard",
        "2 shards",
    )
    no(f"{p}/jobs", {"worker_id": a.wallet.address, "shard_id": "shard-0"}, 422, "unknown_shard")
    no(f"{p}/jobs", {"worker_id": b.wallet.address, "shard_id": sh[0]}, 409, "not_hired", b.wallet.address)
    no(f"{p}/jobs", {"worker_id": "ait1" + "0" * 40, "shard_id": sh[0]}, 409, "not_hired")
    no(f"{p}/jobs", {"worker_id": a.wallet.address, "shard_id": sh[0]}, 403, "forbidden", who=stranger)
    no(f"{p}/jobs", {"worker_id": a.wallet.address}, 422, "invalid_request", "shard_id")
    no(
        f"{p}/jobs",
        {"worker_id": a.wallet.address, "shard_id": sh[0], "config": {"local_steps": 0}},
        422,
        "invalid_request",
        "local_steps",
    )
    for bad, named in [
        ({"epochs": 0}, "epochs must be in [1, 1000], got 0"),
        ({"epochs": 1001}, "epochs must be in [1, 1000], got 1001"),
        ({"epochs": 2.5}, "epochs"),
        ({"learning_rate": 5.0}, "learning_rate must be in [1e-08, 1], got 5"),
        ({"learning_rate": 0.0}, "learning_rate must be in"),
        ({"batch_size": 0}, "batch_size must be in [1, 65536], got 0"),
        ({"lr": 0.1, "learning_rate": 0.1}, "not both"),
        ({"local_steps": 5, "epochs": 2}, "not both"),
        ({"momentum": 0.9}, "momentum"),
    ]:
        no(
            f"{p}/jobs",
            {"worker_id": a.wallet.address, "shard_id": sh[0], "config": bad},
            422,
            "invalid_request",
            named,
        )
    # epochs whose steps pass the local_steps bound (shards of ~900 samples at batch 1)
    no(
        f"{p}/jobs",
        {"worker_id": a.wallet.address, "shard_id": sh[0], "config": {"epochs": 1000, "batch_size": 1}},
        422,
        "bad_config",
        "epochs 1000",
        "at most 100000",
    )
    job = posted(coord, api, owner, f"{p}/jobs", {"worker_id": a.wallet.address, "shard_id": sh[0]}, 201)
    no(f"{p}/jobs", {"worker_id": a.wallet.address, "shard_id": sh[1]}, 409, "worker_busy", job["job_id"])

    # training
    assert owner.post(f"{p}/phase", {"phase": "training"})["status"] == "training"
    no(f"{p}/phase", {"phase": "training"}, 409, "bad_state", "training")
    no(f"{p}/phase", {"phase": "complete"}, 409, "bad_state", "complete the run")
    no(f"{p}/phase", {"phase": "distributing", "config": CONFIG}, 409, "bad_state")
    no(f"{p}/aggregate", {"updates": [cid_of_bytes(b"u")]}, 409, "bad_state", "training")
    u = submit(api, a, job["job_id"], 1, small_update(run["config"]["d"], 7))

    # aggregating, not aggregated
    assert owner.post(f"{p}/phase", {"phase": "aggregating"})["status"] == "aggregating"
    no(f"{p}/phase", {"phase": "aggregating"}, 409, "bad_state")
    no(f"{p}/phase", {"phase": "training"}, 409, "not_aggregated", "round 1")
    no(f"{p}/phase", {"phase": "complete"}, 409, "not_aggregated", "round 1")
    no(f"{p}/aggregate", {"updates": [cid_of_bytes(b"other")]}, 422, "unknown_update", "1 accepted")
    no(f"{p}/aggregate", {"updates": [u, cid_of_bytes(b"other")]}, 422, "unknown_update")
    no(f"{p}/aggregate", {"updates": [u, u]}, 422, "bad_updates", "twice")
    no(f"{p}/aggregate", {"updates": [u], "weights": []}, 422, "bad_weights", "0 weights for 1 updates")
    no(f"{p}/aggregate", {"updates": [u], "weights": [1.0, 2.0]}, 422, "bad_weights")
    for w in (0, -1.0):
        no(f"{p}/aggregate", {"updates": [u], "weights": [w]}, 422, "bad_weights", "finite numbers > 0")
    for w in (float("nan"), float("inf")):  # refused as the body is parsed, like every non-finite number
        no(f"{p}/aggregate", {"updates": [u], "weights": [w]}, 422, "invalid_request", "must be a finite number")
    no(f"{p}/aggregate", {"updates": [u], "weights": ["1"]}, 422, "invalid_request", "weights")
    no(f"{p}/aggregate", {"updates": [u]}, 403, "forbidden", who=stranger)
    with pytest.raises(ApiError) as e:
        owner.post("/runs/training_nope/aggregate", {"updates": [u]})
    api.assert_api_error(e, 404, "unknown_run")
    no(f"{p}/result", {"model_cid": u}, 422, "not_a_model", "not a checkpoint of run")  # an update blob
    agg = owner.post(f"{p}/aggregate", {"updates": [u]})
    no(f"{p}/aggregate", {"updates": [u]}, 409, "already_aggregated")
    no(f"{p}/phase", {"phase": "training"}, 409, "rounds_done", "set phase complete")
    initial = owner.get(f"{p}/rounds")["data"][0]["checkpoint_cid"]
    no(f"{p}/result", {"model_cid": initial}, 422, "unknown_model")  # round 0 is not an aggregated checkpoint
    no(f"{p}/result", {"model_cid": agg["model_cid"]}, 403, "forbidden", who=stranger)

    assert owner.post(f"{p}/phase", {"phase": "complete"})["status"] == "complete"
    no(f"{p}/phase", {"phase": "training"}, 409, "run_ended", "complete")
    no(f"{p}/phase", dist, 409, "run_ended")
    no(f"{p}/jobs", {"worker_id": a.wallet.address, "shard_id": sh[1]}, 409, "run_ended")
    no(f"{p}/contracts", {"worker_id": b.wallet.address, "price": "1"}, 409, "run_ended")
    no(f"/jobs/{job['job_id']}/config", {"local_steps": 2}, 409, "run_ended")
    no(f"/jobs/{job['job_id']}/end", {"status": "released"}, 409, "run_ended")


def test_an_automatic_run_is_taken_over_by_its_first_phase_move(coord, api):
    """Automatic until its owner first sets the phase: jobs, aggregation and the result
    are refused before that (they say how to take over); a phase move the run cannot make
    takes nothing over; the first one that it can makes the run manual, recorded, for good."""
    w = api.register_worker(coord, "auto")
    owner = coord.client("owner")
    owner.post("/wallets/fund", {"amount": "1000"})
    auto = owner.post("/runs", {**RUN_BODY, "budget": "100"})
    assert auto["control"] == "automatic"  # the default
    run_id = auto["training_id"]
    api.upload_digits(owner, run_id, 2)
    hire(owner, run_id, w)
    shard = shards(owner, run_id)[0]["shard_id"]
    for path, body in [
        ("jobs", {"worker_id": w.wallet.address, "shard_id": shard}),
        ("aggregate", {"updates": [cid_of_bytes(b"u")]}),
        ("result", {"model_cid": cid_of_bytes(b"m")}),
    ]:
        refused(
            coord, api, owner, f"/runs/{run_id}/{path}", body, 409, "automatic_control", "take it over", run_id=run_id
        )
    # a move the run cannot make from initializing: refused, and the run is still automatic
    refused(coord, api, owner, f"/runs/{run_id}/phase", {"phase": "training"}, 409, "bad_state", run_id=run_id)
    assert owner.get(f"/runs/{run_id}")["control"] == "automatic"
    run = owner.post(f"/runs/{run_id}/phase", {"phase": "distributing", "config": CONFIG})
    assert (run["status"], run["control"], run["manual_from_round"]) == ("distributing", "manual", 1)
    assert run["manual_since"] >= auto["created_at"]
    # one way: nothing makes it automatic again (distribute is the automatic path)
    refused(coord, api, owner, f"/runs/{run_id}/distribute", CONFIG, 409, "manual_control", run_id=run_id)
    # and a manual run is not distributed by the coordinator
    _, manual_id = manual_run(coord, owner)
    refused(
        coord, api, owner, f"/runs/{manual_id}/distribute", CONFIG, 409, "manual_control", "/phase", run_id=manual_id
    )
    with pytest.raises(ApiError) as e:
        owner.post("/runs", {**RUN_BODY, "control": "robot"})
    api.assert_api_error(e, 422, "invalid_request", "control")


def test_hiring_in_a_live_manual_run_and_a_job_for_the_new_hire(coord, api):
    t = manual_training(coord, api, 2, prefix="hire")
    late = api.register_worker(coord, "late")
    owner, p = t.owner, f"/runs/{t.run_id}"
    c = posted(coord, api, owner, f"{p}/contracts", {"worker_id": late.wallet.address, "price": "1.25"}, 201)
    assert (c["worker_id"], c["price"], c["status"]) == (late.wallet.address, "1.25", "hired")
    assert job_payload(late) is None  # hired, no job yet: a manual run's owner sends it one
    time.sleep(IDLE)
    assert job_payload(late) is None  # the driver does not use it to fill a shard either
    j = owner.post(f"{p}/jobs", {"worker_id": late.wallet.address, "shard_id": t.shards[1]["shard_id"]})
    assert (j["joined_round"], j["shard_index"]) == (1, 1)
    assert [s["jobs"] for s in shards(owner, t.run_id)] == [[t.jobs[0]], [t.jobs[1], j["job_id"]]]
    view = job_payload(late)
    assert (view["action"], view["round"], view["shard_cid"]) == ("train", 1, t.shards[1]["shard_id"])
    # Aggregating: new jobs may still be sent (they train from the next round).
    owner.post(f"{p}/phase", {"phase": "aggregating"})
    spare = api.register_worker(coord, "spare")
    hire(owner, t.run_id, spare)
    j2 = owner.post(f"{p}/jobs", {"worker_id": spare.wallet.address, "shard_id": t.shards[0]["shard_id"]})
    assert job_payload(spare)["action"] == "wait"
    assert j2["job_status"] == "active"


# --- 3. job controls -----------------------------------------------------------------------------


def test_job_controls_of_a_manual_run(new_coordinator, api):
    """On a coordinator of its own: "the best free worker" is then a known one."""
    coord = new_coordinator(heartbeat_flush_seconds=0.05)
    t = manual_training(coord, api, 2, prefix="jc")
    owner, run_id = t.owner, t.run_id
    (a, b), (ja, jb) = t.workers, t.jobs
    c, d = api.register_worker(coord, "c"), api.register_worker(coord, "d")
    stranger = coord.client("stranger")

    def no(path, body, status, code, *detail, who=owner):
        refused(coord, api, who, path, body, status, code, *detail, run_id=run_id)

    for action, body in [
        ("end", {"status": "failed"}),
        ("reassign", {"worker_id": c.wallet.address}),
        ("split", {"worker_id": c.wallet.address}),
        ("config", {"local_steps": 2}),
        ("resend", {}),
    ]:
        no(f"/jobs/{ja}/{action}", body, 403, "forbidden", run_id, who=stranger)
        no(f"/jobs/{ja}/{action}", body, 403, "forbidden", who=a)  # the worker itself does not control its job
        no(f"/jobs/job_nope/{action}", body, 404, "unknown_job", "job_nope")
    with pytest.raises(ApiError) as e:
        owner.get("/jobs/job_nope/updates")
    api.assert_api_error(e, 404, "unknown_job")

    # per-job config: visible on the job and in the worker's payload, merged with what was set before
    no(f"/jobs/{ja}/config", {}, 422, "bad_config", "at least one")
    no(f"/jobs/{ja}/config", {"local_steps": 0}, 422, "invalid_request", "local_steps")
    no(f"/jobs/{ja}/config", {"lr": 100.0}, 422, "invalid_request", "lr")
    no(f"/jobs/{ja}/config", {"local_steps": "5"}, 422, "invalid_request", "local_steps")
    assert job_payload(a)["local_steps"] == 1
    assert owner.post(f"/jobs/{ja}/config", {"local_steps": 7})["config"] == {"local_steps": 7}
    assert owner.post(f"/jobs/{ja}/config", {"lr": 0.01})["config"] == {"local_steps": 7, "lr": 0.01}
    assert owner.get(f"/jobs/{ja}")["config"] == {"local_steps": 7, "lr": 0.01}
    pa = job_payload(a)
    assert (pa["local_steps"], pa["lr"], pa["batch_size"]) == (7, 0.01, 8)
    assert job_payload(b)["local_steps"] == 1  # the other job keeps the run's

    # resend: the update of the open round is dropped; the worker trains that round again
    no(f"/jobs/{ja}/resend", {}, 409, "nothing_to_resend", "round 1")
    ua = submit(api, a, ja, 1, small_update(t.d, 11))
    assert job_payload(a)["action"] == "wait"
    res = owner.post(f"/jobs/{ja}/resend")
    assert res == {"job_id": ja, "worker_id": a.wallet.address, "round": 1, "dropped": ua, "status": "resend_requested"}
    pa = job_payload(a)
    assert (pa["action"], pa["round"], pa["job_id"]) == ("train", 1, ja)
    assert owner.get(f"/jobs/{ja}/updates")["data"] == []
    assert coord.rows("SELECT kind, round FROM flags WHERE worker_id = :w", w=a.wallet.address) == [
        {"kind": "resend_requested", "round": 1}
    ]
    ua2 = submit(api, a, ja, 1, small_update(t.d, 12))  # sent again, accepted
    assert [u["cid"] for u in owner.get(f"/jobs/{ja}/updates")["data"]] == [ua2]

    # split b's shard: b keeps the first half (from its next round), c trains the second
    original = t.shards[1]
    no(f"/jobs/{jb}/split", {"worker_id": b.wallet.address}, 409, "same_worker")
    out = posted(coord, api, owner, f"/jobs/{jb}/split", {"worker_id": c.wallet.address}, 201)
    kept, new = out["job"], out["new_job"]
    view = shards(owner, run_id)
    assert [s["shard_index"] for s in view] == [0, 1, 2, 3]
    assert (view[1]["shard_id"], view[1]["split_into"], view[1]["jobs"]) == (original["shard_id"], [2, 3], [])
    assert [(s["split_from"], s["split_into"]) for s in view[2:]] == [(1, None), (1, None)]
    assert view[2]["samples"] + view[3]["samples"] == original["samples"]
    assert abs(view[2]["samples"] - view[3]["samples"]) <= 1
    assert (kept["job_id"], kept["worker_id"], kept["shard_index"], kept["shard_cid"]) == (
        jb,
        b.wallet.address,
        2,
        view[2]["shard_id"],
    )
    assert kept["shard_cid"] != original["shard_id"] and kept["job_status"] == "active"
    assert (kept["moved_from"], new["moved_from"]) == (1, None)  # the kept half says where it came from
    assert (new["worker_id"], new["shard_index"], new["shard_cid"], new["job_status"]) == (
        c.wallet.address,
        3,
        view[3]["shard_id"],
        "active",
    )
    assert (view[2]["jobs"], view[3]["jobs"]) == ([jb], [new["job_id"]])
    # the halves are the original shard's samples, in order
    x, y = load_shard(owner.get_blob(original["shard_id"]))
    x1, y1 = load_shard(owner.get_blob(view[2]["shard_id"]))
    x2, y2 = load_shard(owner.get_blob(view[3]["shard_id"]))
    assert torch.equal(torch.cat([x1, x2]), x) and torch.equal(torch.cat([y1, y2]), y)
    assert job_payload(b)["shard_cid"] == view[2]["shard_id"]
    pc = job_payload(c)
    assert (pc["job_id"], pc["action"], pc["round"], pc["shard_cid"]) == (
        new["job_id"],
        "train",
        1,
        view[3]["shard_id"],
    )
    assert c.wallet.address in [k["worker_id"] for k in owner.get(f"/runs/{run_id}")["contracts"]]  # hired at its ask
    no(
        f"/runs/{run_id}/jobs",
        {"worker_id": d.wallet.address, "shard_id": original["shard_id"]},
        409,
        "shard_split",
        view[2]["shard_id"],
    )

    # reassign a's job to a named free worker (not hired yet: hired at its ask); a is released
    no(f"/jobs/{ja}/reassign", {"worker_id": a.wallet.address}, 409, "same_worker")
    no(f"/jobs/{ja}/reassign", {"worker_id": c.wallet.address}, 409, "worker_busy", new["job_id"])
    no(f"/jobs/{ja}/reassign", {"worker_id": "ait1" + "0" * 40}, 404, "unknown_worker")
    moved = posted(coord, api, owner, f"/jobs/{ja}/reassign", {"worker_id": d.wallet.address}, 201)
    assert (moved["worker_id"], moved["shard_index"], moved["shard_cid"], moved["replaces"]) == (
        d.wallet.address,
        0,
        t.shards[0]["shard_id"],
        ja,
    )
    assert moved["config"] == {"local_steps": 7, "lr": 0.01}  # the job's own config goes with it
    old = owner.get(f"/jobs/{ja}")
    assert (old["job_status"], old["end_reason"]) == ("released", f"reassigned to {d.wallet.address} by the owner")
    assert job_payload(a) is None
    pd = job_payload(d)
    assert (pd["job_id"], pd["action"], pd["round"], pd["local_steps"]) == (moved["job_id"], "train", 1, 7)
    no(f"/jobs/{ja}/reassign", {"worker_id": c.wallet.address}, 409, "already_replaced", moved["job_id"])
    no(f"/jobs/{ja}/split", {"worker_id": c.wallet.address}, 409, "job_not_active")
    no(f"/jobs/{ja}/end", {"status": "failed"}, 409, "job_not_active")
    no(f"/jobs/{ja}/config", {"local_steps": 3}, 409, "job_not_active")

    # mark c failed: its job fails, its contract too, it is flagged and leaves the market
    flags = coord.rows("SELECT flags FROM offers WHERE id = :w", w=c.wallet.address)[0]["flags"]
    no(f"/jobs/{new['job_id']}/end", {"status": "lost"}, 422, "invalid_request", "status")
    ended = owner.post(f"/jobs/{new['job_id']}/end", {"status": "failed", "reason": "gpu on fire"})
    assert (ended["job_status"], ended["end_reason"]) == ("failed", "gpu on fire")
    offers = {o["worker_id"]: o for o in owner.get("/market/offers", params={"all": "true"})["data"]}
    assert (offers[c.wallet.address]["status"], offers[c.wallet.address]["flags"]) == ("failed", flags + 1)
    assert c.wallet.address not in [o["worker_id"] for o in owner.get("/market/offers")["data"]]
    assert coord.rows("SELECT kind, reason FROM flags WHERE worker_id = :w", w=c.wallet.address) == [
        {"kind": "marked_failed", "reason": "gpu on fire"}
    ]
    assert {k["worker_id"]: k["status"] for k in owner.get(f"/runs/{run_id}")["contracts"]}[
        c.wallet.address
    ] == "failed"
    assert job_payload(c) is None
    no(f"/runs/{run_id}/jobs", {"worker_id": c.wallet.address, "shard_id": view[3]["shard_id"]}, 409, "contract_ended")
    assert stays(owner, run_id, "training", 1)["workers"]  # the driver does not refill a manual run's shard
    assert shards(owner, run_id)[3]["jobs"] == []

    # reassign the failed job to the best free worker: a spare of the run comes first...
    e_, f_ = api.register_worker(coord, "e", price="3"), api.register_worker(coord, "f", price="0.5")
    hire(owner, run_id, e_, price="3")
    best = posted(coord, api, owner, f"/jobs/{new['job_id']}/reassign", {}, 201)
    assert (best["worker_id"], best["shard_index"], best["replaces"]) == (e_.wallet.address, 3, new["job_id"])
    # ... else the best-ranked free live offer, hired now at its asking price
    owner.post(f"/jobs/{moved['job_id']}/end", {"status": "released"})
    assert owner.get(f"/jobs/{moved['job_id']}")["job_status"] == "released"
    assert coord.rows("SELECT status FROM offers WHERE id = :w", w=d.wallet.address) == [
        {"status": "online"}
    ]  # not flagged
    best2 = posted(coord, api, owner, f"/jobs/{moved['job_id']}/reassign", {}, 201)
    assert (best2["worker_id"], best2["shard_index"]) == (f_.wallet.address, 0)
    contract = {k["worker_id"]: k for k in owner.get(f"/runs/{run_id}")["contracts"]}[f_.wallet.address]
    assert (contract["price"], contract["status"]) == ("0.5", "working")
    # nobody free is left
    refused(coord, api, owner, f"/jobs/{jb}/split", {}, 409, "no_free_worker", run_id=run_id)
    owner.post(f"/jobs/{best2['job_id']}/end", {"status": "released"})
    no(f"/jobs/{best2['job_id']}/reassign", {}, 409, "no_free_worker")

    # resend needs the round open
    owner.post(f"/runs/{run_id}/phase", {"phase": "aggregating"})
    no(f"/jobs/{ja}/resend", {}, 409, "job_not_active")
    no(f"/jobs/{jb}/resend", {}, 409, "bad_state", "round must be open")


def test_a_refused_split_writes_no_blob(coord, api):
    """A split refused for its target worker (busy; nobody free) leaves the blob store as
    it was, like every other refusal ("checks before it writes ... or raises, leaving nothing")."""
    t = manual_training(coord, api, 2, prefix="sb", seed=5)  # shards no other test here has (or splits)
    refused(
        coord,
        api,
        t.owner,
        f"/jobs/{t.jobs[0]}/split",
        {"worker_id": t.workers[1].wallet.address},
        409,
        "worker_busy",
        run_id=t.run_id,
    )


def test_job_controls_of_an_automatic_run(new_coordinator, api):
    coord = new_coordinator(heartbeat_flush_seconds=0.05)
    t = api.start_training_run(coord, 2, prefix="auto")
    owner, run_id = t.owner, t.run_id
    w0, w1 = t.workers
    j0, j1 = t.jobs[w0.wallet.address], t.jobs[w1.wallet.address]
    assert owner.post(f"/jobs/{j1}/config", {"local_steps": 4})["config"] == {"local_steps": 4}
    assert job_payload(w1)["local_steps"] == 4 and job_payload(w0)["local_steps"] == 1
    # a resend on an automatic run: dropped, and the round (waiting for w0) stays open
    u = submit(api, w1, j1, 1, small_update(t.d, 21))
    assert owner.post(f"/jobs/{j1}/resend")["dropped"] == u
    assert job_payload(w1)["action"] == "train"
    # a free worker joins the market; releasing w0's job lets the driver give its shard to it
    x = api.register_worker(coord, "joiner")
    ended = owner.post(f"/jobs/{j0}/end", {"status": "released"})
    assert (ended["job_status"], ended["end_reason"]) == ("released", "released by the owner")
    deadline = time.monotonic() + 10
    while (view := job_payload(x)) is None:
        assert time.monotonic() < deadline, "the driver never gave the released shard to the free worker"
        time.sleep(0.05)
    shard0 = owner.get(f"/jobs/{j0}")["shard_cid"]
    assert (view["training_id"], view["shard_cid"], view["action"], view["round"]) == (run_id, shard0, "train", 1)
    assert job_payload(w0) is None
    # reassign (named) and split work here too
    y = api.register_worker(coord, "y")
    moved = posted(coord, api, owner, f"/jobs/{view['job_id']}/reassign", {"worker_id": y.wallet.address}, 201)
    assert (moved["worker_id"], moved["shard_cid"], moved["replaces"]) == (y.wallet.address, shard0, view["job_id"])
    z = api.register_worker(coord, "z")
    i1 = owner.get(f"/jobs/{j1}")["shard_index"]
    out = posted(coord, api, owner, f"/jobs/{j1}/split", {"worker_id": z.wallet.address}, 201)
    assert (out["job"]["shard_index"], out["new_job"]["shard_index"], out["new_job"]["worker_id"]) == (
        2,
        3,
        z.wallet.address,
    )
    assert shards(owner, run_id)[i1]["split_into"] == [2, 3]
    assert job_payload(z)["action"] == "train"


def test_an_update_sent_before_its_shard_was_split_keeps_its_weight(coord, api):
    """Default weights are the samples each update was trained on: b's round-1 update
    covers all of shard 1, though b trains only its first half from round 2 on."""
    t = manual_training(coord, api, 2, prefix="sw", seed=7)
    helper = api.register_worker(coord, "swh")
    (a, b), (ja, jb) = t.workers, t.jobs
    ua = submit(api, a, ja, 1, small_update(t.d, 41))
    ub = submit(api, b, jb, 1, small_update(t.d, 42))  # b trained round 1 on all of shard 1
    t.owner.post(f"/jobs/{jb}/split", {"worker_id": helper.wallet.address})  # b keeps the first half from round 2
    assert t.owner.get(f"/jobs/{jb}/updates")["data"][0]["samples"] == t.shards[1]["samples"]
    t.owner.post(f"/runs/{t.run_id}/phase", {"phase": "aggregating"})
    agg = t.owner.post(f"/runs/{t.run_id}/aggregate", {"updates": [ua, ub]})
    n0, n1 = t.shards[0]["samples"], t.shards[1]["samples"]
    assert agg["weights"] == [float(n0), float(n1)]
    run = t.owner.get(f"/runs/{t.run_id}")
    initial = t.owner.get(f"/runs/{t.run_id}/rounds")["data"][0]["checkpoint_cid"]
    expected = model_params(t.owner, run["manifest_cid"], initial) - (
        n0 * small_update(t.d, 41) + n1 * small_update(t.d, 42)
    ) / (n0 + n1)
    torch.testing.assert_close(
        model_params(t.owner, run["manifest_cid"], agg["model_cid"]), expected, rtol=0, atol=1e-6
    )


# --- 4. the signed max_cost of a manual run without a budget ---------------------------------------


def ledger_state(coord) -> tuple:
    return (
        coord.rows("SELECT * FROM ledger_entries ORDER BY seq"),
        coord.rows("SELECT * FROM ledger_accounts ORDER BY name"),
        coord.rows("SELECT * FROM ledger_head"),
    )


def test_phase_distributing_escrows_the_signed_max_cost(coord, api):
    p_, q_ = api.register_worker(coord, "p", price="1.5"), api.register_worker(coord, "q", price="1.5")
    owner, run_id = manual_run(coord, budget=None)
    assert owner.get(f"/runs/{run_id}")["budget"] is None
    api.upload_digits(owner, run_id, 2)
    hire(owner, run_id, p_, price="1.5")
    hire(owner, run_id, q_, price="2")  # the agreed price, not the ask, is what it costs
    cfg = {**CONFIG, "rounds": 3}  # (1.5 + 2) x 3 = 10.5 AIT

    def no(body, status, code, *detail):
        before = ledger_state(coord)
        refused(coord, api, owner, f"/runs/{run_id}/phase", body, status, code, *detail, run_id=run_id)
        assert ledger_state(coord) == before

    no({"phase": "distributing", "config": cfg}, 422, "no_budget", "10.5 AIT", "max_cost")
    no(
        {"phase": "distributing", "config": {**cfg, "max_cost": "10.499999"}},
        409,
        "over_max_cost",
        "cost 10.5 AIT over 3 rounds",
        "allows 10.499999",
    )
    no({"phase": "distributing", "config": {**cfg, "max_cost": 10}}, 409, "over_max_cost", "allows 10")
    no({"phase": "distributing", "config": {**cfg, "max_cost": "lots"}}, 422, "bad_price", "max_cost")
    no({"phase": "distributing", "config": {**cfg, "max_cost": "-11"}}, 422, "bad_price")
    no(
        {"phase": "distributing", "max_cost": "20", "config": cfg}, 422, "invalid_request", "max_cost"
    )  # not at the top level
    run = owner.get(f"/runs/{run_id}")
    assert (run["status"], run["escrowed"], run["config"]) == ("initializing", "0", {})

    # a wallet that cannot pay: refused by the ledger, nothing written. Hiring checked the
    # owner could pay for the default plan's 10 rounds (issue 33), and that money stays in
    # the wallet (a send of it is refused); the config asks for 11 rounds.
    poor_owner, poor = manual_run(coord, budget=None, fund="15")
    api.upload_digits(poor_owner, poor, 2)
    hire(poor_owner, poor, api.register_worker(coord, "pp", price="1.5"), price="1.5")
    before = ledger_state(coord)
    refused(
        coord,
        api,
        poor_owner,
        "/wallets/send",
        {"to": coord.client("elsewhere").wallet.address, "amount": "11"},
        409,
        "insufficient_funds",
        "hires of its runs not yet distributed hold 15 AIT",
        run_id=poor,
    )
    refused(
        coord,
        api,
        poor_owner,
        f"/runs/{poor}/phase",
        {"phase": "distributing", "config": {**cfg, "rounds": 11, "max_cost": "100"}},
        409,
        "insufficient_funds",
        "16.5 AIT needed",
        run_id=poor,
    )
    assert ledger_state(coord) == before

    # enough: exactly the cost is escrowed, authorised by the owner's signed config.max_cost
    entries = len(ledger_state(coord)[0])
    run = owner.post(f"/runs/{run_id}/phase", {"phase": "distributing", "config": {**cfg, "max_cost": "12"}})
    assert (run["status"], run["escrowed"], run["budget"]) == ("distributing", "10.5", None)
    assert "max_cost" not in run["config"]
    new = ledger_state(coord)[0][entries:]
    assert [(e["kind"], e["debit"], e["credit"], e["amount"]) for e in new] == [
        ("escrow", wallet_account(owner.wallet.address), escrow_account(run_id), 10_500_000)
    ]
    auth = json.loads(new[0]["auth"]) if isinstance(new[0]["auth"], str) else new[0]["auth"]
    assert (auth["type"], auth["method"], auth["path"], auth["field"]) == (
        "request",
        "POST",
        f"/v1/runs/{run_id}/phase",
        "config.max_cost",
    )
    assert json.loads(auth["body"])["config"]["max_cost"] == "12"
    assert new[0]["signer"] == owner.wallet.public_key
    assert owner.get(f"/wallets/{owner.wallet.address}/balance")["balance"] == "989.5"
    with coord.http() as h:  # the whole ledger still audits, this entry included
        info = h.get("/v1/ledger").json()
        everything = h.get("/v1/ledger/entries", params={"limit": 1000}).json()["data"]
        cached = h.get("/v1/ledger/balances").json()["data"]
    result = audit(everything, system_key=info["system_key"], cached=cached, head=(info["entries"], info["head"]))
    assert result.ok, result.describe()


# --- regressions: bugs found while writing these tests -------------------------------------------


def test_excluded_updates_are_not_counted_as_rejected(coord, api):
    t = manual_training(coord, api, 2, prefix="ex")
    u0 = submit(api, t.workers[0], t.jobs[0], 1, small_update(t.d, 31))
    submit(api, t.workers[1], t.jobs[1], 1, small_update(t.d, 32))
    t.owner.post(f"/runs/{t.run_id}/phase", {"phase": "aggregating"})
    t.owner.post(f"/runs/{t.run_id}/aggregate", {"updates": [u0]})
    assert t.owner.get(f"/runs/{t.run_id}/results")["updates_rejected"] == 0  # nothing was rejected ...
    r1 = t.owner.get(f"/runs/{t.run_id}/rounds")["data"][1]
    assert (r1["accepted"], r1["rejected"]) == (1, 0)  # ... yet the round says one was


def test_phase_training_on_a_paused_manual_run_is_not_a_silent_no_op(coord, api):
    t = manual_training(coord, api, 2, prefix="pz")
    assert t.owner.post(f"/runs/{t.run_id}/pause")["status"] == "paused"
    with coord.http() as h:
        r = api.signed_post(h, t.owner.wallet, f"/v1/runs/{t.run_id}/phase", {"phase": "training"})
    status = t.owner.get(f"/runs/{t.run_id}")["status"]
    # Either it resumes the run into training, or it is refused (409: resume it first); not "200, still paused".
    assert (r.status_code == 200 and status == "training") or (r.status_code == 409 and status == "paused"), (
        r.status_code,
        r.json()["status"] if r.status_code == 200 else r.json(),
        status,
    )


def test_a_job_sent_while_aggregating_is_not_a_straggler_of_the_closed_round(coord, api):
    t = manual_training(coord, api, 2, prefix="st")
    late = api.register_worker(coord, "st-late")
    u = submit(api, t.workers[0], t.jobs[0], 1, small_update(t.d, 51))
    v = submit(api, t.workers[1], t.jobs[1], 1, small_update(t.d, 52))  # every job of round 1 answered it
    t.owner.post(f"/runs/{t.run_id}/phase", {"phase": "aggregating"})
    hire(t.owner, t.run_id, late)
    t.owner.post(f"/runs/{t.run_id}/jobs", {"worker_id": late.wallet.address, "shard_id": t.shards[0]["shard_id"]})
    t.owner.post(f"/runs/{t.run_id}/aggregate", {"updates": [u, v]})
    coord.settled()
    assert t.owner.get(f"/runs/{t.run_id}/rounds")["data"][1]["stragglers"] == []
    assert coord.rows("SELECT kind FROM flags WHERE worker_id = :w", w=late.wallet.address) == []
    assert coord.rows("SELECT reputation FROM offers WHERE id = :w", w=late.wallet.address) == [
        {"reputation": 2.5}
    ]  # neutral


def test_a_round_closed_with_no_update_is_not_a_dead_end(coord, api):
    t = manual_training(coord, api, 2, prefix="em")
    p = f"/runs/{t.run_id}"
    t.owner.post(f"{p}/phase", {"phase": "aggregating"})
    res = t.owner.post(f"{p}/aggregate", {"updates": []})  # nothing to average: the round is skipped
    assert res["skipped"] is True and res["updates"] == 0 and res["round"] == 1
    rec = [r for r in t.owner.get(f"{p}/rounds")["data"] if r["round"] == 1][0]
    assert rec["skipped"] and rec["accepted"] == 0
    run = t.owner.post(f"{p}/phase", {"phase": "training"})  # and the run goes on
    assert (run["status"], run["round"]) == ("training", 2)
    assert (
        rec["checkpoint_cid"] == run["global_model_cid"]
    )  # round 2 starts from the (unchanged) model round 1 recorded


# --- regressions from the review of manual control --------------------------------------------


def balance(client) -> int:
    return client.get(f"/wallets/{client.wallet.address}/balance")["balance_micro"]


def test_an_idle_manual_run_fails_and_its_providers_bonds_come_back(new_coordinator, api):
    coord = new_coordinator(manual_idle_seconds=1.0, heartbeat_flush_seconds=0.05)
    w = coord.client("idle-w")
    w.post("/wallets/fund", {"amount": "5"})
    w.post("/workers", {"gpu": "RTX4090", "price": "1", "max_bond": "2"})
    owner, run_id = manual_run(coord, bond="2", budget="10")
    hire(owner, run_id, w)
    assert balance(w) == 3_000_000  # the bond is locked
    deadline = time.monotonic() + 15
    while (run := owner.get(f"/runs/{run_id}"))["status"] != "failed":  # nobody moves it: the agent is gone
        assert time.monotonic() < deadline, run["status"]
        time.sleep(0.1)
    assert "idle for 1 s" in run["error"] and run["contracts"][0]["status"] == "released"
    while balance(w) != 5_000_000:  # the bond comes back without the owner
        assert time.monotonic() < deadline, balance(w)
        time.sleep(0.1)
    pay = owner.get(f"/runs/{run_id}/payments")
    assert pay["escrow_balance"] == "10" and not pay["finalized"]  # the escrow waits for its owner
    assert owner.post(f"/runs/{run_id}/refund")["escrow_balance"] == "0"


def test_a_refund_waits_until_every_round_is_settled(new_coordinator, api):
    coord = new_coordinator(settle_delay=1.5, heartbeat_flush_seconds=0.05)
    t = manual_training(coord, api, 2, prefix="rf", config={**CONFIG, "rounds": 1})
    p = f"/runs/{t.run_id}"
    cids = [submit(api, w, j, 1, small_update(t.d, 40 + i)) for i, (w, j) in enumerate(zip(t.workers, t.jobs))]
    t.owner.post(f"{p}/phase", {"phase": "aggregating"})
    t.owner.post(f"{p}/aggregate", {"updates": cids})
    t.owner.post(f"{p}/phase", {"phase": "complete"})
    with pytest.raises(ApiError) as e:  # round 1 is still being scored and settled (1.5 s per contract)
        t.owner.post(f"{p}/refund")
    api.assert_api_error(e, 409, "unsettled", "settled up to 0 of 1")
    coord.settled()
    owner_before = balance(t.owner)
    out = t.owner.post(f"{p}/refund")
    assert out["finalized"] and out["escrow_balance"] == "0" and out["settled_round"] == 1
    # The owner paid nobody, so the refund first pays each contract what its score earned.
    assert all(r["due_micro"] > 0 and r["paid_micro"] == r["due_micro"] for r in out["data"])
    assert balance(t.owner) == owner_before + 100_000_000 - sum(r["due_micro"] for r in out["data"])
    assert audit_ok(t.owner)


def audit_ok(client) -> bool:
    """The coordinator's ledger passes the offline audit (chain, signatures, conservation)."""
    info = client.get("/ledger")
    entries, after = [], 0
    while after is not None:
        page = client.get("/ledger/entries", params={"after": after})
        entries += page["data"]
        after = page["next"]
    result = audit(entries, system_key=info["system_key"], head=(info["entries"], info["head"]))
    assert result.ok, result.describe()
    return True


def manual_run_to_complete(coord, api, prefix: str) -> Manual:
    """A budget-100 manual run whose one round (two workers) is aggregated and complete."""
    t = manual_training(coord, api, 2, prefix=prefix, config={**CONFIG, "rounds": 1})
    p = f"/runs/{t.run_id}"
    spec = json.loads(t.owner.get_blob(t.owner.get(p)["manifest_cid"]))["spec"]
    cids = [submit(api, w, j, 1, api.honest_update(w, spec, MODEL_OPTIONS)) for w, j in zip(t.workers, t.jobs)]
    t.owner.post(f"{p}/phase", {"phase": "aggregating"})
    t.owner.post(f"{p}/aggregate", {"updates": cids})
    t.owner.post(f"{p}/phase", {"phase": "complete"})
    coord.settled()
    return t


def test_an_owner_cannot_refund_what_the_scores_owe_its_providers(new_coordinator, api):
    """An owner who pays part of a contract's due by hand, and more than the due of another,
    then refunds: the first is topped up to its due, the second keeps what it was given,
    and only the rest goes back to the owner."""
    coord = new_coordinator(heartbeat_flush_seconds=0.05)
    t = manual_run_to_complete(coord, api, "owe")
    p = f"/runs/{t.run_id}"
    rows = {r["contract_id"]: r for r in t.owner.get(f"{p}/payments")["data"]}
    (c0, r0), (c1, r1) = sorted(rows.items(), key=lambda kv: kv[1]["worker_id"] != t.workers[0].wallet.address)
    assert r0["due_micro"] > 2 and r1["due_micro"] > 0 and r0["paid_micro"] == r1["paid_micro"] == 0
    w0, w1 = balance(t.workers[0]), balance(t.workers[1])
    half, more = r0["due_micro"] // 2, r1["due_micro"] + 5
    t.owner.post(f"{p}/payments", {"contract_id": c0, "amount": format_price(half)})
    t.owner.post(f"{p}/payments", {"contract_id": c1, "amount": format_price(more)})
    out = {r["contract_id"]: r for r in t.owner.post(f"{p}/refund")["data"]}
    assert out[c0]["paid_micro"] == r0["due_micro"] and balance(t.workers[0]) == w0 + r0["due_micro"]
    assert out[c1]["paid_micro"] == more and balance(t.workers[1]) == w1 + more
    assert t.owner.get(f"{p}/payments")["escrow_balance"] == "0"
    assert audit_ok(t.owner)


def test_an_owner_who_never_pays_nor_refunds_still_pays_its_providers(new_coordinator, api):
    """After owner_pay_seconds the coordinator pays each contract what is owed and refunds
    the rest itself; an owner who walked away holds nobody's pay."""
    coord = new_coordinator(owner_pay_seconds=1.0, heartbeat_flush_seconds=0.05)
    t = manual_run_to_complete(coord, api, "gone")  # on a loaded machine the second may be over already
    p = f"/runs/{t.run_id}"
    deadline = time.monotonic() + 20
    while not (pay := t.owner.get(f"{p}/payments"))["finalized"]:
        assert time.monotonic() < deadline, pay
        time.sleep(0.1)
    assert pay["escrow_balance"] == "0"
    assert all(r["due_micro"] > 0 and r["paid_micro"] == r["due_micro"] for r in pay["data"])
    # the rest of the budget (100 AIT) went back to the owner's wallet, by the coordinator
    entries, after = [], 0
    while after is not None:
        page = t.owner.get("/ledger/entries", params={"after": after})
        entries, after = entries + page["data"], page["next"]
    owner = f"wallet:{t.owner.wallet.address}"
    back = [e for e in entries if e["kind"] == "refund" and (e["memo"] or {}).get("run") == t.run_id]
    assert [(e["credit"], e["amount"]) for e in back] == [
        (owner, 100_000_000 - sum(r["due_micro"] for r in pay["data"]))
    ], back
    assert audit_ok(t.owner)


def test_a_split_on_an_automatic_run_never_leaves_a_shard_without_a_worker(new_coordinator, api):
    coord = new_coordinator(heartbeat_flush_seconds=0.05)
    t = api.start_training_run(coord, 2, prefix="sp")  # target 2 workers
    w0, w1 = t.workers
    j0, j1 = t.jobs[w0.wallet.address], t.jobs[w1.wallet.address]
    helper = api.register_worker(coord, "sp-helper")
    out = t.owner.post(f"/jobs/{j1}/split", {"worker_id": helper.wallet.address})
    jh = out["new_job"]["job_id"]
    # three workers on three shards, one over the target: the round closes with all three answers
    for i, (w, j) in enumerate([(w0, j0), (w1, j1), (helper, jh)]):
        submit(api, w, j, 1, small_update(t.d, 60 + i))
    run = api.wait_status(t.owner, t.run_id, "training")
    deadline = time.monotonic() + 10
    while run["round"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
        run = t.owner.get(f"/runs/{t.run_id}")
    # no worker was released for being slowest: each would have left its shard without a worker
    active = {w["shard_index"] for w in run["workers"] if w["job_status"] == "active"}
    open_shards = {s["shard_index"] for s in shards(t.owner, t.run_id) if not s["split_into"]}
    assert (
        active == open_shards
        and len(active) == 3
        and len([w for w in run["workers"] if w["job_status"] == "active"]) == 3
    )


def test_a_second_job_on_a_shard_gets_its_own_seed(coord, api):
    t = manual_training(coord, api, 2, prefix="sd")
    extra = api.register_worker(coord, "sd-extra")
    hire(t.owner, t.run_id, extra)
    t.owner.post(f"/runs/{t.run_id}/jobs", {"worker_id": extra.wallet.address, "shard_id": t.shards[0]["shard_id"]})
    first, second = job_payload(t.workers[0]), job_payload(extra)
    assert first["shard_cid"] == second["shard_cid"] and first["seed"] != second["seed"]
    assert first["seed"] == job_payload(t.workers[1])["seed"] - 1  # the first job on each shard: the run's seed scheme
    t.owner.post(f"/runs/{t.run_id}/stop")


def test_an_update_names_the_shard_it_was_trained_on_across_a_split(coord, api):
    t = manual_training(coord, api, 2, prefix="ts")
    w0, w1 = t.workers
    helper = api.register_worker(coord, "ts-helper")
    whole = t.shards[0]
    t.owner.post(
        f"/jobs/{t.jobs[0]}/split", {"worker_id": helper.wallet.address}
    )  # while w0 trains round 1 on the whole shard
    # w0 names the shard it trained on: the whole one (held before the split), so it counts all its samples
    cid = api.put_update(w0, small_update(t.d, 70))
    w0.post(f"/jobs/{t.jobs[0]}/updates", api.update_body(1, cid, shard_cid=whole["shard_id"]))
    # w1 names a shard it never held: ignored, its own shard counts
    cid1 = api.put_update(w1, small_update(t.d, 71))
    w1.post(f"/jobs/{t.jobs[1]}/updates", api.update_body(1, cid1, shard_cid=whole["shard_id"]))
    ups = {u["job_id"]: u for j in t.jobs for u in t.owner.get(f"/jobs/{j}/updates")["data"]}
    assert ups[t.jobs[0]]["samples"] == whole["samples"]
    assert ups[t.jobs[1]]["samples"] == t.shards[1]["samples"]
    half = shards(t.owner, t.run_id)[2]
    owner_job = t.owner.get(f"/jobs/{t.jobs[0]}")
    assert owner_job["shard_cid"] == half["shard_id"] and half["samples"] == whole["samples"] // 2  # round 2: the half
    t.owner.post(f"/runs/{t.run_id}/stop")


def test_a_manual_run_survives_a_coordinator_restart(tmp_path, api, db_url):
    coord, stop = api.start_coordinator(tmp_path, db_url=db_url, heartbeat_flush_seconds=0.05)
    try:
        t = manual_training(coord, api, 2, prefix="rs", config={**CONFIG, "rounds": 2})
        cids = [submit(api, w, j, 1, small_update(t.d, 80 + i)) for i, (w, j) in enumerate(zip(t.workers, t.jobs))]
        t.owner.post(f"/runs/{t.run_id}/phase", {"phase": "aggregating"})
    finally:
        stop()  # the coordinator goes away mid-round, with the round closed but not aggregated
    coord2, stop2 = api.start_coordinator(tmp_path, db_url=db_url, heartbeat_flush_seconds=0.05)
    try:
        owner = coord2.client(wallet=t.owner.wallet)
        workers = [coord2.client(wallet=w.wallet) for w in t.workers]
        stays(owner, t.run_id, "aggregating", 1)  # the restarted driver does not move it either
        res = owner.post(f"/runs/{t.run_id}/aggregate", {"updates": cids})  # the runtime is rebuilt from the database
        assert (res["round"], res["updates"], res["skipped"]) == (1, 2, False)
        run = owner.post(f"/runs/{t.run_id}/phase", {"phase": "training"})
        assert (run["status"], run["round"], run["global_model_cid"]) == ("training", 2, res["model_id"])
        for w in workers:  # the workers' next poll: train round 2
            assert job_payload(w)["round"] == 2 and job_payload(w)["action"] == "train"
        stop_run = owner.post(f"/runs/{t.run_id}/stop")
        assert stop_run["status"] == "stopped"
    finally:
        stop2()
