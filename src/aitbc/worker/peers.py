"""Peer transport on the worker: serve the blobs it holds to other workers, and fetch blobs
from them (checked against their CID as they arrive), the coordinator being the fallback.

The server (:class:`BlobServer`, ``--listen HOST:PORT``) is the standard library's
threading HTTP server on a thread of its own, read-only: ``GET`` and ``HEAD`` of
``/v1/blobs/{cid}`` for a CID :func:`~aitbc.storage.cid.parse_cid` accepts (so no path ever
reaches the file system but a CID), served from the files the worker holds (its global-model
copies and its shard cache), at most ``connections`` at a time (503 past it). A blob the
worker is fetching itself right now (a *seed*: the coordinator already handed it out) is
waited for up to :data:`PENDING_WAIT` seconds, then served.

A gossip worker also serves its signed model records, ``GET /v1/records/{job_id}[?round=R]``
(the round's, else its newest), with a header :data:`PACE_HEADER` saying where its training
of that job is (``round=R; step=S; steps=N; seconds=T``: step S of N of round R, T seconds
into that round's training; see :mod:`aitbc.worker.gossip`).

The fetcher (:class:`PeerFetcher`) streams ``{url}/v1/blobs/{cid}`` into a
:class:`~aitbc.storage.blobstore.LocalBlobStore` writer (hashed as it arrives, renamed to
the CID only if it matches), with a connect timeout, a read timeout and an overall deadline,
following no redirects. A peer that fails is skipped; bytes that do not hash are an
:class:`~aitbc.errors.IntegrityError` its caller reports to the coordinator.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from aitbc.errors import AitbcError, IntegrityError, UsageError
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.cid import parse_cid
from aitbc.storage.peer_fetch import TooLong, TooSlow, bounded_get
from aitbc.worker.bad_peer import serve_badly

log = logging.getLogger("aitbc.worker.peers")

PREFIX = "/v1/blobs/"
RECORDS = "/v1/records/"  # gossip: signed model records
# gossip: beside a record (or its 404), where the worker's training of that job is, so a
# neighbour can tell a slow worker from a late one (aitbc.worker.gossip); advisory, unsigned
PACE_HEADER = "X-Aitbc-Pace"
PENDING_WAIT = 6.0  # seconds a request for a blob being fetched here waits for it
NOT_YET_WAIT = 2.0  # seconds a request for a blob not held waits for this worker to start fetching it
_CHUNK = 1 << 20
UNBOUNDED = 1 << 62  # a blob whose size the fetcher does not know: only the deadline bounds it


class PeerUnavailable(AitbcError):
    """A peer did not serve the blob (refused, not found, busy, too slow)."""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as a pair, or a ValueError naming the form."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"listen address {text!r} must be HOST:PORT with a port in 1-65535")
    return host, int(port)


class BlobServer:
    """See the module's docstring. ``find(cid)``: the path of a held blob, or None;
    ``corrupt``: testing only, serve every blob with its first byte flipped."""

    def __init__(
        self,
        host: str,
        port: int,
        find: Callable[[str], Path | None],
        *,
        connections: int = 8,
        corrupt: bool = False,
        records: Callable[[str, int | None], dict[str, Any] | None] | None = None,
        pace: Callable[[str], str | None] | None = None,
    ) -> None:
        self.find, self.corrupt, self.records, self.pace = find, corrupt, records, pace
        # testing only (aitbc.worker.cheats, set by a gossip cheat): "trickle" sends each blob
        # a byte every TRICKLE_SECONDS; "endless" sends bytes for ever after each blob's own
        self.misbehave: str | None = None
        self.slots = threading.BoundedSemaphore(connections)
        self._pending: dict[str, threading.Event] = {}
        self._lock = threading.Condition()
        try:
            self.httpd = ThreadingHTTPServer((host, port), _Handler)
        except (OSError, ValueError) as e:  # in use, an address not of this machine, a name IDNA refuses
            why = "already in use" if isinstance(e, OSError) and e.errno == errno.EADDRINUSE else str(e)
            raise AitbcError(f"--listen {host}:{port}: cannot listen there: {why}") from None
        self.httpd.daemon_threads = True
        self.httpd.blob_server = self  # type: ignore[attr-defined]
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="blob-server", daemon=True)
        self._thread.start()

    def expect(self, cid: str) -> None:
        """This worker is about to fetch ``cid``: requests for it wait for it (see :meth:`done`)."""
        with self._lock:
            self._pending.setdefault(cid, threading.Event())
            while len(self._pending) > 4:  # the oldest, never fetched: released
                self._pending.pop(next(iter(self._pending))).set()
            self._lock.notify_all()

    def done(self, cid: str) -> None:
        """The fetch of ``cid`` ended (stored or failed): waiting requests look again."""
        with self._lock:
            event = self._pending.pop(cid, None)
            self._lock.notify_all()
        if event is not None:
            event.set()

    def locate(self, cid: str) -> Path | None:
        """The held blob ``cid``; one being fetched here is waited for (up to
        :data:`PENDING_WAIT`), and one not known yet for :data:`NOT_YET_WAIT` (the coordinator
        may have named this worker a seed a moment before this worker's own job view came)."""
        path = self.find(cid)
        if path is not None:
            return path
        deadline = time.monotonic() + NOT_YET_WAIT
        with self._lock:
            while cid not in self._pending and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)
            event = self._pending.get(cid)
        if event is not None:
            event.wait(PENDING_WAIT)
        return self.find(cid)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    timeout = 30  # seconds a socket read or write may stall: a slow client does not hold a slot
    protocol_version = "HTTP/1.1"
    server_version = "aitbc-worker"

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _serve(self, *, body: bool) -> None:
        self.close_connection = True  # one blob per connection: no idle connection holds a thread
        blobs: BlobServer = self.server.blob_server  # type: ignore[attr-defined]
        if self.path.startswith(RECORDS) and blobs.records is not None:
            self._record(blobs, body=body)
            return
        if not blobs.slots.acquire(blocking=False):
            self._error(503, "busy", "this worker serves a few blobs at a time; try another peer")
            return
        try:
            path = self._path(blobs)
            if path is None:
                return
            try:
                f = path.open("rb")
            except FileNotFoundError:  # evicted since
                self._error(404, "unknown_blob", "this worker does not hold that blob")
                return
            with f:
                if blobs.misbehave is not None and body:
                    serve_badly(self, f, blobs.misbehave, chunk=_CHUNK)
                    return
                size = f.seek(0, 2)
                f.seek(0)
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(size))
                self.send_header("X-Aitbc-Cid", path.name)
                self.send_header("Connection", "close")
                self.end_headers()
                if body:
                    first = True
                    while block := f.read(_CHUNK):
                        if first and blobs.corrupt:
                            block = bytes([block[0] ^ 0xFF]) + block[1:]
                        first = False
                        self.wfile.write(block)
        except (BrokenPipeError, ConnectionResetError, TimeoutError) as e:  # it falls back on its own
            log.debug("peer %s went away or stalled while fetching %s: %s", self.client_address[0], self.path, e)
        finally:
            blobs.slots.release()

    def _record(self, blobs: BlobServer, *, body: bool) -> None:
        """``GET /v1/records/{job_id}[?round=R]``: this worker's signed gossip record of that
        round if it keeps it, else its newest (JSON; the reader checks the signature)."""
        assert blobs.records is not None
        url = urlsplit(self.path)
        job_id = url.path[len(RECORDS) :]
        query = parse_qs(url.query)
        raw = (query.get("round") or [""])[0]
        if not job_id or len(job_id) > 64 or not job_id.replace("_", "").isalnum() or (raw and not raw.isdigit()):
            self._error(400, "bad_request", "GET /v1/records/{job_id}[?round=R]")
            return
        signed = blobs.records(job_id, int(raw) if raw else None)
        pace = blobs.pace(job_id) if blobs.pace is not None else None
        extra = {PACE_HEADER: pace} if pace is not None else {}
        if signed is None:
            self._error(404, "no_record", "this worker published no record for that job", extra)
            return
        data = json.dumps(signed).encode()
        self.send_response(200)
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _path(self, blobs: BlobServer) -> Path | None:
        if not self.path.startswith(PREFIX):
            self._error(404, "not_found", "this worker serves only GET /v1/blobs/{cid}")
            return None
        cid = self.path[len(PREFIX) :]
        try:
            parse_cid(cid)
        except UsageError:
            self._error(400, "bad_cid", "not a CIDv1 (base32, starts with 'b')")
            return None
        path = blobs.locate(cid)
        if path is None:
            self._error(404, "unknown_blob", "this worker does not hold that blob")
        return path

    def _error(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        data = json.dumps({"error": code, "detail": detail}).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class PeerFetcher:
    """Fetch blobs from peers (see the module's docstring). ``timeout``: seconds one read
    (or the connect) may wait; the whole download gets four times that, a wall-clock
    deadline that holds however slowly the peer sends
    (:func:`aitbc.storage.peer_fetch.bounded_get`)."""

    def __init__(self, *, timeout: float) -> None:
        self.timeout = timeout
        self.http = httpx.Client(timeout=httpx.Timeout(timeout, connect=min(timeout, 3.0)), follow_redirects=False)

    def close(self) -> None:
        self.http.close()

    def download(self, url: str, cid: str, store: LocalBlobStore, *, max_bytes: int = UNBOUNDED) -> int:
        """Stream ``{url}/v1/blobs/{cid}`` into ``store``; its size. ``PeerUnavailable`` if
        the peer did not serve it (within ``4 x timeout`` seconds), ``IntegrityError`` if
        the bytes are not ``cid``, more than ``max_bytes`` (the blob's known size: refused
        at the byte past it, nothing kept) included."""
        seconds = 4 * self.timeout
        with store.writer(cid) as w:
            try:
                answer = bounded_get(
                    self.http, f"{url}{PREFIX}{cid}", seconds=seconds, max_bytes=max_bytes, take=w.write
                )
            except TooSlow:
                raise PeerUnavailable(f"peer {url} too slow: {w.size} bytes of {cid} in {seconds:g} s") from None
            except TooLong:
                raise IntegrityError(
                    f"blob {cid} from peer {url} is longer than its {max_bytes} bytes; refused at that byte, nothing kept"
                ) from None
            except httpx.HTTPError as e:
                raise PeerUnavailable(f"peer {url}: {type(e).__name__}: {e}") from None
            if answer.status != 200:
                raise PeerUnavailable(f"peer {url} answered {answer.status} for blob {cid}")
            try:
                w.commit()
            except IntegrityError:
                raise IntegrityError(
                    f"blob {cid} from peer {url} does not hash to its CID ({w.size} bytes hashing to "
                    f"{w.hasher.found()}); nothing kept"
                ) from None
            return w.size
