"""Signed HTTP requests: who sent a request, and that nobody changed or replayed it.

The client signs, with its wallet's Ed25519 key, the canonical request::

    AITBC-REQUEST-1
    METHOD
    PATH[?QUERY]          exactly as sent (raw, still percent-encoded)
    BODY DIGEST           sha256 hex of the body, or UNSIGNED-PAYLOAD
    TIMESTAMP             unix seconds as sent in the header
    NONCE                 32 hex digits, random per request

(lines joined by ``\\n``, no newline at the end) and sends four headers: its public key,
the timestamp, the nonce and the signature. The server rebuilds the same bytes from
what it received, checks the signature, that the timestamp is within ``max_skew`` of its
clock and not before it started, and that the nonce is new.

``UNSIGNED-PAYLOAD`` is for blob uploads, whose path names the content's CID: the server
checks the bytes against the CID as they stream in, so the signature need not cover them.

On the server, the path to sign is the raw one, e.g. for Starlette
``scope["raw_path"].decode("latin-1")`` plus ``"?" + scope["query_string"]`` when
there is a query (``request.url.path`` is percent-decoded and would not match).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import re
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aitbc.ledger.keys import key_problem, signature_problem
from aitbc.ledger.wallet import Wallet, public_key_from_hex

HEADER_KEY = "X-Aitbc-Key"
HEADER_TIMESTAMP = "X-Aitbc-Timestamp"
HEADER_NONCE = "X-Aitbc-Nonce"
HEADER_SIGNATURE = "X-Aitbc-Signature"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"

SIGNING_VERSION = b"AITBC-REQUEST-1"

MISSING_SIGNATURE = "missing_signature"
BAD_SIGNATURE = "bad_signature"
EXPIRED_SIGNATURE = "expired_signature"
REPLAYED_NONCE = "replayed_nonce"

_HEADERS = (HEADER_KEY, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE)
_HEADERS_LOWER = tuple(h.lower() for h in _HEADERS)
# Decimal unix seconds, optional fraction: no sign, exponent, spaces, '_', nan or inf.
_TIMESTAMP_RE = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")
_NONCE_RE = re.compile(r"[0-9a-fA-F]{32}")


def body_digest(body: bytes) -> str:
    """sha256 hex of the request body (``b""`` for none)."""
    return hashlib.sha256(body).hexdigest()


def canonical_request(method: str, path: str, digest: str, timestamp: str, nonce: str) -> bytes:
    """The bytes that are signed (see the module docstring). ``ValueError`` if a field
    holds a newline, which would make two different requests sign the same bytes."""
    text = f"{method.upper()}\n{path}\n{digest}\n{timestamp}\n{nonce}"
    if text.count("\n") != 4:
        raise ValueError("a signed request field may not contain a newline")
    return SIGNING_VERSION + b"\n" + text.encode()


def canonical_json(obj: Any) -> bytes:
    """One byte string per JSON value: sorted keys, no spaces, UTF-8 (not ``\\u``
    escapes). ``ValueError`` for NaN or infinite floats, which JSON cannot carry."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def sign_request(
    wallet: Wallet,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    unsigned_payload: bool = False,
    now: float | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The four ``X-Aitbc-*`` headers that sign this request with ``wallet``.

    ``path`` is the path plus ``?query`` exactly as it will be sent. With
    ``unsigned_payload`` the body is not covered (blob uploads; see the module doc)."""
    timestamp = f"{time.time() if now is None else now:.3f}"
    if nonce is None:
        nonce = secrets.token_hex(16)
    digest = UNSIGNED_PAYLOAD if unsigned_payload else body_digest(body)
    signature = wallet.sign(canonical_request(method, path, digest, timestamp, nonce))
    return {
        HEADER_KEY: wallet.public_key,
        HEADER_TIMESTAMP: timestamp,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: signature,
    }


class SignatureError(Exception):
    """A request whose signature is missing, wrong, too old or replayed.

    ``code`` is one of ``missing_signature``, ``bad_signature``, ``expired_signature``,
    ``replayed_nonce``; ``detail`` is one line for the client (also ``str(e)``)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail

    def __str__(self) -> str:
        return self.detail


class NonceStore(Protocol):
    """Where a verifier remembers nonces: this module's in-memory ``NonceCache``, or the
    coordinator replicas' shared table (``coordinator.nonces``)."""

    window: float
    shared: bool  # True: each check is a database round trip (keep it off an event loop)

    def check_and_add(self, nonce: str, timestamp: float, now: float) -> bool: ...


class NonceCache:
    """The nonces seen in the last ``window`` seconds (thread-safe).

    A nonce is remembered until its request's timestamp plus ``window``; a request
    older than that is refused by the timestamp check, so ``window`` must be at least
    the ``max_skew`` it is used with (``verify_request`` checks). Expired entries are
    dropped as new ones arrive (a heap ordered by expiry: amortised O(log n))."""

    shared = False

    def __init__(self, window: float) -> None:
        if not window > 0 or math.isinf(window):
            raise ValueError(f"NonceCache window must be a positive number of seconds, not {window!r}")
        self.window = float(window)
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._expiry: list[tuple[float, str]] = []

    def check_and_add(self, nonce: str, timestamp: float, now: float) -> bool:
        """Record ``nonce``; False if it was seen already (a replay)."""
        with self._lock:
            expiry, seen = self._expiry, self._seen
            while expiry and expiry[0][0] < now:
                seen.discard(heapq.heappop(expiry)[1])
            if nonce in seen:
                return False
            seen.add(nonce)
            heapq.heappush(expiry, (timestamp + self.window, nonce))
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)


