"""Bad input, answered with the JSON error shape and the right status: malformed JSON,
wrong types, unknown ids, conflicts, ended runs, too few workers, bad sizes and prices,
and bad updates (refused with no write, or recorded as rejected and the worker flagged)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch
from sqlalchemy import text

from aitbc.coordinator.errors import ApiError as CoordinatorApiError
from aitbc.coordinator.rounds.submission import _round_gate
from aitbc.coordinator.store.models import Job, Run
from aitbc.core.compression import build_codec
from aitbc.ledger.wallet import Wallet
from aitbc.storage.cid import cid_of_bytes

RUN_BODY = {"model_type": "mlp", "dataset_size": "1GB", "target_workers": 1}
N_TRAINING = 14  # workers of the shared training run: one per update test (12), spare, and a silent one


@pytest.fixture(scope="module")
def training(new_coordinator, api):
    return api.start_training_run(new_coordinator(), N_TRAINING)


@pytest.fixture(scope="module")
def ended(new_coordinator, api):
    """A run that was training (round 1 open, jobs assigned), then stopped by its owner."""
    t = api.start_training_run(new_coordinator(), 2)
    assert t.owner.post(f"/runs/{t.run_id}/stop")["status"] == "stopped"
    return t


def flags_of(coord, worker_id: str) -> list[dict]:
    return coord.rows("SELECT kind, reason, run_id, round FROM flags WHERE worker_id = :w ORDER BY id", w=worker_id)


def offer_flags(coord, worker_id: str) -> int:
    return coord.rows("SELECT flags FROM offers WHERE id = :w", w=worker_id)[0]["flags"]


def updates_of(coord, job_id: str) -> list[dict]:
    return coord.rows(
        "SELECT round, cid, status, reason, train_loss FROM updates WHERE job_id = :j ORDER BY id", j=job_id
    )


# --- malformed bodies ------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b'{"model_type": "mlp",', b"{'model_type': 'mlp'}", b"\xff\xfe", b"{]"])
@pytest.mark.parametrize("path", ["/v1/runs", "/v1/workers"])
def test_malformed_json(server, api, raw, path):
    before = server.snapshot()
    with server.http() as h:
        r = api.signed_post(h, Wallet.generate("a"), path, raw=raw)
    api.assert_error(r, 400, "malformed_json", "not valid JSON")
    assert server.snapshot() == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**RUN_BODY, "target_workers": "three"}, "target_workers"),
        ({**RUN_BODY, "target_workers": "3"}, "target_workers"),  # strict: a number is sent as a number
        ({**RUN_BODY, "target_workers": 2.5}, "target_workers"),
        ({**RUN_BODY, "target_workers": True}, "target_workers"),
        ({**RUN_BODY, "target_workers": None}, "target_workers"),
        ({**RUN_BODY, "target_workers": 0}, "target_workers"),
        ({**RUN_BODY, "target_workers": 10**9}, "target_workers"),
        ({**RUN_BODY, "model_type": 5}, "model_type"),
        ({**RUN_BODY, "model_options": [1, 2]}, "model_options"),
        ({**RUN_BODY, "dataset_size": 100}, "dataset_size"),
        ({**RUN_BODY, "dataset_size": ""}, "dataset_size"),
        ({**RUN_BODY, "seed": -1}, "seed"),
        ({**RUN_BODY, "colour": "red"}, "colour"),  # unknown fields are refused, not ignored
        ({"dataset_size": "1GB", "target_workers": 1}, "model_type"),  # missing
        ([RUN_BODY], "body"),
        ("mlp", "body"),
    ],
)
def test_wrong_field_types_and_unknown_fields(server, api, body, field):
    before = server.snapshot()
    with server.http() as h:
        r = api.signed_post(h, Wallet.generate("a"), "/v1/runs", body)
    api.assert_error(r, 422, "invalid_request", field)
    assert server.snapshot() == before


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"gpu": "RTX4090", "price": True}, "invalid_request"),  # not 1 AIT
        ({"gpu": "RTX4090", "price": [1]}, "invalid_request"),
        ({"gpu": "RTX4090", "price": None}, "invalid_request"),
        ({"gpu": "RTX4090"}, "invalid_request"),
        ({"gpu": "RTX4090", "price": "1", "availability": "high"}, "invalid_request"),
        ({"gpu": "RTX4090", "price": "1", "availability": 1.5}, "invalid_request"),
        ({"gpu": "RTX4090", "price": "1", "availability": True}, "invalid_request"),
        ({"gpu": "", "price": "1"}, "invalid_request"),
        ({"gpu": "RTX4090", "price": "1", "device": "cuda"}, "invalid_request"),
        ({"gpu": "RTX4090", "price": "1", "wallet": "x"}, "invalid_request"),
        ({"gpu": "\x00\x01", "price": "1"}, "bad_offer"),
        ({"gpu": "RTX4090", "price": "-1"}, "bad_price"),
        ({"gpu": "RTX4090", "price": -0.5}, "bad_price"),
        ({"gpu": "RTX4090", "price": "1.0000001"}, "bad_price"),
        ({"gpu": "RTX4090", "price": 0.1 + 0.2}, "bad_price"),
        ({"gpu": "RTX4090", "price": "abc"}, "bad_price"),
        ({"gpu": "RTX4090", "price": "NaN"}, "bad_price"),
        ({"gpu": "RTX4090", "price": "1e7"}, "bad_price"),
        ({"gpu": "RTX4090", "price": ""}, "bad_price"),
    ],
)
def test_bad_worker_registration(server, api, body, code):
    w = server.client("reg")
    before = server.snapshot()
    with pytest.raises(api.ApiError) as e:
        w.post("/workers", body)
    api.assert_api_error(e, 422, code)
    assert server.snapshot() == before
    assert not server.ctx.liveness.knows(w.wallet.address)


def test_prices_are_exact_integers(server, api):
    for price, micro, shown in [
        ("1.20", 1_200_000, "1.2"),
        (0.3, 300_000, "0.3"),
        (2, 2_000_000, "2"),
        ("0.000001", 1, "0.000001"),
        ("0", 0, "0"),
    ]:
        w = server.client("p")
        offer = w.post("/workers", {"gpu": "RTX3090", "price": price})
        assert (offer["price_micro"], offer["price"]) == (micro, shown)
        assert server.rows("SELECT price FROM offers WHERE id = :w", w=w.wallet.address) == [{"price": micro}]


@pytest.mark.parametrize("size", ["lots", "0GB", "0", "-1GB", "1e3GB", "1XB", "99999999999PB"])
def test_bad_dataset_size(server, api, size):
    owner = server.client("o")
    before = server.snapshot()
    with pytest.raises(api.ApiError) as e:
        owner.post("/runs", {**RUN_BODY, "dataset_size": size})
    api.assert_api_error(e, 422, "bad_size", repr(size))
    assert server.snapshot() == before


def test_bad_model(server, api):
    owner = server.client("o")
    before = server.snapshot()
    for body in (
        {**RUN_BODY, "model_type": "resnet9000"},
        {**RUN_BODY, "model_options": {"hidden": "x"}},
        {**RUN_BODY, "model_options": {"depth": 3}},
    ):
        with pytest.raises(api.ApiError) as e:
            owner.post("/runs", body)
        api.assert_api_error(e, 422, "bad_model")
    assert server.snapshot() == before


# --- unknown things ----------------------------------------------------------------------


def test_unknown_run(server, api):
    c = server.client("o")
    before = server.snapshot()
    for path in ("/runs/training_nope", "/runs/training_nope/rounds", "/runs/training_nope/results"):
        with pytest.raises(api.ApiError) as e:
            c.get(path)
        api.assert_api_error(e, 404, "unknown_run", "training_nope")
    for action, body in [
        ("stop", {}),
        ("pause", {}),
        ("resume", {}),
        ("discover", {"required_workers": 1}),
        ("distribute", {}),
        ("data", {"manifest_cid": cid_of_bytes(b"m")}),
    ]:
        with pytest.raises(api.ApiError) as e:
            c.post(f"/runs/training_nope/{action}", body)
        api.assert_api_error(e, 404, "unknown_run")
    assert server.snapshot() == before


def test_unknown_job_worker_and_route(server, api):
    w = api.register_worker(server, "known")
    stranger = server.client("stranger")
    cid = cid_of_bytes(b"u")
    before = server.snapshot()
    with pytest.raises(api.ApiError) as e:
        w.post("/jobs/job_nope/progress", {"progress": 1.0, "status": "training"})
    api.assert_api_error(e, 404, "unknown_job", "job_nope")
    with pytest.raises(api.ApiError) as e:
        w.post("/jobs/job_nope/updates", api.update_body(1, cid))
    api.assert_api_error(e, 404, "unknown_job")
    with pytest.raises(api.ApiError) as e:
        stranger.post("/workers/heartbeat")
    api.assert_api_error(e, 404, "unknown_worker", "POST /v1/workers")
    with pytest.raises(api.ApiError) as e:
        stranger.get(f"/workers/{stranger.wallet.address}/job", sign=True)
    api.assert_api_error(e, 404, "unknown_worker")
    assert w.get(f"/workers/{w.wallet.address}/job", sign=True)["job"] is None  # known, no job yet
    with server.http() as h:
        api.assert_error(h.get("/v1/nothing/here"), 404, "not_found")
        api.assert_error(h.get("/v1/workers"), 405, "method_not_allowed")
        api.assert_error(h.get("/v1/runs", params={"status": "sleeping"}), 422, "bad_status", "initializing")
        for wait in ("-1", "61", "soon"):
            path = f"/v1/workers/{w.wallet.address}/job?wait={wait}"
            r = h.get(path, headers=api.sign_request(w.wallet, "GET", path, b""))
            api.assert_error(r, 422, "invalid_request", "wait")
    assert server.snapshot() == before


# --- registration ------------------------------------------------------------------------


def test_duplicate_registration_while_alive(server, api):
    w = api.register_worker(server, "dup", price="1.5")
    before = server.snapshot()
    with pytest.raises(api.ApiError) as e:
        w.post("/workers", {"gpu": "RTX3090", "price": "2"})
    api.assert_api_error(e, 409, "duplicate_registration", w.wallet.address, "lease")
    assert server.snapshot() == before
    assert server.rows("SELECT gpu, price FROM offers WHERE id = :w", w=w.wallet.address) == [
        {"gpu": "RTX4090", "price": 1_500_000}
    ]


def test_registering_again_after_the_lease(server, api):
    w = api.register_worker(server, "back")
    # the first process stopped heartbeating a lease ago (set, not waited for), in the database
    # and in memory: the driver takes the later of the two (replicas share heartbeats there),
    # so once the registration's beat has been flushed (nothing newer is pending after it)
    time.sleep(server.ctx.settings.heartbeat_flush_seconds + 0.5)
    long_ago = time.time() - api.LEASE - 1
    with server.ctx.engine.begin() as conn:
        conn.execute(
            text("UPDATE offers SET last_heartbeat = :t WHERE id = :w"), {"t": long_ago, "w": w.wallet.address}
        )
    server.ctx.liveness.touch(w.wallet.address, long_ago)
    offer = w.post("/workers", {"gpu": "RTX3090", "price": "2"})
    assert (offer["gpu_type"], offer["price_micro"], offer["live"]) == ("RTX3090", 2_000_000, True)
    assert server.rows("SELECT gpu, price, status FROM offers WHERE id = :w", w=w.wallet.address) == [
        {"gpu": "RTX3090", "price": 2_000_000, "status": "online"}
    ]


# --- hiring ------------------------------------------------------------------------------


def test_discover_with_too_few_offers(fresh_server, api):
    coord = fresh_server
    api.register_worker(coord, "a", gpu="RTX4090", price="1")
    api.register_worker(coord, "b", gpu="RTX4090", price="3")
    api.register_worker(coord, "c", gpu="RTX3060", price="1")
    owner = coord.client("o")
    run_id = api.create_run(owner, target_workers=3)
    before = coord.snapshot()
    cases = [
        ({"required_workers": 4}, "found 3 free live offers (of 3 free, 0 busy); 4 required"),
        ({"required_workers": 3, "min_gpu": "RTX3090"}, "found 2 free live offers with GPU at least RTX3090"),
        (
            {"required_workers": 2, "min_gpu": "rtx 3090", "max_price": "2.5"},
            "found 1 free live offer with GPU at least RTX3090 at most 2.5 AIT/round (of 3 free, 0 busy); 2 required",
        ),
    ]
    for body, detail in cases:
        with pytest.raises(api.ApiError) as e:
            owner.post(f"/runs/{run_id}/discover", body)
        api.assert_api_error(e, 409, "not_enough_workers", detail, "no contracts made")
    assert coord.snapshot() == before
    assert coord.rows("SELECT * FROM contracts") == []
    # hired workers are busy for the next run
    hired = owner.post(f"/runs/{run_id}/discover", {"required_workers": 2, "min_gpu": "RTX3090"})
    assert hired["count"] == 2
    o2 = coord.client("o2")
    other = api.create_run(o2)
    with pytest.raises(api.ApiError) as e:
        o2.post(f"/runs/{other}/discover", {"required_workers": 2})
    api.assert_api_error(e, 409, "not_enough_workers", "found 1 free live offer (of 1 free, 2 busy); 2 required")


@pytest.mark.parametrize(
    ("body", "code", "detail"),
    [
        ({"required_workers": 1, "min_gpu": "GTX9999"}, "bad_gpu", "unknown GPU class 'GTX9999'"),
        ({"required_workers": 1, "min_gpu": "quantum"}, "bad_gpu", "RTX3090"),
        ({"required_workers": 1, "max_price": "abc"}, "bad_price", "max price 'abc'"),
        ({"required_workers": 1, "max_price": "-1"}, "bad_price", "max price"),
        ({"required_workers": 1, "max_price": True}, "invalid_request", "max_price"),
        ({"required_workers": 0}, "invalid_request", "required_workers"),
        ({"required_workers": "2"}, "invalid_request", "required_workers"),
    ],
)
def test_bad_discover(server, api, body, code, detail):
    api.register_worker(server, "spare")
    owner = server.client("o")
    run_id = api.create_run(owner)
    before = server.snapshot()
    with pytest.raises(api.ApiError) as e:
        owner.post(f"/runs/{run_id}/discover", body)
    api.assert_api_error(e, 422, code, detail)
    assert server.snapshot() == before


def test_distribute_refusals(new_coordinator, api):
    coord = new_coordinator()
    owner = coord.client("o")
    no_data = api.create_run(owner, target_workers=2)
    with pytest.raises(api.ApiError) as e:
        owner.post(f"/runs/{no_data}/distribute", {})
    api.assert_api_error(e, 409, "no_data", "upload-data")
    run_id = api.create_run(owner, target_workers=2)
    api.upload_digits(owner, run_id, 2)
    with pytest.raises(api.ApiError) as e:
        owner.post(f"/runs/{run_id}/distribute", {})
    api.assert_api_error(e, 409, "no_workers", "discover-workers")
    api.register_worker(coord, "a")
    api.register_worker(coord, "b")
    owner.post(f"/runs/{run_id}/discover", {"required_workers": 2})
    before = coord.snapshot()
    for body, code in [
        ({"aggregator": "bogus"}, "bad_config"),
        ({"compression": "zip"}, "bad_config"),
        ({"compression": "sparseloco:error_feedback_decay=1"}, "bad_config"),
        ({"compression": "sparseloco:error_feedback_decay=0.95", "outer": "diloco"}, "bad_config"),
        ({"outer": "sgd9"}, "bad_config"),
        ({"inner_opt": "lion9"}, "bad_config"),
        ({"min_workers": 3, "max_workers": 2}, "bad_config"),
        ({"aggregator": "krum:f=5"}, "bad_config"),
        ({"rounds": 0}, "invalid_request"),
        ({"strategy": "model-parallel"}, "invalid_request"),
        ({"mode": "flood"}, "invalid_request"),  # sync, async and gossip are the modes
        ({"mode": "gossip", "topology": ""}, "invalid_request"),
        ({"lr": 0}, "invalid_request"),
        ({"deadline": -1}, "invalid_request"),
        ({"error_feedback": "yes"}, "invalid_request"),
        ({"precision": "fp16"}, "invalid_request"),
        ({"precision": None}, "invalid_request"),
        ({"precision": "bf16", "verify_rate": 0.1}, "bad_config"),  # bf16 steps do not replay within tolerance
    ]:
        with pytest.raises(api.ApiError) as e:
            owner.post(f"/runs/{run_id}/distribute", body)
        api.assert_api_error(e, 422, code)
    assert coord.snapshot() == before
    assert coord.rows("SELECT status FROM runs WHERE id = :r", r=run_id) == [{"status": "initializing"}]


# --- ended runs ------------------------------------------------------------------------


def test_requests_after_the_run_ended(api, ended):
    coord, owner, run_id = ended.coord, ended.owner, ended.run_id
    manifest = coord.rows("SELECT manifest_cid FROM runs WHERE id = :r", r=run_id)[0]["manifest_cid"]
    api.register_worker(coord, "late")
    before = coord.snapshot()
    for action, body in [
        ("distribute", {}),
        ("discover", {"required_workers": 1}),
        ("data", {"manifest_cid": manifest}),
        ("stop", {}),
        ("pause", {}),
        ("resume", {}),
    ]:
        with pytest.raises(api.ApiError) as e:
            owner.post(f"/runs/{run_id}/{action}", body)
        api.assert_api_error(e, 409, "run_ended", run_id, "stopped")
    w = ended.workers[0]
    job = ended.jobs[w.wallet.address]
    cid = api.put_update(w, torch.zeros(ended.d))
    before = coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{job}/updates", api.update_body(1, cid))
    api.assert_api_error(e, 409, "run_ended", job)
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{job}/progress", {"progress": 10.0, "status": "training"})
    api.assert_api_error(e, 409, "run_ended")
    assert coord.snapshot() == before
    assert w.get(f"/workers/{w.wallet.address}/job", sign=True)["job"] is None
    run = owner.get(f"/runs/{run_id}")
    assert (run["status"], run["error"]) == ("stopped", "stopped by the owner")
    assert {j["job_status"] for j in run["workers"]} == {"released"}
    assert {c["status"] for c in run["contracts"]} == {"released"}


# --- updates -----------------------------------------------------------------------------


def test_update_for_a_future_round_is_refused_and_flagged(api, training):
    coord = training.coord
    w, job = training.take()
    cid = api.put_update(w, torch.zeros(training.d))
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{job}/updates", api.update_body(2, cid))
    api.assert_api_error(e, 409, "wrong_round", "round 2", "open round is 1")
    assert updates_of(coord, job) == []
    assert flags_of(coord, w.wallet.address) == [
        {
            "kind": "wrong_round",
            "reason": "update is for round 2; the open round is 1",
            "run_id": training.run_id,
            "round": 1,
        }
    ]
    assert offer_flags(coord, w.wallet.address) == 1
    # the worker may still send its real update for the open round
    assert w.post(f"/jobs/{job}/updates", api.update_body(1, cid))["status"] == "accepted"


def test_duplicate_update(api, training):
    coord = training.coord
    w, job = training.take()
    cid = api.put_update(w, torch.full((training.d,), 0.01))
    assert w.post(f"/jobs/{job}/updates", api.update_body(1, cid)) == {
        "status": "accepted",
        "round": 1,
        "cid": cid,
        "size": len(api.update_blob(torch.full((training.d,), 0.01))),
        "verification": None,  # the run does not verify work
        "challenge": None,
    }
    other = api.put_update(w, torch.full((training.d,), 0.02))
    before = coord.snapshot()
    for c in (cid, other):
        with pytest.raises(api.ApiError) as e:
            w.post(f"/jobs/{job}/updates", api.update_body(1, c))
        api.assert_api_error(e, 409, "duplicate_update", job)
    assert coord.snapshot() == before
    assert [u["status"] for u in updates_of(coord, job)] == ["accepted"]
    assert flags_of(coord, w.wallet.address) == []
    view = w.get(f"/workers/{w.wallet.address}/job", sign=True)["job"]
    assert (view["round"], view["action"]) == (1, "wait")  # answered: nothing to train


def test_update_blob_not_uploaded(api, training):
    coord = training.coord
    w, job = training.take()
    before = coord.snapshot()
    missing = cid_of_bytes(api.update_blob(torch.ones(training.d)))
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{job}/updates", api.update_body(1, missing))
    api.assert_api_error(e, 422, "missing_blob", missing, "PUT /v1/blobs/")
    for bad in ("not-a-cid", "Qmd286K6pohQcTKYqnS1YhWrCiS4gz7Xi34sdwMe9USZ7u"):
        with pytest.raises(api.ApiError) as e:
            w.post(f"/jobs/{job}/updates", api.update_body(1, bad))
        api.assert_api_error(e, 422, "bad_cid")
    assert coord.snapshot() == before


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda d: torch.zeros(d).index_fill_(0, torch.tensor([d // 2]), float("nan")), "NaN or Inf"),
        (lambda d: torch.zeros(d).index_fill_(0, torch.tensor([0]), float("inf")), "NaN or Inf"),
        (lambda d: torch.zeros(d - 1), "has shape"),
        (lambda d: torch.zeros(2, d // 2), "has shape"),
        (lambda d: torch.zeros(d + 1), "malformed update blob"),
        (lambda d: b"these bytes are not an update at all", "malformed update blob"),
        (lambda d: b"ATBC\x01" + (10**6).to_bytes(4, "little") + b"{}", "malformed update blob"),
        (lambda d: build_codec("none", {}).encode(torch.zeros(d))[:-8], "malformed update blob"),  # truncated
    ],
)
def test_bad_update_is_recorded_as_rejected_and_flagged(api, training, make, reason):
    coord = training.coord
    w, job = training.take()
    t = make(training.d)
    blob = t if isinstance(t, bytes) else api.update_blob(t)
    cid = api.put_update(w, blob)
    bytes_up = coord.rows("SELECT bytes_up FROM runs WHERE id = :r", r=training.run_id)[0]["bytes_up"]
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{job}/updates", api.update_body(1, cid))
    api.assert_api_error(e, 422, "update_rejected", "round 1 rejected", reason)
    [u] = updates_of(coord, job)
    assert (u["round"], u["cid"], u["status"], u["train_loss"]) == (1, cid, "rejected", None)
    assert reason in u["reason"]
    [f] = flags_of(coord, w.wallet.address)
    assert (f["kind"], f["run_id"], f["round"], f["reason"]) == ("rejected_update", training.run_id, 1, u["reason"])
    assert offer_flags(coord, w.wallet.address) == 1
    assert coord.rows("SELECT bytes_up FROM runs WHERE id = :r", r=training.run_id)[0]["bytes_up"] == bytes_up + len(
        blob
    )
    with pytest.raises(api.ApiError) as e:  # rejected is still answered: no second try this round
        w.post(f"/jobs/{job}/updates", api.update_body(1, api.put_update(w, torch.zeros(training.d))))
    api.assert_api_error(e, 409, "duplicate_update")
    # Nor for the next round, were round 1 to close before the settlement that slashes and ejects
    # the job (that window's state, held in this session only, never committed).
    with coord.ctx.session() as s:
        job_row, run_row = s.get(Job, job), s.get(Run, training.run_id)
        run_row.round = 2
        with pytest.raises(CoordinatorApiError) as gate:
            _round_gate(s, job_row, run_row, SimpleNamespace(round=2))  # type: ignore[arg-type]
    assert (gate.value.status, gate.value.code) == (409, "ejection_pending") and reason in gate.value.detail


def test_non_finite_training_loss_rejects_the_update(api, training):
    coord = training.coord
    w, job = training.take()
    cid = api.put_update(w, torch.zeros(training.d))
    raw = json.dumps(api.update_body(1, cid, train_loss=float("nan"))).encode()  # JSON's NaN extension
    with coord.http() as h:
        r = api.signed_post(h, w.wallet, f"/v1/jobs/{job}/updates", raw=raw)
    # Non-finite numbers are refused at parse time in every body (issue 12): nothing recorded.
    api.assert_error(r, 422, "invalid_request", "NaN and Infinity")
    assert updates_of(coord, job) == []
    assert flags_of(coord, w.wallet.address) == []


@pytest.mark.parametrize(
    "body",
    [
        {"round": 0, "cid": "x", "steps": 1},
        {"round": 1, "cid": "x", "steps": 0},
        {"round": "1", "cid": "x", "steps": 1},
        {"round": 1, "cid": "x", "steps": 1, "compute_seconds": -1},
        {"round": 1, "cid": "", "steps": 1},
        {"round": 1, "cid": "x", "steps": 1, "weights": [1]},
        {"round": 1, "steps": 1},
    ],
)
def test_update_body_shape(api, training, body):
    w = training.workers[-1]  # the silent worker: a 422 at the schema writes nothing
    before = training.coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{training.jobs[w.wallet.address]}/updates", body)
    api.assert_api_error(e, 422, "invalid_request")
    assert training.coord.snapshot() == before


def test_progress(api, training):
    coord = training.coord
    w = training.workers[-1]
    job = training.jobs[w.wallet.address]
    before = coord.snapshot()
    for body in (
        {"progress": 101.0, "status": "training"},
        {"progress": -1, "status": "training"},
        {"progress": 5.0, "status": ""},
        {"progress": 5.0, "status": "x" * 33},
        {"progress": "5", "status": "training"},
        {"progress": 5.0, "status": "training", "eta": 3},
    ):
        with pytest.raises(api.ApiError) as e:
            w.post(f"/jobs/{job}/progress", body)
        api.assert_api_error(e, 422, "invalid_request")
    with coord.http() as h:
        raw = json.dumps({"progress": 5.0, "loss": float("inf"), "status": "training"}).encode()
        r = api.signed_post(h, w.wallet, f"/v1/jobs/{job}/progress", raw=raw)
    api.assert_error(r, 422, "invalid_request", "loss: must be a finite number")
    assert coord.snapshot() == before
    assert w.post(f"/jobs/{job}/progress", {"progress": 42.5, "loss": 1.25, "epoch": 0.5, "status": "training"}) == {
        "ok": True
    }
    assert coord.rows("SELECT progress, loss, epoch, worker_status FROM jobs WHERE id = :j", j=job) == [
        {"progress": 42.5, "loss": 1.25, "epoch": 0.5, "worker_status": "training"}
    ]


def test_late_update_for_a_closed_round_is_not_flagged(new_coordinator, api):
    """A straggler's update for a round that closed at its deadline: 409 (it lost its place
    at the close, issue 33), no flag for it."""
    # a deadline the fast worker meets on a loaded machine: missing it loses the place (issue 33)
    t = api.start_training_run(new_coordinator(), 2, deadline=10.0, quorum=1)
    (fast, slow) = t.workers
    cid = api.put_update(fast, torch.zeros(t.d))
    fast.post(f"/jobs/{t.jobs[fast.wallet.address]}/updates", api.update_body(1, cid))
    deadline = time.monotonic() + 180

    def idle() -> bool:  # round 1 closed, evaluated, scored and paid: the driver is idle
        run = t.owner.get(f"/runs/{t.run_id}")
        paid = t.owner.get(f"/runs/{t.run_id}/payments")["settled_round"] >= 1
        return run["round"] == 2 and (run["val_round"] or 0) >= 1 and paid

    while not idle():  # the evaluation may land after the settlement: both are waited for
        assert time.monotonic() < deadline
        time.sleep(0.02)
    late = api.put_update(slow, torch.zeros(t.d).add_(0.5))
    before = t.coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        slow.post(f"/jobs/{t.jobs[slow.wallet.address]}/updates", api.update_body(1, late))
    api.assert_api_error(e, 409, "job_not_active", "no update for round 1 within its deadline", "lost its place")
    assert t.coord.snapshot() == before
    assert [f["kind"] for f in flags_of(t.coord, slow.wallet.address)] == ["straggler"]  # from the close only


def test_paused_run_takes_no_updates(new_coordinator, api):
    t = api.start_training_run(new_coordinator(), 2)
    w = t.workers[0]
    job = t.jobs[w.wallet.address]
    cid = api.put_update(w, torch.zeros(t.d))
    with pytest.raises(api.ApiError) as e:
        t.owner.post(f"/runs/{t.run_id}/resume")
    api.assert_api_error(e, 409, "bad_state", "not paused")
    assert t.owner.post(f"/runs/{t.run_id}/pause")["status"] == "paused"
    before = t.coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        t.owner.post(f"/runs/{t.run_id}/pause")
    api.assert_api_error(
        e, 409, "already_paused", f"resume it with `aitbc distributed-training resume --training-id {t.run_id}`"
    )
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{job}/updates", api.update_body(1, cid))
    api.assert_api_error(e, 409, "not_accepting", "paused")
    for action, body in [("discover", {"required_workers": 1}), ("distribute", {})]:
        with pytest.raises(api.ApiError) as e:
            t.owner.post(f"/runs/{t.run_id}/{action}", body)
        api.assert_api_error(e, 409, "bad_state", "paused")
    assert t.coord.snapshot() == before
    assert w.get(f"/workers/{w.wallet.address}/job", sign=True)["job"]["action"] == "wait"
    run = t.owner.post(f"/runs/{t.run_id}/resume")
    assert (run["status"], run["round"]) == ("training", 1)
    assert w.get(f"/workers/{w.wallet.address}/job", sign=True)["job"]["action"] == "train"
    assert w.post(f"/jobs/{job}/updates", api.update_body(1, cid))["status"] == "accepted"
