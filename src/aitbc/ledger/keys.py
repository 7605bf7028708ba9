"""Ed25519 keys and signatures we accept: canonical encodings, prime-order points.

``cryptography`` (OpenSSL) verifies RFC 8032 signatures but accepts public keys of small
or mixed order. With a small-order key ``A`` (``[8]A`` is the identity) the equation
``[S]B = R + [k]A`` holds for a trivial signature (``R`` the identity, ``S = 0``) over
*any* message, so anyone could "sign" for the wallet whose address derives from ``A``.
Here every key that enters (signed requests, offers, wallets, the ledger audit) must be
the canonical encoding of a point of the prime-order subgroup, not the identity; and
every signature must have ``S < L`` and a canonically encoded ``R`` that is not of small
order (as libsodium's ``crypto_sign_verify_detached``; see "Taming the many EdDSAs",
Chalkias et al. 2020).

Pure integer arithmetic over the curve ``-x^2 + y^2 = 1 + d x^2 y^2`` mod ``p = 2^255 - 19``
(RFC 8032 section 5.1), points in extended coordinates ``(X, Y, Z, T)``.
"""

from __future__ import annotations

import functools

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493  # the prime order of the base point
D = (-121665 * pow(121666, P - 2, P)) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)  # a square root of -1 mod p

Point = tuple[int, int, int, int]  # extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z, xy = T/Z
IDENTITY: Point = (0, 1, 1, 0)


def decode_point(raw: bytes) -> Point | None:
    """The point a 32-byte encoding names (RFC 8032 5.1.3), or None when it names none
    or is not canonical: ``y >= p``, or ``x = 0`` with the sign bit set."""
    if len(raw) != 32:
        return None
    n = int.from_bytes(raw, "little")
    sign, y = n >> 255, n & ((1 << 255) - 1)
    if y >= P:
        return None
    u, v = (y * y - 1) % P, (D * y * y + 1) % P  # x^2 = u / v
    x = (u * pow(v, 3, P) * pow(u * pow(v, 7, P), (P - 5) // 8, P)) % P
    vx2 = (v * x * x) % P
    if vx2 == (-u) % P:
        x = (x * SQRT_M1) % P
    elif vx2 != u:
        return None  # u / v is not a square: no point has this y
    if x == 0 and sign:
        return None  # -0: a second encoding of the same point
    if x & 1 != sign:
        x = P - x
    return (x, y, 1, (x * y) % P)


def encode_point(pt: Point) -> bytes:
    """The canonical 32-byte encoding of a point (RFC 8032 5.1.2)."""
    x, y, z, _ = pt
    zi = pow(z, P - 2, P)
    x, y = x * zi % P, y * zi % P
    return (y | (x & 1) << 255).to_bytes(32, "little")


def add_points(a: Point, b: Point) -> Point:
    """a + b (the unified addition of RFC 8032 5.1.4; also doubles)."""
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    aa = (y1 - x1) * (y2 - x2) % P
    bb = (y1 + x1) * (y2 + x2) % P
    cc = 2 * D * t1 * t2 % P
    dd = 2 * z1 * z2 % P
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def mul_point(k: int, pt: Point) -> Point:
    """[k] pt by double-and-add (public scalars only: not constant-time)."""
    out = IDENTITY
    while k:
        if k & 1:
            out = add_points(out, pt)
        pt = add_points(pt, pt)
        k >>= 1
    return out


def is_identity(pt: Point) -> bool:
    x, y, z, _ = pt
    return x % P == 0 and (y - z) % P == 0


def has_small_order(pt: Point) -> bool:
    """True for the 8 torsion points (the identity included): ``[8] pt`` is the identity."""
    return is_identity(mul_point(8, pt))


@functools.lru_cache(maxsize=4096)
def key_problem(raw: bytes) -> str | None:
    """Why the 32 bytes are not a public key we accept, or None when they are one.

    Cached: the same few keys sign most requests, and the order check costs a scalar
    multiplication (about a millisecond)."""
    pt = decode_point(raw)
    if pt is None:
        return "not the canonical encoding of a curve point"
    if has_small_order(pt):
        return "a small-order point (a signature for any message would verify)"
    if not is_identity(mul_point(L, pt)):
        return "a mixed-order point (not in the prime-order subgroup)"
    return None


def key_problem_hex(value: object) -> str | None:
    """``key_problem`` of a key written as 64 hex digits; malformed text has a problem too."""
    if not isinstance(value, str) or len(value) != 64:
        return "not 64 hex digits"
    try:
        return key_problem(bytes.fromhex(value))
    except ValueError:
        return "not 64 hex digits"


def is_valid_public_key(raw: bytes) -> bool:
    """True for the canonical encoding of a point of prime order ``L``."""
    return key_problem(bytes(raw)) is None


def signature_problem(sig: bytes) -> str | None:
    """Why a 64-byte signature ``R || S`` is not canonical, or None: ``S`` must be below
    ``L`` (else ``S + L`` would be a second signature), ``R`` a canonical point encoding
    and not of small order."""
    if len(sig) != 64:
        return "not 64 bytes"
    if int.from_bytes(sig[32:], "little") >= L:
        return "S is not below the group order"
    r = decode_point(sig[:32])
    if r is None:
        return "R is not the canonical encoding of a curve point"
    if has_small_order(r):
        return "R is a small-order point"
    return None
