"""Ed25519 keys and signatures we accept (ledger/keys.py): canonical prime-order keys only,
canonical signatures only; and the places a key enters (request signatures, the ledger
audit) refuse the rest even where OpenSSL would verify."""

from __future__ import annotations

import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aitbc.ledger import keys
from aitbc.ledger.chain import ENTRY_FIELDS, check_authorisation
from aitbc.ledger.signing import NonceCache, SignatureError, canonical_request, sign_request, verify_request
from aitbc.ledger.wallet import Wallet, verify_signature

# libsodium's blocklist (ed25519_ref10.c, ge25519_has_small_order) with both sign bits where
# the encoding is canonical: the 8 points of order 1, 2, 4 and 8.
SMALL_ORDER = [
    "0100000000000000000000000000000000000000000000000000000000000000",  # identity (order 1)
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # (0, -1), order 2
    "0000000000000000000000000000000000000000000000000000000000000000",  # order 4
    "0000000000000000000000000000000000000000000000000000000000000080",  # order 4
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",  # order 8
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",  # order 8
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",  # order 8
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",  # order 8
]
# Non-canonical encodings of small-order points (y >= p, or x = 0 with the sign bit set).
NON_CANONICAL = [
    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # y = p (= 0)
    "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # y = p + 1 (= 1)
    "0100000000000000000000000000000000000000000000000000000000000080",  # identity, "-0"
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",  # (0, -1), "-0"
    "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",  # y = 2^255 - 1
]
IDENTITY = bytes.fromhex(SMALL_ORDER[0])
BASE = keys.encode_point(keys.decode_point(bytes.fromhex("58" + "66" * 31)) or keys.IDENTITY)


def torsion_points() -> set[bytes]:
    """The 8-torsion subgroup, computed: [L] Q for a point Q of full order, and its multiples."""
    out: set[bytes] = set()
    seed = 0
    while len(out) < 8:
        q = keys.decode_point(hashlib.sha256(str(seed).encode()).digest())
        seed += 1
        if q is not None:
            t = keys.mul_point(keys.L, q)
            out |= {keys.encode_point(keys.mul_point(k, t)) for k in range(8)}
    return out


def test_the_blocklist_is_exactly_the_torsion_subgroup():
    assert torsion_points() == {bytes.fromhex(h) for h in SMALL_ORDER}


@pytest.mark.parametrize("hex_key", SMALL_ORDER)
def test_small_order_keys_are_refused(hex_key):
    assert keys.key_problem(bytes.fromhex(hex_key)) == "a small-order point (a signature for any message would verify)"
    assert not keys.is_valid_public_key(bytes.fromhex(hex_key))


@pytest.mark.parametrize("hex_key", NON_CANONICAL)
def test_non_canonical_encodings_are_refused(hex_key):
    assert keys.decode_point(bytes.fromhex(hex_key)) is None
    assert keys.key_problem(bytes.fromhex(hex_key)) == "not the canonical encoding of a curve point"


def test_a_y_with_no_point_is_refused():
    raw = (2).to_bytes(32, "little")  # y = 2: (y^2 - 1) / (d y^2 + 1) is not a square mod p
    assert keys.decode_point(raw) is None


def test_real_keys_pass_and_round_trip():
    for _ in range(5):
        raw = bytes.fromhex(Wallet.generate("w").public_key)
        pt = keys.decode_point(raw)
        assert pt is not None and keys.encode_point(pt) == raw
        assert keys.key_problem(raw) is None
    assert keys.key_problem(BASE) is None


@pytest.mark.parametrize("torsion", SMALL_ORDER[1:])
def test_mixed_order_keys_are_refused(torsion):
    """A real key plus a torsion point: not small order, not in the prime-order subgroup."""
    a = keys.decode_point(bytes.fromhex(Wallet.generate("w").public_key))
    t = keys.decode_point(bytes.fromhex(torsion))
    assert a is not None and t is not None
    mixed = keys.encode_point(keys.add_points(a, t))
    assert keys.key_problem(mixed) == "a mixed-order point (not in the prime-order subgroup)"