def _get_headers(headers: Mapping[str, str]) -> tuple[str, str, str, str]:
    """The four signing headers (key, timestamp, nonce, signature), looked up
    case-insensitively; a missing or empty one is a ``missing_signature`` error."""
    if isinstance(headers, dict):  # a plain dict is case-sensitive: normalise
        lowered = {k.lower(): v for k, v in headers.items()}
        values = [lowered.get(name) for name in _HEADERS_LOWER]
    else:  # Starlette's and httpx's Headers are case-insensitive mappings.
        values = [headers.get(lower) or headers.get(name) for name, lower in zip(_HEADERS, _HEADERS_LOWER)]
    found: list[str] = []
    for value, name in zip(values, _HEADERS):
        if not value:
            raise SignatureError(MISSING_SIGNATURE, f"request is not signed: missing header {name}")
        found.append(value)
    key, timestamp, nonce, signature = found
    return key, timestamp, nonce, signature


def precheck_headers(headers: Mapping[str, str], *, now: float, max_skew: float, not_before: float = 0.0) -> None:
    """The checks of :func:`verify_request` that need neither the body nor the nonce cache:
    the four headers are present and well formed and the timestamp is current. Run before
    a request's body is read, so an unsigned or stale request costs no body bytes.
    Raises ``SignatureError`` as :func:`verify_request` would."""
    _checked_headers(headers, now=now, max_skew=max_skew, not_before=not_before)


def _checked_headers(
    headers: Mapping[str, str], *, now: float, max_skew: float, not_before: float
) -> tuple[str, str, str, str, Ed25519PublicKey, bytes]:
    key, timestamp, nonce, signature = _get_headers(headers)

    if _TIMESTAMP_RE.fullmatch(timestamp) is None:
        raise SignatureError(BAD_SIGNATURE, f"bad signature: malformed {HEADER_TIMESTAMP} (want decimal unix seconds)")
    if _NONCE_RE.fullmatch(nonce) is None:
        raise SignatureError(BAD_SIGNATURE, f"bad signature: malformed {HEADER_NONCE} (want 32 hex digits)")
    try:
        public_key = public_key_from_hex(key)
    except ValueError:
        raise SignatureError(BAD_SIGNATURE, f"bad signature: malformed {HEADER_KEY} (want 64 hex digits)") from None
    try:
        if len(signature) != 128:
            raise ValueError
        raw_signature = bytes.fromhex(signature)
        if len(raw_signature) != 64:
            raise ValueError
    except ValueError:
        raise SignatureError(
            BAD_SIGNATURE, f"bad signature: malformed {HEADER_SIGNATURE} (want 128 hex digits)"
        ) from None

    # The clock checks come before the (costlier) signature check.
    ts = float(timestamp)
    if abs(now - ts) > max_skew:
        raise SignatureError(
            EXPIRED_SIGNATURE,
            f"signature expired: timestamp {timestamp} is {now - ts:+.0f}s from the server's clock; "
            f"at most {max_skew:g}s of clock skew is allowed",
        )
    if ts < not_before:
        raise SignatureError(
            EXPIRED_SIGNATURE,
            f"signature expired: timestamp {timestamp} is before the server started ({not_before:.3f}); "
            f"sign again with the current time (at most {max_skew:g}s of clock skew is allowed)",
        )

    return key, timestamp, nonce, signature, public_key, raw_signature


def verify_request(
    headers: Mapping[str, str],
    method: str,
    path: str,
    digest: str,
    *,
    now: float,
    max_skew: float,
    nonces: NonceStore,
    not_before: float = 0.0,
) -> str:
    """Check a signed request and return the signer's public key (lower-case hex).

    ``path`` is the raw path plus ``?query`` as received, ``digest`` the sha256 hex of
    the body received (or ``UNSIGNED_PAYLOAD``). Raises ``SignatureError``:
    ``missing_signature`` if a header is missing; ``bad_signature`` if one is malformed,
    the signature is not canonical or does not match, or the key is not a canonical
    prime-order point (``ledger.keys``); ``expired_signature`` if the timestamp is more than
    ``max_skew`` seconds from ``now`` or before ``not_before`` (the server's start, so
    requests signed for an earlier run cannot be replayed after a restart);
    ``replayed_nonce`` if the nonce was used before. The nonce is recorded only once the
    signature has been checked."""
    if nonces.window < max_skew:
        raise ValueError(f"NonceCache window {nonces.window:g}s is shorter than max_skew {max_skew:g}s")
    key, timestamp, nonce, signature, public_key, raw_signature = _checked_headers(
        headers, now=now, max_skew=max_skew, not_before=not_before
    )

    why = signature_problem(raw_signature)
    if why is not None:
        raise SignatureError(BAD_SIGNATURE, f"bad signature: not a canonical Ed25519 signature ({why})")
    try:
        message = canonical_request(method, path, digest, timestamp, nonce)
        public_key.verify(raw_signature, message)
    except (InvalidSignature, ValueError):
        raise SignatureError(BAD_SIGNATURE, "bad signature: it does not match this request and key") from None
    # Only after the signature matched: the order check costs a scalar multiplication
    # (cached per key), and an unsigned flood should not make the server pay it.
    why = key_problem(bytes.fromhex(key))
    if why is not None:
        raise SignatureError(
            BAD_SIGNATURE,
            f"bad signature: {HEADER_KEY} is {why}; only canonical prime-order Ed25519 keys are accepted",
        )

    if not nonces.check_and_add(nonce.lower(), float(timestamp), now):
        raise SignatureError(REPLAYED_NONCE, f"replayed request: nonce {nonce} was already used")
    return key.lower()
