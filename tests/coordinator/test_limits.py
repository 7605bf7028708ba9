"""Requests are bounded before they are parsed (issue 12 part 6) and errors leak nothing
(part 7), against a real coordinator process (``aitbc coordinator serve``, SQLite) on a
loopback port chosen at run time.

- a JSON body over ``max_json_bytes`` is refused 413 ``body_too_large``: at once when its
  Content-Length says so, and while it is read when it is chunked; the server's RSS does not
  grow by the bodies' size;
- a signed route's headers are checked before the body is read (401, no body bytes read);
- at most ``max_uploads`` blob uploads are in flight (429 ``too_many_uploads``);
- health and heartbeats keep answering during a flood of oversized bodies;
- NaN / Infinity anywhere in any JSON body is refused 422 with our error body.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from aitbc.client import ApiError, CoordinatorClient
from aitbc.ledger.signing import sign_request
from aitbc.ledger.wallet import Wallet
from aitbc.storage.cid import cid_of_bytes

AITBC = Path(sys.executable).parent / "aitbc"
MIB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, home: Path, *flags: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / "coordinator.log"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        args = [str(AITBC), "coordinator", "serve", "--home", str(home / "c"), "--port", str(self.port)]
        with self.log.open("ab") as out:
            self.p = subprocess.Popen(
                [*args, "--log-level", "warning", *flags], stdout=out, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + 180  # a loaded CI machine starts slowly
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert self.p.poll() is None, self.log.read_text()
            time.sleep(0.1)
        raise RuntimeError(f"coordinator did not start:\n{self.log.read_text()}")

    def rss(self) -> int:
        return psutil.Process(self.p.pid).memory_info().rss

    def close(self) -> None:
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


@pytest.fixture(scope="module")
def coord(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    c = Proc(tmp_path_factory.mktemp("limits"), "--max-uploads", "2", "--lease", "600")
    yield c
    c.close()


def raw(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str],
    *,
    declared: int | None = None,
    send: int = 0,
    chunk: int = MIB,
) -> tuple[int | None, dict, int]:
    """Send a request by hand: ``declared`` as its Content-Length (None: chunked), then up to
    ``send`` body bytes, stopping as soon as the server answers. Returns (status, JSON body,
    bytes sent); status None if the connection was dropped with no answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    head.append(f"Content-Length: {declared}" if declared is not None else "Transfer-Encoding: chunked")
    sent = 0
    data = b""
    try:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        block = b"x" * chunk
        while sent < send:
            if select.select([s], [], [], 0)[0]:
                break  # the server has answered (or closed): stop sending
            s.sendall(block if declared is not None else f"{len(block):x}\r\n".encode() + block + b"\r\n")
            sent += len(block)
        s.settimeout(30)
        while b"\r\n\r\n" not in data or len(data) < _length(data):
            more = s.recv(65536)
            if not more:
                break
            data += more
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        s.close()
    if not data.startswith(b"HTTP/1.1 "):
        return None, {}, sent
    status = int(data.split()[1])
    body = data.split(b"\r\n\r\n", 1)[1]
    return status, (json.loads(body) if body else {}), sent


