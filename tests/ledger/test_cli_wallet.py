"""``aitbc wallet`` through the real console script (the ``aitbc`` fixture: AITBC_HOME set)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from eth_account import Account

from aitbc.ledger.evm_keys import create_evm_account, evm_address, evm_key_path
from aitbc.ledger.wallet import address_of, create_wallet


def _one_line_error(result, code: int) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def _private_key(aitbc, name: str) -> str:
    return json.loads((aitbc.home / "wallets" / name / "key.json").read_text())["private_key"]


def test_create_prints_name_and_address(aitbc):
    result = aitbc("wallet", "create", "alice")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "Wallet created: alice"
    assert lines[1].startswith("Address: ait1") and len(lines[1]) == len("Address: ") + 44
    assert lines[2] == "EVM address: none yet (made at its first on-chain use, or by: aitbc wallet evm alice)"
    assert not evm_key_path(aitbc.home, "alice").exists()
    key_file = aitbc.home / "wallets" / "alice" / "key.json"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert _private_key(aitbc, "alice") not in result.stdout + result.stderr


def test_create_json(aitbc):
    result = aitbc("wallet", "create", "bob", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data) == {"name", "address", "evm_address", "public_key", "created", "existed"}
    assert data["name"] == "bob"
    assert data["address"] == address_of(data["public_key"])
    assert data["evm_address"] is None and evm_address(aitbc.home, "bob") is None


def test_list_and_show(aitbc):
    for name in ("carol", "alice"):
        assert aitbc("wallet", "create", name).returncode == 0
    listed = aitbc("wallet", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.index("alice") < listed.stdout.index("carol")
    data = json.loads(aitbc("wallet", "list", "--json").stdout)
    assert data["count"] == 2
    assert [w["name"] for w in data["data"]] == ["alice", "carol"]
    for wallet in data["data"]:
        assert wallet["address"] in listed.stdout  # never cut short

    shown = aitbc("wallet", "show", "alice")
    assert shown.returncode == 0, shown.stderr
    alice = data["data"][0]
    for value in (alice["name"], alice["address"], alice["public_key"], alice["created"], "key.json"):
        assert value in shown.stdout
    assert alice["evm_address"] is None  # made at its first on-chain use
    assert "EVM address: none yet (made at its first on-chain use, or by: aitbc wallet evm alice)" in shown.stdout
    assert _private_key(aitbc, "alice") not in shown.stdout + shown.stderr

    as_json = json.loads(aitbc("wallet", "show", "alice", "--json").stdout)
    assert as_json == {**alice, "path": str(aitbc.home / "wallets" / "alice" / "key.json")}
    assert "private_key" not in as_json


def test_home_option_beats_the_environment(aitbc, tmp_path):
    other = tmp_path / "other"
    assert aitbc("wallet", "create", "x", "--home", str(other)).returncode == 0
    assert (other / "wallets" / "x" / "key.json").is_file()
    assert json.loads(aitbc("wallet", "list", "--json").stdout) == {"data": [], "count": 0}


def test_list_without_wallets(aitbc):
    result = aitbc("wallet", "list")
    assert result.returncode == 0
    assert result.stdout == ""
    assert result.stderr.strip() == f"no wallets in {aitbc.home / 'wallets'}"


def test_create_again_leaves_the_wallet_and_says_so(aitbc):
    """The README's setup line (``wallet create NAME && wallet fund NAME 100``) run twice
    funds twice: the second create keeps the key (it may hold money) and exits 0."""
    first = json.loads(aitbc("wallet", "create", "alice", "--json").stdout)
    key = _private_key(aitbc, "alice")
    again = aitbc("wallet", "create", "alice")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        "Wallet exists: alice (left unchanged)",
        f"Address: {first['address']}",
        "EVM address: none yet (made at its first on-chain use, or by: aitbc wallet evm alice)",
    ]
    assert _private_key(aitbc, "alice") == key
    as_json = json.loads(aitbc("wallet", "create", "alice", "--json").stdout)
    assert as_json == {**first, "existed": True} and first["existed"] is False


def test_create_again_refuses_what_it_cannot_keep(aitbc, tmp_path):
    assert aitbc("wallet", "create", "alice").returncode == 0
    key = _private_key(aitbc, "alice")
    # asked for an encrypted wallet, has a plaintext one: not reported as done
    err = _one_line_error(aitbc("wallet", "create", "alice", "--encrypt"), 1)
    assert "wallet 'alice' already exists unencrypted" in err and "another name" in err
    assert _private_key(aitbc, "alice") == key
    # the name's key file replaced by another key: refused as every use refuses it
    assert aitbc("wallet", "create", "mallory", "--home", str(tmp_path / "m")).returncode == 0
    planted = (tmp_path / "m" / "wallets" / "mallory" / "key.json").read_text().replace('"mallory"', '"alice"')
    (aitbc.home / "wallets" / "alice" / "key.json").write_text(planted)
    err = _one_line_error(aitbc("wallet", "create", "alice"), 1)
    assert "alice" in err and "Wallet exists" not in err


def test_bad_name_is_a_usage_error(aitbc):
    err = _one_line_error(aitbc("wallet", "create", "../evil"), 2)
    assert "letters, digits" in err
    assert not (aitbc.home / "evil").exists()


def test_show_missing_wallet_says_how_to_create_it(aitbc):
    err = _one_line_error(aitbc("wallet", "show", "nobody"), 1)
    assert "create it with: aitbc wallet create nobody" in err


def test_corrupt_wallet_is_one_line_error(aitbc):
    assert aitbc("wallet", "create", "alice").returncode == 0
    (aitbc.home / "wallets" / "alice" / "key.json").write_text("{oops")
    err = _one_line_error(aitbc("wallet", "show", "alice"), 1)
    assert "corrupt" in err
    _one_line_error(aitbc("wallet", "list"), 1)


def test_home_that_is_a_file_is_one_line_error(aitbc, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    err = _one_line_error(aitbc("wallet", "create", "alice", "--home", str(not_a_dir)), 1)
    assert "cannot create wallet 'alice'" in err


def test_a_wallet_without_an_evm_account_shows_none_yet(aitbc):
    create_wallet(aitbc.home, "old")
    shown = aitbc("wallet", "show", "old")
    assert shown.returncode == 0, shown.stderr
    assert "EVM address: none yet (made at its first on-chain use, or by: aitbc wallet evm old)" in shown.stdout
    assert json.loads(aitbc("wallet", "show", "old", "--json").stdout)["evm_address"] is None
    listed = json.loads(aitbc("wallet", "list", "--json").stdout)["data"]
    assert [w["evm_address"] for w in listed] == [None]
    assert not evm_key_path(aitbc.home, "old").exists()  # showing makes nothing


def test_wallet_evm_makes_the_account_once_and_show_and_list_print_it(aitbc):
    create_wallet(aitbc.home, "alice")
    made = aitbc("wallet", "evm", "alice", "--json")
    assert made.returncode == 0, made.stderr
    data = json.loads(made.stdout)
    address = data["evm_address"]
    assert data == {"name": "alice", "evm_address": address, "existed": False}
    path = evm_key_path(aitbc.home, "alice")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Account.from_key(Account.decrypt(json.loads(path.read_text()), "")).address == address
    again = aitbc("wallet", "evm", "alice")  # never replaced: it may hold money
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"EVM address: {address}\n" and again.stderr == ""
    assert f"EVM address: {address}" in aitbc("wallet", "show", "alice").stdout.splitlines()
    assert aitbc("wallet", "create", "alice").stdout.splitlines()[-1] == f"EVM address: {address}"
    assert "create it with" in _one_line_error(aitbc("wallet", "evm", "nobody"), 1)


def test_an_encrypted_wallet_s_evm_account_is_under_its_passphrase(aitbc, monkeypatch):
    create_wallet(aitbc.home, "sealed", passphrase="s3cret")
    monkeypatch.setenv("AITBC_WALLET_PASSPHRASE", "wrong")
    assert _one_line_error(aitbc("wallet", "evm", "sealed"), 1) == "error: wrong passphrase for wallet 'sealed'\n"
    assert not evm_key_path(aitbc.home, "sealed").exists()
    monkeypatch.setenv("AITBC_WALLET_PASSPHRASE", "s3cret")
    made = aitbc("wallet", "evm", "sealed", "--json")
    assert made.returncode == 0, made.stderr
    keystore = json.loads(evm_key_path(aitbc.home, "sealed").read_text())
    assert Account.from_key(Account.decrypt(keystore, "s3cret")).address == json.loads(made.stdout)["evm_address"]
    evm_key_path(aitbc.home, "sealed").write_text("{oops")
    assert "EVM account is corrupt" in _one_line_error(aitbc("wallet", "show", "sealed"), 1)


# The CLI's commands run in one process, as the console script runs them, to see what they import.
NO_ETH_ACCOUNT = """
import sys
from aitbc.cli.main import main
for args in (["create", "a"], ["create", "b", "--encrypt"], ["list"], ["show", "a"], ["create", "a"], ["show", "c"]):
    sys.argv = ["aitbc", "wallet", *args]
    try:
        main()
    except SystemExit as e:
        assert not e.code, (args, e.code)
    assert "eth_account" not in sys.modules, f"aitbc wallet {' '.join(args)} imported eth_account"
"""


def test_wallet_commands_do_not_import_eth_account(aitbc):
    """eth-account takes seconds to import: only the commands that make or open an EVM key
    pay it, not create, list or show, with or without an EVM account."""
    create_wallet(aitbc.home, "c")
    address = create_evm_account(aitbc.home, "c")
    env = {**os.environ, "AITBC_HOME": str(aitbc.home), "AITBC_WALLET_PASSPHRASE": "pw"}
    done = subprocess.run([sys.executable, "-c", NO_ETH_ACCOUNT], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"EVM address: {address}" in done.stdout
