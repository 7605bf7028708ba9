"""A wallet's EVM account: a Web3 Secret Storage (v3) keystore beside its Ed25519 key,
written and opened by eth-account, 0600, created whole once, recorded, opened only with the
wallet's passphrase, and refused in one line when it does not open."""

from __future__ import annotations

import json
import stat

import pytest
from eth_account import Account

from aitbc.errors import AitbcError, IntegrityError, NotFoundError
from aitbc.ledger.evm_keys import (
    create_evm_account,
    ensure_evm_account,
    evm_address,
    evm_key_path,
    load_evm_account,
)
from aitbc.ledger.sealed import PASSPHRASE_ENV, WrongPassphrase
from aitbc.ledger.wallet import create_wallet, load_wallet, record_path

# anvil's first development account: a known key and address
DEV_KEY = bytes.fromhex("ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80")
DEV_ADDRESS = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"


def test_an_unencrypted_wallet_gets_a_keystore_with_an_empty_password(tmp_path):
    create_wallet(tmp_path, "alice")
    assert evm_address(tmp_path, "alice") is None  # none until its first on-chain use
    address = create_evm_account(tmp_path, "alice")
    path = evm_key_path(tmp_path, "alice")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    keystore = json.loads(path.read_text())
    assert keystore["version"] == 3 and "0x" + keystore["address"].lower() == address.lower()
    assert Account.from_key(Account.decrypt(keystore, "")).address == address  # the standard format
    assert evm_address(tmp_path, "alice") == address
    key = load_evm_account(tmp_path, "alice")
    assert key.address == address and "private_key" not in repr(key)
    assert json.loads(record_path(tmp_path, "alice").read_text())["evm_address"] == address
    with pytest.raises(AitbcError, match="has an EVM account already"):
        create_evm_account(tmp_path, "alice")
    assert ensure_evm_account(tmp_path, "alice").address == address
    load_wallet(tmp_path, "alice")  # the Ed25519 key loads as before


def test_an_encrypted_wallet_s_keystore_opens_with_its_passphrase_only(tmp_path, monkeypatch):
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    create_wallet(tmp_path, "bob", passphrase="correct horse")
    with pytest.raises(WrongPassphrase):  # never a keystore under a passphrase the wallet lacks
        create_evm_account(tmp_path, "bob", passphrase="wrong")
    assert not evm_key_path(tmp_path, "bob").exists()
    address = create_evm_account(tmp_path, "bob", passphrase="correct horse")
    keystore = json.loads(evm_key_path(tmp_path, "bob").read_text())
    assert Account.from_key(Account.decrypt(keystore, "correct horse")).address == address
    assert load_evm_account(tmp_path, "bob", passphrase="correct horse").address == address
    with pytest.raises(WrongPassphrase) as wrong:
        load_evm_account(tmp_path, "bob", passphrase="nope")
    assert str(wrong.value) == "wrong passphrase for wallet 'bob'"
    monkeypatch.setenv(PASSPHRASE_ENV, "correct horse")  # as unattended workers give it
    assert load_evm_account(tmp_path, "bob").address == address


def test_a_keystore_put_in_place_of_the_one_created_is_refused(tmp_path):
    create_wallet(tmp_path, "alice")
    create_evm_account(tmp_path, "alice")
    evm_key_path(tmp_path, "alice").write_text(json.dumps(Account.encrypt(DEV_KEY, "", iterations=1 << 10)))
    for read in (evm_address, load_evm_account):
        with pytest.raises(IntegrityError, match="not the one created for it") as refused:
            read(tmp_path, "alice")
        assert "\n" not in str(refused.value) and str(record_path(tmp_path, "alice")) in str(refused.value)
    evm_key_path(tmp_path, "alice").write_text("{oops")
    with pytest.raises(IntegrityError, match="corrupt"):
        evm_address(tmp_path, "alice")


def test_an_account_for_a_missing_wallet_or_none_yet(tmp_path):
    with pytest.raises(NotFoundError):
        create_evm_account(tmp_path, "nobody")
    create_wallet(tmp_path, "carol")
    with pytest.raises(NotFoundError, match="has no EVM account"):
        load_evm_account(tmp_path, "carol")
    assert ensure_evm_account(tmp_path, "carol").address == evm_address(tmp_path, "carol")


def test_a_keystore_that_does_not_open_is_one_line_and_refused(tmp_path):
    create_wallet(tmp_path, "alice")
    path = evm_key_path(tmp_path, "alice")
    path.write_text(json.dumps(Account.encrypt(DEV_KEY, "not empty", iterations=1 << 10)))
    assert evm_address(tmp_path, "alice") == DEV_ADDRESS  # unrecorded: checksummed, trusted now, recorded
    assert json.loads(record_path(tmp_path, "alice").read_text())["evm_address"] == DEV_ADDRESS
    with pytest.raises(IntegrityError, match="does not open with an empty password"):
        load_evm_account(tmp_path, "alice")
    keystore = Account.encrypt(DEV_KEY, "", iterations=1 << 10)
    for crypto, why in (
        ({**keystore["crypto"], "kdf": "argon2"}, "unknown kdf 'argon2'"),
        ({**keystore["crypto"], "kdfparams": {**keystore["crypto"]["kdfparams"], "n": 1 << 30}}, "is not in 1.."),
        ({**keystore["crypto"], "ciphertext": "zz"}, "corrupt"),
        ({k: v for k, v in keystore["crypto"].items() if k != "mac"}, "malformed"),
    ):
        path.write_text(json.dumps({**keystore, "crypto": crypto}))
        with pytest.raises(IntegrityError, match=why) as refused:
            load_evm_account(tmp_path, "alice")
        assert "\n" not in str(refused.value) and str(path) in str(refused.value)
    path.write_text(json.dumps({**keystore, "address": "12"}))
    with pytest.raises(IntegrityError, match="not 40 hex digits"):
        evm_address(tmp_path, "alice")
