"""Owner-driven runs as the SDK's documentation drives them (issue 13), through the API of a
real coordinator (uvicorn, the round driver, a real database) with signed clients acting as
the owner and as the workers.

A run made the documented way is automatic; its owner's first phase move takes it over
for good. Example 2's flow: hire in ``initializing``, phase ``distributing``, cut the shards,
one job per worker with ``{batch_size, learning_rate, epochs}``, phase ``training``, poll each
job until ``complete``, collect, phase ``aggregating``, aggregate, keep the result with its
metrics, phase ``complete``, pay each contract its ``price``. Also: the job and run views
(progress of the job's own work, loss, speed, gpu_type, target_speed), prices as numbers,
``stop`` ending a run ``stopped`` and ``pause`` refusals in the user's words. Every refusal
is the JSON error shape and changes nothing.
"""

from __future__ import annotations

import json
import math
import time
from decimal import Decimal

import pytest
import torch

from aitbc.coordinator.errors import ApiError as ServerError
from aitbc.coordinator.runs.control import take_over
from aitbc.coordinator.runs.owner import _require_pausable
from aitbc.coordinator.store.models import Run
from aitbc.ledger.chain import audit
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.checkpoint import tensors_to_bytes
from aitbc.training.data_spec import DataSpec
from aitbc.training.local import epoch_steps
from aitbc.training.models import build_model

from .conftest import honest_update, job_order

MODEL_OPTIONS = {"hidden": [8]}
RUN_BODY = {"model_type": "mlp", "model_options": MODEL_OPTIONS, "dataset_size": "1GB", "target_workers": 2}


@pytest.fixture(scope="module")
def coord(new_coordinator):
    return new_coordinator(heartbeat_flush_seconds=0.05)


# --- helpers -----------------------------------------------------------------------------


def refused(coord, api, client, path: str, body, status: int, code: str, *detail: str) -> str:
    """POST ``path`` is refused with the JSON error shape, and nothing changed."""
    coord.settled()
    before = coord.snapshot()
    with coord.http() as h:
        r = api.signed_post(h, client.wallet, "/v1" + path, body)
    text = api.assert_error(r, status, code, *detail)
    assert coord.snapshot() == before
    return text


def ledger_ok(coord) -> None:
    """The whole ledger audits (what ``aitbc ledger verify`` checks over the API)."""
    with coord.http() as h:
        info = h.get("/v1/ledger").json()
        entries = h.get("/v1/ledger/entries", params={"limit": 10_000}).json()["data"]
        cached = h.get("/v1/ledger/balances").json()["data"]
    result = audit(entries, system_key=info["system_key"], cached=cached, head=(info["entries"], info["head"]))
    assert result.ok, result.describe()


def automatic_run(coord, owner, **body) -> str:
    """A run made the documented way: model_type, dataset_size, target_workers (automatic)."""
    owner.post("/wallets/fund", {"amount": "1000"})
    run = owner.post("/runs", {**RUN_BODY, **body})
    assert run["control"] == "automatic" and run["status"] == "initializing", run
    return run["training_id"]


def state_dict_blob(manifest: dict, params: torch.Tensor | None = None) -> bytes:
    """The run's model as a plain state dict in safetensors (what the SDK's
    ``upload_to_ipfs(data=model)`` stores)."""
    spec = manifest["spec"]
    model = build_model(
        "mlp", DataSpec(spec["task"], tuple(spec["input_shape"]), int(spec["num_classes"])), MODEL_OPTIONS
    )
    return tensors_to_bytes(dict(model.state_dict()))


# --- example 2's flow ------------------------------------------------------------------------


