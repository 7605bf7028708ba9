"""The coordinator's ``/metrics``: Prometheus text that prometheus-client's own parser reads,
every family present (zeros) on an empty database, labels from fixed sets only (a rejected
update's free-text reason mapped to a code, in Python and in SQL alike), the process's own
counters (heartbeats, bytes) counting what was sent, and the route outside the API document,
unsigned and read-only. A live run's counters against its record: tests/e2e/test_metrics.py."""

from __future__ import annotations

import ast
import asyncio
import math
import time
from pathlib import Path

import pytest
import torch
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, literal, select

from aitbc.coordinator.observability import metrics
from aitbc.coordinator.observability.metrics import REASON_CODES, reason_case, reason_code
from aitbc.coordinator.rounds.jobs import update_problem
from aitbc.coordinator.verification.spot_checks import drift_reason, failed_reason, unanswered_reason
from aitbc.core.compression import build_codec
from aitbc.core.norms import NormBound, judge_norms
from aitbc.storage.cid import cid_of_bytes

COORDINATOR = Path(metrics.__file__).parents[1]  # the coordinator package (metrics is in observability/)


def scrape(http) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``{sample name: {sorted labels: value}}`` of one GET /metrics, parsed by prometheus-client."""
    r = http.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def by(samples: dict[tuple[tuple[str, str], ...], float], label: str) -> dict[str, float]:
    return {dict(k)[label]: v for k, v in samples.items()}


# --- the reason codes ----------------------------------------------------------------------


def _reasons_the_coordinator_writes() -> dict[str, str]:
    """One reason per code, made by the code that writes it."""
    d = 8
    codec = build_codec("none", {})
    nan = torch.zeros(d)
    nan[3] = float("nan")
    norms = judge_norms([1.0, 1.0, 1.0, 1e9, float("inf")], NormBound())
    return {
        "malformed": update_problem(b"not an update", d),
        "wrong_shape": update_problem(codec.encode(torch.zeros(d - 1)), d),
        "non_finite": update_problem(codec.encode(nan), d),
        "norm_bound": norms.reasons[3],
        "non_finite_norm": norms.reasons[4],
        "bad_loss": f"reported training loss is {math.inf}",  # workers.submit_update's words
        "verification": failed_reason("steps 0-2 do not replay: relative distance 0.5 > 0.01"),
        "unanswered": unanswered_reason(120.0),
        "replay_drift": drift_reason("steps 0-2 replay off by 0.03 (the parameters): could be drift, not proof"),
    }


def test_every_reason_the_coordinator_writes_has_its_code():
    reasons = _reasons_the_coordinator_writes()
    codes = {what: reason_code(text) for what, text in reasons.items()}
    assert codes == {
        "malformed": "malformed",
        "wrong_shape": "wrong_shape",
        "non_finite": "non_finite",
        "norm_bound": "norm_bound",
        "non_finite_norm": "non_finite",
        "bad_loss": "bad_loss",
        "verification": "verification",
        "unanswered": "unanswered",
        "replay_drift": "replay_drift",
    }, reasons
    assert set(codes.values()) | {"other"} == set(REASON_CODES)


@pytest.mark.parametrize(
    "text",
    [None, "", "something new", "x" * 10_000, 'update"} evil{label="1', "%update norm", "_pdate has shape"],
)
def test_any_other_reason_is_other(text):
    assert reason_code(text) == "other"


def test_the_sql_mapping_agrees_with_the_python_one():
    texts = [*_reasons_the_coordinator_writes().values(), "something new", "update norm", "100% update norm 5"]
    engine = create_engine("sqlite://")
    try:
        with engine.connect() as conn:
            for text in texts:
                assert conn.scalar(select(reason_case(literal(text)))) == reason_code(text), text
    finally:
        engine.dispose()


def _kinds_written(call_name: str, arg_index: int | None = None) -> set[str]:
    """The string ``kind`` of every call to ``call_name`` in the coordinator's modules."""
    found: set[str] = set()
    for path in COORDINATOR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name != call_name:
                continue
            args = [k.value for k in node.keywords if k.arg == "kind"]
            if arg_index is not None and len(node.args) > arg_index:
                args.append(node.args[arg_index])
            found |= {a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return found


def test_the_kinds_labels_list_every_kind_the_code_writes():
    ledger = _kinds_written("post")
    flags = _kinds_written("Flag") | _kinds_written("_flag", arg_index=3) | _kinds_written("_flag", arg_index=2)
    assert ledger and flags
    assert ledger <= set(metrics.LEDGER_KINDS), ledger - set(metrics.LEDGER_KINDS)
    assert flags <= set(metrics.FLAG_KINDS), flags - set(metrics.FLAG_KINDS)


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("PUT", "/v1/blobs/bafkabc", "blob"),
        ("GET", "/v1/blobs/bafkabc", "blob"),
        ("POST", "/v1/blobs/missing", "api"),
        ("POST", "/v1/blobs/bafkabc/pin", "api"),
        ("GET", "/v1/runs", "api"),
        ("GET", "/metrics", "web"),
        ("GET", "/static/vendor/uplot/uPlot.iife.min.js", "web"),
        ("GET", "/v1/blobs/", "api"),
    ],
)
def test_byte_kinds(method, path, kind):
    assert metrics.byte_kind(method, path) == kind


