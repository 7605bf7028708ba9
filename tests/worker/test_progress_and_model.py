"""A worker's round costs no more requests than it needs: progress goes out from a thread
of its own (in order, the newest waiting report only, and none after the round's update),
and the global model is downloaded once per CID, checked against it."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from aitbc.client import ApiError, Unreachable
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


def test_drain_sends_a_jobs_first_report_and_the_rate_limit_counts_reports_sent():
    """A small model's round can end before the reporter's thread takes its first report:
    drain sends that one (a job's first report goes out at once) and drops later ones;
    ``sent_at`` stamps only reports that went out."""
    gate, started = threading.Event(), threading.Event()
    sent: list[tuple[str, int]] = []

    def send(job_id: str, body: dict[str, Any]) -> None:
        if job_id == "other":
            started.set()
            assert gate.wait(5)
        sent.append((job_id, body["step"]))

    r = Reporter(send)
    r.report("other", {"step": 1})
    assert started.wait(5)  # in flight until the gate opens
    r.report("j", {"step": 1})  # waiting: job j has sent nothing yet
    assert r.sent_at("j") is None
    gate.set()
    r.drain()
    assert sent == [("other", 1), ("j", 1)]
    assert r.sent_at("j") is not None

    gate.clear()
    started.clear()
    r.report("other", {"step": 2})
    assert started.wait(5)
    r.report("j", {"step": 5})  # j has reported before: drain drops this one
    gate.set()
    r.drain()
    assert r.flush(5)
    assert sent == [("other", 1), ("j", 1), ("other", 2)]
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


# --- the global model and shards: streamed to disk, checked as they arrive ----------------

MODEL = b"model bytes of round 7" * 100
OTHER = b"model bytes of round 8" * 100
THIRD = b"model bytes of round 9" * 100
BIG = bytes(range(256)) * 5000  # 1.28 MB: more than one 1 MiB piece and several CID chunks


class Blobs(BaseHTTPRequestHandler):
    """GET /v1/blobs/<cid>: what the test put under that CID (lies included), counted; a CID
    in ``cut`` is sent with its full Content-Length but only half its bytes, then the
    connection closes (a download cut off)."""

    served: dict[str, bytes] = {}
    cut: set[str] = set()
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
        if cid in self.cut:
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    Blobs.served, Blobs.gets, Blobs.cut = {}, [], set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Blobs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    w = Worker(WorkerSettings(wallet="w"), coordinator=f"http://127.0.0.1:{server.server_port}", home=tmp_path)
    yield w
    w.reporter.close()
    w.client.close()
    server.shutdown()


def _files(folder: Path) -> list[str]:
    """Every file in ``folder``, temporary ones included."""
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_the_global_model_is_downloaded_once_per_cid(worker):
    model, other, third = cid_of_bytes(MODEL), cid_of_bytes(OTHER), cid_of_bytes(THIRD)
    Blobs.served = {model: MODEL, other: OTHER, third: THIRD}
    assert worker.fetcher.global_model(model).read_bytes() == MODEL
    assert worker.fetcher.global_model(model).read_bytes() == MODEL  # a round trained again, a skipped round: kept
    assert worker.fetcher.global_model(other).read_bytes() == OTHER  # the next round's model
    assert Blobs.gets == [model, other]
    assert worker.fetcher.cache.store.list() == []  # the disk cache is for shards
    assert _files(worker.fetcher.models.dir) == sorted([model, other])
    worker.fetcher.global_model(third)  # the last two are kept; the oldest file goes
    assert _files(worker.fetcher.models.dir) == sorted([other, third])


def test_a_model_whose_bytes_do_not_match_its_cid_is_refused_and_not_kept(worker):
    model = cid_of_bytes(MODEL)
    Blobs.served = {model: OTHER}  # a coordinator (or a path to it) hands over other bytes
    with pytest.raises(IntegrityError, match=f"blob {model} from .* does not hash to its CID"):
        worker.fetcher.global_model(model)
    assert _files(worker.fetcher.models.dir) == []  # no file under its name, no temporary one
    Blobs.served = {model: MODEL}
    assert worker.fetcher.global_model(model).read_bytes() == MODEL  # fetched again: the lie was not kept
    assert Blobs.gets == [model, model]


def test_a_download_cut_off_leaves_no_file_and_is_fetched_again(worker):
    big = cid_of_bytes(BIG)
    Blobs.served, Blobs.cut = {big: BIG}, {big}
    with pytest.raises(Unreachable, match=f"download of blob {big} from .* cut off after"):
        worker.fetcher.global_model(big)
    assert _files(worker.fetcher.models.dir) == []
    Blobs.cut = set()
    assert worker.fetcher.global_model(big).read_bytes() == BIG


def test_a_truncated_or_corrupt_shard_is_refused_and_not_cached(worker):
    big = cid_of_bytes(BIG)
    for lie in (BIG[:-1], BIG[:1000], BIG[:-1] + b"x"):  # a byte short, a prefix, one byte changed
        Blobs.served = {big: lie}
        with pytest.raises(IntegrityError, match="does not hash to its CID"):
            worker.fetcher.shard(big)
        assert _files(worker.fetcher.cache.store.dir) == []
    Blobs.served = {big: BIG}
    path = worker.fetcher.shard(big)
    assert path.read_bytes() == BIG and _files(worker.fetcher.cache.store.dir) == [big]
    assert worker.fetcher.shard(big) == path and Blobs.gets.count(big) == 4  # cached: read from disk, checked again
    path.write_bytes(BIG[:-1])  # damaged on disk: dropped and fetched again
    assert worker.fetcher.shard(big).read_bytes() == BIG and Blobs.gets.count(big) == 5


def test_a_blob_over_the_store_limit_is_refused_as_it_streams(worker, tmp_path):
    from aitbc.errors import AitbcError
    from aitbc.storage.blobstore import LocalBlobStore

    big = cid_of_bytes(BIG)
    Blobs.served = {big: BIG}
    store = LocalBlobStore(tmp_path / "capped", max_size=len(BIG) - 1)
    with pytest.raises(AitbcError, match="blob too large"):
        worker.client.download_blob(big, store)
    assert _files(store.dir) == []
    exact = LocalBlobStore(tmp_path / "exact", max_size=len(BIG))
    assert worker.client.download_blob(big, exact) == len(BIG)
    assert _files(exact.dir) == [big]


def test_an_unknown_blob_is_the_coordinator_s_error(worker):
    missing = cid_of_bytes(b"never served")
    with pytest.raises(ApiError) as e:
        worker.fetcher.global_model(missing)
    assert (e.value.status, e.value.code) == (404, "unknown_blob")
    assert _files(worker.fetcher.models.dir) == []


def test_a_model_inside_the_job_view_is_kept_only_if_it_hashes_to_its_cid(worker):
    """A small model comes inside the job poll's answer (base64): kept, with no download,
    when its bytes hash to the CID; bytes that do not (or are not base64) are dropped, with
    nothing stored under the CID, and the model is downloaded by its CID instead."""
    model, other = cid_of_bytes(MODEL), cid_of_bytes(OTHER)
    Blobs.served = {model: MODEL, other: OTHER}
    assert worker.fetcher.global_model(model, inline=base64.b64encode(MODEL).decode()).read_bytes() == MODEL
    assert Blobs.gets == []  # no second request
    moved = {
        d: worker.metrics.registry.get_sample_value("aitbc_worker_bytes_total", {"direction": d})
        for d in ("inline", "down")
    }
    assert moved == {"inline": len(MODEL), "down": 0}
    for bad in (base64.b64encode(MODEL).decode(), "not base64!", ""):  # the wrong model's bytes, junk, none
        worker.fetcher._kept_models.clear()
        for f in worker.fetcher.models.dir.iterdir():
            f.unlink()
        assert worker.fetcher.global_model(other, inline=bad).read_bytes() == OTHER  # fetched by CID instead
    assert Blobs.gets == [other, other, other]
    assert _files(worker.fetcher.models.dir) == sorted([other])  # no temporary file left, nothing under a wrong name


def test_a_shard_outside_its_spec_declines_the_job_in_one_line(worker):
    """Token ids past the vocabulary (an owner's int32 windows can carry any id) are refused
    before anything trains: a BadShard, which the job loop declines as ``refused: bad data``,
    not an IntegrityError it would fetch again every second."""
    import types

    import torch

    from aitbc.training.checkpoint import shard_bytes
    from aitbc.training.data_spec import DataSpec
    from aitbc.worker.records import BadShard

    x = torch.zeros(2, 8, dtype=torch.int32)
    x[1, 3] = 5000
    good, bad = (shard_bytes(t, t, dataset="d", index=0, count=1) for t in (torch.zeros(2, 8, dtype=torch.int32), x))
    Blobs.served = {cid_of_bytes(good): good, cid_of_bytes(bad): bad}
    spec = DataSpec("language", (8,), 300)
    job = types.SimpleNamespace(shard_cid=cid_of_bytes(good))
    assert worker.trainer._shard(job, spec)[0].shape == (2, 8)
    job.shard_cid = cid_of_bytes(bad)
    with pytest.raises(BadShard) as e:
        worker.trainer._shard(job, spec)
    assert "token ids must be in [0, 300), found 0..5000" in str(e.value) and "\n" not in str(e.value)
