"""What an unauthenticated client can do to the coordinator's routes outside ``/v1`` (issue 16):
``/static`` serves only the package's files, each as its own type with
``X-Content-Type-Options: nosniff`` (the dashboard's page there is held to its policy as at
``/``), never a directory listing or a path outside the folder however it is spelled;
``/docs`` and ``/redoc`` cannot be framed or sniffed; ``/metrics`` answers an ``Accept``
header prometheus-client cannot read with the text format, not a 500. Requests are sent on
a raw socket where httpx would normalise the path before it leaves."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from aitbc.coordinator.api.routes.dashboard import CSP as DASHBOARD_CSP
from aitbc.coordinator.api.web import STATIC_DIR


def raw_get(url: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """``GET path`` exactly as written (no normalisation): status, headers, body."""
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


OUTSIDE = (
    "/static/",  # a listing of the folder
    "/static/vendor/",
    "/static/vendor",
    "/static/../app.py",
    "/static/%2e%2e/__init__.py",
    "/static/%2e%2e/%2e%2e/app.py",
    "/static/..%2f__init__.py",
    "/static/..%5c__init__.py",
    "/static/%2fetc%2fpasswd",
    "/static//etc/passwd",
    "/static/%00",
    "/static/index.html%00.js",
)


@pytest.mark.parametrize("path", OUTSIDE)
def test_static_serves_nothing_outside_its_files(server, path):
    status, headers, body = raw_get(server.url, path)
    assert status == 404, (path, status, body[:200])
    assert headers["content-type"] == "application/json" and b'"error":"not_found"' in body, (path, body[:200])


def test_the_package_static_folder_holds_no_symlink():
    # Starlette refuses a symlink out of the folder; the package ships none to follow
    assert not [p for p in STATIC_DIR.rglob("*") if p.is_symlink()]


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/static/index.html", "text/html"),
        ("/static/dashboard.js", "text/javascript"),
        ("/static/dashboard.css", "text/css"),
        ("/static/vendor/README.md", "text/markdown"),
        ("/static/vendor/redoc/LICENSE", "application/octet-stream"),
        ("/static/vendor/swagger-ui/favicon-32x32.png", "image/png"),
    ],
)
def test_static_files_are_their_declared_type_only(server, path, kind):
    with server.http() as h:
        for method in ("GET", "HEAD"):
            r = h.request(method, path)
            assert r.status_code == 200, (method, path, r.text[:200])
            assert r.headers["content-type"].split(";")[0] == kind, (path, r.headers["content-type"])
            assert r.headers["x-content-type-options"] == "nosniff", (method, path, dict(r.headers))
            # the dashboard's page opened at /static/index.html is held to its policy as at /
            assert r.headers["content-security-policy"] == DASHBOARD_CSP, (method, path)


@pytest.mark.parametrize("page", ["/docs", "/redoc", "/docs/oauth2-redirect"])
def test_docs_pages_cannot_be_framed_or_sniffed(server, page):
    with server.http() as h:
        r = h.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text[:200]
    assert r.headers["x-content-type-options"] == "nosniff"
    policy = [d.strip() for d in r.headers["content-security-policy"].split(";")]
    assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy, policy


@pytest.mark.parametrize(
    "accept",
    [
        "application/openmetrics-text; version=1.x",  # prometheus-client raised TypeError: a 500
        "application/openmetrics-text; version=<b>x</b>",
        "application/openmetrics-text; version=a.b.c",
    ],
)
def test_metrics_answers_an_unreadable_accept_in_the_text_format(server, accept):
    with server.http() as h:
        r = h.get("/metrics", headers={"accept": accept})
    assert r.status_code == 200, r.text[:300]
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4"), r.headers["content-type"]
    assert r.headers["x-content-type-options"] == "nosniff"
    names = {f.name for f in text_string_to_metric_families(r.text)}
    assert {"aitbc_runs", "aitbc_heartbeats", "aitbc_record_up"} <= names, names


def test_scrapes_during_a_slow_reading_get_the_last_one_at_once(fresh_server):
    """A reading of the record in progress (held here: a large record takes seconds) makes
    no scrape wait for it: each gets the last reading at once, so a flood of unsigned
    scrapes cannot hold the thread pool that every sync /v1 route runs in."""
    record = fresh_server.ctx.metrics.record
    assert record is not None
    with fresh_server.http() as h:
        first = h.get("/metrics")
        assert first.status_code == 200
        time.sleep(record.min_interval + 0.1)  # the reading is due again
        with record._lock:  # a reading in progress
            t0 = time.monotonic()
            again = [h.get("/metrics", timeout=5) for _ in range(3)]
            took = time.monotonic() - t0
            assert all(r.status_code == 200 for r in again), [r.status_code for r in again]
            assert took < 3, took  # the last reading, not a wait for the one in progress
        assert {scrape_seconds(r.text) for r in again} == {scrape_seconds(first.text)}
        time.sleep(record.min_interval + 0.1)
        assert scrape_seconds(h.get("/metrics").text) != scrape_seconds(first.text)  # a new reading


def scrape_seconds(text: str) -> float:
    return (
        next(f for f in text_string_to_metric_families(text) if f.name == "aitbc_record_scrape_seconds")
        .samples[0]
        .value
    )


def test_update_counts_that_can_fall_are_gauges(new_coordinator, api):
    """An update's status changes after it is counted (accepted, then rejected by the norm
    bound at its round's close or excluded by the owner) and a resend deletes it: the counts
    by status fall, which Prometheus reads as a counter's reset (rate() and increase() then
    add the whole count again), so they are gauges. Here an accepted update is dropped by
    its owner's resend and ``accepted`` falls from 1 to 0."""
    coord = new_coordinator()
    t = api.start_training_run(coord, 3, prefix="g")
    worker, job = t.take()
    res = worker.post(f"/jobs/{job}/updates", api.update_body(1, api.put_update(worker, torch.zeros(t.d))))
    assert res["status"] == "accepted", res
    with coord.http() as h:
        before = record_families(h.get("/metrics").text)
        t.owner.post(f"/jobs/{job}/resend")
        time.sleep(coord.ctx.metrics.record.min_interval + 0.1)  # a new reading of the record
        after = record_families(h.get("/metrics").text)
    accepted = [{s.labels["status"]: s.value for s in m["aitbc_updates"].samples}["accepted"] for m in (before, after)]
    assert accepted == [1.0, 0.0]
    for name in ("aitbc_updates", "aitbc_updates_rejected"):  # a resend deletes a rejected update too
        assert before[name].type == after[name].type == "gauge", name


