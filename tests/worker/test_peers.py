"""Peer transport's parts (issue 14, part 3), each against real HTTP on loopback: the
worker's blob server, the fetcher's CID check, the coordinator's book of holders and its own
check of an accused peer (one report cannot get an honest peer flagged)."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

import httpx
import pytest

from aitbc.coordinator.transfer.peers import DISTRUST_REPORTS, PEERS_GIVEN, PeerBook, _fetch_and_check
from aitbc.errors import AitbcError, IntegrityError
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.cid import cid_of_bytes
from aitbc.storage.peer_url import check_advertise
from aitbc.worker import bad_peer
from aitbc.worker.peers import BlobServer, PeerFetcher, PeerUnavailable, parse_listen

DATA = bytes(range(256)) * 4000  # ~1 MB: more than one streamed piece
CID = cid_of_bytes(DATA)
OTHER = cid_of_bytes(b"not held")


@pytest.fixture
def held(tmp_path: Path) -> Path:
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / CID).write_bytes(DATA)
    return tmp_path / "held"


def _server(held: Path, **kw) -> BlobServer:
    def find(cid: str) -> Path | None:
        path = held / cid
        return path if path.is_file() else None

    return BlobServer("127.0.0.1", 0, find, **kw)


def test_server_serves_held_blobs_by_cid_only(held):
    server = _server(held)
    url = f"http://127.0.0.1:{server.port}"
    try:
        r = httpx.get(f"{url}/v1/blobs/{CID}")
        assert r.status_code == 200 and r.content == DATA and r.headers["x-aitbc-cid"] == CID
        head = httpx.head(f"{url}/v1/blobs/{CID}")
        assert head.status_code == 200 and head.headers["content-length"] == str(len(DATA)) and not head.content
        assert httpx.get(f"{url}/v1/blobs/{OTHER}").status_code == 404  # after the short wait for a seed
        assert httpx.get(f"{url}/v1/blobs/..%2F{CID}").json()["error"] == "bad_cid"
        assert httpx.get(f"{url}/v1/blobs/{CID}?x=1").status_code == 400
        with socket.create_connection(("127.0.0.1", server.port)) as sock:  # sent as is (httpx would normalize)
            sock.sendall(f"GET /v1/blobs/../../{CID} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert sock.recv(100).startswith(b"HTTP/1.1 400")
        assert httpx.get(f"{url}/etc/passwd").status_code == 404
        assert httpx.post(f"{url}/v1/blobs/{CID}", content=b"x").status_code == 501  # read-only
    finally:
        server.close()


def test_server_waits_for_a_blob_it_is_fetching_and_refuses_past_its_connections(held):
    server = _server(held, connections=1)
    url = f"http://127.0.0.1:{server.port}"
    late = b"fetched a moment later"
    server.expect(cid_of_bytes(late))
    results: list[httpx.Response] = []
    t = threading.Thread(target=lambda: results.append(httpx.get(f"{url}/v1/blobs/{cid_of_bytes(late)}", timeout=30)))
    try:
        t.start()
        deadline = 50
        while server.slots._value != 0 and deadline:  # the waiting request holds the only slot
            threading.Event().wait(0.05)
            deadline -= 1
        busy = httpx.get(f"{url}/v1/blobs/{CID}")
        assert busy.status_code == 503 and busy.json()["error"] == "busy"
        (held / cid_of_bytes(late)).write_bytes(late)
        server.done(cid_of_bytes(late))
        t.join(30)
        assert results[0].status_code == 200 and results[0].content == late
    finally:
        server.close()


def test_fetcher_checks_the_cid_as_bytes_arrive(held, tmp_path):
    store = LocalBlobStore(tmp_path / "store", durable=False)
    store.dir.mkdir(parents=True, exist_ok=True)
    fetcher = PeerFetcher(timeout=5)
    honest, corrupt = _server(held), _server(held, corrupt=True)
    try:
        with pytest.raises(IntegrityError, match="does not hash to its CID"):
            fetcher.download(f"http://127.0.0.1:{corrupt.port}", CID, store)
        assert not store.has(CID) and list(store.dir.iterdir()) == []  # nothing kept, no temporary left
        with pytest.raises(PeerUnavailable, match="404"):
            fetcher.download(f"http://127.0.0.1:{honest.port}", OTHER, store)
        closed = f"http://127.0.0.1:{corrupt.port}"
        corrupt.close()
        with pytest.raises(PeerUnavailable):
            fetcher.download(closed, CID, store)
        assert fetcher.download(f"http://127.0.0.1:{honest.port}", CID, store) == len(DATA)
        assert store.get_bytes(CID) == DATA
    finally:
        honest.close()
        fetcher.close()


def test_the_coordinators_own_check_of_an_accused_peer(held):
    honest, corrupt = _server(held), _server(held, corrupt=True)
    try:
        assert _fetch_and_check(f"http://127.0.0.1:{honest.port}", CID, len(DATA)) == "ok"  # a false report
        assert _fetch_and_check(f"http://127.0.0.1:{corrupt.port}", CID, len(DATA)) == "bad"
        assert _fetch_and_check(f"http://127.0.0.1:{honest.port}", OTHER, 8) == "gone"
        closed = f"http://127.0.0.1:{corrupt.port}"
        corrupt.close()
        assert _fetch_and_check(closed, CID, len(DATA)) == "gone"
    finally:
        honest.close()


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("ftp://h:1", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("http://user:pw@h:1", "credentials"),
        ("http://h:1/v1/blobs", "no path"),
        ("http://h:1?x=1", "no path"),
        ("http://:1", "no host"),
        ("http://h:99999", "not a URL"),
        ("http://" + "h" * 300, "at most"),
    ],
)
def test_advertised_urls_are_bounded(url, error):
    with pytest.raises(ValueError, match=error):
        check_advertise(url)


def test_advertised_url_is_normalized_and_listen_parsed():
    assert check_advertise("http://127.0.0.1:9000/") == "http://127.0.0.1:9000"
    assert check_advertise("https://[::1]:9000") == "https://[::1]:9000"
    assert parse_listen("127.0.0.1:9000") == ("127.0.0.1", 9000)
    assert parse_listen("[::1]:9000") == ("::1", 9000)
    for bad in ("9000", "host:", "host:0", "host:x", ":9000"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_listen(bad)


def _book(n: int, alive: set[str] | None = None) -> tuple[PeerBook, list[str]]:
    book = PeerBook(rng=random.Random(0))
    ws = [f"w{i}" for i in range(n)]
    for w in ws:
        book.advertise(w, f"http://10.0.0.{ws.index(w)}:9000")
    return book, ws


def test_the_first_asker_seeds_and_later_askers_get_it_never_themselves():
    book, ws = _book(4)
    everyone = lambda w: True
    run = lambda: ws
    assert book.holders_for("m", "w0", everyone, fetchers=run) == []  # the seed: from the coordinator
    assert [p["worker"] for p in book.holders_for("m", "w1", everyone, fetchers=run)] == ["w0"]
    assert book.holders_for("m", "w0", everyone, fetchers=run) == []  # asks again: still the coordinator
    book.announce("w1", "http://10.0.0.1:9000", ["m"])
    got = {p["worker"] for _ in range(20) for p in book.holders_for("m", "w2", everyone, fetchers=run)}
    assert got == {"w0", "w1"}  # holders and seeds, never the asker
    assert all(p["worker"] != "w1" for p in book.holders_for("m", "w1", everyone, fetchers=run))


def test_a_worker_that_cannot_serve_is_handed_a_seed_that_can():
    book, ws = _book(2)
    book.advertise("plain", None)
    everyone = lambda w: True
    got = book.holders_for("m", "plain", everyone, fetchers=lambda: ["plain", "w1"])
    assert [p["worker"] for p in got] == ["w1"]
    assert book.holders_for("m", "w1", everyone, fetchers=lambda: ["plain", "w1"]) == []  # the seed itself
    assert book.holders_for("shard", "plain", everyone) == []  # no fetchers (a shard): nobody is made a seed


def test_holders_are_live_spread_and_capped():
    book, ws = _book(8)
    for w in ws:
        book.announce(w, f"http://10.0.0.{ws.index(w)}:9000", ["m"])
    dead = {"w3"}
    seen: dict[str, int] = {}
    for _ in range(200):
        got = book.holders_for("m", "w0", lambda w: w not in dead)
        assert len(got) == PEERS_GIVEN
        for p in got:
            seen[p["worker"]] = seen.get(p["worker"], 0) + 1
    assert set(seen) == set(ws) - {"w0", "w3"}  # every live holder but the asker, each some of the time
    book.announce("w1", "http://10.0.0.1:9000", [])  # evicted: no longer claims it
    assert all(p["worker"] != "w1" for p in book.holders_for("m", "w0", lambda w: True))


def test_reports_count_distinct_reporters_and_a_confirmed_bad_peer_is_banned():
    book, ws = _book(5)
    for w in ws:
        book.announce(w, f"http://10.0.0.{ws.index(w)}:9000", ["m"])
    for _ in range(DISTRUST_REPORTS + 2):
        book.report("w1", "w2")  # one reporter, many times: still handed out
    assert any(p["worker"] == "w1" for _ in range(30) for p in book.holders_for("m", "w0", lambda w: True))
    for reporter in ("w3", "w4"):
        book.report("w1", reporter)
    assert all(p["worker"] != "w1" for _ in range(30) for p in book.holders_for("m", "w0", lambda w: True))
    book.judge("w2", "m", "bad")
    book.announce("w2", "http://10.0.0.2:9000", ["m"])  # ignored: banned
    assert "w2" in book.banned and book.url("w2") is None
    book.judge("w3", "m", "gone")  # did not answer: its claim goes, not its other blobs or its URL
    assert all(p["worker"] != "w3" for _ in range(30) for p in book.holders_for("m", "w0", lambda w: True))
    assert book.url("w3") is not None


def test_the_book_forgets_cids_nobody_holds():
    book, ws = _book(2)
    for r in range(50):  # a round's model each time, the previous one evicted
        book.announce("w0", "http://10.0.0.0:9000", [f"m{r}"])
        book.announce("w1", "http://10.0.0.1:9000", [f"m{r}"])
    assert set(book._holders) == {"m49"}


def test_a_listen_address_in_use_is_one_clear_error(held):
    server = _server(held)
    try:
        with pytest.raises(AitbcError, match=f"--listen 127.0.0.1:{server.port}: cannot listen there: already in use"):
            BlobServer("127.0.0.1", server.port, lambda cid: None)
    finally:
        server.close()


# --- slow and endless peers (issue 33): a deadline however the bytes come, a cap at the size ---


class _Counting(LocalBlobStore):
    """A store that remembers the most bytes any of its writers held (what a fetch cost on disk)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, durable=False)
        self.writers: list = []

    def writer(self, cid: str):
        w = super().writer(cid)
        self.writers.append(w)
        return w


