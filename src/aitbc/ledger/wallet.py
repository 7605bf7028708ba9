"""Wallets: Ed25519 identities kept under ``HOME/wallets/NAME/key.json``.

A wallet is one Ed25519 key pair. Its public key (hex of the 32 raw bytes) identifies
the holder to the coordinator and the market; its address ``ait1`` + the first 40 hex
digits of sha256(public key) is the short name used in listings and payments.

``key.json`` is JSON, never a pickle::

    {"name": ..., "address": ..., "public_key": <64 hex>, "private_key": <64 hex, the
     raw 32-byte seed>, "created": <ISO 8601 UTC>}

The directory is 0700 and the file 0600; the file appears whole or not at all (written
to a temporary file, fsynced, then hard-linked into place so two creators cannot both
win). Every load re-derives the public key and address from the private key and refuses
a file whose stored ones differ.

What a wallet was created as is also recorded outside its own directory, in
``HOME/wallets/.records/NAME.json`` (``{"name", "address", "public_key", "encrypted"}``, and
``evm_address`` once the wallet has an EVM account (:mod:`aitbc.ledger.evm_keys`); 0600; a
dot name is never a wallet's): a ``key.json`` (or a whole ``NAME/`` folder) put in
place of the one created is refused by every load and by ``wallet show``, before any
passphrase is asked for: a plaintext key where an encrypted one was (it would have been
used without a passphrase or a word), or any key of another address. A wallet made
before records existed is recorded at its first load (trusted then); one encrypted by
hand later is recorded as encrypted from then on, never back. A key replaced on purpose
(a restored backup) is accepted again once its record is deleted, as the error says.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from aitbc.errors import AitbcError, IntegrityError, NotFoundError, UsageError
from aitbc.json_value import JSONObject
from aitbc.ledger.files import mkdir_private, replace_private, write_exclusive
from aitbc.ledger.keys import key_problem, signature_problem
from aitbc.ledger.sealed import SealedKey, passphrase_for, seal, unseal

WALLET_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""Allowed wallet names (use ``fullmatch``): 1-64 letters, digits, '.', '_', '-', first a
letter or digit (so no hidden names, no '..', nothing that leaves ``HOME/wallets``)."""

ADDRESS_PREFIX = "ait1"
KEY_FILE = "key.json"
WALLETS_DIR = "wallets"
RECORDS_DIR = ".records"  # under WALLETS_DIR: what each wallet was created as

_KEY_HEX_LEN = 64  # 32 bytes, public key and private seed alike
_SIG_HEX_LEN = 128  # 64 bytes
_FIELDS = ("name", "address", "public_key", "private_key", "created")


class WalletExistsError(AitbcError):
    """``create_wallet`` found a wallet of that name already (an ``AitbcError``, exit 1)."""


