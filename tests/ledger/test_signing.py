"""Signed requests: sign with a real wallet, verify as the server would (real Ed25519)."""

from __future__ import annotations

import json
import math
import threading

import pytest
from starlette.datastructures import Headers

from aitbc.ledger.signing import (
    HEADER_KEY,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    UNSIGNED_PAYLOAD,
    NonceCache,
    SignatureError,
    body_digest,
    canonical_json,
    canonical_request,
    sign_request,
    verify_request,
)
from aitbc.ledger.wallet import Wallet

NOW = 1_764_440_000.0
SKEW = 300.0
BODY = b'{"round":3}'
PATH = "/v1/jobs/j1/updates?round=3"


@pytest.fixture(scope="module")
def wallet() -> Wallet:
    return Wallet.generate("alice")


@pytest.fixture
def nonces() -> NonceCache:
    return NonceCache(SKEW)


def verify(headers, method="POST", path=PATH, body=BODY, *, now=NOW, nonces=None, not_before=0.0, digest=None):
    return verify_request(
        headers,
        method,
        path,
        body_digest(body) if digest is None else digest,
        now=now,
        max_skew=SKEW,
        nonces=nonces if nonces is not None else NonceCache(SKEW),
        not_before=not_before,
    )


def code_of(excinfo) -> str:
    return excinfo.value.code


# --- the canonical forms ------------------------------------------------------------


def test_body_digest_is_sha256_hex():
    assert body_digest(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_canonical_request_layout():
    got = canonical_request("post", "/a/b?x=1&y=%20", "d1g", "1764440000.123", "ab" * 16)
    assert got == b"AITBC-REQUEST-1\nPOST\n/a/b?x=1&y=%20\nd1g\n1764440000.123\n" + b"ab" * 16


def test_canonical_request_refuses_newlines_in_fields():
    with pytest.raises(ValueError):
        canonical_request("GET", "/a\nPOST", "d", "1", "n")


def test_canonical_json_is_sorted_compact_utf8():
    assert canonical_json({"b": 1, "a": [1.5, "é", None, True]}) == '{"a":[1.5,"é",null,true],"b":1}'.encode()
    assert canonical_json({"b": 1, "a": 2}) == canonical_json({"a": 2, "b": 1})


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_canonical_json_refuses_nan_and_inf(bad):
    with pytest.raises(ValueError):
        canonical_json({"loss": bad})


# --- signing and verifying ----------------------------------------------------------


def test_sign_request_gives_the_four_headers(wallet):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW, nonce="0f" * 16)
    assert headers == {
        HEADER_KEY: wallet.public_key,
        HEADER_TIMESTAMP: "1764440000.000",
        HEADER_NONCE: "0f" * 16,
        HEADER_SIGNATURE: headers[HEADER_SIGNATURE],
    }
    assert len(bytes.fromhex(headers[HEADER_SIGNATURE])) == 64
    fresh = sign_request(wallet, "GET", "/x")
    assert len(fresh[HEADER_NONCE]) == 32 and int(fresh[HEADER_NONCE], 16) >= 0
    assert fresh[HEADER_NONCE] != sign_request(wallet, "GET", "/x")[HEADER_NONCE]


def test_roundtrip_returns_the_signers_key(wallet, nonces):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW)
    assert verify(headers, nonces=nonces) == wallet.public_key


def test_roundtrip_with_the_real_clock(wallet):
    import time

    headers = sign_request(wallet, "GET", "/v1/status")
    assert verify(headers, "GET", "/v1/status", b"", now=time.time()) == wallet.public_key


def test_header_names_are_case_insensitive(wallet):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW)
    lowered = {k.lower(): v for k, v in headers.items()}
    upper = {k.upper(): v for k, v in headers.items()}
    starlette = Headers(raw=[(k.lower().encode(), v.encode()) for k, v in headers.items()])
    for form in (lowered, upper, starlette):
        assert verify(form) == wallet.public_key


def test_method_case_does_not_matter(wallet):
    headers = sign_request(wallet, "post", PATH, BODY, now=NOW)
    assert verify(headers, "POST") == wallet.public_key


def test_unsigned_payload_does_not_cover_the_body(wallet):
    headers = sign_request(wallet, "PUT", "/v1/blobs/bafkrei", b"any bytes", unsigned_payload=True, now=NOW)
    assert verify(headers, "PUT", "/v1/blobs/bafkrei", digest=UNSIGNED_PAYLOAD) == wallet.public_key
    with pytest.raises(SignatureError) as e:  # but a signed-body request cannot pass as unsigned
        verify(
            sign_request(wallet, "PUT", "/v1/blobs/bafkrei", b"x", now=NOW),
            "PUT",
            "/v1/blobs/bafkrei",
            digest=UNSIGNED_PAYLOAD,
        )
    assert code_of(e) == "bad_signature"


