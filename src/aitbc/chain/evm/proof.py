"""Proof that a party controls the EVM account it names to a coordinator.

An init names the run's owner on chain and an offer the account a provider bonds from and
is paid at. A name alone proves nothing: an init naming a rich stranger's account would
pass the hire checks (they count that account's AIT) with none of the signer's own, and an
offer naming a victim's account would take a place in runs that then stall unbonded. So
each names its account with ``evm_proof``: an EIP-191 personal-sign signature by that
account over :func:`proof_message`, which binds it to the signer's aitbc wallet address
and to the coordinator's id (``/v1/health``'s ``coordinator_id``), so a proof made for one
wallet or one coordinator is worth nothing to another.

eth-account (seconds to import) is imported inside the two functions that need it, so
building the message costs a local coordinator nothing.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

_SIGNATURE = re.compile(r"0x[0-9a-fA-F]{130}")  # r, s and v: 65 bytes


def proof_message(evm_address: str, wallet: str, coordinator_id: str) -> str:
    """The text an EVM account signs to say it belongs to ``wallet`` at this coordinator
    (the address in lower case: a checksummed and a lower-case spelling prove the same)."""
    return f"aitbc: EVM account {evm_address.lower()} belongs to wallet {wallet} at coordinator {coordinator_id}"


def sign_proof(account: LocalAccount, wallet: str, coordinator_id: str) -> str:
    """``account``'s ``evm_proof`` for ``wallet`` at ``coordinator_id``: 0x and 130 hex digits."""
    from eth_account.messages import encode_defunct

    signed = account.sign_message(encode_defunct(text=proof_message(account.address, wallet, coordinator_id)))
    return "0x" + bytes(signed.signature).hex()


def proof_signer(evm_address: str, wallet: str, coordinator_id: str, proof: str) -> str | None:
    """The account whose signature ``proof`` is over the message for ``evm_address``,
    ``wallet`` and ``coordinator_id`` (checksummed); None if it is no signature at all."""
    if not _SIGNATURE.fullmatch(proof):
        return None
    from eth_account import Account
    from eth_account.messages import encode_defunct
    from eth_keys.exceptions import BadSignature

    message = encode_defunct(text=proof_message(evm_address, wallet, coordinator_id))
    try:
        return str(Account.recover_message(message, signature=proof))
    except (ValueError, BadSignature):  # v, r or s out of range: a signature of nobody
        return None
