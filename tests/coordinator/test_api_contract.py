"""The API's contract as its OpenAPI document states it: every route declares what it
returns and every error it sends, in our one error shape, and a reply has exactly its
view's keys. The schemathesis suite in tests/api checks live replies against the document;
test_internal_error.py checks that a 500 says nothing of the internals."""

from __future__ import annotations

import json
from typing import Any

import httpx
import torch
from pydantic import BaseModel

from aitbc.coordinator.runs import views
from aitbc.coordinator.store import repository


def test_the_document_declares_our_error_shape_and_every_output(server, api) -> None:
    doc = httpx.get(server.url + "/openapi.json", timeout=10).json()
    assert "HTTPValidationError" not in str(doc), "FastAPI's 422 shape is not what the app sends"
    assert set(doc["components"]["schemas"]["ErrorBody"]["properties"]) == {"error", "detail"}
    ops = [(m.upper() + " " + path, op) for path, item in doc["paths"].items() for m, op in item.items()]
    assert len(ops) >= 45
    for label, op in ops:
        responses = op["responses"]
        ok = [s for s in responses if s.startswith("2")]
        # one success status, or two where a repeat answers otherwise (a pin made again: 200, not 201)
        assert len(ok) == 1 or (label == "POST /v1/blobs/{cid}/pin" and ok == ["200", "201"]), (label, ok)
        for status in ok:
            content = responses[status]["content"]
            if label.endswith("/v1/blobs/{cid}") and not label.startswith("PUT"):
                assert list(content) == ["application/octet-stream"], label
            else:
                assert content["application/json"]["schema"].get("$ref"), (label, "declares no response model")
        for status, spec in responses.items():
            if status.startswith(("4", "5")):
                schema = spec["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (label, status)
        if "requestBody" in op and "application/json" in op["requestBody"]["content"]:
            assert {"400", "422"} <= set(responses), (label, "a JSON body can be malformed or invalid")
    signed = {label for label, op in ops if "401" in op["responses"]}
    assert "POST /v1/runs" in signed and "PUT /v1/blobs/{cid}" in signed and "POST /v1/workers/heartbeat" in signed
    assert not {label for label in signed if label.startswith("GET") and "/job" not in label}, signed


def test_signed_routes_answer_the_declared_401(server, api) -> None:
    doc = httpx.get(server.url + "/openapi.json", timeout=10).json()
    with server.http() as http:
        r = http.post("/v1/runs/training_000000000000/stop", content=b"")
        assert "401" in doc["paths"]["/v1/runs/{run_id}/stop"]["post"]["responses"]
        api.assert_error(r, 401, "missing_signature")


def test_numbers_the_database_or_json_cannot_hold_are_refused(new_coordinator, api) -> None:
    """Found by the schemathesis suite (``after`` past a 64-bit integer was a 500; past a
    32-bit one on PostgreSQL, whose INTEGER sequence column is 32 bits) and by
    reading the bodies: an infinite epoch or compute time would be stored, and every view
    of the job would then show it as null where the document promises a number."""
    t = api.start_training_run(new_coordinator(), 2)
    (w, job), coord = t.take(), t.coord
    with coord.http() as h:
        api.assert_error(h.get("/v1/ledger/entries", params={"after": 2**31}), 422, "invalid_request", "after")
        assert h.get("/v1/ledger/entries", params={"after": 2**31 - 1}).json()["count"] == 0
        before = coord.snapshot()
        raw = json.dumps({"progress": 5.0, "epoch": float("inf"), "status": "training"}).encode()
        api.assert_error(api.signed_post(h, w.wallet, f"/v1/jobs/{job}/progress", raw=raw), 422, "invalid_request")
        assert coord.snapshot() == before
        cid = api.put_update(w, torch.zeros(t.d))
        before = coord.snapshot()
        for seconds in (float("inf"), 1e308):
            raw = json.dumps(api.update_body(1, cid, compute_seconds=seconds)).encode()
            r = api.signed_post(h, w.wallet, f"/v1/jobs/{job}/updates", raw=raw)
            api.assert_error(r, 422, "invalid_request", "compute_seconds")
        assert coord.snapshot() == before
        assert h.get(f"/v1/jobs/{job}").json()["epoch"] == 0.0


def _shape(x: Any) -> Any:
    """The keys of every object, in order (a list by its first item): the JSON's shape. A
    view's reply model counts as the JSON it is sent as."""
    if isinstance(x, BaseModel):
        x = x.model_dump(mode="json", by_alias=True)
    if isinstance(x, dict):
        return [(k, _shape(v)) for k, v in x.items()]
    if isinstance(x, list):
        return [_shape(x[0])] if x else []
    return None


def test_replies_keep_the_views_keys_in_order(new_coordinator, api) -> None:
    """Each reply has exactly its view's keys, in the view's order: the route sends the
    view's model as it is (clients read the JSON)."""
    t = api.start_training_run(new_coordinator(), 2)
    (w, job), coord = t.take(), t.coord
    w.post(f"/jobs/{job}/updates", api.update_body(1, api.put_update(w, torch.zeros(t.d))))
    with coord.ctx.session() as s, coord.http() as h:
        run = repository.get_run(s, t.run_id)
        expected = {
            f"/v1/runs/{t.run_id}": views.run_detail(coord.ctx, s, run),
            f"/v1/runs/{t.run_id}/results": views.results(coord.ctx, s, run),
            f"/v1/runs/{t.run_id}/payments": views.payments_view(coord.ctx, s, run),
            f"/v1/runs/{t.run_id}/rounds": {"data": views.rounds_view(s, run), "count": 1},
            f"/v1/runs/{t.run_id}/shards": {"data": views.shards_view(s, run), "count": 2},
            f"/v1/jobs/{job}": views.job_detail(coord.ctx, s, job),
            f"/v1/jobs/{job}/updates": {"data": views.updates_of(s, job), "count": 1},
            f"/v1/workers/{w.wallet.address}/jobs": {"data": views.jobs_of(coord.ctx, s, w.wallet.address), "count": 1},
            "/v1/market/offers?all=true": {"data": views.market(coord.ctx, s, live_only=False), "count": 2},
            "/v1/runs": {"data": [views.run_summary(run)], "count": 1},
        }
        for path, view in expected.items():
            assert _shape(h.get(path).json()) == _shape(view), path