def _length(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return 0


def signed_headers(method: str, path: str, body: bytes = b"") -> dict[str, str]:
    return sign_request(Wallet.generate("flood"), method, path, body)


def test_declared_oversized_json_is_refused_before_reading(coord: Proc) -> None:
    before = coord.rss()
    for _ in range(3):  # 3 x 512 MiB declared, unsigned: answered from the headers
        status, body, _ = raw(coord.port, "POST", "/v1/workers/heartbeat", {}, declared=512 * MIB, send=8 * MIB)
        assert status == 413, body
        assert body["error"] == "body_too_large"
    assert coord.rss() - before < 64 * MIB


def test_unsigned_chunked_json_is_refused_before_reading(coord: Proc) -> None:
    status, body, sent = raw(coord.port, "POST", "/v1/wallets/send", {}, send=256 * MIB)
    assert status == 401, body
    assert body["error"] == "missing_signature"
    assert sent < 256 * MIB  # answered long before the whole body was sent


def test_bad_timestamp_is_refused_before_reading(coord: Proc) -> None:
    h = signed_headers("POST", "/v1/wallets/send")
    h["X-Aitbc-Timestamp"] = str(int(time.time()) - 100_000)
    status, body, _ = raw(coord.port, "POST", "/v1/wallets/send", h, declared=100, send=0)
    assert (status, body["error"]) == (401, "expired_signature")
    h["X-Aitbc-Timestamp"] = "nan"
    status, body, _ = raw(coord.port, "POST", "/v1/wallets/send", h, declared=100, send=0)
    assert (status, body["error"]) == (401, "bad_signature")


def test_chunked_oversized_json_is_cut_while_read(coord: Proc) -> None:
    """Well-formed signature headers (for another body) pass the pre-check; the chunked body
    is counted as it arrives and refused once past 1 MiB, never held whole."""
    before = coord.rss()
    for _ in range(3):
        path = "/v1/workers/heartbeat"
        status, body, sent = raw(coord.port, "POST", path, signed_headers("POST", path), send=256 * MIB)
        assert status == 413, body
        assert body["error"] == "body_too_large"
        assert sent < 256 * MIB
    assert coord.rss() - before < 64 * MIB


def test_json_under_the_limit_still_works(coord: Proc) -> None:
    c = CoordinatorClient(coord.url, Wallet.generate("w"))
    c.post("/workers", {"gpu": "RTX3090", "price": "1"})
    assert c.post("/workers/heartbeat")
    c.close()


def test_uploads_in_flight_are_capped(coord: Proc) -> None:
    """Two uploads hold their slots (headers sent, body trickling); a third is refused 429."""
    cid = cid_of_bytes(b"x" * 1_000_000)
    socks = []
    try:
        for _ in range(2):
            path = f"/v1/blobs/{cid}"
            h = sign_request(Wallet.generate("u"), "PUT", path, unsigned_payload=True)
            s = socket.create_connection(("127.0.0.1", coord.port), timeout=10)
            head = [f"PUT {path} HTTP/1.1", "Host: x", "Content-Length: 1000000"] + [f"{k}: {v}" for k, v in h.items()]
            s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b"x" * 10)
            socks.append(s)
        time.sleep(0.5)
        path = f"/v1/blobs/{cid}"
        h = sign_request(Wallet.generate("u"), "PUT", path, unsigned_payload=True)
        status, body, _ = raw(coord.port, "PUT", path, h, declared=10, send=0)
        assert status == 429, body
        assert body["error"] == "too_many_uploads"
    finally:
        for s in socks:
            s.close()
    time.sleep(0.5)  # the slots are free again once the uploads are gone
    h = sign_request(Wallet.generate("u"), "PUT", path, unsigned_payload=True)
    status, body, _ = raw(coord.port, "PUT", path, h, declared=3, send=3, chunk=3)
    assert status == 400 and body["error"] != "too_many_uploads", body  # taken, then refused: bad hash


