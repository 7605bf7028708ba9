"""Wallet keys encrypted at rest with a passphrase (scrypt + ChaCha20-Poly1305)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aitbc.errors import AitbcError, IntegrityError
from aitbc.ledger.sealed import PASSPHRASE_ENV, WrongPassphrase
from aitbc.ledger.wallet import create_wallet, list_wallets, load_wallet, wallet_info, wallet_path

PASS = "tr0ub4dor&3"


@pytest.fixture(autouse=True)
def _no_env_passphrase(monkeypatch):
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)


def test_created_encrypted_loads_with_the_right_passphrase(tmp_path: Path):
    w = create_wallet(tmp_path, "enc", passphrase=PASS)
    loaded = load_wallet(tmp_path, "enc", passphrase=PASS)
    assert (loaded.address, loaded.public_key) == (w.address, w.public_key)
    assert loaded.sign(b"m") == w.sign(b"m")  # the same private key


def test_the_file_holds_no_plaintext_key(tmp_path: Path):
    w = create_wallet(tmp_path, "enc", passphrase=PASS)
    text = wallet_path(tmp_path, "enc").read_text()
    assert w._seed_hex() not in text and w._seed_hex().upper() not in text
    record = json.loads(text)
    assert "private_key" not in record and record["encrypted_key"]["kdf"] == "scrypt"
    assert bytes.fromhex(w._seed_hex()) not in wallet_path(tmp_path, "enc").read_bytes()


def test_a_wrong_passphrase_is_refused_in_one_line(tmp_path: Path):
    create_wallet(tmp_path, "enc", passphrase=PASS)
    with pytest.raises(WrongPassphrase, match=r"^wrong passphrase for wallet 'enc'$"):
        load_wallet(tmp_path, "enc", passphrase="not it")


def test_the_passphrase_comes_from_the_environment(tmp_path: Path, monkeypatch):
    w = create_wallet(tmp_path, "enc", passphrase=PASS)
    with pytest.raises(AitbcError, match=PASSPHRASE_ENV):  # no terminal here, no variable
        load_wallet(tmp_path, "enc")
    monkeypatch.setenv(PASSPHRASE_ENV, PASS)
    assert load_wallet(tmp_path, "enc").address == w.address


def test_a_sealed_key_moved_into_another_wallet_does_not_open(tmp_path: Path):
    create_wallet(tmp_path, "a", passphrase=PASS)
    create_wallet(tmp_path, "b", passphrase=PASS)
    a = json.loads(wallet_path(tmp_path, "a").read_text())
    b = json.loads(wallet_path(tmp_path, "b").read_text())
    b["encrypted_key"] = a["encrypted_key"]  # the associated data binds it to a's identity
    wallet_path(tmp_path, "b").write_text(json.dumps(b))
    with pytest.raises(WrongPassphrase):
        load_wallet(tmp_path, "b", passphrase=PASS)


def test_a_malformed_sealed_key_is_corrupt(tmp_path: Path):
    create_wallet(tmp_path, "enc", passphrase=PASS)
    record = json.loads(wallet_path(tmp_path, "enc").read_text())
    record["encrypted_key"]["n"] = 1 << 30  # a memory bomb is refused before deriving
    wallet_path(tmp_path, "enc").write_text(json.dumps(record))
    with pytest.raises(IntegrityError, match="malformed"):
        load_wallet(tmp_path, "enc", passphrase=PASS)


def test_listing_and_showing_need_no_passphrase(tmp_path: Path):
    w = create_wallet(tmp_path, "enc", passphrase=PASS)
    create_wallet(tmp_path, "plain")
    assert [i.name for i in list_wallets(tmp_path)] == ["enc", "plain"]
    assert wallet_info(tmp_path, "enc").address == w.address


def test_cli_create_encrypt_and_a_wrong_passphrase(aitbc, monkeypatch):
    r = aitbc("wallet", "create", "enc", "--encrypt", input=f"{PASS}\n{PASS}\n")
    assert r.returncode == 0, r.stderr
    assert "encrypted" in r.stderr
    assert "private_key" not in wallet_path(aitbc.home, "enc").read_text()
    assert aitbc("wallet", "show", "enc").returncode == 0  # public facts: no passphrase
    r = aitbc("wallet", "create", "mismatch", "--encrypt", input=f"{PASS}\nother\n{PASS}\n{PASS}\n")
    assert r.returncode == 0 and "do not match" in (r.stdout + r.stderr).lower()
    # Using the key needs it: without it, one line; with a wrong one, one line, exit 1.
    r = aitbc("wallet", "history", "enc")
    assert r.returncode == 1 and r.stderr.strip() == (
        f"error: wallet 'enc' is encrypted: set {PASSPHRASE_ENV} to its passphrase"
    ), r.stderr
    monkeypatch.setenv(PASSPHRASE_ENV, "not it")
    r = aitbc("wallet", "history", "enc")
    assert r.returncode == 1 and r.stderr.strip() == "error: wrong passphrase for wallet 'enc'", r.stderr
    monkeypatch.setenv(PASSPHRASE_ENV, PASS)  # the variable also answers `create --encrypt`
    r = aitbc("wallet", "create", "unattended", "--encrypt")
    assert r.returncode == 0, r.stderr
    assert load_wallet(aitbc.home, "unattended", passphrase=PASS).name == "unattended"
