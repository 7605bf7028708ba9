"""A worker's round costs no more requests than it needs: progress goes out from a thread
of its own (in order, the newest waiting report only, and none after the round's update),
and the global model is downloaded once per CID, checked against it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from aitbc.errors import IntegrityError
from aitbc.storage.cid import cid_of_bytes
from aitbc.worker.config import WorkerSettings
from aitbc.worker.daemon import Worker
from aitbc.worker.progress import Reporter


class Slow:
    """A send that takes ``delay`` seconds and records what it sent, in order."""

    def __init__(self, delay: float) -> None:
        self.delay, self.sent = delay, []
        self.started = threading.Event()

    def __call__(self, job_id: str, body: dict[str, Any]) -> None:
        self.started.set()
        time.sleep(self.delay)
        self.sent.append((job_id, body["step"]))


def test_reports_go_out_in_order_and_the_newest_waiting_replaces_older_ones():
    send = Slow(0.2)
    r = Reporter(send)
    r.report("j", {"step": 1})
    assert send.started.wait(5)  # step 1 in flight
    for step in (10, 20, 30):  # made while it is: only the newest is sent after it
        r.report("j", {"step": step})
    assert r.flush(5)
    assert send.sent == [("j", 1), ("j", 30)]
    r.close()


def test_report_does_not_wait_for_the_coordinator():
    r = Reporter(Slow(0.5))
    t = time.perf_counter()
    for step in range(100):
        r.report("j", {"step": step})
    assert time.perf_counter() - t < 0.1
    r.close()


def test_drain_drops_the_waiting_report_and_waits_for_the_one_in_flight():
    send = Slow(0.3)
    r = Reporter(send)
    r.report("j", {"step": 10})
    assert send.started.wait(5)
    r.report("j", {"step": 20})
    r.drain()  # what the worker does before it sends its update
    assert send.sent == [("j", 10)]  # in flight: done before drain returned; 20 dropped
    time.sleep(0.4)
    assert send.sent == [("j", 10)]
    r.close()


def test_a_failing_send_does_not_end_reporting():
    calls = []

    def send(job_id: str, body: dict[str, Any]) -> None:
        calls.append(body["step"])
        if body["step"] == 1:
            raise RuntimeError("boom")

    r = Reporter(send)
    r.report("j", {"step": 1})
    assert r.flush(5)
    r.report("j", {"step": 2})
    assert r.flush(5)
    assert calls == [1, 2]
    r.close()


# --- the global model ------------------------------------------------------------------

MODEL = b"model bytes of round 7" * 100
OTHER = b"model bytes of round 8" * 100


class Blobs(BaseHTTPRequestHandler):
    """GET /v1/blobs/<cid>: what the test put under that CID (lies included), counted."""

    served: dict[str, bytes] = {}
    gets: list[str] = []

    def do_GET(self) -> None:
        cid = self.path.rsplit("/", 1)[-1]
        type(self).gets.append(cid)
        data = self.served.get(cid)
        if data is None:
            self.send_response(404)
            self.send_header("content-type", "application/json")
            body = b'{"error": "unknown_blob", "detail": "no such blob"}'
        else:
            self.send_response(200)
            self.send_header("content-type", "application/octet-stream")
            body = data
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    Blobs.served, Blobs.gets = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Blobs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    w = Worker(WorkerSettings(wallet="w"), coordinator=f"http://127.0.0.1:{server.server_port}", home=tmp_path)
    yield w
    w.reporter.close()
    w.client.close()
    server.shutdown()


def test_the_global_model_is_downloaded_once_per_cid(worker):
    model, other = cid_of_bytes(MODEL), cid_of_bytes(OTHER)
    Blobs.served = {model: MODEL, other: OTHER}
    assert worker._global_model(model) == MODEL
    assert worker._global_model(model) == MODEL  # a round trained again, a skipped round: kept
    assert worker._global_model(other) == OTHER  # the next round's model
    assert Blobs.gets == [model, other]
    assert worker.cache.store.list() == []  # kept in memory: the disk cache is for shards


def test_a_model_whose_bytes_do_not_match_its_cid_is_refused_and_not_kept(worker):
    model = cid_of_bytes(MODEL)
    Blobs.served = {model: OTHER}  # a coordinator (or a path to it) hands over other bytes
    with pytest.raises(IntegrityError):
        worker._global_model(model)
    Blobs.served = {model: MODEL}
    assert worker._global_model(model) == MODEL  # fetched again: the lie was not kept
    assert Blobs.gets == [model, model]