def check_wallet_name(name: str) -> str:
    """Return ``name`` if it is a valid wallet name, else raise ``UsageError``."""
    if not isinstance(name, str) or WALLET_NAME_RE.fullmatch(name) is None:
        raise UsageError(
            f"bad wallet name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def _hex32(value: Any) -> bytes | None:
    """The 32 bytes a 64-hex-digit string spells, or None for anything else.

    ``bytes.fromhex`` skips whitespace, so the string length is checked as well."""
    if not isinstance(value, str) or len(value) != _KEY_HEX_LEN:
        return None
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        return None
    return raw if len(raw) == 32 else None


def _address_of_raw(raw_public: bytes) -> str:
    return ADDRESS_PREFIX + hashlib.sha256(raw_public).hexdigest()[:40]


def address_of(public_key_hex: str) -> str:
    """The address of a public key: ``ait1`` + sha256(raw 32 bytes).hexdigest()[:40].

    Upper- and lower-case hex give the same address. ``UsageError`` for anything that is
    not 64 hex digits."""
    raw = _hex32(public_key_hex)
    if raw is None:
        raise UsageError(f"bad public key {public_key_hex!r}: want 64 hex digits (32-byte Ed25519 key)")
    return _address_of_raw(raw)


@functools.lru_cache(maxsize=4096)
def public_key_from_hex(public_key_hex: str) -> Ed25519PublicKey:
    """The key object for a 64-hex-digit public key, cached (the same few keys sign most
    requests). ``ValueError`` for a malformed one (not cached)."""
    raw = _hex32(public_key_hex)
    if raw is None:
        raise ValueError("want 64 hex digits")
    return Ed25519PublicKey.from_public_bytes(raw)


def verify_signature(public_key_hex: str, message: bytes, signature_hex: str) -> bool:
    """True if ``signature_hex`` is a valid, canonical Ed25519 signature of ``message`` by
    a canonical prime-order key (``ledger.keys``: small- and mixed-order keys, ``S >= L``
    and non-canonical ``R`` are refused).

    Never raises on malformed input (bad hex, wrong lengths, wrong types): False."""
    try:
        if not isinstance(signature_hex, str) or len(signature_hex) != _SIG_HEX_LEN:
            return False
        signature = bytes.fromhex(signature_hex)
        if len(signature) != 64 or signature_problem(signature) is not None:
            return False
        public_key_from_hex(public_key_hex).verify(signature, message)
        # The costly order check last: only a key that signed this message pays for it.
        return key_problem(bytes.fromhex(public_key_hex)) is None
    except (InvalidSignature, ValueError, TypeError):
        return False


def _utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class WalletInfo:
    """What can be shown about a wallet: never its private key."""

    name: str
    address: str
    public_key: str  # hex of the 32 raw bytes
    created: str  # ISO 8601, UTC

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "address": self.address, "public_key": self.public_key, "created": self.created}


class Wallet:
    """An Ed25519 key pair with a name. The private key never leaves this object except
    through ``create_wallet`` writing ``key.json``; ``repr`` does not show it."""

    __slots__ = ("name", "address", "public_key", "created", "_private_key")

    def __init__(self, name: str, private_key: Ed25519PrivateKey, created: str | None = None) -> None:
        self.name = check_wallet_name(name)
        self._private_key = private_key
        raw_public = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public_key = raw_public.hex()
        self.address = _address_of_raw(raw_public)
        self.created = created if created is not None else _utc_now_iso()

    @classmethod
    def generate(cls, name: str) -> Wallet:
        """A new random key pair, in memory only (``create_wallet`` also saves it)."""
        return cls(name, Ed25519PrivateKey.generate())

    def sign(self, message: bytes) -> str:
        """Hex of the 64-byte Ed25519 signature of ``message``."""
        return self._private_key.sign(message).hex()

    def info(self) -> WalletInfo:
        return WalletInfo(name=self.name, address=self.address, public_key=self.public_key, created=self.created)

    def _seed_hex(self) -> str:
        return self._private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()).hex()

    def __repr__(self) -> str:
        return f"Wallet(name={self.name!r}, address={self.address!r})"


# --- on disk -------------------------------------------------------------------------


def wallets_dir(home: Path) -> Path:
    return Path(home) / WALLETS_DIR


def wallet_path(home: Path, name: str) -> Path:
    """``HOME/wallets/NAME/key.json`` (the name checked first)."""
    return wallets_dir(home) / check_wallet_name(name) / KEY_FILE