def test_key_problem_hex_refuses_malformed_text():
    for bad in ("zz" * 32, "ab", None, 7, "01" * 32 + " "):
        assert keys.key_problem_hex(bad) == "not 64 hex digits"


def test_non_canonical_signatures_are_refused():
    w = Wallet.generate("w")
    sig = bytes.fromhex(w.sign(b"m"))
    assert keys.signature_problem(sig) is None and verify_signature(w.public_key, b"m", sig.hex())
    s = int.from_bytes(sig[32:], "little")
    malleated = sig[:32] + (s + keys.L).to_bytes(32, "little")  # S + L: a second signature of m
    assert keys.signature_problem(malleated) == "S is not below the group order"
    assert not verify_signature(w.public_key, b"m", malleated.hex())
    for r_hex in NON_CANONICAL:
        assert keys.signature_problem(bytes.fromhex(r_hex) + sig[32:]) == (
            "R is not the canonical encoding of a curve point"
        )
    for r_hex in SMALL_ORDER:
        assert keys.signature_problem(bytes.fromhex(r_hex) + bytes(32)) == "R is a small-order point"


def forged(key: bytes, message: bytes) -> bytes:
    """A "signature" of ``message`` under the identity key with no secret: R = B, S = 1,
    since [1]B = B + [k]identity for every k."""
    assert key == IDENTITY
    return BASE + (1).to_bytes(32, "little")


def test_openssl_accepts_the_forgery_and_we_do_not():
    msg = b"any message at all"
    sig = forged(IDENTITY, msg)
    Ed25519PublicKey.from_public_bytes(IDENTITY).verify(sig, msg)  # the attack is real
    assert not verify_signature(IDENTITY.hex(), msg, sig.hex())


def test_a_forged_request_is_refused():
    w = Wallet.generate("w")
    body = b'{"to": "x", "amount": "1"}'
    headers = sign_request(w, "POST", "/v1/wallets/send", body)
    message = canonical_request(
        "POST",
        "/v1/wallets/send",
        hashlib.sha256(body).hexdigest(),
        headers["X-Aitbc-Timestamp"],
        headers["X-Aitbc-Nonce"],
    )
    headers["X-Aitbc-Key"] = IDENTITY.hex()
    headers["X-Aitbc-Signature"] = forged(IDENTITY, message).hex()
    digest = hashlib.sha256(body).hexdigest()
    now = float(headers["X-Aitbc-Timestamp"])
    with pytest.raises(SignatureError) as e:
        verify_request(headers, "POST", "/v1/wallets/send", digest, now=now, max_skew=60, nonces=NonceCache(60))
    assert e.value.code == "bad_signature" and "small-order" in e.value.detail
    # The trivial signature (R = identity, S = 0) is refused as non-canonical first.
    headers["X-Aitbc-Signature"] = (IDENTITY + bytes(32)).hex()
    with pytest.raises(SignatureError) as e:
        verify_request(headers, "POST", "/v1/wallets/send", digest, now=now, max_skew=60, nonces=NonceCache(60))
    assert e.value.code == "bad_signature" and "R is a small-order point" in e.value.detail


def test_the_audit_refuses_an_entry_signed_by_a_small_order_key():
    entry: dict = dict.fromkeys(ENTRY_FIELDS)  # every field the signature covers
    entry.update(
        auth={"type": "entry"},
        signer=IDENTITY.hex(),
        signature=forged(IDENTITY, b"").hex(),
        debit="mint:local",
        credit="wallet:x",
    )
    assert "small-order" in (check_authorisation(entry, None) or "")
    # A valid key that did not sign it: the forged signature does not verify under it either.
    entry["signer"] = Wallet.generate("other").public_key
    assert check_authorisation(entry, None) == "coordinator signature does not verify"