@pytest.mark.parametrize(
    "change",
    [
        {"method": "PUT"},
        {"path": "/v1/jobs/j2/updates?round=3"},
        {"path": "/v1/jobs/j1/updates?round=4"},
        {"path": "/v1/jobs/j1/updates"},
        {"body": b'{"round":4}'},
        {"body": b""},
    ],
    ids=["method", "path", "query", "query-dropped", "body", "body-dropped"],
)
def test_a_tampered_request_is_a_bad_signature(wallet, change):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW)
    with pytest.raises(SignatureError) as e:
        verify(headers, **change)
    assert code_of(e) == "bad_signature"
    assert str(e.value) == e.value.detail


@pytest.mark.parametrize(
    "header, value",
    [
        (HEADER_TIMESTAMP, f"{NOW + 1:.3f}"),
        (HEADER_TIMESTAMP, "1764440000"),  # the same instant, spelled differently
        (HEADER_NONCE, "00" * 16),
        (HEADER_KEY, Wallet.generate("mallory").public_key),
    ],
    ids=["timestamp", "timestamp-respelled", "nonce", "key"],
)
def test_tampered_headers_are_a_bad_signature(wallet, header, value):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW)
    headers[header] = value
    with pytest.raises(SignatureError) as e:
        verify(headers)
    assert code_of(e) == "bad_signature"


def test_a_flipped_signature_bit_is_a_bad_signature(wallet):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW)
    sig = bytearray(bytes.fromhex(headers[HEADER_SIGNATURE]))
    sig[10] ^= 1
    headers[HEADER_SIGNATURE] = sig.hex()
    with pytest.raises(SignatureError) as e:
        verify(headers)
    assert code_of(e) == "bad_signature"


@pytest.mark.parametrize("missing", [HEADER_KEY, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE])
def test_a_missing_header_is_missing_signature(wallet, missing):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW)
    del headers[missing]
    with pytest.raises(SignatureError) as e:
        verify(headers)
    assert code_of(e) == "missing_signature"
    assert str(e.value) == f"request is not signed: missing header {missing}"
    headers[missing] = ""
    with pytest.raises(SignatureError) as e:
        verify(headers)
    assert code_of(e) == "missing_signature"


def test_no_headers_at_all_is_missing_signature():
    with pytest.raises(SignatureError) as e:
        verify({"Content-Type": "application/json"})
    assert code_of(e) == "missing_signature"


@pytest.mark.parametrize(
    "header, value",
    [
        (HEADER_KEY, "zz" * 32),
        (HEADER_KEY, "ab" * 31),
        (HEADER_KEY, "ab" * 33),
        (HEADER_KEY, " " + "ab" * 31 + "a"),
        (HEADER_SIGNATURE, "zz" * 64),
        (HEADER_SIGNATURE, "ab" * 63),
        (HEADER_SIGNATURE, "ab" * 65),
        (HEADER_SIGNATURE, "ab" * 63 + " a"),
        (HEADER_NONCE, "zz" * 16),
        (HEADER_NONCE, "ab" * 15),
        (HEADER_NONCE, "ab" * 17),
        (HEADER_TIMESTAMP, "nan"),
        (HEADER_TIMESTAMP, "inf"),
        (HEADER_TIMESTAMP, "-1764440000"),
        (HEADER_TIMESTAMP, "1.76444e9"),
        (HEADER_TIMESTAMP, " 1764440000"),
        (HEADER_TIMESTAMP, "1_764_440_000"),
        (HEADER_TIMESTAMP, "1764440000."),
        (HEADER_TIMESTAMP, "yesterday"),
    ],
)
def test_malformed_headers_are_a_bad_signature(wallet, header, value):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW)
    headers[header] = value
    with pytest.raises(SignatureError) as e:
        verify(headers)
    assert code_of(e) == "bad_signature"
    assert header in str(e.value)


@pytest.mark.parametrize("offset", [SKEW + 1, -(SKEW + 1), 86_400.0])
def test_a_timestamp_outside_the_skew_is_expired(wallet, offset):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW + offset)
    with pytest.raises(SignatureError) as e:
        verify(headers)
    assert code_of(e) == "expired_signature"
    assert "300s" in str(e.value)  # names the skew allowed


@pytest.mark.parametrize("offset", [SKEW - 1, -(SKEW - 1)])
def test_a_timestamp_inside_the_skew_is_accepted(wallet, offset):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW + offset)
    assert verify(headers) == wallet.public_key


def test_a_request_signed_before_the_server_started_is_expired(wallet):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW - 10)
    with pytest.raises(SignatureError) as e:
        verify(headers, not_before=NOW - 5)
    assert code_of(e) == "expired_signature"
    assert "before the server started" in str(e.value) and "300s" in str(e.value)
    assert verify(headers, not_before=NOW - 10) == wallet.public_key