def test_a_trickling_peer_is_given_up_at_the_deadline_whatever_it_sends(held, tmp_path, monkeypatch):
    """``misbehave="trickle"``: a byte every 0.1 s with an honest Content-Length, so every
    read returns within the read timeout (0.5 s) and ~1 MB would take a day. The fetch's deadline
    (4 x timeout, wall clock, enforced by shutting the socket down) ends it: PeerUnavailable,
    nothing kept, the peer's connection closed."""
    monkeypatch.setattr(bad_peer, "TRICKLE_SECONDS", 0.1)
    server = _server(held)
    server.misbehave = "trickle"
    fetcher = PeerFetcher(timeout=0.5)
    store = LocalBlobStore(tmp_path / "in", durable=False)
    try:
        with pytest.raises(PeerUnavailable, match=r"too slow: \d+ bytes of .* in 2 s"):
            fetcher.download(f"http://127.0.0.1:{server.port}", CID, store)
        assert not store.has(CID) and not list(store.dir.iterdir())
    finally:
        fetcher.close()
        server.close()


def test_headers_sent_a_byte_at_a_time_cannot_hold_a_fetch(tmp_path):
    """A peer that never finishes its headers (a line every 0.2 s, each read well inside the
    read timeout) is cut at the deadline too: the deadline covers the whole exchange."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.wait(0.2):
                try:
                    conn.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    fetcher = PeerFetcher(timeout=0.5)
    try:
        with pytest.raises(PeerUnavailable, match="too slow"):
            fetcher.download(f"http://127.0.0.1:{listener.getsockname()[1]}", CID, LocalBlobStore(tmp_path / "in"))
    finally:
        stop.set()
        fetcher.close()
        listener.close()


def test_an_endless_peer_costs_at_most_the_blobs_size(held, tmp_path):
    """``misbehave="endless"``: the blob, then bytes for ever (no Content-Length). Given the
    blob's known size, the fetch stops at the byte past it: IntegrityError (reported as a bad
    peer), nothing kept, and never more than that size written. Without a size only the
    deadline bounds it (the coordinator's and a gossip worker's fetches always give one)."""
    server = _server(held)
    server.misbehave = "endless"
    fetcher = PeerFetcher(timeout=5.0)
    store = _Counting(tmp_path / "in")
    try:
        with pytest.raises(IntegrityError, match=f"longer than its {len(DATA)} bytes; refused at that byte"):
            fetcher.download(f"http://127.0.0.1:{server.port}", CID, store, max_bytes=len(DATA))
        assert [w.size for w in store.writers] == [len(DATA)]  # on disk at most: the blob's own size
        assert not store.has(CID) and not list(store.dir.iterdir())
        # the coordinator's check of an accused peer stops at the blob's size as well: bad
        assert _fetch_and_check(f"http://127.0.0.1:{server.port}", CID, len(DATA)) == "bad"
    finally:
        fetcher.close()
        server.close()
