"""Money through the real console script against a real coordinator process: ``aitbc
wallet fund/balance/send/history``, ``aitbc ledger entries`` and ``aitbc ledger verify``
(through the API, and offline on the database), then the database tampered with by hand
and the audit failing on the entry touched. The coordinator's database is of the backend
under test (SQLite, or PostgreSQL with ``AITBC_TEST_DB=postgresql``). Bad input is one ``error:`` line, a
non-zero exit, and no ledger entry."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

AITBC = Path(sys.executable).parent / "aitbc"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CoordinatorProcess:
    """``aitbc coordinator serve`` on a free port, in its own process group."""

    def __init__(self, home: Path, db_url: str) -> None:
        self.home, self.db_url, self.proc, self.url = home, db_url, None, None

    def start(self) -> str:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = (self.home.parent / "coordinator.log").open("ab")
        self.proc = subprocess.Popen(
            [
                str(AITBC),
                "coordinator",
                "serve",
                "--home",
                str(self.home),
                "--port",
                str(port),
                "--db",
                self.db_url,
                "--log-level",
                "warning",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    return self.url
            except httpx.TransportError:
                pass
            assert self.proc.poll() is None, (self.home.parent / "coordinator.log").read_text()[-3000:]
            time.sleep(0.05)
        raise RuntimeError("coordinator did not start")

    def stop(self) -> None:
        """A clean stop (SIGTERM: the database is closed and its WAL checkpointed)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)
        self.proc = None

    def entries(self) -> int:
        return httpx.get(f"{self.url}/v1/ledger", timeout=10).json()["entries"]


@pytest.fixture
def coordinator(tmp_path, monkeypatch, databases):
    url = databases.new(tmp_path / "coord")
    c = CoordinatorProcess(tmp_path / "coord", url)
    monkeypatch.setenv("AITBC_COORDINATOR", c.start())
    yield c
    c.stop()
    databases.drop(url)


def ok(result) -> str:
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result.stdout


def one_line_error(result, code: int = 1, *words: str) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    for w in words:
        assert w in result.stderr, (w, result.stderr)
    return result.stderr


def address(aitbc, name: str) -> str:
    return json.loads((aitbc.home / "wallets" / name / "key.json").read_text())["address"]


SWAP_2_3 = (
    "UPDATE ledger_entries SET seq = -1 WHERE seq = 2",
    "UPDATE ledger_entries SET seq = 2 WHERE seq = 3",
    "UPDATE ledger_entries SET seq = 3 WHERE seq = -1",
)


