"""Wallet keys encrypted at rest with a passphrase (scrypt + ChaCha20-Poly1305)."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest

from aitbc.errors import AitbcError, IntegrityError
from aitbc.ledger.sealed import PASSPHRASE_ENV, WrongPassphrase, seal
from aitbc.ledger.wallet import (
    _aad,
    create_wallet,
    ensure_wallet,
    list_wallets,
    load_wallet,
    record_path,
    wallet_info,
    wallet_path,
)

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


# --- a key file put in place of the one created (issue 33) ---------------------------------


def _key_of_another(tmp_path: Path, name: str, passphrase: str | None = None) -> str:
    """A key file an intruder made for wallet ``name`` (its own key, self-consistent)."""
    other = tmp_path / "intruder"
    create_wallet(other, name, passphrase=passphrase)
    return wallet_path(other, name).read_text()


def test_a_plaintext_key_put_where_an_encrypted_one_was_is_refused(tmp_path: Path):
    """Issue 33: it was used without a passphrase or a warning, and show printed its address."""
    home = tmp_path / "home"
    w = create_wallet(home, "w", passphrase=PASS)
    wallet_path(home, "w").write_text(_key_of_another(tmp_path, "w"))
    for call in (
        lambda: load_wallet(home, "w"),
        lambda: load_wallet(home, "w", passphrase=PASS),
        lambda: wallet_info(home, "w"),
        lambda: list_wallets(home),
        lambda: ensure_wallet(home, "w"),
    ):
        with pytest.raises(IntegrityError, match=r"wallet 'w' was created encrypted, but .* holds a plaintext key"):
            call()
    # the intruder's self-consistent file with our own address is not possible (it would need our key);
    # the same plaintext key under its real address, moved with the whole folder, is refused alike
    shutil.rmtree(home / "wallets" / "w")
    shutil.copytree(tmp_path / "intruder" / "wallets" / "w", home / "wallets" / "w")
    with pytest.raises(IntegrityError, match="was created encrypted"):
        load_wallet(home, "w")
    assert record_path(home, "w").exists() and w.address in record_path(home, "w").read_text()


def test_an_encrypted_key_of_another_address_is_refused_before_the_passphrase(tmp_path: Path):
    home = tmp_path / "home"
    w = create_wallet(home, "w", passphrase=PASS)
    wallet_path(home, "w").write_text(_key_of_another(tmp_path, "w", passphrase="the intruder's"))
    with pytest.raises(IntegrityError, match=f"it was created as {w.address}") as e:
        wallet_info(home, "w")  # show would print the intruder's address
    assert "is not the wallet created under this name" in str(e.value)
    with pytest.raises(IntegrityError, match=f"it was created as {w.address}"):
        load_wallet(home, "w")  # no passphrase asked for (none here would be an AitbcError naming the variable)


def test_a_plaintext_wallet_swapped_for_another_is_refused(tmp_path: Path):
    home = tmp_path / "home"
    w = create_wallet(home, "w")
    wallet_path(home, "w").write_text(_key_of_another(tmp_path, "w"))
    with pytest.raises(IntegrityError, match=f"gives address ait1[0-9a-f]{{40}}, it was created as {w.address}"):
        wallet_info(home, "w")


def test_a_replaced_key_is_accepted_once_its_record_is_deleted(tmp_path: Path):
    """The way out the error names (a backup restored on purpose), and the record kept then."""
    home = tmp_path / "home"
    create_wallet(home, "w", passphrase=PASS)
    wallet_path(home, "w").write_text(_key_of_another(tmp_path, "w"))
    with pytest.raises(IntegrityError, match=f"delete {record_path(home, 'w')}"):
        load_wallet(home, "w")
    record_path(home, "w").unlink()
    new = load_wallet(home, "w")
    assert json.loads(record_path(home, "w").read_text()) == {
        "name": "w",
        "address": new.address,
        "public_key": new.public_key,
        "encrypted": False,
    }
    assert stat.S_IMODE(record_path(home, "w").stat().st_mode) == 0o600


def test_a_wallet_made_before_records_is_recorded_at_its_first_load(tmp_path: Path):
    home = tmp_path / "home"
    w = create_wallet(home, "w", passphrase=PASS)
    shutil.rmtree(home / "wallets" / ".records")  # as a release before them left it
    assert load_wallet(home, "w", passphrase=PASS).address == w.address
    assert json.loads(record_path(home, "w").read_text())["encrypted"] is True
    wallet_path(home, "w").write_text(_key_of_another(tmp_path, "w"))
    with pytest.raises(IntegrityError, match="was created encrypted"):
        load_wallet(home, "w")


def test_a_plaintext_wallet_encrypted_later_stays_encrypted(tmp_path: Path):
    """Sealing a plaintext key by hand (the same address) is kept: its record says encrypted
    from then on, and its old plaintext file put back is refused."""
    home = tmp_path / "home"
    w = create_wallet(home, "w")
    plain = wallet_path(home, "w").read_text()
    record = json.loads(plain)
    ident = {f: record[f] for f in ("name", "address", "public_key")}
    sealed = {
        **ident,
        "created": record["created"],
        "encrypted_key": seal(
            bytes.fromhex(record["private_key"]), PASS, _aad(ident["name"], ident["address"], ident["public_key"])
        ),
    }
    wallet_path(home, "w").write_text(json.dumps(sealed))
    assert load_wallet(home, "w", passphrase=PASS).address == w.address
    assert json.loads(record_path(home, "w").read_text())["encrypted"] is True
    wallet_path(home, "w").write_text(plain)
    with pytest.raises(IntegrityError, match="was created encrypted"):
        load_wallet(home, "w")


def test_creating_a_deleted_wallets_name_again_replaces_its_record(tmp_path: Path):
    home = tmp_path / "home"
    create_wallet(home, "w", passphrase=PASS)
    shutil.rmtree(home / "wallets" / "w")  # the owner deleted it
    again = create_wallet(home, "w")
    assert load_wallet(home, "w").address == again.address


def test_a_corrupt_record_is_one_clear_error(tmp_path: Path):
    home = tmp_path / "home"
    create_wallet(home, "w")
    record_path(home, "w").write_text('{"address": 5}')
    with pytest.raises(IntegrityError, match=r"wallet 'w''s record is corrupt .*delete it"):
        load_wallet(home, "w")


def test_cli_show_refuses_a_swapped_key_in_one_line(aitbc, tmp_path: Path):
    r = aitbc("wallet", "create", "w", "--encrypt", input=f"{PASS}\n{PASS}\n")
    assert r.returncode == 0, r.stderr
    intruder = _key_of_another(tmp_path, "w")
    wallet_path(aitbc.home, "w").write_text(intruder)
    for args in (("wallet", "show", "w"), ("wallet", "list"), ("wallet", "history", "w")):
        r = aitbc(*args)
        assert r.returncode == 1, r.stdout + r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "was created encrypted" in lines[0], r.stderr
        assert json.loads(intruder)["address"] not in r.stdout  # the swapped address is never shown
