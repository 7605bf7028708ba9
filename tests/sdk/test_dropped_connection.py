"""The keep-alive race: a server closes a pooled connection just as the client sends on it
("Server disconnected without sending a response"). Idempotent requests (reads, blob
uploads) are sent once more, signed afresh, on a new connection; a signed POST, which may
have been applied, is not: the caller gets the one-line unreachable error.

The server here is a plain socket on 127.0.0.1 that speaks just enough HTTP/1.1 to answer
with keep-alive, and drops the requests it is told to after reading them in full, so the
client cannot tell a drop from a server that closed the connection as the request arrived."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from aitbc.client import CoordinatorClient, Unreachable
from aitbc.ledger.signing import HEADER_NONCE
from aitbc.ledger.wallet import Wallet, create_wallet
from aitbc.replies.money import Balance
from aitbc.storage.cid import cid_of_bytes
from aitbc_agent_sdk import Agent, AgentConfig, AsyncAgent
from aitbc_agent_sdk.errors import CoordinatorUnreachable


@dataclass
class Seen:
    method: str
    path: str
    nonce: str | None
    connection: int
    body: bytes


@dataclass
class Server:
    """Answers every request ``200`` with ``reply`` (keep-alive; ``{"ok": true}`` unless
    told otherwise), except the ones whose index (0-based, over all connections) is in
    ``drop``: read whole, then the connection closed."""

    drop: set[int]
    reply: bytes = b'{"ok": true}'
    seen: list[Seen] = field(default_factory=list)
    sock: socket.socket = field(default_factory=socket.socket)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def serve(self) -> None:
        n = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            n += 1
            threading.Thread(target=self._connection, args=(conn, n), daemon=True).start()

    def _connection(self, conn: socket.socket, number: int) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ")
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
                length = int(headers.get("content-length", "0"))
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                index = len(self.seen)
                self.seen.append(Seen(method, path, headers.get(HEADER_NONCE.lower()), number, body))
                if index in self.drop:
                    return  # closed without a response
                reply = self.reply
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(reply)}\r\n\r\n".encode()
                    + reply
                )


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server(drop=set())
    srv.sock.bind(("127.0.0.1", 0))
    srv.sock.listen()
    threading.Thread(target=srv.serve, daemon=True).start()
    yield srv
    srv.sock.close()


def test_a_read_on_a_dropped_connection_is_sent_again_on_a_new_one(server):
    server.drop = {1}
    with CoordinatorClient(server.url) as c:
        assert c.get("/health") == {"ok": True}  # opens the pooled connection
        assert c.get("/runs") == {"ok": True}  # sent on it, dropped, sent again
    assert [(s.path, s.connection) for s in server.seen] == [("/v1/health", 1), ("/v1/runs", 1), ("/v1/runs", 2)]


def test_a_signed_post_on_a_dropped_connection_is_not_sent_again(server):
    server.drop = {1}
    with CoordinatorClient(server.url, Wallet.generate("w")) as c:
        c.get("/health")
        with pytest.raises(Unreachable, match="127.0.0.1"):
            c.post("/wallets/send", {"to": "ait1x", "amount": "1"})
    assert [s.path for s in server.seen] == ["/v1/health", "/v1/wallets/send"]


def test_a_blob_upload_is_sent_again_with_a_fresh_signature(server):
    server.drop = {1}
    blob = b"x" * 3000
    cid = cid_of_bytes(blob)
    with CoordinatorClient(server.url, Wallet.generate("w")) as c:
        c.get("/health")
        assert c.put_blob(cid, blob) == {"ok": True}
    first, again = server.seen[1:]
    assert first.path == again.path == f"/v1/blobs/{cid}" and first.body == again.body == blob
    assert first.nonce and again.nonce and first.nonce != again.nonce  # a replayed nonce would be refused


def test_a_read_dropped_twice_fails_with_one_line(server):
    server.drop = {1, 2}
    with CoordinatorClient(server.url) as c:
        c.get("/health")
        with pytest.raises(Unreachable) as e:
            c.get("/runs")
    assert "\n" not in str(e.value)
    assert [s.path for s in server.seen] == ["/v1/health", "/v1/runs", "/v1/runs"]


def _agent_config(tmp_path, url: str) -> AgentConfig:
    create_wallet(tmp_path, "sdk")
    return AgentConfig(name="t", wallet_name="sdk", home=tmp_path, coordinator_url=url)


BALANCE = {"address": "ait1" + "0" * 40, "network": "local", "balance": "1.5", "balance_micro": 1_500_000}


def test_the_sdk_sends_a_read_again_and_never_a_post(server, tmp_path):
    server.drop, server.reply = {1, 3}, json.dumps(BALANCE).encode()
    with Agent(_agent_config(tmp_path, server.url)) as a:
        a.get_balance()
        assert a.get_balance() == Balance(**BALANCE)  # dropped once, sent again
        with pytest.raises(CoordinatorUnreachable):
            a.transfer_funds("ait1" + "0" * 40, 1)
    assert [s.method for s in server.seen] == ["GET", "GET", "GET", "POST"]
    assert server.seen[1].nonce != server.seen[2].nonce or server.seen[1].nonce is None


def test_the_async_sdk_sends_a_read_again_and_never_a_post(server, tmp_path):
    server.drop, server.reply = {1, 3}, json.dumps(BALANCE).encode()

    async def go() -> None:
        async with AsyncAgent(_agent_config(tmp_path, server.url)) as a:
            await a.get_balance()
            assert await a.get_balance() == Balance(**BALANCE)
            with pytest.raises(CoordinatorUnreachable):
                await a.transfer_funds("ait1" + "0" * 40, 1)

    asyncio.run(go())
    assert [s.method for s in server.seen] == ["GET", "GET", "GET", "POST"]
    assert json.loads(server.seen[3].body)["amount"]


def test_a_reply_of_another_shape_is_an_agent_error_naming_the_call(server, tmp_path):
    from aitbc_agent_sdk import AgentError

    with Agent(_agent_config(tmp_path, server.url)) as a, pytest.raises(AgentError) as e:
        a.get_balance()  # the server answers {"ok": true}: no Balance
    assert e.value.code == "bad_reply" and "/v1/wallets/" in e.value.detail and "Balance" in e.value.detail
