"""A wallet's EVM account: a secp256k1 key beside its Ed25519 one, in the standard Web3
Secret Storage format (a version 3 keystore, as geth, Foundry's ``cast`` and every
Ethereum wallet read it).

``HOME/wallets/NAME/evm.json`` holds the keystore (``{"address", "crypto", "id",
"version": 3}``; the key encrypted with scrypt and AES-128-CTR: :mod:`aitbc.ledger.keystore`), 0600,
created whole or not at all like ``key.json``. Its password is the wallet's passphrase
for an encrypted wallet (given, else ``AITBC_WALLET_PASSPHRASE``, else asked on a
terminal, as for its Ed25519 key) and the empty string for an unencrypted one, whose
Ed25519 key is stored in the clear beside it anyway.

The Ed25519 key keeps signing the API's requests; the EVM account holds and moves AIT on
an EVM chain. Its address is recorded in the wallet's record (``HOME/wallets/.records``)
when it is made, and a keystore of another address put in its place is refused before
any passphrase is asked for, as a replaced ``key.json`` is. A wallet made before EVM
accounts existed gets one at its first on-chain use (:func:`ensure_evm_account`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aitbc.errors import AitbcError, IntegrityError, NotFoundError
from aitbc.ledger import keystore as v3
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
    key = v3.new_key()
    keystore = v3.encrypt(key, password, n=SCRYPT_N)
    path = evm_key_path(home, name)
    try:
        written = write_exclusive(path, (json.dumps(keystore, indent=2) + "\n").encode())
    except OSError as e:
        raise AitbcError(f"cannot create wallet '{name}''s EVM account in {path}: {e.strerror or e}") from None
    if not written:
        raise AitbcError(f"wallet '{name}' has an EVM account already ({path}); it is never replaced")
    address = v3.address_of_key(key)
    record_evm_address(home, name, address)
    return address


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
    if not isinstance(keystore, dict) or keystore.get("version") != 3 or not _is_address(keystore.get("address")):
        raise IntegrityError(
            f"wallet '{name}''s EVM account is corrupt ({path}): want a version 3 keystore with its address"
        )
    return keystore


def evm_address(home: Path, name: str) -> str | None:
    """The wallet's EVM address (checksummed), None if it has no EVM account yet; nothing
    decrypted. ``IntegrityError`` for a keystore that is not the one recorded for it."""
    home = Path(home)
    keystore = _keystore(home, name)
    if keystore is None:
        return None
    address = v3.checksummed(keystore["address"])
    recorded = recorded_evm_address(home, name)
    if recorded is None:  # made before records held EVM addresses: trusted now, checked from now on
        record_evm_address(home, name, address)
    elif recorded != address:
        raise IntegrityError(
            f"wallet '{name}''s EVM account is not the one created for it: {evm_key_path(home, name)} holds "
            f"{address}, it was created as {recorded}; refused; restore the keystore created, or, if you "
            f"replaced it on purpose, delete {record_path(home, name)}"
        )
    return address


def load_evm_account(home: Path, name: str, *, passphrase: str | None = None) -> EvmKey:
    """The wallet's EVM account, decrypted; ``NotFoundError`` if it has none,
    ``WrongPassphrase`` if the passphrase does not open it."""
    home = Path(home)
    wallet_info(home, name)
    address = evm_address(home, name)
    keystore = _keystore(home, name)
    path = evm_key_path(home, name)
    if address is None or keystore is None:
        raise NotFoundError(f"wallet '{name}' has no EVM account ({path}); an on-chain command makes one")
    password = _keystore_password(home, name, passphrase)
    try:
        key = v3.decrypt(keystore, password)
    except v3.WrongPassword:
        if password:
            raise WrongPassphrase(f"wrong passphrase for wallet '{name}'") from None
        raise IntegrityError(
            f"wallet '{name}' is unencrypted, but its EVM account {path} does not open with an empty password: refused"
        ) from None
    except v3.BadKeystore as e:
        raise IntegrityError(f"wallet '{name}''s EVM account is corrupt ({path}): {e}") from None
    if v3.address_of_key(key) != address:
        raise IntegrityError(
            f"wallet '{name}''s EVM account is corrupt ({path}): its key gives "
            f"{v3.address_of_key(key)}, not the address {address} it states"
        )
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


def _is_address(value: Any) -> bool:
    try:
        v3.checksummed(value)
    except (ValueError, AttributeError):
        return False
    return isinstance(value, str)
