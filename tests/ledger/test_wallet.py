"""Wallets: Ed25519 key pairs, their addresses, and key.json on disk (real files, real keys)."""

from __future__ import annotations

import hashlib
import json
import stat
import threading
from pathlib import Path

import pytest

from aitbc.errors import AitbcError, IntegrityError, NotFoundError, UsageError
from aitbc.ledger.wallet import (
    WALLET_NAME_RE,
    Wallet,
    WalletExistsError,
    WalletInfo,
    address_of,
    create_wallet,
    ensure_wallet,
    list_wallets,
    load_wallet,
    record_path,
    verify_signature,
)

# RFC 8032, section 7.1, TEST 1: secret key, public key, empty message, signature.
RFC_SEED = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"
RFC_PUBLIC = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
RFC_SIGNATURE = (
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
    "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
)

GOOD_NAMES = ["a", "Z", "0", "alice", "worker-01", "A.b_c-1", "a" * 64, "a..b"]
BAD_NAMES = ["", ".hidden", "..", ".", "-x", "_x", "a/b", "../x", "a b", "a" * 65, "é", "a\n", "a:b"]


def _key_file(home: Path, name: str) -> Path:
    return home / "wallets" / name / "key.json"


def _rewrite(home: Path, name: str, **changes: object) -> None:
    path = _key_file(home, name)
    record = json.loads(path.read_text())
    record.update(changes)
    path.write_text(json.dumps(record))


# --- addresses and signatures -----------------------------------------------------


def test_address_is_ait1_plus_40_hex_of_sha256_of_the_raw_key():
    expected = "ait1" + hashlib.sha256(bytes.fromhex(RFC_PUBLIC)).hexdigest()[:40]
    assert address_of(RFC_PUBLIC) == expected
    assert len(expected) == 44
    assert address_of(RFC_PUBLIC.upper()) == expected


@pytest.mark.parametrize(
    "bad",
    ["", "zz" * 32, RFC_PUBLIC[:-2], RFC_PUBLIC + "00", " " + RFC_PUBLIC[1:], RFC_PUBLIC[:62] + " 0"],
    ids=["empty", "non-hex", "31-bytes", "33-bytes", "space", "inner-space"],
)
def test_address_of_refuses_what_is_not_a_32_byte_hex_key(bad):
    with pytest.raises(UsageError, match="64 hex digits"):
        address_of(bad)


def test_generate_sign_and_verify():
    wallet = Wallet.generate("alice")
    assert len(wallet.public_key) == 64 and bytes.fromhex(wallet.public_key)
    assert wallet.address == address_of(wallet.public_key)
    signature = wallet.sign(b"hello")
    assert len(bytes.fromhex(signature)) == 64
    assert verify_signature(wallet.public_key, b"hello", signature)
    assert not verify_signature(wallet.public_key, b"hello!", signature)
    assert not verify_signature(Wallet.generate("bob").public_key, b"hello", signature)


def test_signatures_match_rfc8032_test_vector(tmp_path):
    # A key.json holding the RFC's seed must give the RFC's public key and signature.
    create_wallet(tmp_path, "rfc")
    _rewrite(tmp_path, "rfc", private_key=RFC_SEED, public_key=RFC_PUBLIC, address=address_of(RFC_PUBLIC))
    record_path(tmp_path, "rfc").unlink()  # replaced on purpose (else refused: not the wallet created)
    wallet = load_wallet(tmp_path, "rfc")
    assert wallet.public_key == RFC_PUBLIC
    assert wallet.sign(b"") == RFC_SIGNATURE
    assert verify_signature(RFC_PUBLIC, b"", RFC_SIGNATURE)


@pytest.mark.parametrize(
    "key, signature",
    [
        ("zz" * 32, RFC_SIGNATURE),
        (RFC_PUBLIC[:-2], RFC_SIGNATURE),
        (RFC_PUBLIC, RFC_SIGNATURE[:-2]),
        (RFC_PUBLIC, RFC_SIGNATURE + "00"),
        (RFC_PUBLIC, "g" * 128),
        (RFC_PUBLIC, " " + RFC_SIGNATURE[1:]),
        (RFC_PUBLIC, ""),
        ("", RFC_SIGNATURE),
        (None, RFC_SIGNATURE),
        (RFC_PUBLIC, None),
        (12, 34),
        (RFC_PUBLIC, "00" * 64),
    ],
)
def test_verify_signature_never_raises_on_malformed_input(key, signature):
    assert verify_signature(key, b"", signature) is False


def test_wallet_name_pattern():
    for name in GOOD_NAMES:
        assert WALLET_NAME_RE.fullmatch(name), name
    for name in BAD_NAMES:
        assert not WALLET_NAME_RE.fullmatch(name), name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_usage_errors_that_say_what_is_allowed(tmp_path, name):
    for call in (create_wallet, load_wallet, ensure_wallet):
        with pytest.raises(UsageError, match="letters, digits"):
            call(tmp_path, name)
    with pytest.raises(UsageError):
        Wallet.generate(name)
    assert not (tmp_path / "wallets").exists() or not any((tmp_path / "wallets").iterdir())


def test_info_and_repr_never_hold_the_private_key(tmp_path):
    wallet = create_wallet(tmp_path, "alice")
    seed = json.loads(_key_file(tmp_path, "alice").read_text())["private_key"]
    info = wallet.info()
    assert info == WalletInfo("alice", wallet.address, wallet.public_key, wallet.created)
    assert seed not in repr(wallet) and seed not in repr(info) and seed not in str(info.to_dict())


# --- on disk ----------------------------------------------------------------------