def test_example_two_on_a_run_made_the_documented_way(coord, api):
    """The documented coordinator example, step by step, against the API (the SDK's calls
    are each one of these requests): it trains, completes and pays."""
    workers = [api.register_worker(coord, f"ex2-{i}", gpu="RTX4090", price="1.5") for i in range(2)]
    owner = coord.client("ex2-owner")
    run_id = automatic_run(coord, owner)
    p = f"/runs/{run_id}"
    first = api.upload_digits(owner, run_id, 2)  # upload_to_ipfs(path=...) made it the run's dataset

    # initializing: discover (prices are decimal strings of AIT) and negotiate a contract with each
    offers = {o["worker_id"]: o for o in owner.get("/market/offers")["data"]}
    contracts = {}
    for w in workers:
        o = offers[w.wallet.address]
        assert (o["price"], o["price_micro"]) == ("1.5", 1_500_000)
        assert 1 / (Decimal(o["price"]) + 1) == Decimal("0.4")  # the example's price score, exact
        c = owner.post(f"{p}/contracts", {"worker_id": w.wallet.address, "price": o["price"]})
        assert (c["price"], c["price_micro"], c["status"]) == ("1.5", 1_500_000, "hired")
        contracts[w.wallet.address] = c

    # update_training_phase('distributing'): the owner takes the run over
    run = owner.post(f"{p}/phase", {"phase": "distributing", "config": {"rounds": 3, "max_cost": "9"}})
    assert (run["status"], run["control"], run["manual_from_round"]) == ("distributing", "manual", 1)
    assert (run["shards"], run["manifest_cid"]) == (2, first)

    # create_data_shards(num_shards=len(workers)): the data is cut again, in distributing
    recut = api.upload_digits(owner, run_id, 2, seed=1)
    assert owner.get(p)["manifest_cid"] == recut != first
    shards = owner.get(f"{p}/shards")["data"]
    assert len(shards) == 2

    # send_training_job(worker_id, training_id, shard_id, config={batch_size, learning_rate, epochs})
    jobs = {}
    for w, sh in zip(workers, shards):
        body = {
            "worker_id": w.wallet.address,
            "shard_id": sh["shard_id"],
            "config": {"batch_size": 32, "learning_rate": 0.001, "epochs": 2},
        }
        job = owner.post(f"{p}/jobs", body)
        assert job["config"] == {"batch_size": 32, "lr": 0.001, "epochs": 2}
        assert job["gpu_type"] == "RTX4090" and job["loss"] is None  # nothing trained yet
        jobs[w.wallet.address] = job["job_id"]
    # the data cannot change any more
    refused(coord, api, owner, f"{p}/data", {"manifest_cid": run["manifest_cid"]}, 409, "jobs_sent")

    run = owner.post(f"{p}/phase", {"phase": "training"})
    assert (run["status"], run["round"]) == ("training", 1)
    for w, sh in zip(workers, shards):
        order = job_order(w)
        steps = epoch_steps(2, sh["samples"], 32)
        assert steps == 2 * (sh["samples"] // 32)
        assert (order["epochs"], order["local_steps"], order["batch_size"], order["lr"]) == (2, steps, 32, 0.001)
        view = owner.get(f"/jobs/{jobs[w.wallet.address]}")
        # training has started: a loss (the model it starts from), the job's own progress 0
        assert math.isfinite(view["loss"]) and view["loss"] == run["initial_val_loss"]
        assert (view["progress"], view["status"], view["epoch"], view["speed"]) == (0.0, "assigned", 0.0, 0.0)

    # the workers report progress (each report names its round and step) and send updates
    d = run["config"]["d"]
    cids = {}
    for i, (w, sh) in enumerate(zip(workers, shards)):
        job = jobs[w.wallet.address]
        steps = epoch_steps(2, sh["samples"], 32)
        w.post(f"/jobs/{job}/progress", {"progress": 0.0, "epoch": 0.0, "status": "training", "round": 1, "step": 0})
        time.sleep(0.05)
        half = steps // 2
        w.post(
            f"/jobs/{job}/progress",
            {
                "progress": 100.0 * half / steps,
                "loss": 2.0,
                "epoch": 1.0,
                "status": "training",
                "round": 1,
                "step": half,
            },
        )
        view = owner.get(f"/jobs/{job}")
        assert view["progress"] == pytest.approx(50.0, abs=5) and view["status"] == "training"
        assert view["loss"] == 2.0 and view["epoch"] == 1.0
        assert 0 < view["speed"] < half * 32 / 0.05 * 1.01  # samples/s, measured on the coordinator's clock
        cid = api.put_update(w, torch.randn(d, generator=torch.Generator().manual_seed(i)) * 1e-3)
        w.post(f"/jobs/{job}/updates", api.update_body(1, cid))
        cids[w.wallet.address] = cid
        view = owner.get(f"/jobs/{job}")
        assert (view["progress"], view["status"], view["this_round"]) == (100.0, "complete", "accepted")

    # the run's progress view: numbers, target derived from the plan (no deadline)
    run = owner.get(p)
    assert run["speed"] == 0.0  # no round closed yet
    measured = [j for j in run["workers"] if j["speed"] > 0]
    assert len(measured) == 2
    slowest = max(
        epoch_steps(2, sh["samples"], 32) * 32 / j["speed"]
        for j, sh in zip(sorted(measured, key=lambda j: j["shard_index"]), shards)
    )
    assert run["target_speed"] == pytest.approx(1 / slowest)

    # collect_checkpoint: each job's update, with checkpoint_id and worker_id
    latest = owner.get(f"{p}/updates", params={"latest": "true"})["data"]
    assert {(u["worker_id"], u["checkpoint_id"]) for u in latest} == set(cids.items())

    owner.post(f"{p}/phase", {"phase": "aggregating"})
    closes = coord.ctx.metrics.registry.get_sample_value("aitbc_round_close_seconds_count")
    agg = owner.post(f"{p}/aggregate", {"updates": list(cids.values()), "weights": [0.5, 0.5]})
    assert agg["round"] == 1 and math.isfinite(agg["loss"])
    # the owner's aggregation is a round close too (aitbc_round_close_seconds)
    assert coord.ctx.metrics.registry.get_sample_value("aitbc_round_close_seconds_count") == closes + 1

    # upload_to_ipfs(data=aggregated_model['model']) + save_training_results(model_cid, metrics)
    manifest = owner.get(f"{p}")["manifest_cid"]
    model_blob = state_dict_blob(json.loads(owner.get_blob(manifest)))
    model_cid = cid_of_bytes(model_blob)
    refused(coord, api, owner, f"{p}/result", {"model_cid": model_cid}, 422, "unknown_model", "upload it first")
    owner.put_blob(model_cid, model_blob)
    metrics = {"final_loss": agg["loss"], "workers": 2, "epochs": 2}
    saved = owner.post(f"{p}/result", {"model_cid": model_cid, "metrics": metrics})
    assert (saved["model_cid"], saved["metrics"], saved["round"]) == (model_cid, metrics, None)

    run = owner.post(f"{p}/phase", {"phase": "complete"})
    assert run["status"] == "complete"
    results = owner.get(f"{p}/results")
    assert (results["model_cid"], results["metrics"]) == (model_cid, metrics)

    # process_payment(worker_id, contract_id, amount=contract['price']): the decimal string it came as
    for w in workers:
        c = contracts[w.wallet.address]
        paid = owner.post(f"{p}/payments", {"contract_id": c["contract_id"], "amount": c["price"]})
        assert paid["amount_micro"] == 1_500_000
    rows = {r["worker_id"]: r for r in owner.get(f"{p}/payments")["data"]}
    assert all((r["price"], r["price_micro"]) == ("1.5", 1_500_000) for r in rows.values())
    assert all(r["paid_micro"] >= 1_500_000 for r in rows.values())
    ledger_ok(coord)


# --- taking over -------------------------------------------------------------------------------


def test_taking_over_a_training_run_keeps_the_driver_s_rounds_paid(new_coordinator, api):
    """An automatic run taken over mid-training: the rounds the driver closed were paid by
    it; from the owner's first round on, the owner closes, aggregates and pays."""
    coord = new_coordinator(heartbeat_flush_seconds=0.05)
    t = api.start_training_run(coord, 2, rounds=4)
    p = f"/runs/{t.run_id}"
    spec = json.loads(t.owner.get_blob(t.owner.get(p)["manifest_cid"]))["spec"]
    for w in t.workers:  # round 1: the driver closes it
        cid = api.put_update(w, honest_update(w, spec, MODEL_OPTIONS))
        w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", api.update_body(1, cid))
    api.wait_status(t.owner, t.run_id, "training")
    deadline = time.monotonic() + 20
    while t.owner.get(p)["round"] != 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    coord.settled()
    # a move the run cannot make takes nothing over
    refused(coord, api, t.owner, f"{p}/phase", {"phase": "complete"}, 409, "bad_state", "complete the run")
    assert t.owner.get(p)["control"] == "automatic"
    run = t.owner.post(f"{p}/phase", {"phase": "aggregating"})  # the owner closes round 2 itself, with nothing in
    assert (run["status"], run["control"], run["manual_from_round"], run["round"]) == ("aggregating", "manual", 2, 2)
    time.sleep(0.4)  # 8 driver ticks: it leaves the run where its owner put it
    assert (t.owner.get(p)["status"], t.owner.get(p)["round"]) == ("aggregating", 2)
    refused(
        coord,
        api,
        t.workers[0],
        f"/jobs/{t.jobs[t.workers[0].wallet.address]}/updates",
        api.update_body(2, cid),
        409,
        "round_closed",
    )
    t.owner.post(f"{p}/aggregate", {"updates": []})  # nothing sent for round 2: recorded as skipped
    t.owner.post(f"{p}/phase", {"phase": "training"})  # the owner opens round 3, its workers train it
    cids = []
    for w in t.workers:
        cids.append(api.put_update(w, honest_update(w, spec, MODEL_OPTIONS)))
        w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", api.update_body(3, cids[-1]))
    t.owner.post(f"{p}/phase", {"phase": "aggregating"})
    t.owner.post(f"{p}/aggregate", {"updates": cids})
    t.owner.post(f"{p}/phase", {"phase": "complete"})
    coord.settled()
    pays = coord.rows("SELECT round, paid, due FROM settlements WHERE run_id = :r ORDER BY round", r=t.run_id)
    assert {r["round"] for r in pays} == {1, 2, 3}
    assert all(r["paid"] == r["due"] > 0 for r in pays if r["round"] == 1)  # the driver's round: paid by it
    assert any(r["due"] > 0 for r in pays if r["round"] == 3)
    assert all(r["paid"] == 0 for r in pays if r["round"] > 1)  # the owner's rounds: the owner pays
    ledger_ok(coord)


def test_the_driver_s_steps_refuse_a_take_over():
    """While the coordinator writes the initial model or aggregates a round, the owner
    cannot take the run over (409 driver_busy, the run unchanged); a manual run is not
    taken over twice."""
    for status, words in [("distributing", "writing its initial model"), ("aggregating", "aggregating round 3")]:
        run = Run(id="training_x", status=status, control="automatic", round=3)
        with pytest.raises(ServerError) as e:
            take_over(run, now=1.0)
        assert (e.value.status, e.value.code) == (409, "driver_busy") and words in e.value.detail
        assert (run.control, run.manual_since, run.manual_from_round) == ("automatic", None, None)
    run = Run(id="training_x", status="stopped", control="automatic", round=3)
    with pytest.raises(ServerError) as e:
        take_over(run, now=1.0)
    assert e.value.code == "run_ended"
    run = Run(id="training_x", status="training", control="manual", round=3, manual_since=None)
    take_over(run, now=1.0)
    assert (run.control, run.manual_since) == ("manual", None)  # made manual: nothing recorded


# --- job configs -------------------------------------------------------------------------------


def test_job_config_changes_take_the_documented_keys(coord, api):
    w = api.register_worker(coord, "cfg-w")
    owner = coord.client("cfg-owner")
    run_id = automatic_run(coord, owner, budget="50")
    api.upload_digits(owner, run_id, 2)
    owner.post(f"/runs/{run_id}/contracts", {"worker_id": w.wallet.address, "price": 1})
    owner.post(f"/runs/{run_id}/phase", {"phase": "distributing", "config": {"local_steps": 3}})
    shard = owner.get(f"/runs/{run_id}/shards")["data"][0]
    job = owner.post(f"/runs/{run_id}/jobs", {"worker_id": w.wallet.address, "shard_id": shard["shard_id"]})
    assert job_order(w) is None or job_order(w)["local_steps"] == 3
    jid = job["job_id"]
    changed = owner.post(f"/jobs/{jid}/config", {"epochs": 3, "learning_rate": 0.01})
    assert changed["config"] == {"epochs": 3, "lr": 0.01}
    changed = owner.post(f"/jobs/{jid}/config", {"local_steps": 7})  # the steps given win over epochs
    assert changed["config"] == {"local_steps": 7, "lr": 0.01}
    for bad, code, words in [
        ({"epochs": 0}, "invalid_request", "epochs must be in [1, 1000], got 0"),
        ({"learning_rate": 2}, "invalid_request", "learning_rate must be in [1e-08, 1], got 2"),
        ({"learning_rate": 0.1, "lr": 0.1}, "invalid_request", "not both"),
        ({"epochs": 1000, "batch_size": 1}, "bad_config", "at most 100000"),
        ({}, "bad_config", "epochs"),
    ]:
        refused(coord, api, owner, f"/jobs/{jid}/config", bad, 422, code, words)


# --- stop and pause ---------------------------------------------------------------------------


def test_an_owner_s_stop_ends_the_run_stopped_and_settles_it(new_coordinator, api):
    coord = new_coordinator(heartbeat_flush_seconds=0.05)
    w = coord.client("stop-w")
    w.post("/wallets/fund", {"amount": "5"})
    w.post("/workers", {"gpu": "RTX4090", "price": "1", "max_bond": "2"})
    owner = coord.client("stop-owner")
    run_id = automatic_run(coord, owner, budget="10", bond="2")
    owner.post(f"/runs/{run_id}/contracts", {"worker_id": w.wallet.address, "price": 1})
    balance = lambda c: c.get(f"/wallets/{c.wallet.address}/balance")["balance_micro"]
    assert (balance(w), balance(owner)) == (3_000_000, 990_000_000)
    run = owner.post(f"/runs/{run_id}/stop")
    assert (run["status"], owner.get(f"/runs/{run_id}")["error"]) == ("stopped", "stopped by the owner")
    deadline = time.monotonic() + 15
    while (balance(w), balance(owner)) != (5_000_000, 1_000_000_000):  # bond back, escrow refunded
        assert time.monotonic() < deadline, (balance(w), balance(owner))
        time.sleep(0.05)
    assert owner.get("/runs", params={"status": "stopped"})["count"] >= 1
    refused(coord, api, owner, f"/runs/{run_id}/stop", {}, 409, "run_ended", "already ended (stopped)")
    refused(coord, api, owner, f"/runs/{run_id}/pause", {}, 409, "run_ended", "nothing to pause")
    refused(coord, api, owner, f"/runs/{run_id}/phase", {"phase": "distributing"}, 409, "run_ended")
    ledger_ok(coord)


def test_pause_refusals_say_what_to_do(coord, api):
    """Already paused, or a round being aggregated: one line saying what the user can do."""
    w = api.register_worker(coord, "pause-w")
    owner = coord.client("pause-owner")
    run_id = automatic_run(coord, owner, budget="50")
    api.upload_digits(owner, run_id, 2)
    owner.post(f"/runs/{run_id}/contracts", {"worker_id": w.wallet.address, "price": 1})
    owner.post(f"/runs/{run_id}/phase", {"phase": "distributing", "config": {"local_steps": 1}})
    shard = owner.get(f"/runs/{run_id}/shards")["data"][0]["shard_id"]
    job = owner.post(f"/runs/{run_id}/jobs", {"worker_id": w.wallet.address, "shard_id": shard})["job_id"]
    detail = refused(coord, api, owner, f"/runs/{run_id}/pause", {}, 409, "distributing", "phase training")
    assert "\n" not in detail
    owner.post(f"/runs/{run_id}/phase", {"phase": "training"})
    w.post(
        f"/jobs/{job}/updates",
        api.update_body(1, api.put_update(w, torch.zeros(owner.get(f"/runs/{run_id}")["config"]["d"]))),
    )
    owner.post(f"/runs/{run_id}/phase", {"phase": "aggregating"})
    detail = refused(coord, api, owner, f"/runs/{run_id}/pause", {}, 409, "round_aggregating")
    assert detail == (
        f"run {run_id} is aggregating round 1; pause it once you have aggregated it and opened the next round "
        f"(phase training)"
    )
    for wording in ("can become", "not paused"):
        assert wording not in detail


@pytest.mark.parametrize(
    ("status", "control", "code", "detail"),
    [
        (
            "paused",
            "automatic",
            "already_paused",
            "run training_x is already paused; resume it with "
            "`aitbc distributed-training resume --training-id training_x`",
        ),
        (
            "aggregating",
            "automatic",
            "round_aggregating",
            "run training_x is aggregating round 3; pause it once the round is committed (a few seconds)",
        ),
        (
            "distributing",
            "automatic",
            "distributing",
            "run training_x is writing its initial model; pause it once round 1 is open (a few seconds)",
        ),
        ("complete", "automatic", "run_ended", "run training_x has ended (complete); there is nothing to pause"),
    ],
)
def test_pause_refusal_words(status, control, code, detail):
    run = Run(id="training_x", status=status, control=control, round=3)
    with pytest.raises(ServerError) as e:
        _require_pausable(run)
    assert (e.value.status, e.value.code, e.value.detail) == (409, code, detail)


# --- a provider's progress reports ----------------------------------------------------------------


def test_progress_reports_a_worker_cannot_bend(new_coordinator, api):
    """A report for a round not yet open, a step past the bound, or for another worker's job
    is refused and changes nothing; a late report of a closed round measures no speed."""
    coord = new_coordinator(heartbeat_flush_seconds=0.05)
    t = api.start_training_run(coord, 2, rounds=3)
    (w, job), other = t.take(), t.workers[-1]
    base = {"progress": 10.0, "epoch": 0.1, "status": "training"}
    refused(coord, api, w, f"/jobs/{job}/progress", {**base, "round": 2, "step": 1}, 409, "wrong_round", "open round")
    refused(
        coord, api, w, f"/jobs/{job}/progress", {**base, "round": 1, "step": 100_001}, 422, "invalid_request", "step"
    )
    refused(coord, api, w, f"/jobs/{job}/progress", {**base, "round": 0}, 422, "invalid_request", "round")
    refused(coord, api, other, f"/jobs/{job}/progress", {**base, "round": 1, "step": 1}, 403, "forbidden")
    w.post(f"/jobs/{job}/progress", {**base, "round": 1, "step": 0})
    time.sleep(0.05)
    w.post(f"/jobs/{job}/progress", {**base, "progress": 100.0, "round": 1, "step": 1})
    speed = t.owner.get(f"/jobs/{job}")["speed"]
    assert speed > 0
    w.post(f"/jobs/{job}/progress", {**base, "round": 1, "step": 0})  # a step back: no new measurement
    assert t.owner.get(f"/jobs/{job}")["speed"] == speed


def test_result_metrics_are_bounded(coord, api):
    """An owner's metrics are data the API keeps: flat, finite, bounded; anything else is a
    422 that changes nothing."""
    owner = coord.client("metrics-owner")
    run_id = automatic_run(coord, owner)
    cid = cid_of_bytes(b"model")
    for metrics, words in [
        ({f"k{i}": i for i in range(65)}, "metrics"),
        ({"nested": {"a": 1}}, "metrics.nested"),
        ({"list": [1, 2]}, "metrics.list"),
        ({"long": "x" * 501}, "metrics.long"),
        ({"": 1}, "metrics"),
        ({"k" * 65: 1}, "metrics"),
        ({"loss": float("nan")}, "finite"),
    ]:
        refused(
            coord,
            api,
            owner,
            f"/runs/{run_id}/result",
            {"model_cid": cid, "metrics": metrics},
            422,
            "invalid_request",
            words,
        )
    refused(coord, api, owner, f"/runs/{run_id}/result", {"model_cid": "not-a-cid"}, 409, "automatic_control")


def test_an_owner_driven_run_escrows_every_hired_contract(coord, api):
    """The owner may put every hired worker on a shard (after cutting the data again), so
    its run escrows price x rounds for each of them, not one per shard of the first cut."""
    workers = [api.register_worker(coord, f"esc-{i}") for i in range(3)]
    owner = coord.client("esc-owner")
    run_id = automatic_run(coord, owner)
    api.upload_digits(owner, run_id, 2)
    for w in workers:
        owner.post(f"/runs/{run_id}/contracts", {"worker_id": w.wallet.address, "price": 1})
    refused(
        coord,
        api,
        owner,
        f"/runs/{run_id}/phase",
        {"phase": "distributing", "config": {"rounds": 2, "max_cost": "5"}},
        409,
        "over_max_cost",
        "cost 6 AIT",
    )
    run = owner.post(f"/runs/{run_id}/phase", {"phase": "distributing", "config": {"rounds": 2, "max_cost": "6"}})
    assert (run["escrowed"], run["shards"], len(run["contracts"])) == ("6", 2, 3)
    ledger_ok(coord)
