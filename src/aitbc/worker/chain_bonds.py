"""The worker on an EVM coordinator (``GET /v1/chain`` says ``evm``): its offer names its
wallet's EVM account, and it posts its bonds on chain.

A hired provider is paid on chain only once its bond is there (0 is a bond too). The
offer names the account with a proof that it controls it (:mod:`aitbc.chain.evm.proof`). The
coordinator hands a job whose contract is not bonded yet with ``bond_required`` (the
chain, the escrow, the run's key and the amount); the worker posts it from its wallet's
EVM account (:func:`aitbc.chain_clients.ensure_bond`: nothing is sent if it is there
already) and asks for the job again. A bond it cannot post (no AIT, no gas, a node that
does not answer) is one line in the log, and is tried again at the next pickup, after a
pause. eth-account (seconds to import) is imported only here, and only on an EVM coordinator.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aitbc.chain.evm.proof import sign_proof
from aitbc.chain_clients import ensure_bond, open_escrow
from aitbc.errors import AitbcError
from aitbc.replies.chain import EvmChain
from aitbc.replies.jobs import BondRequired

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

log = logging.getLogger("aitbc.worker")


@dataclass(frozen=True, slots=True)
class BondOrder:
    """A job's ``bond_required``: post ``amount`` micro-AIT as the bond in run ``key``."""

    chain_id: int
    escrow: str
    token: str
    key: bytes
    amount: int

    @classmethod
    def of(cls, required: BondRequired) -> BondOrder:
        """From the job's ``bond_required``; ``AitbcError`` for a key that is not 32 bytes of hex."""
        try:
            key = bytes.fromhex(required.key.removeprefix("0x"))
        except ValueError:
            key = b""
        if len(key) != 32:
            raise AitbcError(f"bond_required names no run key: {required.key!r} is not 0x and 64 hex digits")
        return cls(
            chain_id=required.chain_id,
            escrow=required.escrow,
            token=required.token,
            key=key,
            amount=int(required.amount_micro),
        )


class WorkerChain:
    """This worker's EVM account on the chain ``view`` names (made at the first use if its
    wallet has none; the wallet's passphrase as for its Ed25519 key). It bonds at most
    ``max_bond`` micro-AIT (its offer's): the amount comes from the coordinator, which must
    not be able to lock more of the provider's AIT than the provider allowed."""

    def __init__(self, view: EvmChain, *, home: Path, wallet: str, max_bond: int) -> None:
        from aitbc.ledger.evm_keys import evm_address

        self.view, self.home, self.wallet, self.max_bond = view, home, wallet, max_bond
        self._account: LocalAccount | None = None
        self.address = evm_address(home, wallet) or self.account.address

    @property
    def account(self) -> LocalAccount:
        if self._account is None:
            from eth_account import Account

            from aitbc.ledger.evm_keys import ensure_evm_account

            self._account = Account.from_key(ensure_evm_account(self.home, self.wallet).private_key)
        return self._account

    def proof(self, wallet: str, coordinator_id: str) -> str:
        """The offer's ``evm_proof``: this account's signature saying it belongs to ``wallet``
        (the worker's aitbc address) at ``coordinator_id``."""
        return sign_proof(self.account, wallet, coordinator_id)

    def post_bond(self, required: BondRequired) -> bool:
        """Post the bond a job's ``bond_required`` asks for; False (logged in one line) if
        it could not be."""
        try:
            order = BondOrder.of(required)
        except AitbcError as e:
            log.error("bond not posted: %s", e)
            return False
        if (order.chain_id, order.escrow.lower()) != (self.view.chain_id, self.view.escrow.lower()):
            log.error(
                "bond in run 0x%s not posted: asked on chain %s escrow %s, the coordinator settles on chain %s escrow %s",
                order.key.hex(),
                order.chain_id,
                order.escrow,
                self.view.chain_id,
                self.view.escrow,
            )
            return False
        if order.amount > self.max_bond:
            log.error(
                "bond in run 0x%s not posted: asked for %s micro-AIT, above this worker's max_bond of %s",
                order.key.hex(),
                order.amount,
                self.max_bond,
            )
            return False
        try:
            escrow = open_escrow(self.view)
            try:
                tx = ensure_bond(escrow, self.account, order.key, order.amount, wallet=self.wallet)
            finally:
                escrow.client.close()
        except AitbcError as e:
            log.error("bond not posted (tried again at the next pickup): %s", e)
            return False
        if tx is not None:
            log.info("bond of %s micro-AIT posted in run 0x%s (tx %s)", order.amount, order.key.hex(), tx)
        return True