def create_wallet(home: Path, name: str, *, passphrase: str | None = None) -> Wallet:
    """Generate a wallet and save it as ``HOME/wallets/NAME/key.json``; with a
    ``passphrase``, its key is stored encrypted (:mod:`aitbc.ledger.sealed`).

    ``UsageError`` for a bad name; ``WalletExistsError`` (an ``AitbcError``) if the
    wallet exists already, which is never overwritten."""
    home = Path(home)
    path = wallet_path(home, name)
    if path.exists():
        raise WalletExistsError(f"wallet '{name}' already exists ({path.parent})")
    wallet = Wallet.generate(name)
    record: PlainKeyFile | SealedKeyFile
    if passphrase is None:
        record = {
            "name": wallet.name,
            "address": wallet.address,
            "public_key": wallet.public_key,
            "private_key": wallet._seed_hex(),
            "created": wallet.created,
        }
    else:  # the seed is stored sealed: no plaintext key in the file
        aad = _aad(wallet.name, wallet.address, wallet.public_key)
        record = {
            "name": wallet.name,
            "address": wallet.address,
            "public_key": wallet.public_key,
            "created": wallet.created,
            "encrypted_key": seal(bytes.fromhex(wallet._seed_hex()), passphrase, aad),
        }
    data = (json.dumps(record, indent=2) + "\n").encode()
    try:
        mkdir_private(wallets_dir(home))
        mkdir_private(path.parent)
        written = write_exclusive(path, data)
    except OSError as e:  # home is a file, no permission, disk full, ...
        raise AitbcError(f"cannot create wallet '{name}' in {path.parent}: {e.strerror or e}") from None
    if not written:
        raise WalletExistsError(f"wallet '{name}' already exists ({path.parent})")
    # this creator alone won the name: a record left by a wallet deleted before is replaced
    try:
        _write_record(home, wallet, encrypted=passphrase is not None)
    except OSError as e:
        raise AitbcError(f"cannot record wallet '{name}' in {record_path(home, name)}: {e.strerror or e}") from None
    return wallet


def load_wallet(home: Path, name: str, *, passphrase: str | None = None) -> Wallet:
    """Load ``HOME/wallets/NAME/key.json`` and check it. An encrypted key is opened with
    ``passphrase``, else ``AITBC_WALLET_PASSPHRASE``, else a prompt on a terminal
    (``WrongPassphrase`` if it does not open).

    ``NotFoundError`` if there is no such wallet; ``IntegrityError`` if the file is not
    the JSON object described above or its public key or address is not the one its
    private key gives. The wallet's name is its directory's name."""
    home = Path(home)
    path = wallet_path(home, name)
    try:
        text = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        raise NotFoundError(
            f"no wallet '{name}' in {wallets_dir(home)}; create it with: aitbc wallet create {name}"
        ) from None
    except OSError as e:
        raise AitbcError(f"cannot read wallet '{name}' ({path}): {e.strerror or e}") from None
    record = _key_record(name, path, text)
    encrypted = _is_sealed(record)
    if encrypted:  # its stored address (the sealed key is bound to it), before a passphrase is asked for
        _check_recorded(home, name, path, record.get("address"), encrypted=True)
    wallet = _parse_key_record(name, path, record, passphrase)
    if not encrypted:  # the address its key gives
        _check_recorded(home, name, path, wallet.address, encrypted=False)
    _remember(home, wallet, encrypted=encrypted)
    return wallet


class PlainKeyFile(TypedDict):
    """``key.json`` of a wallet whose key is stored as it is (keys in the file's order)."""

    name: str
    address: str
    public_key: str
    private_key: str
    created: str


class SealedKeyFile(TypedDict):
    """``key.json`` of a wallet whose key is stored encrypted (keys in the file's order)."""

    name: str
    address: str
    public_key: str
    created: str
    encrypted_key: SealedKey


@dataclass(frozen=True, slots=True)
class WalletRecord:
    """What a wallet was created as (``HOME/wallets/.records/NAME.json``)."""

    address: str
    encrypted: bool
    evm_address: str | None = None  # its EVM account's (evm_keys), once it has one


def _aad(name: object, address: object, public_key: object) -> bytes:
    """What an encrypted key is bound to: the wallet's name, address and public key."""
    return f"aitbc-wallet\n{name}\n{address}\n{public_key}".encode()


def _corrupt(name: str, path: Path, why: str) -> IntegrityError:
    return IntegrityError(f"wallet '{name}' is corrupt ({path}): {why}")