# --- the route -----------------------------------------------------------------------------


def test_an_empty_database_scrapes_every_family_at_zero(fresh_server):
    with fresh_server.http() as http:
        m = scrape(http)
    assert m["aitbc_record_up"] == {(): 1.0}
    assert by(m["aitbc_runs"], "status") == dict.fromkeys(metrics.RUN_STATUSES + ("other",), 0.0)
    assert m["aitbc_runs_active"] == {(): 0.0}
    assert by(m["aitbc_rounds_total"], "outcome") == {"aggregated": 0.0, "skipped": 0.0}
    assert by(m["aitbc_updates"], "status") == dict.fromkeys(metrics.UPDATE_STATUSES + ("other",), 0.0)
    assert by(m["aitbc_updates_rejected"], "reason") == dict.fromkeys(REASON_CODES, 0.0)
    assert set(by(m["aitbc_flags_total"], "kind").values()) == {0.0}
    assert set(by(m["aitbc_workers"], "status").values()) == {0.0}
    assert set(by(m["aitbc_jobs"], "status").values()) == {0.0}
    assert m["aitbc_workers_busy"] == {(): 0.0} and m["aitbc_workers_alive"] == {(): 0.0}
    assert set(by(m["aitbc_ledger_entries_total"], "kind").values()) == {0.0}
    assert by(m["aitbc_training_bytes_total"], "direction") == {"up": 0.0, "down": 0.0}
    assert m["aitbc_heartbeats_total"] == {(): 0.0}
    assert m["aitbc_round_close_seconds_count"] == {(): 0.0}
    assert m["aitbc_round_evaluation_seconds_count"] == {(): 0.0}
    assert m["aitbc_record_scrape_seconds"][()] >= 0


def test_heartbeats_bytes_workers_and_ledger_are_counted(fresh_server, api):
    worker = api.register_worker(fresh_server, "w")
    for _ in range(3):
        worker.post("/workers/heartbeat", {})
    blob = bytes(range(256)) * 40  # 10 KiB
    worker.put_blob(cid_of_bytes(blob), blob)
    owner = fresh_server.client("owner")
    owner.post("/wallets/fund", {"amount": "10"})
    with fresh_server.http() as http:
        assert http.get(f"/v1/blobs/{cid_of_bytes(blob)}").content == blob
        entries = http.get("/v1/ledger/entries").json()["count"]
        m = scrape(http)
    assert m["aitbc_heartbeats_total"] == {(): 3.0}
    assert m["aitbc_workers_alive"] == {(): 1.0}  # its registration and heartbeats
    assert by(m["aitbc_workers"], "status")["online"] == 1.0
    sent = by({k: v for k, v in m["aitbc_http_bytes_total"].items() if ("kind", "blob") in k}, "direction")
    assert sent["in"] >= len(blob) and sent["out"] >= len(blob)
    ledger = by(m["aitbc_ledger_entries_total"], "kind")
    assert ledger["mint"] == 1.0 and sum(ledger.values()) == entries == 1


def test_metrics_is_outside_the_api_unsigned_and_read_only(fresh_server, api):
    with fresh_server.http() as http:
        assert "/metrics" not in http.get("/openapi.json").json()["paths"]
        assert http.get("/v1/metrics").status_code == 404
        api.assert_error(http.post("/metrics", json={}), 405, "method_not_allowed")
        before = scrape(http)
        om = http.get("/metrics", headers={"accept": "application/openmetrics-text"})
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        assert {f.name for f in openmetrics_families(om.text)} >= {"aitbc_rounds", "aitbc_heartbeats"}
        for path in ("/nowhere", "/v1/blobs/" + "b" * 300, "/metrics?run=training_x&worker=evil"):
            http.get(path)
        after = scrape(http)
    # the same series, whatever was asked: no label comes from a request
    assert {name: set(s) for name, s in before.items()} == {name: set(s) for name, s in after.items()}