def test_create_writes_key_json_with_private_permissions(tmp_path):
    wallet = create_wallet(tmp_path, "alice")
    path = _key_file(tmp_path, "alice")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "wallets").stat().st_mode) == 0o700
    record = json.loads(path.read_text())
    assert set(record) == {"name", "address", "public_key", "private_key", "created"}
    assert record["name"] == "alice"
    assert record["address"] == wallet.address
    assert record["public_key"] == wallet.public_key
    assert len(bytes.fromhex(record["private_key"])) == 32
    assert record["created"].endswith("+00:00")
    assert [p.name for p in path.parent.iterdir()] == ["key.json"]  # no temporary file left


def test_create_then_load_gives_the_same_key(tmp_path):
    created = create_wallet(tmp_path, "alice")
    loaded = load_wallet(tmp_path, "alice")
    assert loaded.info() == created.info()
    assert verify_signature(created.public_key, b"m", loaded.sign(b"m"))


def test_create_refuses_an_existing_wallet_and_keeps_it(tmp_path):
    first = create_wallet(tmp_path, "alice")
    before = _key_file(tmp_path, "alice").read_bytes()
    with pytest.raises(AitbcError) as info:
        create_wallet(tmp_path, "alice")
    assert isinstance(info.value, WalletExistsError)
    assert str(info.value) == f"wallet 'alice' already exists ({tmp_path / 'wallets' / 'alice'})"
    assert _key_file(tmp_path, "alice").read_bytes() == before
    assert load_wallet(tmp_path, "alice").public_key == first.public_key


def test_racing_creators_exactly_one_wins(tmp_path):
    results: list[object] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        try:
            results.append(create_wallet(tmp_path, "racy"))
        except WalletExistsError as e:
            results.append(e)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if isinstance(r, Wallet)]
    assert len(winners) == 1
    assert load_wallet(tmp_path, "racy").public_key == winners[0].public_key
    assert [p.name for p in (tmp_path / "wallets" / "racy").iterdir()] == ["key.json"]


def test_load_missing_wallet_says_how_to_create_it(tmp_path):
    with pytest.raises(NotFoundError) as info:
        load_wallet(tmp_path, "bob")
    assert str(info.value) == f"no wallet 'bob' in {tmp_path / 'wallets'}; create it with: aitbc wallet create bob"
    (tmp_path / "wallets" / "bob").mkdir(parents=True)  # a directory without key.json
    with pytest.raises(NotFoundError):
        load_wallet(tmp_path, "bob")


@pytest.mark.parametrize(
    "content, why",
    [
        (b"", "not valid JSON"),
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"name": "alice"}', "missing or non-string field"),
    ],
)
def test_corrupt_key_json_is_an_integrity_error(tmp_path, content, why):
    create_wallet(tmp_path, "alice")
    _key_file(tmp_path, "alice").write_bytes(content)
    with pytest.raises(IntegrityError, match=why) as info:
        load_wallet(tmp_path, "alice")
    assert str(_key_file(tmp_path, "alice")) in str(info.value)


@pytest.mark.parametrize(
    "changes, why",
    [
        ({"private_key": "zz" * 32}, "private_key is not 64 hex digits"),
        ({"private_key": "00" * 31}, "private_key is not 64 hex digits"),
        ({"private_key": 5}, "non-string field 'private_key'"),
        ({"created": None}, "non-string field 'created'"),
        ({"public_key": RFC_PUBLIC}, "public_key does not match"),
        ({"address": address_of(RFC_PUBLIC)}, "address does not match"),
        ({"private_key": RFC_SEED}, "public_key does not match"),  # a swapped private key
    ],
)
def test_key_json_that_does_not_match_its_private_key_is_an_integrity_error(tmp_path, changes, why):
    create_wallet(tmp_path, "alice")
    _rewrite(tmp_path, "alice", **changes)
    with pytest.raises(IntegrityError, match=why):
        load_wallet(tmp_path, "alice")


def test_ensure_creates_once_then_loads(tmp_path):
    first = ensure_wallet(tmp_path, "worker-0")
    second = ensure_wallet(tmp_path, "worker-0")
    assert first.info() == second.info()
    assert len(list_wallets(tmp_path)) == 1


def test_ensure_does_not_replace_a_corrupt_wallet(tmp_path):
    create_wallet(tmp_path, "w")
    _key_file(tmp_path, "w").write_text("garbage")
    with pytest.raises(IntegrityError):
        ensure_wallet(tmp_path, "w")
    assert _key_file(tmp_path, "w").read_text() == "garbage"


def test_list_is_sorted_and_skips_what_is_not_a_wallet(tmp_path):
    assert list_wallets(tmp_path) == []  # no HOME/wallets at all
    for name in ["carol", "alice", "Bob", "bob-2"]:
        create_wallet(tmp_path, name)
    (tmp_path / "wallets" / "empty").mkdir()  # no key.json
    (tmp_path / "wallets" / "stray.txt").write_text("not a wallet")
    (tmp_path / "wallets" / ".hidden").mkdir()
    infos = list_wallets(tmp_path)
    assert [i.name for i in infos] == ["Bob", "alice", "bob-2", "carol"]
    assert all(isinstance(i, WalletInfo) for i in infos)
    assert infos[1] == load_wallet(tmp_path, "alice").info()


def test_list_reports_a_corrupt_wallet(tmp_path):
    create_wallet(tmp_path, "alice")
    _key_file(tmp_path, "alice").write_text("{}")
    with pytest.raises(IntegrityError, match="alice"):
        list_wallets(tmp_path)
