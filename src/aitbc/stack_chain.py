"""``aitbc up --chain evm``: the local stack's EVM chain, a dev node it starts and owns.

    HOME/chain.json                          where the contracts are (the CLI reads it; the
                                             coordinator is given it as --chain-file)
    HOME/logs/anvil.log                      the node's log (anvil-accounts.json beside it)
    HOME/coordinator/wallets/chain-operator  the wallet that deploys, mints and settles:
                                             the deployment's minter and settlement key

    HOME/chain-state.json                    the chain itself, between a down and an up

The node is anvil on a port the kernel picks, started in its own session like the
stack's other processes and recorded with them (``role`` "chain"), so ``aitbc down``
stops it. It keeps its chain in HOME/chain-state.json (written when ``down`` stops it,
loaded by the next ``up``): the coordinator's database mirrors money held there, and a
new chain would leave its escrows and bonds pointing at nothing. The contracts recorded in
chain.json are reused while their code is on the node, and deployed again only when it is
not (the state file lost): then a coordinator database that settled on the old chain is
refused, as is ``up --chain local`` on one that settles on a chain, and the other way round.
Each worker's wallet gets an EVM account, ether for gas and :data:`WORKER_AIT` AIT minted
for its bonds before it starts. No typer here, and eth-account (seconds to import) only
once an EVM stack is asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sqlite3
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
    reused: bool  # the contracts were on the node's saved chain already (else deployed now)

    @property
    def coordinator_args(self) -> list[str]:
        return [
            *("--chain", "evm", "--chain-file", str(self.chain_file)),
            *("--settlement-wallet", OPERATOR_WALLET, "--chain-confirmations", str(DEV_CONFIRMATIONS)),
        ]


def coordinator_home(home: Path) -> Path:
    return home / "coordinator"


def state_file(home: Path) -> Path:
    return home / "chain-state.json"


def coordinator_db(home: Path) -> Path:
    """The stack's coordinator database (its default, under its HOME)."""
    return coordinator_home(home) / "coordinator.db"


def recorded_chain(home: Path) -> str | None:
    """The chain (local | evm) the stack's coordinator database keeps its money on, as it
    recorded at its first start; None: no database, or none recorded yet."""
    db = coordinator_db(home)
    if not db.exists():
        return None
    with contextlib.suppress(sqlite3.Error), contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        row = c.execute("SELECT chain FROM chain_binding WHERE id = 1").fetchone()
        return None if row is None else str(row[0])
    return None


def check_database(home: Path, chain: str) -> None:
    """Refuse, before anything starts, an ``up`` on another chain than the one the stack's
    coordinator database keeps its money on."""
    held = recorded_chain(home)
    if held is None or held == chain:
        return
    where = "an EVM chain (its own anvil)" if held == "evm" else "the coordinator's own ledger"
    raise AitbcError(
        f"the stack in {home} keeps its money on {where}, recorded in {coordinator_db(home)}: start it with "
        f"aitbc up --chain {held}, or start over with another --home (or without that database)"
    )


def start_chain(home: Path) -> DevChain:
    """Start the dev node on the stack's saved chain (its log in HOME/logs) and reuse the
    contracts of HOME/chain.json when their code is on it; else deploy them from the
    operator's wallet (made if missing, funded with gas) and write HOME/chain.json. The
    caller records ``node`` as a stack process and stops it on failure."""
    from aitbc.chain.evm.client import EvmClient
    from aitbc.chain.evm.deploy import deploy_contracts, write_deployment
    from aitbc.chain.evm.node import start_anvil

    fresh = not state_file(home).exists()
    node = start_anvil(home / "logs", state=state_file(home))
    try:
        operator = _operator(home)
        with EvmClient(node.url) as client:
            give_gas(client, operator.address)
            deployment = _saved_deployment(home, client)
            reused = deployment is not None
            if deployment is None:
                _refuse_new_chain(home)
                deployment = deploy_contracts(client, operator, minter_wallet=OPERATOR_WALLET)
        path = write_deployment(home, deployment)  # the node's new port, when reused
    except BaseException:
        node.stop(grace=2.0)
        if fresh:  # a start refused leaves no chain behind (the node wrote its new one as it stopped)
            state_file(home).unlink(missing_ok=True)
        raise
    return DevChain(node=node, deployment=deployment, chain_file=path, reused=reused)


def _saved_deployment(home: Path, client: EvmClient) -> Deployment | None:
    """HOME/chain.json's deployment at the node's URL, when its contracts are on the node
    and the stack's operator is still their minter; None: deploy again."""
    from aitbc.chain.evm.deploy import chain_file, check_deployment, read_deployment

    if not chain_file(home).exists():
        return None
    try:
        deployment = dataclasses.replace(read_deployment(home), rpc=client.url)
        check_deployment(client, deployment)
    except AitbcError:
        return None
    return deployment if deployment.minter == _operator(home).address else None


def _refuse_new_chain(home: Path) -> None:
    if recorded_chain(home) == "evm":
        raise AitbcError(
            f"the stack's chain is gone ({state_file(home)} is missing or holds no contracts of "
            f"{home / 'chain.json'}), and its coordinator database {coordinator_db(home)} keeps the money of "
            f"runs on it: put that state file back, or start over with another --home (or without that database)"
        )


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
    held = fund_account(home, deployment, address, 0).balance  # a stack started again kept its chain
    fund_account(home, deployment, address, max(0, int(WORKER_AIT * MICRO) - held))
    return address