@pytest.mark.long  # a minute or more of real processes: make test-long (and test-pg)
def test_money_workflow_and_tamper_evident_ledger(aitbc, coordinator, tmp_path, databases):
    for name in ("alice", "bob"):
        ok(aitbc("wallet", "create", name))
    out = ok(aitbc("wallet", "fund", "alice", "100"))
    assert out.strip() == "Funded alice with 100 AIT (ledger entry 1); balance 100 AIT"
    bob = address(aitbc, "bob")
    out = ok(aitbc("wallet", "send", "alice", "bob", "12.5"))
    assert out.strip() == f"Sent 12.5 AIT from alice to {bob} (ledger entry 2); balance 87.5 AIT"
    funded = json.loads(ok(aitbc("wallet", "fund", "bob", "3", "--json")))
    assert (funded["amount"], funded["balance"]) == ("3", "15.5")  # money in --json: decimal strings of AIT
    ok(aitbc("wallet", "send", "bob", "alice", "1.000001"))
    sent = json.loads(ok(aitbc("wallet", "send", "alice", bob, "0.5", "--json")))  # to an address, too
    assert (sent["amount"], sent["balance"]) == ("0.5", "88.000001")
    assert ok(aitbc("wallet", "balance", "bob")).strip() == f"bob ({bob}): 14.999999 AIT on local"
    bal = json.loads(ok(aitbc("wallet", "balance", "alice", "--json")))
    assert (bal["balance"], bal["balance_micro"], bal["name"]) == ("88.000001", 88_000_001, "alice")

    hist = ok(aitbc("wallet", "history", "alice"))
    for text in ("mint", "+100", "-12.5", "+1.000001", "-0.5"):
        assert text in hist, (text, hist)

    listed = ok(aitbc("ledger", "entries"))
    for text in ("seq", "transfer", "mint:local", "12.5", "1.000001"):
        assert text in listed, (text, listed)
    page = json.loads(ok(aitbc("ledger", "entries", "--after", "3", "--limit", "1", "--json")))
    assert [e["seq"] for e in page["data"]] == [4] and page["next"] == 4
    # the ledger's signed amount stays micro-AIT; amount_ait beside it is the decimal string
    assert (page["data"][0]["amount_ait"], page["data"][0]["amount"]) == ("1.000001", 1_000_001)
    history = json.loads(ok(aitbc("wallet", "history", "bob", "--json")))["data"]
    assert all(isinstance(e["amount_ait"], str) and isinstance(e["amount"], int) for e in history)

    out = ok(aitbc("ledger", "verify"))
    assert out.startswith("ledger OK: 5 entries, head "), out
    result = json.loads(ok(aitbc("ledger", "verify", "--json")))
    assert result["ok"] and result["entries"] == 5 and result["minted"] == 103_000_000
    assert result["system_key_from"] == "GET /v1/ledger" and result["network"] == "local"
    system_key = result["system_key"]
    one_line_error(aitbc("ledger", "verify", "--system-key", "ab" * 32), 1, "not the --system-key")

    # Offline, on the database: the key comes from the coordinator's home (or --system-key).
    coordinator.stop()
    url = coordinator.db_url
    assert ok(aitbc("ledger", "verify", "--db", url, "--home", str(coordinator.home))).startswith(
        "ledger OK: 5 entries"
    )
    one_line_error(aitbc("ledger", "verify", "--db", url), 2, "--system-key", "coordinator's home")
    one_line_error(
        aitbc("ledger", "verify", "--db", url, "--system-key", "ab" * 32), 1, "entry 1 (", "not the coordinator's key"
    )
    one_line_error(
        aitbc("ledger", "verify", "--db", f"sqlite:///{tmp_path}/none.db", "--system-key", system_key),
        1,
        "no database file",
    )
    assert not (tmp_path / "none.db").exists()

    cases = {  # tamper -> what the one error line must say
        "amount": (
            ("UPDATE ledger_entries SET amount = amount + 1 WHERE seq = 2",),
            "error: entry 2 (",
            "hash does not match",
        ),
        "delete": (("DELETE FROM ledger_entries WHERE seq = 3",), "error: entry 3: ", "out of sequence"),
        "delete-last": (("DELETE FROM ledger_entries WHERE seq = 5",), "error: entry 5: ", "last entries were deleted"),
        "swap": (SWAP_2_3, "error: entry 2 (", "does not link"),
        "balance": (
            ("UPDATE ledger_accounts SET balance = balance + 1 WHERE name LIKE 'wallet:%'",),
            "error: ledger: cached balance of wallet:",
            "",
        ),
    }
    copies = {}
    for name, (statements, start, words) in cases.items():
        copies[name] = databases.copy(url, tmp_path / name)
        databases.sql(copies[name], *statements)
        r = aitbc("ledger", "verify", "--db", copies[name], "--home", str(coordinator.home))
        line = one_line_error(r, 1, words)
        assert line.startswith(start), (name, line)
        assert r.stdout == ""
    r = aitbc("ledger", "verify", "--db", copies["swap"], "--system-key", system_key, "--json")
    assert r.returncode == 1
    as_json = json.loads(r.stdout)
    assert (as_json["ok"], as_json["bad_seq"], as_json["system_key_from"]) == (False, 2, "--system-key")
    assert "does not link" in as_json["problem"] and as_json["description"].startswith("entry 2 (")

    # Through the API: the tampered database served by a restarted coordinator.
    databases.sql(coordinator.db_url, "UPDATE ledger_entries SET amount = amount + 1 WHERE seq = 2")
    url = coordinator.start()
    one_line_error(aitbc("ledger", "verify", "--coordinator", url), 1, "entry 2 (", "hash does not match")
    # ... and tampered while it runs: the edit undone, two entries swapped under it.
    databases.sql(coordinator.db_url, "UPDATE ledger_entries SET amount = amount - 1 WHERE seq = 2", *SWAP_2_3)
    one_line_error(aitbc("ledger", "verify", "--coordinator", url), 1, "entry 2 (", "does not link")


