"""``aitbc up --chain evm``: the local stack's EVM chain, a dev node it starts and owns.

    HOME/chain.json                          where the contracts are (the CLI reads it; the
                                             coordinator is given it as --chain-file)
    HOME/logs/anvil.log                      the node's log (anvil-accounts.json beside it)
    HOME/coordinator/wallets/chain-operator  the wallet that deploys, mints and settles:
                                             the deployment's minter and settlement key

The node is anvil on a port the kernel picks, started in its own session like the
stack's other processes and recorded with them (``role`` "chain"), so ``aitbc down``
stops it. Every ``up`` starts a new, empty chain and deploys the contracts on it again:
a dev node keeps its state in memory only. Each worker's wallet gets an EVM account,
ether for gas and :data:`WORKER_AIT` AIT minted for its bonds before it starts. No typer
here, and eth-account (seconds to import) only once an EVM stack is asked for.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from aitbc.errors import AitbcError
from aitbc.units import MICRO

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from aitbc.chain.evm.client import EvmClient
    from aitbc.chain.evm.deploy import Deployment
    from aitbc.chain.evm.node import AnvilNode

CHAINS = ("local", "evm")
OPERATOR_WALLET = "chain-operator"
NODE_NAME = "anvil"
DEV_GAS_WEI = 100 * 10**18  # ether each funded account gets on the dev node: thousands of transactions
WORKER_AIT = Decimal("100")  # AIT minted to each worker: bonds of ten runs at the stack's max bond
# A dev node mines a block per transaction and none in between: a second confirmation could wait
# for the next user's transaction. Nothing reorganises a local node, so its first block is final.
DEV_CONFIRMATIONS = 1


@dataclass(frozen=True, slots=True)
class DevChain:
    """The running node and its deployment; ``coordinator_args`` put the coordinator on it."""

    node: AnvilNode
    deployment: Deployment
    chain_file: Path

    @property
    def coordinator_args(self) -> list[str]:
        return [
            *("--chain", "evm", "--chain-file", str(self.chain_file)),
            *("--settlement-wallet", OPERATOR_WALLET, "--chain-confirmations", str(DEV_CONFIRMATIONS)),
        ]


def coordinator_home(home: Path) -> Path:
    return home / "coordinator"


def start_chain(home: Path) -> DevChain:
    """Start the dev node (its log in HOME/logs) and deploy the contracts from the
    operator's wallet (made if missing, funded with gas); the deployment is written to
    HOME/chain.json. The caller records ``node`` as a stack process and stops it on failure."""
    from aitbc.chain.evm.client import EvmClient
    from aitbc.chain.evm.deploy import deploy_contracts, write_deployment
    from aitbc.chain.evm.node import start_anvil

    node = start_anvil(home / "logs")
    try:
        operator = _operator(home)
        with EvmClient(node.url) as client:
            give_gas(client, operator.address)
            deployment = deploy_contracts(client, operator, minter_wallet=OPERATOR_WALLET)
        path = write_deployment(home, deployment)
    except BaseException:
        node.stop(grace=2.0)
        raise
    return DevChain(node=node, deployment=deployment, chain_file=path)


@functools.cache  # one decryption per process (up funds every worker from it)
def _operator(home: Path) -> LocalAccount:
    from eth_account import Account

    from aitbc.ledger.evm_keys import ensure_evm_account
    from aitbc.ledger.wallet import ensure_wallet

    ensure_wallet(coordinator_home(home), OPERATOR_WALLET)
    return Account.from_key(ensure_evm_account(coordinator_home(home), OPERATOR_WALLET).private_key)


def give_gas(client: EvmClient, address: str) -> None:
    """Ether for gas on the dev node (its anvil_setBalance method)."""
    from aitbc.chain.evm.rpc import RpcError

    try:
        client.rpc.call("anvil_setBalance", address, hex(DEV_GAS_WEI))
    except RpcError as e:
        raise AitbcError(f"the node at {client.url} gives no ether for gas (anvil_setBalance: {e.message})") from None


@dataclass(frozen=True, slots=True)
class Funded:
    """What :func:`fund_account` did: the mint's transaction (None: nothing minted) and the
    account's AIT after it, in micro-AIT."""

    tx_hash: str | None
    balance: int


def fund_account(home: Path, deployment: Deployment, address: str, micro: int) -> Funded:
    """Give ``address`` gas and mint it ``micro`` micro-AIT, from the stack's operator (the
    deployment's minter)."""
    from aitbc.chain.evm.client import EvmClient
    from aitbc.chain.evm.deploy import contracts_of

    operator = _operator(home)
    if operator.address != deployment.minter:
        raise AitbcError(
            f"the stack's {OPERATOR_WALLET} wallet ({operator.address}) is not the minter of the contracts in "
            f"{home / 'chain.json'} ({deployment.minter}): start the stack again (aitbc down, aitbc up --chain evm)"
        )
    with EvmClient(deployment.rpc) as client:
        give_gas(client, address)
        token, _ = contracts_of(client, deployment)
        tx = token.transact(operator, "mint", address, micro).tx_hash if micro > 0 else None
        return Funded(tx_hash=tx, balance=int(token.call("balanceOf", address)))


def fund_worker(home: Path, deployment: Deployment, worker_home: Path, wallet: str) -> str:
    """Worker wallet ``wallet``'s EVM account (made if missing), given gas and
    :data:`WORKER_AIT`; its address."""
    from aitbc.ledger.evm_keys import ensure_evm_account

    address = ensure_evm_account(worker_home, wallet).address
    fund_account(home, deployment, address, int(WORKER_AIT * MICRO))
    return address
