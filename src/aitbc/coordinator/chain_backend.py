"""The EVM chain a coordinator started with ``--chain evm`` settles on: the node, the
deployed escrow and token, and the settlement key. Built once at start
(:func:`connect`, ``Context.chain``); a local coordinator has none.

Everything a start can find wrong is one line before the coordinator serves anything: no
``--settlement-wallet``, no deployment record, a node that does not answer or is another
chain, no contract code at the recorded addresses (a dev node restarted since), a wallet
without an EVM account or whose account is not the deployment's settlement key, a wrong
passphrase.
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_account import Account
from eth_account.signers.local import LocalAccount

from aitbc.chain.evm.client import EvmClient
from aitbc.chain.evm.deploy import Deployment, chain_file, check_deployment, read_deployment_file
from aitbc.chain.evm.escrow import Escrow
from aitbc.coordinator.config import Settings
from aitbc.errors import AitbcError, UsageError
from aitbc.ledger.evm_keys import evm_address, load_evm_account


@dataclass(frozen=True, slots=True)
class ChainBackend:
    """One EVM deployment through one node, and the key that settles its runs."""

    client: EvmClient
    escrow: Escrow
    deployment: Deployment
    account: LocalAccount  # the settlement key: signs settle and finalize
    confirmations: int  # blocks on a transaction (its own counted) before it is final

    @property
    def chain_id(self) -> int:
        return self.deployment.chain_id

    @property
    def rpc(self) -> str:
        return self.client.url

    def close(self) -> None:
        self.client.close()


def connect(settings: Settings) -> ChainBackend | None:
    """The chain of ``settings`` (None on ``--chain local``), checked against the node;
    ``AitbcError`` (one line) when anything does not match."""
    if settings.chain == "local":
        return None
    wallet = settings.settlement_wallet
    if wallet is None:
        raise UsageError(
            "--chain evm settles with a wallet's EVM account: give --settlement-wallet NAME "
            "(or AITBC_SETTLEMENT_WALLET), the wallet under HOME/wallets whose account is the settlement key"
        )
    path = settings.chain_file or chain_file(settings.home)
    deployment = read_deployment_file(path)
    address = evm_address(settings.home, wallet)
    if address is None:
        raise AitbcError(
            f"wallet '{wallet}' under {settings.home / 'wallets'} has no EVM account; the settlement key of "
            f"{path} is {deployment.settlement_key}"
        )
    if address.lower() != deployment.settlement_key.lower():
        raise AitbcError(
            f"wallet '{wallet}''s EVM account {address} is not the settlement key of {path} "
            f"({deployment.settlement_key}): give the wallet that deployed, or the one named at deploy"
        )
    key = load_evm_account(settings.home, wallet)  # the passphrase: AITBC_WALLET_PASSPHRASE
    client = EvmClient(settings.rpc or deployment.rpc)
    try:
        check_deployment(client, deployment)
    except AitbcError:
        client.close()
        raise
    return ChainBackend(
        client=client,
        escrow=Escrow(client, deployment),
        deployment=deployment,
        account=Account.from_key(key.private_key),
        confirmations=settings.chain_confirmations,
    )
