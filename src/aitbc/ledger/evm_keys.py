"""A wallet's EVM account: a secp256k1 key beside its Ed25519 one, in the standard Web3
Secret Storage format (a version 3 keystore, as geth, Foundry's ``cast`` and every
Ethereum wallet read it), written and opened by eth-account.

``HOME/wallets/NAME/evm.json`` holds the keystore (``{"address", "crypto", "id",
"version": 3}``), 0600, created whole or not at all like ``key.json``. Its password is
the wallet's passphrase for an encrypted wallet (given, else ``AITBC_WALLET_PASSPHRASE``,
else asked on a terminal, as for its Ed25519 key) and the empty string for an unencrypted
one, whose Ed25519 key is stored in the clear beside it anyway.

The Ed25519 key keeps signing the API's requests; the EVM account holds and moves AIT on
an EVM chain. It is made at the wallet's first on-chain use (:func:`ensure_evm_account`),
not with the wallet: importing eth-account takes seconds (eth-keyfile loads py_ecc's
pairing tables), which ``aitbc wallet create`` and every other wallet command would pay.
So eth-account is imported only where a key is made or opened; :func:`evm_address` reads
the keystore's JSON alone. The address is recorded in the wallet's record
(``HOME/wallets/.records``) when the account is made, and a keystore of another address
put in its place is refused before any passphrase is asked for, as a replaced
``key.json`` is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aitbc.errors import AitbcError, IntegrityError, NotFoundError
from aitbc.ledger.files import write_exclusive
from aitbc.ledger.sealed import SCRYPT_N, WrongPassphrase, passphrase_for
from aitbc.ledger.wallet import (
    load_wallet,
    record_evm_address,
    record_path,
    recorded_evm_address,
    wallet_encrypted,
    wallet_info,
    wallet_path,
)

EVM_KEY_FILE = "evm.json"
_ADDRESS_RE = re.compile(r"(0x)?[0-9a-fA-F]{40}")
# A keystore asking for more work than these is refused before it is opened: its KDF would
# take the memory or the minutes of whoever opens it.
_MAX_SCRYPT_N = 1 << 20
_MAX_PBKDF2_C = 10_000_000


@dataclass(frozen=True, slots=True)
class EvmKey:
    """A wallet's decrypted EVM account (``eth_account.Account.from_key(key.private_key)``
    signs with it); ``repr`` does not show the key."""

    address: str  # checksummed
    private_key: bytes = field(repr=False)


def evm_key_path(home: Path, name: str) -> Path:
    """``HOME/wallets/NAME/evm.json``."""
    return wallet_path(home, name).parent / EVM_KEY_FILE


def _keystore_password(home: Path, name: str, passphrase: str | None) -> str:
    """The keystore's password: the wallet's passphrase if it is encrypted, else empty."""
    return passphrase_for(name, passphrase) if wallet_encrypted(home, name) else ""


def create_evm_account(home: Path, name: str, *, passphrase: str | None = None) -> str:
    """Give wallet ``name`` (which must exist) a new EVM account; its checksummed address.

    An encrypted wallet's passphrase is checked by opening its Ed25519 key first, so the
    keystore never gets a password the wallet does not have. ``AitbcError`` if the wallet
    has an EVM account already (never replaced: it may hold money)."""
    home = Path(home)
    wallet_info(home, name)  # exists, and is the wallet recorded under the name
    password = _keystore_password(home, name, passphrase)
    if password:
        load_wallet(home, name, passphrase=password)  # WrongPassphrase before anything is written
    from eth_account import Account  # seconds to import: only once a key is to be made

    account = Account.create()
    keystore = Account.encrypt(account.key, password, kdf="scrypt", iterations=SCRYPT_N)
    path = evm_key_path(home, name)
    try:
        written = write_exclusive(path, (json.dumps(keystore, indent=2) + "\n").encode())
    except OSError as e:
        raise AitbcError(f"cannot create wallet '{name}''s EVM account in {path}: {e.strerror or e}") from None
    if not written:
        raise AitbcError(f"wallet '{name}' has an EVM account already ({path}); it is never replaced")
    record_evm_address(home, name, account.address)
    return str(account.address)


def _corrupt(name: str, path: Path, why: str) -> IntegrityError:
    return IntegrityError(f"wallet '{name}''s EVM account is corrupt ({path}): {why}")


def _keystore(home: Path, name: str) -> dict[str, Any] | None:
    """The wallet's keystore JSON (None: no EVM account yet); ``IntegrityError`` if unreadable."""
    path = evm_key_path(home, name)
    try:
        keystore = json.loads(path.read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise AitbcError(f"cannot read wallet '{name}''s EVM account ({path}): {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError):
        keystore = None
    if not (isinstance(keystore, dict) and keystore.get("version") == 3 and isinstance(keystore.get("address"), str)):
        raise _corrupt(name, path, "want a version 3 keystore with its address")
    if _ADDRESS_RE.fullmatch(keystore["address"]) is None:
        raise _corrupt(name, path, f"its address {keystore['address']!r} is not 40 hex digits")
    return keystore


def _same_address(a: str, b: str) -> bool:
    return a.lower().removeprefix("0x") == b.lower().removeprefix("0x")


def evm_address(home: Path, name: str) -> str | None:
    """The wallet's EVM address (checksummed), None if it has no EVM account yet; nothing
    decrypted, and eth-account not imported. ``IntegrityError`` for a keystore that is not
    the one recorded for it."""
    home = Path(home)
    keystore = _keystore(home, name)
    if keystore is None:
        return None
    recorded = recorded_evm_address(home, name)
    if recorded is None:  # a keystore put there by hand, unrecorded: trusted now, checked from now on
        from eth_utils import to_checksum_address

        recorded = str(to_checksum_address("0x" + keystore["address"].lower().removeprefix("0x")))
        record_evm_address(home, name, recorded)
    elif not _same_address(recorded, keystore["address"]):
        raise IntegrityError(
            f"wallet '{name}''s EVM account is not the one created for it: {evm_key_path(home, name)} holds "
            f"0x{keystore['address'].lower().removeprefix('0x')}, it was created as {recorded}; refused; "
            f"restore the keystore created, or, if you replaced it on purpose, delete {record_path(home, name)}"
        )
    return recorded


def _kdf_problem(keystore: dict[str, Any]) -> str | None:
    """Why the keystore's KDF is not one to run (None: it is)."""
    crypto = keystore.get("crypto")
    if not (isinstance(crypto, dict) and isinstance(crypto.get("kdfparams"), dict)):
        return "no crypto.kdfparams"
    limits = {"scrypt": ("n", _MAX_SCRYPT_N), "pbkdf2": ("c", _MAX_PBKDF2_C)}
    kdf = crypto.get("kdf")
    if kdf not in limits:
        return f"unknown kdf {kdf!r} (want scrypt or pbkdf2)"
    param, limit = limits[kdf]
    work = crypto["kdfparams"].get(param)
    if not isinstance(work, int) or not 1 <= work <= limit:
        return f"its {kdf} {param} {work!r} is not in 1..{limit}"
    return None


def _decrypt(name: str, path: Path, keystore: dict[str, Any], password: str) -> bytes:
    """The keystore's private key, opened by eth-account; one-line errors."""
    from eth_account import Account  # seconds to import: only where a key is opened

    problem = _kdf_problem(keystore)
    if problem is not None:
        raise _corrupt(name, path, problem)
    try:
        return bytes(Account.decrypt(keystore, password))
    except ValueError as e:
        if str(e) != "MAC mismatch":  # what eth-keyfile says of a password that does not open it
            raise _corrupt(name, path, str(e)) from None
    except (KeyError, TypeError, NotImplementedError) as e:
        raise _corrupt(name, path, f"malformed ({type(e).__name__}: {e})") from None
    if password:
        raise WrongPassphrase(f"wrong passphrase for wallet '{name}'")
    raise IntegrityError(
        f"wallet '{name}' is unencrypted, but its EVM account {path} does not open with an empty password: refused"
    )


def load_evm_account(home: Path, name: str, *, passphrase: str | None = None) -> EvmKey:
    """The wallet's EVM account, decrypted; ``NotFoundError`` if it has none,
    ``WrongPassphrase`` if the passphrase does not open it."""
    from eth_account import Account

    home = Path(home)
    wallet_info(home, name)
    address = evm_address(home, name)
    keystore = _keystore(home, name)
    path = evm_key_path(home, name)
    if address is None or keystore is None:
        raise NotFoundError(
            f"wallet '{name}' has no EVM account ({path}); make it with: aitbc wallet evm {name} "
            "(an on-chain command makes it too)"
        )
    key = _decrypt(name, path, keystore, _keystore_password(home, name, passphrase))
    try:
        derived = Account.from_key(key).address
    except ValueError as e:
        raise _corrupt(name, path, f"its key is not a secp256k1 private key ({e})") from None
    if derived != address:
        raise _corrupt(name, path, f"its key gives {derived}, not the address {address} it states")
    return EvmKey(address=address, private_key=key)


def ensure_evm_account(home: Path, name: str, *, passphrase: str | None = None) -> EvmKey:
    """The wallet's EVM account, made first if it has none (the passphrase asked for once)."""
    if wallet_encrypted(Path(home), name):
        passphrase = passphrase_for(name, passphrase)
    if evm_address(Path(home), name) is None:
        try:
            create_evm_account(home, name, passphrase=passphrase)
        except AitbcError:
            if evm_address(Path(home), name) is None:  # not a racing creator's win: a real failure
                raise
    return load_evm_account(home, name, passphrase=passphrase)