def test_health_and_heartbeats_answer_during_a_flood(coord: Proc) -> None:
    c = CoordinatorClient(coord.url, Wallet.generate("hb"))
    c.post("/workers", {"gpu": "RTX3090", "price": "1"})
    stop = threading.Event()

    def flood(signed: bool) -> None:
        path = "/v1/workers/heartbeat"
        while not stop.is_set():
            h = signed_headers("POST", path) if signed else {}
            raw(coord.port, "POST", path, h, declared=None if signed else 512 * MIB, send=128 * MIB)

    threads = [threading.Thread(target=flood, args=(i % 2 == 0,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    before = coord.rss()
    try:
        worst = 0.0
        for _ in range(20):
            t0 = time.monotonic()
            assert httpx.get(f"{coord.url}/v1/health", timeout=5).status_code == 200
            assert c.post("/workers/heartbeat")
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.05)
        assert worst < 5  # answered (the latency target is bench/flood.py's)
        assert coord.rss() - before < 128 * MIB
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        c.close()


NAN, INF = float("nan"), float("inf")
# Every route with a float field (one non-finite value each; other fields may be missing: the
# refusal comes first). Unknown ids are fine: the body is refused before the route runs.
NAN_BODIES = [
    ("/workers", {"gpu": "RTX3090", "price": "1", "availability": NAN}),
    ("/workers", {"gpu": "RTX3090", "price": INF}),
    ("/workers", {"gpu": "RTX3090", "price": "1", "max_bond": -INF}),
    ("/workers", {"gpu": "RTX3090", "price": "1", "device": {"mem": [1, -INF]}}),
    ("/jobs/x/progress", {"progress": NAN}),
    ("/jobs/x/progress", {"progress": 1, "loss": INF}),
    ("/jobs/x/progress", {"progress": 1, "epoch": NAN}),
    ("/jobs/x/updates", {"train_loss": NAN}),
    ("/jobs/x/updates", {"compute_seconds": INF}),
    ("/wallets/fund", {"amount": NAN}),
    ("/wallets/send", {"to": "x", "amount": NAN}),
    ("/runs", {"model_type": "mlp", "dataset_size": "1", "target_workers": 1, "budget": NAN}),
    ("/runs", {"model_type": "mlp", "dataset_size": "1", "target_workers": 1, "bond": INF}),
    ("/runs", {"model_type": "mlp", "dataset_size": "1", "target_workers": 1, "model_options": {"x": NAN}}),
    ("/runs/x/discover", {"required_workers": 1, "max_price": NAN}),
    ("/runs/x/contracts", {"price": INF}),
    ("/runs/x/distribute", {"lr": NAN}),
    ("/runs/x/distribute", {"deadline": INF}),
    ("/runs/x/distribute", {"max_cost": NAN}),
    ("/runs/x/distribute", {"outer_options": {"lr": NAN}}),
    ("/runs/x/payments", {"amount": -INF}),
    ("/jobs/x/config", {"lr": NAN}),
    ("/runs/x/aggregate", {"weights": [1.0, NAN]}),
]


@pytest.mark.parametrize(("path", "body"), NAN_BODIES)
def test_non_finite_numbers_are_refused(coord: Proc, path: str, body: dict) -> None:
    c = CoordinatorClient(coord.url, Wallet.generate("nan"))
    try:
        with pytest.raises(ApiError) as e:
            c.post(path, body)  # json.dumps writes NaN / Infinity / -Infinity
        assert e.value.status == 422, e.value
        assert e.value.code == "invalid_request"
        assert "NaN" in e.value.detail or "finite" in e.value.detail
    finally:
        c.close()


# --- PostgreSQL: concurrent first writes, NaN ---------------------------------------------------


@pytest.fixture
def pg_coord(tmp_path: Path, databases) -> Iterator[Proc]:
    url = databases.new(tmp_path / "db", backend="postgresql")
    c = Proc(tmp_path, "--db", url)
    try:
        yield c
    finally:
        c.close()
        databases.drop(url)


def test_concurrent_first_writes_on_postgresql(pg_coord: Proc) -> None:
    """An empty ledger, 12 faucet requests at once: each is the 'first write' that creates the
    head row; none may fail on its duplicate key (it was a 500)."""
    n = 12
    clients = [CoordinatorClient(pg_coord.url, Wallet.generate(f"f{i}")) for i in range(n)]
    gate = threading.Barrier(n)
    results: list[object] = [None] * n

    def fund(i: int) -> None:
        gate.wait()
        try:
            results[i] = clients[i].post("/wallets/fund", {"amount": "5"})
        except ApiError as e:
            results[i] = e

    threads = [threading.Thread(target=fund, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not [r for r in results if isinstance(r, ApiError)], results
    for c in clients:
        assert c.get(f"/wallets/{c.wallet.address}/balance")
    info = clients[0].get("/ledger")
    assert info["entries"] == n
    # NaN in a JSON field on PostgreSQL: refused at parse time, not a 500 with SQL in it
    with pytest.raises(ApiError) as e:
        clients[0].post("/wallets/fund", {"amount": float("nan")})
    assert (e.value.status, e.value.code) == (422, "invalid_request")
    assert clients[0].get("/ledger")["entries"] == n
    verify = subprocess.run(
        [str(AITBC), "ledger", "verify", "--coordinator", pg_coord.url], capture_output=True, text=True, timeout=120
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    for c in clients:
        c.close()