def _key_record(name: str, path: Path, text: bytes) -> JSONObject:
    """``key.json``'s JSON object (nothing checked inside it yet)."""
    try:
        record = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        raise _corrupt(name, path, "not valid JSON") from None
    if not isinstance(record, dict):
        raise _corrupt(name, path, "not a JSON object")
    return record


def _is_sealed(record: JSONObject) -> bool:
    return "encrypted_key" in record and "private_key" not in record


def _parse_key_record(name: str, path: Path, record: JSONObject, passphrase: str | None = None) -> Wallet:
    def corrupt(why: str) -> IntegrityError:
        return _corrupt(name, path, why)

    if _is_sealed(record):
        if not all(isinstance(record.get(f), str) for f in ("name", "address", "public_key")):
            raise corrupt("missing or non-string name, address or public_key")
        aad = _aad(record["name"], record["address"], record["public_key"])
        opened = unseal(name, record["encrypted_key"], passphrase_for(name, passphrase), aad)
        record = {**record, "private_key": opened.hex()}
    fields: dict[str, str] = {}
    for field in _FIELDS:
        value = record.get(field)
        if not isinstance(value, str):
            raise corrupt(f"missing or non-string field '{field}'")
        fields[field] = value
    seed = _hex32(fields["private_key"])
    if seed is None:
        raise corrupt("private_key is not 64 hex digits")
    wallet = Wallet(name, Ed25519PrivateKey.from_private_bytes(seed), created=fields["created"])
    if fields["public_key"].lower() != wallet.public_key:
        raise corrupt("its public_key does not match its private key")
    if fields["address"] != wallet.address:
        raise corrupt("its address does not match its private key")
    return wallet


def wallet_info(home: Path, name: str) -> WalletInfo:
    """A wallet's public facts, checked as a load checks them: a plaintext key is loaded
    (its address derived from it); an encrypted one is not opened, its stored public key
    and address are checked against each other (the sealed key is bound to both) and
    against the wallet's record."""
    home = Path(home)
    path = wallet_path(home, name)
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        record = None
    if not (isinstance(record, dict) and _is_sealed(record)):
        return load_wallet(home, name).info()
    address, public, created = (str(record.get(f, "")) for f in ("address", "public_key", "created"))
    if _hex32(public) is None or address_of(public) != address:
        raise IntegrityError(f"wallet '{name}' is corrupt ({path}): its address does not match its public key")
    _check_recorded(home, name, path, address, encrypted=True)
    return WalletInfo(name, address, public.lower(), created)


