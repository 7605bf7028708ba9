"""An update sent with its blob inside the message (``UpdateSubmit.blob``, base64): one
request instead of ``PUT /v1/blobs/{cid}`` then ``POST /v1/jobs/{id}/updates``. The blob is
checked as a PUT checks it (base64, size, hash: a mismatch flags the sender), stored
durably before the update naming it commits, and nothing is written for a refused request."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import torch

from aitbc.storage.cid import cid_of_bytes

N_TRAINING = 8  # one worker per test below, and the silent last one that keeps round 1 open


@pytest.fixture(scope="module")
def training(new_coordinator, api):
    return api.start_training_run(new_coordinator(max_json_bytes=200_000), N_TRAINING)


def inline_body(api: Any, blob: bytes, round: int = 1, **kw: Any) -> dict:
    return api.update_body(round, cid_of_bytes(blob), blob=base64.b64encode(blob).decode(), **kw)


def updates_of(coord: Any, job_id: str) -> list[dict]:
    return coord.rows("SELECT round, cid, status, size FROM updates WHERE job_id = :j ORDER BY id", j=job_id)


def flags_of(coord: Any, worker_id: str) -> list[tuple[str, str]]:
    return [
        (f["kind"], f["reason"])
        for f in coord.rows("SELECT kind, reason FROM flags WHERE worker_id = :w ORDER BY id", w=worker_id)
    ]


def test_inline_update_is_stored_and_accepted(api, training):
    coord = training.coord
    w, job = training.take()
    blob = api.update_blob(torch.full((training.d,), 0.01))
    cid = cid_of_bytes(blob)
    assert not coord.ctx.store.has(cid)
    reply = w.post(f"/jobs/{job}/updates", inline_body(api, blob))
    assert (reply["status"], reply["round"], reply["cid"], reply["size"]) == ("accepted", 1, cid, len(blob))
    assert coord.ctx.store.get_bytes(cid) == blob  # stored under its CID, re-hashed on read
    assert updates_of(coord, job) == [{"round": 1, "cid": cid, "status": "accepted", "size": len(blob)}]
    # the reply was lost and the worker sends it again: a duplicate, nothing more written
    before = coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{job}/updates", inline_body(api, blob))
    api.assert_api_error(e, 409, "duplicate_update", job)
    assert coord.snapshot() == before


def test_inline_blob_already_held(api, training):
    """A blob uploaded before (a retry after a PUT whose reply was lost) is taken as held."""
    coord = training.coord
    w, job = training.take()
    blob = api.update_blob(torch.full((training.d,), 0.02))
    api.put_update(w, blob)
    assert w.post(f"/jobs/{job}/updates", inline_body(api, blob))["status"] == "accepted"
    assert coord.ctx.store.get_bytes(cid_of_bytes(blob)) == blob


def test_inline_blob_not_matching_its_cid(api, training):
    coord = training.coord
    w, job = training.take()
    blob = api.update_blob(torch.full((training.d,), 0.03))
    other = api.update_blob(torch.full((training.d,), 0.04))
    body = api.update_body(1, cid_of_bytes(blob), blob=base64.b64encode(other).decode())
    before = coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{job}/updates", body)
    api.assert_api_error(e, 400, "cid_mismatch", cid_of_bytes(blob), "nothing stored")
    after = coord.snapshot()
    assert after["blobs"] == before["blobs"] and after["updates"] == before["updates"]
    assert not coord.ctx.store.has(cid_of_bytes(blob)) and not coord.ctx.store.has(cid_of_bytes(other))
    detail = f"uploaded bytes do not hash to {cid_of_bytes(blob)}; nothing stored"
    assert flags_of(coord, w.wallet.address) == [("bad_blob", detail)]
    # the job is still open: the right bytes are then accepted
    assert w.post(f"/jobs/{job}/updates", inline_body(api, blob))["status"] == "accepted"


@pytest.mark.parametrize(
    ("blob", "status", "code", "words"),
    [
        ("not base64 at all!", 422, "bad_blob", "not base64"),
        ("QUJ", 422, "bad_blob", "not base64"),  # unpadded
        ("", 422, "invalid_request", "blob"),
        (12345, 422, "invalid_request", "blob"),
    ],
)
def test_bad_inline_blob_changes_nothing(api, training, blob, status, code, words):
    coord = training.coord
    w, job = training.workers[-1], training.jobs[training.workers[-1].wallet.address]  # never sends a good one
    cid = cid_of_bytes(b"ABC")
    before = coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{job}/updates", api.update_body(1, cid, blob=blob))
    api.assert_api_error(e, status, code, words)
    assert coord.snapshot() == before


def test_inline_blob_over_the_json_limit(api, training):
    """A blob whose base64 passes the coordinator's JSON limit is refused before it is read
    (413 body_too_large, what the worker takes as "upload it first")."""
    coord = training.coord
    w, job = training.take()
    blob = bytes(range(256)) * 625  # 160 kB: over 200 kB as base64
    assert len(base64.b64encode(blob)) > 200_000
    before = coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{job}/updates", inline_body(api, blob))
    api.assert_api_error(e, 413, "body_too_large")
    assert coord.snapshot() == before


def test_inline_update_for_a_closed_round_stores_nothing(api, training):
    """A refusal that says nothing about the blob (wrong round) writes no blob either."""
    coord = training.coord
    w, job = training.take()
    blob = api.update_blob(torch.full((training.d,), 0.05))
    before = coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{job}/updates", inline_body(api, blob, round=2))
    api.assert_api_error(e, 409, "wrong_round")  # flagged, as a PUT + POST would be
    after = coord.snapshot()
    assert after["blobs"] == before["blobs"] and after["updates"] == before["updates"]
    assert not coord.ctx.store.has(cid_of_bytes(blob))


def test_bad_inline_update_is_stored_and_rejected(api, training):
    """An update that decodes to NaN is recorded as rejected (the sender flagged), its blob
    stored as a PUT would have stored it: the record names a blob that is there."""
    coord = training.coord
    w, job = training.take()
    blob = api.update_blob(torch.zeros(training.d).index_fill_(0, torch.tensor([0]), float("nan")))
    with pytest.raises(api.ApiError) as e:
        w.post(f"/jobs/{job}/updates", inline_body(api, blob))
    api.assert_api_error(e, 422, "update_rejected", "NaN or Inf")
    [u] = updates_of(coord, job)
    assert (u["status"], u["cid"]) == ("rejected", cid_of_bytes(blob))
    assert coord.ctx.store.get_bytes(cid_of_bytes(blob)) == blob
    assert [k for k, _ in flags_of(coord, w.wallet.address)] == ["rejected_update"]
