"""Identities and signatures: Ed25519 wallets under ``HOME/wallets`` and signed HTTP
requests (who sent it, unchanged, not replayed)."""

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
    verify_signature,
)

__all__ = [
    "HEADER_KEY",
    "HEADER_NONCE",
    "HEADER_SIGNATURE",
    "HEADER_TIMESTAMP",
    "UNSIGNED_PAYLOAD",
    "WALLET_NAME_RE",
    "NonceCache",
    "SignatureError",
    "Wallet",
    "WalletExistsError",
    "WalletInfo",
    "address_of",
    "body_digest",
    "canonical_json",
    "canonical_request",
    "create_wallet",
    "ensure_wallet",
    "list_wallets",
    "load_wallet",
    "sign_request",
    "verify_request",
    "verify_signature",
]