def wallet_encrypted(home: Path, name: str) -> bool:
    """Whether the wallet's key is stored encrypted (check it first: :func:`wallet_info`)."""
    try:
        record = json.loads(wallet_path(Path(home), name).read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(record, dict) and _is_sealed(record)


# --- what each wallet was created as ---------------------------------------------------


def record_path(home: Path, name: str) -> Path:
    """``HOME/wallets/.records/NAME.json``: outside the wallet's own folder, so replacing
    ``key.json`` or the folder leaves it."""
    return wallets_dir(home) / RECORDS_DIR / f"{check_wallet_name(name)}.json"


def _read_record(home: Path, name: str) -> WalletRecord | None:
    """The wallet's record (None: none yet); ``IntegrityError`` for one that is not ours."""
    path = record_path(home, name)
    try:
        record = json.loads(path.read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise AitbcError(f"cannot read wallet '{name}''s record ({path}): {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError):
        record = None
    if not (isinstance(record, dict) and isinstance(record.get("address"), str)) or not isinstance(
        record.get("encrypted"), bool
    ):
        raise IntegrityError(
            f"wallet '{name}''s record is corrupt ({path}): want a JSON object with an address and "
            "encrypted true or false (delete it to record the wallet as it is now)"
        )
    evm = record.get("evm_address")
    return WalletRecord(
        address=record["address"], encrypted=record["encrypted"], evm_address=evm if isinstance(evm, str) else None
    )


def _check_recorded(home: Path, name: str, path: Path, address: Any, *, encrypted: bool) -> None:
    """Refuse a key file that is not the wallet recorded under ``name``: a plaintext key
    for a wallet created encrypted, or another address."""
    recorded = _read_record(home, name)
    if recorded is None:
        return
    undo = f"restore the key created, or, if you replaced it on purpose, delete {record_path(home, name)}"
    if recorded.encrypted and not encrypted:
        raise IntegrityError(
            f"wallet '{name}' was created encrypted, but {path} holds a plaintext key: refused "
            f"(a key file put in its place would be used without your passphrase); {undo}"
        )
    if isinstance(address, str) and address != recorded.address:
        raise IntegrityError(
            f"wallet '{name}' is not the wallet created under this name: {path} gives address {address}, "
            f"it was created as {recorded.address}; refused; {undo}"
        )


def _write_record(home: Path, wallet: Wallet, *, encrypted: bool, evm_address: str | None = None) -> None:
    folder = wallets_dir(home) / RECORDS_DIR
    mkdir_private(folder)
    record: dict[str, object] = {
        "name": wallet.name,
        "address": wallet.address,
        "public_key": wallet.public_key,
        "encrypted": encrypted,
    }
    if evm_address is not None:
        record["evm_address"] = evm_address
    replace_private(record_path(home, wallet.name), (json.dumps(record) + "\n").encode())


def recorded_evm_address(home: Path, name: str) -> str | None:
    """The EVM address recorded for the wallet (None: none recorded yet)."""
    recorded = _read_record(Path(home), name)
    return None if recorded is None else recorded.evm_address


def record_evm_address(home: Path, name: str, evm_address: str) -> None:
    """Record the wallet's EVM address in its record (which must exist: the wallet was
    loaded or created first); a keystore put in place of the one recorded is then refused."""
    path = record_path(Path(home), name)
    if _read_record(Path(home), name) is None:
        raise AitbcError(f"wallet '{name}' has no record ({path}) to add its EVM address to")
    record = json.loads(path.read_bytes())
    record["evm_address"] = evm_address
    replace_private(path, (json.dumps(record) + "\n").encode())


def _remember(home: Path, wallet: Wallet, *, encrypted: bool) -> None:
    """Record a loaded wallet that has no record yet (made before records existed), or
    that is encrypted now and was not: from then on it loads only as it is now."""
    recorded = _read_record(home, wallet.name)
    if recorded is not None and (recorded.encrypted or not encrypted):
        return
    try:
        _write_record(home, wallet, encrypted=encrypted, evm_address=recorded.evm_address if recorded else None)
    except OSError as e:  # a read-only home still loads its wallets, unrecorded
        warnings.warn(
            f"wallet '{wallet.name}' could not be recorded in {record_path(home, wallet.name)} ({e.strerror or e}); "
            "a key file put in its place would not be noticed",
            stacklevel=3,
        )


def ensure_wallet(home: Path, name: str) -> Wallet:
    """Load the wallet, or create it if there is none (safe against a racing creator)."""
    try:
        return load_wallet(home, name)
    except NotFoundError:
        pass
    try:
        return create_wallet(home, name)
    except WalletExistsError:  # someone else created it between our load and create
        return load_wallet(home, name)


def list_wallets(home: Path) -> list[WalletInfo]:
    """Every wallet under ``HOME/wallets``, sorted by name. Directories without a
    ``key.json`` (or with a name that is not a wallet name) are skipped; a corrupt
    ``key.json`` raises ``IntegrityError`` naming it."""
    root = wallets_dir(home)
    try:
        entries = sorted(os.listdir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise AitbcError(f"cannot list wallets in {root}: {e.strerror or e}") from None
    infos = []
    for entry in entries:
        if WALLET_NAME_RE.fullmatch(entry) is None or not (root / entry / KEY_FILE).is_file():
            continue
        infos.append(wallet_info(home, entry))
    return infos
