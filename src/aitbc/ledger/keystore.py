"""secp256k1 keys in the Web3 Secret Storage format (a version 3 keystore), and their
Ethereum addresses.

The format, as geth, Foundry's ``cast``, eth-account and every Ethereum wallet read it::

    {"version": 3, "id": <uuid4>, "address": <40 hex, no 0x>,
     "crypto": {"cipher": "aes-128-ctr", "cipherparams": {"iv": <32 hex>},
                "ciphertext": <64 hex>, "kdf": "scrypt",
                "kdfparams": {"dklen": 32, "n": ..., "r": 8, "p": 1, "salt": <64 hex>},
                "mac": <keccak-256(derived key[16:32] + ciphertext), 64 hex>}}

Written here with ``cryptography`` (scrypt, AES) and pycryptodome's Keccak rather than
``eth_account.Account.encrypt``: importing eth-account costs about two seconds
(eth-keyfile loads py_ecc's pairing tables), which every ``aitbc wallet`` command would
pay. The tests hold the two to each other both ways. Reading also takes the ``pbkdf2``
(HMAC-SHA256) keystores other tools write.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from typing import Any

from Crypto.Hash import keccak
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from aitbc.ledger.sealed import SCRYPT_N, SCRYPT_P, SCRYPT_R

_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141  # secp256k1's group order
_MAX_N = 1 << 20  # a keystore asking for more scrypt memory than this is refused
_MAX_PBKDF2 = 10_000_000


class BadKeystore(ValueError):
    """Not a keystore this module can open (malformed, unknown cipher or KDF)."""


class WrongPassword(ValueError):
    """The keystore's MAC does not match: the password does not open it."""


def keccak256(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def checksummed(address: str) -> str:
    """An address (0x optional, any case) in EIP-55 mixed-case form; ``ValueError`` if it is
    not 40 hex digits."""
    digits = address.removeprefix("0x").removeprefix("0X")
    if len(digits) != 40 or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise ValueError(f"not an EVM address: {address!r}")
    lower = digits.lower()
    hashed = keccak256(lower.encode()).hex()
    return "0x" + "".join(c.upper() if int(h, 16) >= 8 else c for c, h in zip(lower, hashed))


def address_of_key(key: bytes) -> str:
    """The checksummed address of a 32-byte secp256k1 private key: the last 20 bytes of the
    Keccak-256 of its uncompressed public point."""
    numbers = ec.derive_private_key(int.from_bytes(key, "big"), ec.SECP256K1()).public_key().public_numbers()
    point = numbers.x.to_bytes(32, "big") + numbers.y.to_bytes(32, "big")
    return checksummed(keccak256(point)[-20:].hex())


def new_key() -> bytes:
    """A random secp256k1 private key (32 bytes, in 1..order-1)."""
    while True:
        key = secrets.token_bytes(32)
        if 0 < int.from_bytes(key, "big") < _ORDER:
            return key


def _aes_ctr(key: bytes, iv: bytes, data: bytes) -> bytes:
    # CTR is its own inverse: the same call encrypts and decrypts
    cipher = Cipher(algorithms.AES(key), modes.CTR(iv)).encryptor()
    return cipher.update(data) + cipher.finalize()


def encrypt(key: bytes, password: str, *, n: int = SCRYPT_N) -> dict[str, Any]:
    """The version 3 keystore of ``key`` under ``password`` (scrypt, AES-128-CTR)."""
    salt, iv = secrets.token_bytes(32), secrets.token_bytes(16)
    derived = Scrypt(salt=salt, length=32, n=n, r=SCRYPT_R, p=SCRYPT_P).derive(password.encode())
    ciphertext = _aes_ctr(derived[:16], iv, key)
    return {
        "address": address_of_key(key)[2:].lower(),
        "crypto": {
            "cipher": "aes-128-ctr",
            "cipherparams": {"iv": iv.hex()},
            "ciphertext": ciphertext.hex(),
            "kdf": "scrypt",
            "kdfparams": {"dklen": 32, "n": n, "r": SCRYPT_R, "p": SCRYPT_P, "salt": salt.hex()},
            "mac": keccak256(derived[16:32] + ciphertext).hex(),
        },
        "id": str(uuid.uuid4()),
        "version": 3,
    }


def _derive(crypto: dict[str, Any], password: bytes) -> bytes:
    params = crypto["kdfparams"]
    dklen, salt = int(params["dklen"]), bytes.fromhex(params["salt"])
    if dklen < 32:
        raise BadKeystore(f"dklen {dklen} is below 32")
    if crypto["kdf"] == "scrypt":
        n, r, p = int(params["n"]), int(params["r"]), int(params["p"])
        if not (1 < n <= _MAX_N and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16):
            raise BadKeystore("scrypt parameters out of range")
        return Scrypt(salt=salt, length=dklen, n=n, r=r, p=p).derive(password)
    if crypto["kdf"] == "pbkdf2":
        if params.get("prf") != "hmac-sha256" or not 1 <= int(params["c"]) <= _MAX_PBKDF2:
            raise BadKeystore("pbkdf2 wants prf hmac-sha256 and a sane iteration count")
        return hashlib.pbkdf2_hmac("sha256", password, salt, int(params["c"]), dklen)
    raise BadKeystore(f"unknown kdf {crypto['kdf']!r}")


def decrypt(keystore: dict[str, Any], password: str) -> bytes:
    """The private key in ``keystore``; ``WrongPassword`` or ``BadKeystore``."""
    try:
        crypto = keystore.get("crypto") or keystore["Crypto"]
        if crypto["cipher"] != "aes-128-ctr":
            raise BadKeystore(f"unknown cipher {crypto['cipher']!r}")
        derived = _derive(crypto, password.encode())
        ciphertext = bytes.fromhex(crypto["ciphertext"])
        iv = bytes.fromhex(crypto["cipherparams"]["iv"])
        mac = bytes.fromhex(crypto["mac"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, BadKeystore):
            raise
        raise BadKeystore(f"malformed keystore ({e!r})") from None
    if not hmac.compare_digest(keccak256(derived[16:32] + ciphertext), mac):
        raise WrongPassword("MAC mismatch")
    key = _aes_ctr(derived[:16], iv, ciphertext)
    if len(key) != 32 or not 0 < int.from_bytes(key, "big") < _ORDER:
        raise BadKeystore("the decrypted key is not a secp256k1 private key")
    return key
