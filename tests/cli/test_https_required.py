"""A client given a CA certificate refuses ``http://`` coordinators (issue 33): with
``--ca-cert`` the CLI, the worker and the SDK still sent signed requests in the clear to a
plain URL, to the http entry of a failover list, or to ``AITBC_COORDINATOR``. Now each
path is one line naming the URL, exit 2, and not a byte is sent; the port below stands
for the http coordinator and counts who connects to it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from aitbc.tls import local_tls

NEEDS = "https is required when a CA is given"


class PlainPort:
    """A TCP port on loopback that accepts and closes every connection, counting them
    (what an ``http://`` coordinator, or a man in the middle, would see)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()
        self._thread.join(10)


@pytest.fixture
def plain() -> Iterator[PlainPort]:
    port = PlainPort()
    yield port
    port.close()


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> str:
    return str(local_tls(tmp_path_factory.mktemp("tls")).ca_cert)


@pytest.fixture
def cli(aitbc, monkeypatch):
    """``aitbc`` with a wallet ``w`` made, and no coordinator or CA from the test's environment."""
    for name in ("AITBC_COORDINATOR", "AITBC_CA_CERT"):
        monkeypatch.delenv(name, raising=False)
    r = aitbc("wallet", "create", "w")
    assert r.returncode == 0, r.stderr
    return aitbc


def _refused(r, url: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(lines) == 1 and url in lines[0] and NEEDS in lines[0], r.stderr


def test_the_flag_with_a_plain_url(cli, plain, ca):
    r = cli("--ca-cert", ca, "wallet", "fund", "w", "5", "--coordinator", plain.url)
    _refused(r, plain.url)
    assert plain.connections == 0


def test_an_http_entry_of_a_failover_list(cli, plain, ca, monkeypatch):
    monkeypatch.setenv("AITBC_CA_CERT", ca)
    dead_https = "https://127.0.0.1:1"  # first: the client would have failed over to the http one
    r = cli("wallet", "fund", "w", "5", "--coordinator", f"{dead_https},{plain.url}")
    _refused(r, plain.url)
    assert plain.connections == 0


def test_the_environments_coordinator(cli, plain, ca, monkeypatch):
    monkeypatch.setenv("AITBC_COORDINATOR", plain.url)
    r = cli("--ca-cert", ca, "market", "offers")
    _refused(r, plain.url)
    r = cli("--ca-cert", ca, "wallet", "fund", "w", "5")
    _refused(r, plain.url)
    assert plain.connections == 0


def test_a_worker_given_a_ca(cli, plain, ca):
    r = cli("worker", "start", "--coordinator", plain.url, "--ca-cert", ca, "--wallet", "w", timeout=120)
    _refused(r, plain.url)
    assert plain.connections == 0


def test_without_a_ca_http_is_still_spoken_and_https_with_one(cli, plain, ca):
    """The check is the CA's alone: without one the client connects to the http URL (and
    this port, which closes at once, is unreachable: exit 1); with one an https URL passes
    it (nothing listens there: unreachable too, not refused)."""
    r = cli("wallet", "fund", "w", "5", "--coordinator", plain.url)
    assert r.returncode == 1 and NEEDS not in r.stderr, r.stderr
    assert plain.connections >= 1
    https = plain.url.replace("http://", "https://")
    r = cli("--ca-cert", ca, "market", "offers", "--coordinator", https)
    assert r.returncode == 1 and NEEDS not in r.stderr, r.stderr


# --- the SDK and the client library -----------------------------------------------------------


def test_the_sdk_refuses_at_configuration(tmp_path, plain, ca, monkeypatch):
    from aitbc_agent_sdk import AgentConfig, HttpsRequired, InvalidArgument

    monkeypatch.delenv("AITBC_CA_CERT", raising=False)
    monkeypatch.delenv("AITBC_COORDINATOR", raising=False)
    for url in (plain.url, f"https://127.0.0.1:1,{plain.url}"):
        with pytest.raises(HttpsRequired, match=NEEDS) as e:
            AgentConfig(name="a", home=tmp_path, coordinator_url=url, ca_cert=ca)
        assert isinstance(e.value, InvalidArgument) and e.value.code == "https_required"
        assert plain.url in e.value.detail
    monkeypatch.setenv("AITBC_COORDINATOR", plain.url)
    with pytest.raises(HttpsRequired, match=plain.url):
        AgentConfig(name="a", home=tmp_path, ca_cert=ca)
    monkeypatch.setenv("AITBC_CA_CERT", ca)  # the CA from the environment, the URL too
    with pytest.raises(HttpsRequired, match=plain.url):
        AgentConfig(name="a", home=tmp_path)
    # the local stack's CA (aitbc up --tls writes it into HOME/stack.json) counts as given
    monkeypatch.delenv("AITBC_CA_CERT")
    (tmp_path / "stack.json").write_text(f'{{"coordinator": "https://127.0.0.1:1", "ca_cert": "{ca}"}}')
    with pytest.raises(HttpsRequired, match=plain.url):
        AgentConfig(name="a", home=tmp_path)
    monkeypatch.delenv("AITBC_COORDINATOR")
    assert AgentConfig(name="a", home=tmp_path).resolved_coordinator_urls == ["https://127.0.0.1:1"]
    assert plain.connections == 0


def test_the_client_library_refuses_at_construction(plain, ca, monkeypatch):
    from aitbc.client import CoordinatorClient, HttpsRequired
    from aitbc.errors import UsageError

    monkeypatch.delenv("AITBC_CA_CERT", raising=False)
    with pytest.raises(HttpsRequired, match=NEEDS) as e:
        CoordinatorClient(f"https://127.0.0.1:1,{plain.url}", ca_cert=ca)
    assert isinstance(e.value, UsageError) and e.value.exit_code == 2 and plain.url in str(e.value)
    monkeypatch.setenv("AITBC_CA_CERT", ca)
    with pytest.raises(HttpsRequired, match=plain.url):
        CoordinatorClient(plain.url)
    CoordinatorClient("https://127.0.0.1:1").close()  # https with the CA: built
    assert plain.connections == 0
