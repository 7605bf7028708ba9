"""Who may do what: 401 for requests whose signature is missing, wrong, stale or replayed;
403 for a signed request by someone who does not own what it touches. Each refusal is the
JSON error shape and leaves the database and the blob store as they were."""

from __future__ import annotations

import json
import time

import pytest
import torch

from aitbc.ledger.signing import sign_request
from aitbc.ledger.wallet import Wallet
from aitbc.storage.cid import cid_of_bytes

RUN_BODY = {"model_type": "mlp", "dataset_size": "1GB", "target_workers": 1}


@pytest.fixture(scope="module")
def training(new_coordinator, api):
    return api.start_training_run(new_coordinator(), 3)


@pytest.fixture(scope="module")
def owned_run(server, api):
    """An initializing run with its data uploaded, owned by ``owner``."""
    owner = server.client("auth-owner")
    run_id = api.create_run(owner, target_workers=2)
    manifest = api.upload_digits(owner, run_id, 2)
    return owner, run_id, manifest


# --- 401 -------------------------------------------------------------------------------


def post_raw(http, path, body: bytes, headers):
    return http.post(path, content=body, headers={"content-type": "application/json", **headers})


def test_missing_signature(server, api):
    w = Wallet.generate("a")
    body = json.dumps(RUN_BODY).encode()
    full = sign_request(w, "POST", "/v1/runs", body)
    before = server.snapshot()
    with server.http() as h:
        r = post_raw(h, "/v1/runs", body, {})
        api.assert_error(r, 401, "missing_signature", "X-Aitbc-Key")
        for name in full:  # each header alone is required
            partial = {k: v for k, v in full.items() if k != name}
            r = post_raw(h, "/v1/runs", body, partial)
            api.assert_error(r, 401, "missing_signature", name)
        r = h.post("/v1/workers/heartbeat", content=b"{}")
        api.assert_error(r, 401, "missing_signature")
        r = h.put(f"/v1/blobs/{cid_of_bytes(b'x')}", content=b"x")
        api.assert_error(r, 401, "missing_signature")
    assert server.snapshot() == before


def test_tampered_body(server, api):
    w = Wallet.generate("a")
    signed = json.dumps(RUN_BODY).encode()
    sent = json.dumps({**RUN_BODY, "target_workers": 2}).encode()
    before = server.snapshot()
    with server.http() as h:
        r = post_raw(h, "/v1/runs", sent, sign_request(w, "POST", "/v1/runs", signed))
        api.assert_error(r, 401, "bad_signature", "does not match")
    assert server.snapshot() == before


def test_tampered_path(server, api, owned_run):
    owner, run_id, _ = owned_run
    before = server.snapshot()
    with server.http() as h:
        # signed for pause, sent to stop
        headers = sign_request(owner.wallet, "POST", f"/v1/runs/{run_id}/pause", b"{}")
        r = post_raw(h, f"/v1/runs/{run_id}/stop", b"{}", headers)
        api.assert_error(r, 401, "bad_signature")
        # signed for one run, sent to another's path
        headers = sign_request(owner.wallet, "POST", "/v1/runs/training_000000000000/stop", b"{}")
        r = post_raw(h, f"/v1/runs/{run_id}/stop", b"{}", headers)
        api.assert_error(r, 401, "bad_signature")
        # signed as POST, sent as PUT to a blob
        data = b"some bytes"
        path = f"/v1/blobs/{cid_of_bytes(data)}"
        r = h.put(path, content=data, headers=sign_request(owner.wallet, "POST", path, unsigned_payload=True))
        api.assert_error(r, 401, "bad_signature")
    assert server.snapshot() == before
    assert server.rows("SELECT status FROM runs WHERE id = :id", id=run_id) == [{"status": "initializing"}]


def test_tampered_query(api, training):
    w = training.workers[0]
    addr = w.wallet.address
    with training.coord.http() as h:
        headers = sign_request(w.wallet, "GET", f"/v1/workers/{addr}/job?wait=0", b"")
        r = h.get(f"/v1/workers/{addr}/job?wait=5", headers=headers)
        api.assert_error(r, 401, "bad_signature")
        r = h.get(f"/v1/workers/{addr}/job?wait=0", headers=headers)  # as signed: fine
        assert r.status_code == 200 and r.json()["job"]["job_id"] == training.jobs[addr]


def test_wrong_key_for_the_signature(server, api):
    signer, claimed = Wallet.generate("a"), Wallet.generate("b")
    body = json.dumps(RUN_BODY).encode()
    headers = sign_request(signer, "POST", "/v1/runs", body)
    headers["X-Aitbc-Key"] = claimed.public_key
    before = server.snapshot()
    with server.http() as h:
        api.assert_error(post_raw(h, "/v1/runs", body, headers), 401, "bad_signature")
        # a signature that is not even 64 bytes, and a key that is not a key
        bad = dict(sign_request(signer, "POST", "/v1/runs", body), **{"X-Aitbc-Signature": "ab" * 10})
        api.assert_error(post_raw(h, "/v1/runs", body, bad), 401, "bad_signature", "X-Aitbc-Signature")
        bad = dict(sign_request(signer, "POST", "/v1/runs", body), **{"X-Aitbc-Key": "zz" * 32})
        api.assert_error(post_raw(h, "/v1/runs", body, bad), 401, "bad_signature", "X-Aitbc-Key")
        bad = dict(sign_request(signer, "POST", "/v1/runs", body), **{"X-Aitbc-Nonce": "not-hex"})
        api.assert_error(post_raw(h, "/v1/runs", body, bad), 401, "bad_signature", "X-Aitbc-Nonce")
        bad = dict(sign_request(signer, "POST", "/v1/runs", body), **{"X-Aitbc-Timestamp": "1e9"})
        api.assert_error(post_raw(h, "/v1/runs", body, bad), 401, "bad_signature", "X-Aitbc-Timestamp")
    assert server.snapshot() == before


