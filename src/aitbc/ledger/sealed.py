"""Wallet keys encrypted with a passphrase (``aitbc wallet create --encrypt``).

An encrypted ``key.json`` holds, instead of ``private_key``, an ``encrypted_key`` object::

    {"kdf": "scrypt", "n": 32768, "r": 8, "p": 1, "salt": <32 hex>,
     "cipher": "chacha20-poly1305", "nonce": <24 hex>, "ciphertext": <96 hex>}

The 32-byte key is scrypt(passphrase, salt); the ciphertext is the 32-byte Ed25519 seed
sealed with ChaCha20-Poly1305, the wallet's name, address and public key as associated
data (a sealed seed moved into another wallet's file does not open). A wrong passphrase
fails the tag: one clear line, nothing else learned. The passphrase comes from the caller,
else ``AITBC_WALLET_PASSPHRASE`` (unattended workers), else a prompt on a terminal.
"""

from __future__ import annotations

import getpass
import os
import secrets
import sys
from typing import Any, TypedDict

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from aitbc.errors import AitbcError, IntegrityError

PASSPHRASE_ENV = "AITBC_WALLET_PASSPHRASE"
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 15, 8, 1  # about 32 MiB and 0.1 s per derivation
_MAX_N = 1 << 20  # a file asking for more is refused (memory)


class WrongPassphrase(AitbcError):
    """The passphrase does not open the wallet's key."""


def _kdf(passphrase: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return Scrypt(salt=salt, length=32, n=n, r=r, p=p).derive(passphrase.encode())


class SealedKey(TypedDict):
    """A wallet's ``encrypted_key``: the scrypt parameters and the sealed seed, as hex."""

    kdf: str
    n: int
    r: int
    p: int
    salt: str
    cipher: str
    nonce: str
    ciphertext: str


def seal(seed: bytes, passphrase: str, aad: bytes) -> SealedKey:
    """``encrypted_key`` for ``seed`` under ``passphrase``."""
    if not passphrase:
        raise AitbcError("an empty passphrase encrypts nothing; give a passphrase")
    salt, nonce = secrets.token_bytes(16), secrets.token_bytes(12)
    key = _kdf(passphrase, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    box = ChaCha20Poly1305(key).encrypt(nonce, seed, aad)
    return {
        "kdf": "scrypt",
        "n": SCRYPT_N,
        "r": SCRYPT_R,
        "p": SCRYPT_P,
        "salt": salt.hex(),
        "cipher": "chacha20-poly1305",
        "nonce": nonce.hex(),
        "ciphertext": box.hex(),
    }


def unseal(name: str, sealed: Any, passphrase: str, aad: bytes) -> bytes:
    """The seed in ``sealed``; ``WrongPassphrase`` if the passphrase (or the associated
    data) does not open it, ``IntegrityError`` if ``sealed`` is malformed."""
    try:
        if sealed["kdf"] != "scrypt" or sealed["cipher"] != "chacha20-poly1305":
            raise ValueError(f"unknown kdf or cipher {sealed['kdf']!r}/{sealed['cipher']!r}")
        n, r, p = int(sealed["n"]), int(sealed["r"]), int(sealed["p"])
        if not (1 < n <= _MAX_N and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16):
            raise ValueError("scrypt parameters out of range")
        salt, nonce, box = (bytes.fromhex(sealed[k]) for k in ("salt", "nonce", "ciphertext"))
        if len(nonce) != 12:
            raise ValueError("nonce is not 12 bytes")
    except (KeyError, TypeError, ValueError) as e:
        raise IntegrityError(f"wallet '{name}': its encrypted_key is malformed ({e})") from None
    try:
        seed = ChaCha20Poly1305(_kdf(passphrase, salt, n, r, p)).decrypt(nonce, box, aad)
    except InvalidTag:
        raise WrongPassphrase(f"wrong passphrase for wallet '{name}'") from None
    if len(seed) != 32:
        raise IntegrityError(f"wallet '{name}': its encrypted_key does not hold a 32-byte key")
    return seed


def passphrase_for(name: str, given: str | None) -> str:
    """``given``, else ``AITBC_WALLET_PASSPHRASE``, else asked on the terminal."""
    if given:
        return given
    env = os.environ.get(PASSPHRASE_ENV)
    if env:
        return env
    if sys.stdin is not None and sys.stdin.isatty():
        return getpass.getpass(f"Passphrase for wallet '{name}': ")
    raise AitbcError(f"wallet '{name}' is encrypted: set {PASSPHRASE_ENV} to its passphrase")