def test_responses_are_counted_by_code_refusals_before_any_route_included(fresh_server, api):
    """A 413 or 401 that Limits answers before any route runs is counted, as are the routes'
    own answers; the series are the same fixed set before and after."""
    with fresh_server.http() as http:
        before = scrape(http)["aitbc_http_responses_total"]
        assert set(by({k: v for k, v in before.items() if ("kind", "api") in k}, "code")) == set(metrics.RESPONSE_CODES)
        big = http.post("/v1/workers/heartbeat", content=b"x" * (2 << 20), headers={"content-type": "application/json"})
        api.assert_error(big, 413, "body_too_large")
        api.assert_error(http.post("/v1/wallets/send", json={}), 401, "missing_signature")
        assert http.get("/nowhere").status_code == 404
        assert http.get("/v1/health").status_code == 200
        after = scrape(http)["aitbc_http_responses_total"]
    assert set(after) == set(before)
    delta = {dict(k)["kind"] + " " + dict(k)["code"]: v - before[k] for k, v in after.items() if v != before[k]}
    # the first scrape's own 200 (web) is counted once its answer is sent
    assert delta == {"api 413": 1.0, "api 401": 1.0, "web 404": 1.0, "api 200": 1.0, "web 200": 1.0}


@pytest.mark.parametrize(("status", "code"), [(200, "200"), (429, "429"), (418, "other"), (599, "other")])
def test_response_codes_are_a_fixed_set(status, code):
    assert metrics.response_code(status) == code


def test_two_apps_in_one_process_keep_their_own_counts(fresh_server, new_coordinator, api):
    other = new_coordinator()
    api.register_worker(fresh_server, "a").post("/workers/heartbeat", {})
    with fresh_server.http() as a, other.http() as b:
        assert scrape(a)["aitbc_heartbeats_total"] == {(): 1.0}
        assert scrape(b)["aitbc_heartbeats_total"] == {(): 0.0}


def test_a_flood_of_scrapes_shares_one_reading_of_the_record(fresh_server, api):
    """/metrics is unsigned: scrapes within a second of each other reuse one reading of the
    database (its queries grow with the tables); the process's own counters stay live."""
    worker = api.register_worker(fresh_server, "w")
    with fresh_server.http() as http:
        first = scrape(http)
        worker.post("/workers/heartbeat", {})
        api.register_worker(fresh_server, "w2")
        again = scrape(http)
        assert again["aitbc_record_scrape_seconds"] == first["aitbc_record_scrape_seconds"]  # the same reading
        assert by(again["aitbc_workers"], "status")["online"] == 1.0  # as read before the second worker came
        assert again["aitbc_heartbeats_total"] == {(): 1.0}  # the process's counter is not cached
        time.sleep(1.1)
        later = scrape(http)
    assert by(later["aitbc_workers"], "status")["online"] == 2.0


@pytest.mark.parametrize(
    ("root", "path", "kind"),
    [("", "/v1/blobs/bafy", "blob"), ("/aitbc", "/aitbc/v1/blobs/bafy", "blob"), ("/aitbc", "/aitbc/v1/runs", "api")],
)
def test_bytes_are_counted_by_kind_behind_a_path_prefix_too(root, path, kind):
    """The middleware alone, around a plain ASGI app: a body of 100 bytes in, 10 out."""
    m = metrics.CoordinatorMetrics()

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x" * 10})

    bodies = [
        {"type": "http.request", "body": b"a" * 60, "more_body": True},
        {"type": "http.request", "body": b"b" * 40},
    ]

    async def receive():
        return bodies.pop(0)

    async def send(message):
        pass

    scope = {"type": "http", "method": "PUT", "path": path, "root_path": root, "headers": []}
    asyncio.run(metrics.CountBytes(app, m)(scope, receive, send))
    sample = m.registry.get_sample_value
    assert sample("aitbc_http_bytes_total", {"direction": "in", "kind": kind}) == 100
    assert sample("aitbc_http_bytes_total", {"direction": "out", "kind": kind}) == 10