@pytest.mark.parametrize("offset", [-1000.0, 1000.0])
def test_expired_timestamp(server, api, offset):
    w = Wallet.generate("a")
    body = json.dumps(RUN_BODY).encode()
    headers = sign_request(w, "POST", "/v1/runs", body, now=time.time() + offset)
    before = server.snapshot()
    with server.http() as h:
        api.assert_error(post_raw(h, "/v1/runs", body, headers), 401, "expired_signature", "clock skew")
    assert server.snapshot() == before


def test_replayed_nonce(server, api):
    w = Wallet.generate("a")
    body = json.dumps(RUN_BODY).encode()
    headers = sign_request(w, "POST", "/v1/runs", body)
    with server.http() as h:
        first = post_raw(h, "/v1/runs", body, headers)
        assert first.status_code == 201, first.text
        before = server.snapshot()
        api.assert_error(post_raw(h, "/v1/runs", body, headers), 401, "replayed_nonce", headers["X-Aitbc-Nonce"])
        # the same nonce under a fresh signature (new timestamp) is a replay too
        again = sign_request(w, "POST", "/v1/runs", body, nonce=headers["X-Aitbc-Nonce"])
        api.assert_error(post_raw(h, "/v1/runs", body, again), 401, "replayed_nonce")
    assert server.snapshot() == before
    assert len(server.rows("SELECT id FROM runs WHERE owner = :o", o=w.address)) == 1


def test_signature_from_before_the_coordinator_started(fresh_server, api):
    w = Wallet.generate("a")
    body = json.dumps(RUN_BODY).encode()
    headers = sign_request(w, "POST", "/v1/runs", body, now=fresh_server.ctx.started_at - 1.0)
    before = fresh_server.snapshot()
    with fresh_server.http() as h:
        api.assert_error(post_raw(h, "/v1/runs", body, headers), 401, "expired_signature", "before the server started")
    assert fresh_server.snapshot() == before == {**before, "runs": []}


def test_signature_checked_before_the_body(server, api):
    """An unsigned request with a bad body is refused for its signature, not its fields."""
    with server.http() as h:
        r = post_raw(h, "/v1/runs", json.dumps({"target_workers": "many"}).encode(), {})
        api.assert_error(r, 401, "missing_signature")


# --- 403 -------------------------------------------------------------------------------


def test_worker_reports_for_another_workers_job(api, training):
    server = training.coord
    intruder, victim = training.workers[0], training.workers[-1]
    victim_job = training.jobs[victim.wallet.address]
    cid = api.put_update(intruder, api.update_blob(torch.zeros(training.d)))
    before = server.snapshot()
    with server.http() as h:
        r = api.signed_post(
            h,
            intruder.wallet,
            f"/v1/jobs/{victim_job}/progress",
            {"progress": 50.0, "loss": 1.0, "epoch": 0.5, "status": "training"},
        )
        api.assert_error(r, 403, "forbidden", victim.wallet.address, intruder.wallet.address)
        r = api.signed_post(h, intruder.wallet, f"/v1/jobs/{victim_job}/updates", api.update_body(1, cid))
        api.assert_error(r, 403, "forbidden", victim.wallet.address)
        # someone who is not a worker at all
        r = api.signed_post(h, Wallet.generate("x"), f"/v1/jobs/{victim_job}/updates", api.update_body(1, cid))
        api.assert_error(r, 403, "forbidden")
    assert server.snapshot() == before


def test_worker_reads_another_workers_job(api, training):
    server = training.coord
    me, other = training.workers[0], training.workers[1]
    before = server.snapshot()
    with server.http() as h:
        path = f"/v1/workers/{other.wallet.address}/job"
        r = h.get(path, headers=sign_request(me.wallet, "GET", path, b""))
        api.assert_error(r, 403, "forbidden", other.wallet.address)
        path += "?wait=60"  # refused at once, not after a long poll
        t0 = time.monotonic()
        r = h.get(path, headers=sign_request(me.wallet, "GET", path, b""))
        api.assert_error(r, 403, "forbidden")
        assert time.monotonic() - t0 < 30
        r = h.get(f"/v1/workers/{other.wallet.address}/job")  # unsigned
        api.assert_error(r, 401, "missing_signature")
    assert server.snapshot() == before


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("data", "manifest"),
        ("discover", {"required_workers": 1}),
        ("distribute", {"rounds": 1}),
        ("stop", {}),
        ("pause", {}),
        ("resume", {}),
    ],
)
def test_non_owner_may_not_control_a_run(server, api, owned_run, action, body):
    owner, run_id, manifest = owned_run
    if body == "manifest":
        body = {"manifest_cid": manifest}
    register = server.client("auth-bystander")
    register.post("/workers", {"gpu": "RTX4090", "price": "1"})  # even a registered worker
    stranger = server.client("auth-stranger")
    before = server.snapshot()
    for who in (stranger, register):
        with pytest.raises(api.ApiError) as e:
            who.post(f"/runs/{run_id}/{action}", body)
        api.assert_api_error(e, 403, "forbidden", owner.wallet.address, who.wallet.address)
    assert server.snapshot() == before
    assert server.rows("SELECT status FROM runs WHERE id = :id", id=run_id) == [{"status": "initializing"}]