def test_bad_money_input_is_one_line_and_writes_nothing(aitbc, coordinator):
    for name in ("alice", "bob"):
        ok(aitbc("wallet", "create", name))
    ok(aitbc("wallet", "fund", "alice", "5"))
    before = coordinator.entries()
    alice = address(aitbc, "alice")
    cases = [
        (
            ("wallet", "send", "alice", "bob", "5.000001"),
            1,
            [f"wallet {alice} holds 5 AIT", "5.000001 AIT needed", "aitbc wallet fund alice 0.000001"],
        ),
        # amounts are usage errors, caught before any request (exit 2); 0 is never said to be allowed
        (("wallet", "send", "alice", "bob", "0"), 2, ["amount must be more than 0 AIT; got 0"]),
        (("wallet", "send", "alice", "bob", "-1"), 2, ["amount must be more than 0 AIT; got -1"]),
        (("wallet", "send", "alice", "bob", "--", "-1"), 2, ["amount must be more than 0 AIT; got -1"]),
        (("wallet", "send", "alice", "bob", "0.0000001"), 2, ["more than 6 decimals"]),
        (("wallet", "send", "alice", "carol", "1"), 1, ["no wallet 'carol'"]),
        (("wallet", "send", "alice", "ait1" + "z" * 40, "1"), 2, ["is not a wallet address"]),  # the 422: usage
        (
            ("wallet", "send", "alice", "bob", "1", "--network", "mainnet"),
            2,
            ["network 'mainnet' is not available", "--network local"],
        ),
        (
            ("wallet", "fund", "alice", "1", "--network", "testnet"),
            2,
            ["network 'testnet' is not available", "--network local"],
        ),
        (("wallet", "balance", "alice", "--network", "devnet"), 2, ["unknown network 'devnet'"]),
        (("ledger", "entries", "--limit", "0"), 2, ["--limit"]),
        (("ledger", "verify", "--coordinator", f"http://127.0.0.1:{free_port()}"), 1, ["unreachable"]),
    ]
    for args, code, words in cases:
        r = aitbc(*args)
        one_line_error(r, code, *words)
        assert r.stdout == "", (args, r.stdout)
    assert coordinator.entries() == before
    assert ok(aitbc("wallet", "balance", "alice")).strip().endswith(": 5 AIT on local")
    assert ok(aitbc("ledger", "verify")).startswith(f"ledger OK: {before} entries")


def test_offline_verify_of_what_is_not_a_ledger(aitbc, tmp_path, databases):
    key = "ab" * 32
    (tmp_path / "garbage.db").write_text("not a database")
    one_line_error(
        aitbc("ledger", "verify", "--db", f"sqlite:///{tmp_path}/garbage.db", "--system-key", key),
        1,
        "cannot read the ledger",
        "file is not a database",
    )
    other = databases.new(tmp_path / "other")  # a database of the backend under test, with no ledger in it
    databases.sql(other, "CREATE TABLE t (a INTEGER)")
    missing = "no such table" if databases.backend == "sqlite" else "does not exist"
    one_line_error(aitbc("ledger", "verify", "--db", other, "--system-key", key), 1, "cannot read the ledger", missing)
    one_line_error(aitbc("ledger", "verify", "--db", "not a url", "--system-key", key), 2, "not a database URL")
    one_line_error(aitbc("ledger", "verify", "--db", other, "--system-key", "zz"), 2, "not a public key")
    databases.drop(other)