def record_families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_scores_come_in_bounded_pages_and_the_sdk_reads_them_all(new_coordinator, api, tmp_path):
    """``GET /v1/runs/{id}/scores`` is unsigned and a long run holds rounds x workers rows (64k
    were one 14 MB reply and ~4 s of the coordinator): at most MAX_SCORES rows a reply, paged
    with ``next``; a larger ``limit`` is a 422. The SDK's get_round_scores reads every page."""
    from aitbc.coordinator.api.routes.runs import MAX_SCORES
    from aitbc.coordinator.store.models import Score
    from aitbc_agent_sdk import Agent, AgentConfig

    coord = new_coordinator()
    t = api.start_training_run(coord, 2, prefix="p")
    contract = coord.rows("SELECT id, worker_id FROM contracts WHERE run_id = :r", r=t.run_id)[0]
    n = MAX_SCORES + 7
    with coord.ctx.session() as s:  # one contract's score in each of n rounds, written as the driver does
        s.add_all(
            Score(
                run_id=t.run_id,
                round=r,
                contract_id=contract["id"],
                worker_id=contract["worker_id"],
                status="accepted",
                quality=0.5,
                flags=[],
            )
            for r in range(n, 0, -1)  # written newest first: the SDK still returns them by round
        )
        s.commit()
    with coord.http() as h:
        first = h.get(f"/v1/runs/{t.run_id}/scores").json()
        assert first["count"] == len(first["data"]) == MAX_SCORES and first["next"] is not None
        rest = h.get(f"/v1/runs/{t.run_id}/scores", params={"after": first["next"]}).json()
        assert rest["count"] == 7 and rest["next"] is None
        small = h.get(f"/v1/runs/{t.run_id}/scores", params={"limit": 2}).json()
        assert small["count"] == 2 and small["next"] is not None
        api.assert_error(h.get(f"/v1/runs/{t.run_id}/scores", params={"limit": MAX_SCORES + 1}), 422, "invalid_request")
        api.assert_error(h.get(f"/v1/runs/{t.run_id}/scores", params={"after": -1}), 422, "invalid_request")
    config = AgentConfig(name="reader", wallet_name=None, coordinator_url=coord.url, home=tmp_path / "reader")
    with Agent(config) as reader:
        rows = reader.get_round_scores(t.run_id)
    assert [r["round"] for r in rows] == list(range(1, n + 1))
