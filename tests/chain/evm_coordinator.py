"""A real coordinator on a real anvil, in-process (uvicorn in a thread, as
tests/coordinator's fixtures run it): the contracts deployed from a wallet of the
coordinator's HOME (``ops``: minter and settlement key), ``chain.json`` written, and the
coordinator started with ``--chain evm``. Helpers give parties EVM accounts with gas and
AIT, and act on chain as an owner's or a provider's client would."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from tests.chain.anvil import running_anvil
from tests.coordinator.conftest import Coordinator, serve

from aitbc.chain.evm.client import EvmClient
from aitbc.chain.evm.deploy import Deployment, deploy_contracts, write_deployment
from aitbc.chain.evm.escrow import Escrow
from aitbc.chain.evm.node import AnvilNode
from aitbc.coordinator.app import create_app
from aitbc.coordinator.config import Settings
from aitbc.ledger.evm_keys import ensure_evm_account
from aitbc.ledger.wallet import create_wallet

GAS_WEI = 100 * 10**18
SETTLEMENT_WALLET = "ops"


@dataclass
class EvmStack:
    node: AnvilNode
    client: EvmClient
    deployment: Deployment
    escrow: Escrow
    minter: LocalAccount
    home: Path

    def account(self, ait: int = 0) -> LocalAccount:
        """A new EVM account with gas and ``ait`` micro-AIT (minted)."""
        acct = Account.create()
        self.client.rpc.call("anvil_setBalance", acct.address, hex(GAS_WEI))
        if ait:
            self.escrow.mint(self.minter, acct.address, ait)
        return acct

    def settings(self, **over: Any) -> Settings:
        cfg: dict[str, Any] = dict(
            home=self.home,
            lease_seconds=600.0,
            max_blob_bytes=256 << 10,
            tick_seconds=0.05,
            chain="evm",
            settlement_wallet=SETTLEMENT_WALLET,
            chain_confirmations=1,
        )
        cfg.update(over)
        return Settings(**cfg)


@contextmanager
def evm_stack(tmp: Path) -> Iterator[EvmStack]:
    """anvil, the contracts deployed from wallet ``ops`` of ``tmp/coord`` (its HOME), chain.json written."""
    home = tmp / "coord"
    create_wallet(home, SETTLEMENT_WALLET)
    key = ensure_evm_account(home, SETTLEMENT_WALLET)
    minter = Account.from_key(key.private_key)
    with running_anvil(tmp / "anvil") as node, EvmClient(node.url) as client:
        client.rpc.call("anvil_setBalance", minter.address, hex(GAS_WEI))
        deployment = deploy_contracts(client, minter)
        write_deployment(home, deployment)
        yield EvmStack(node, client, deployment, Escrow(client, deployment), minter, home)


@contextmanager
def coordinator(settings: Settings) -> Iterator[Coordinator]:
    """``settings``' coordinator served in this process until the block ends, as
    tests/coordinator's fixtures (and `aitbc coordinator serve`) run it."""
    app = create_app(settings)
    url, stop = serve(app)
    coord = Coordinator(url, app.state.ctx, settings.home)
    try:
        yield coord
    finally:
        for c in coord.clients:
            c.close()
        stop()