def test_a_replayed_nonce_is_refused(wallet, nonces):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW)
    verify(headers, nonces=nonces)
    with pytest.raises(SignatureError) as e:
        verify(headers, nonces=nonces, now=NOW + 100)
    assert code_of(e) == "replayed_nonce"
    # The nonce's case is not a way around it (hex digits, one value).
    again = sign_request(wallet, "POST", PATH, BODY, now=NOW, nonce=headers[HEADER_NONCE].upper())
    with pytest.raises(SignatureError) as e:
        verify(again, nonces=nonces)
    assert code_of(e) == "replayed_nonce"


def test_a_bad_request_does_not_burn_its_nonce(wallet, nonces):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW)
    forged = dict(headers, **{HEADER_SIGNATURE: "00" * 64})
    with pytest.raises(SignatureError):
        verify(forged, nonces=nonces)
    with pytest.raises(SignatureError):
        verify(headers, body=b"tampered", nonces=nonces)
    assert len(nonces) == 0
    assert verify(headers, nonces=nonces) == wallet.public_key


def test_nonces_are_per_server_run_and_not_before_covers_a_restart(wallet):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW)
    verify(headers, nonces=NonceCache(SKEW))
    # After a restart the cache is empty; not_before (the new start time) still refuses it.
    with pytest.raises(SignatureError) as e:
        verify(headers, nonces=NonceCache(SKEW), now=NOW + 2, not_before=NOW + 1)
    assert code_of(e) == "expired_signature"


def test_a_window_shorter_than_the_skew_is_a_programming_error(wallet):
    headers = sign_request(wallet, "POST", PATH, BODY, now=NOW)
    with pytest.raises(ValueError, match="shorter than max_skew"):
        verify(headers, nonces=NonceCache(SKEW / 2))


def test_signature_error_carries_code_and_detail():
    e = SignatureError("bad_signature", "bad signature: x")
    assert (e.code, e.detail, str(e)) == ("bad_signature", "bad signature: x", "bad signature: x")


# --- the nonce cache ----------------------------------------------------------------


def test_nonce_cache_remembers_for_the_window_then_forgets():
    cache = NonceCache(10.0)
    assert cache.check_and_add("a", timestamp=100.0, now=100.0)
    assert not cache.check_and_add("a", timestamp=100.0, now=105.0)
    assert not cache.check_and_add("a", timestamp=100.0, now=110.0)  # still inside the window
    assert cache.check_and_add("b", timestamp=111.0, now=111.0)  # pruning "a" (expired at 110)
    assert len(cache) == 1
    assert cache.check_and_add("a", timestamp=111.0, now=111.0)


def test_nonce_cache_prunes_as_it_goes():
    cache = NonceCache(5.0)
    for i in range(10_000):
        t = float(i)
        assert cache.check_and_add(f"n{i}", timestamp=t, now=t)
        assert len(cache) <= 7  # only the last ~window seconds are kept
    assert len(cache) == 6


def test_nonce_cache_expiry_follows_the_timestamp_not_arrival():
    cache = NonceCache(10.0)
    # A request stamped in the future must be remembered until that stamp plus the window.
    assert cache.check_and_add("future", timestamp=108.0, now=100.0)
    assert cache.check_and_add("x", timestamp=112.0, now=112.0)
    assert not cache.check_and_add("future", timestamp=108.0, now=117.0)
    assert cache.check_and_add("y", timestamp=119.0, now=119.0)
    assert cache.check_and_add("future", timestamp=119.0, now=119.0)


@pytest.mark.parametrize("window", [0, -1, math.nan, math.inf])
def test_nonce_cache_needs_a_positive_finite_window(window):
    with pytest.raises(ValueError):
        NonceCache(window)


def test_nonce_cache_is_thread_safe():
    cache = NonceCache(1e6)
    wins: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        mine = [f"n{i}" for i in range(2000) if cache.check_and_add(f"n{i}", 0.0, 0.0)]
        with lock:
            wins.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == sorted(f"n{i}" for i in range(2000))  # each nonce won exactly once


def test_verify_request_from_many_threads(wallet):
    cache = NonceCache(SKEW)
    requests = [sign_request(wallet, "POST", PATH, BODY, now=NOW) for _ in range(50)]
    codes: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        for headers in requests:
            try:
                verify(headers, nonces=cache)
                got = "ok"
            except SignatureError as e:
                got = e.code
            with lock:
                codes.append(got)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes.count("ok") == 50 and codes.count("replayed_nonce") == 150


def test_signed_json_body_roundtrip(wallet):
    body = canonical_json({"round": 3, "loss": 0.25, "cid": "bafk"})
    headers = sign_request(wallet, "POST", "/v1/x", body, now=NOW)
    assert (
        verify(headers, "POST", "/v1/x", json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode())
        == wallet.public_key
    )
