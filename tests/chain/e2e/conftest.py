"""A local deployment on a real EVM chain for end-to-end tests: an anvil node started by the
test (port picked by the kernel), the contracts deployed on it by ``aitbc chain deploy``,
and the processes of tests/e2e's :class:`Stack` (coordinator, workers, the owner's CLI) on
127.0.0.1, the coordinator settling on the chain.

Three wallets under the coordinator's home, so that the settlement key's nonce counts the
settlement transactions alone: ``chain-deployer`` deploys and is the token's minter (the
faucet the test funds every party from), ``chain-operator`` is the settlement key
(``--settlement-wallet``). Every party's home holds a copy of ``chain.json``: the CLI's
``aitbc chain`` commands read it, never the coordinator."""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from tests.chain.anvil import anvil_binary
from tests.e2e.conftest import Stack

from aitbc.units import MICRO

DEPLOYER, OPERATOR, OWNER = "chain-deployer", "chain-operator", "my-agent-wallet"
GAS_WEI = 100 * 10**18
CONFIRMATIONS = 1  # anvil mines a block per transaction and none between: a second could wait for ever


class EvmStack(Stack):
    """:class:`Stack` with a chain: ``start_chain`` first, then coordinators and workers."""

    def __init__(self, root: Path, db_url: str) -> None:
        super().__init__(root, db_url)
        self.node: Any = None
        self.deployment: Any = None
        self.env["AITBC_HOME"] = str(self.home("owner"))

    def home(self, name: str) -> Path:
        return self.root / name

    # --- the chain ---------------------------------------------------------------------------

    def start_chain(self) -> None:
        from aitbc.chain.evm.deploy import read_deployment
        from aitbc.chain.evm.node import start_anvil

        self.node = start_anvil(self.root / "anvil", binary=anvil_binary())
        coord = self.home("coordinator")
        operator = self.evm_wallet("coordinator", OPERATOR)
        self.cli("wallet", "create", DEPLOYER, "--home", str(coord))
        r = self.cli(
            "chain", "deploy", "--rpc", self.node.url, "--wallet", DEPLOYER, "--settlement-key", operator,
            "--fund-gas", "--home", str(coord),
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        self.deployment = read_deployment(coord)
        self.give_gas(operator)

    def client(self) -> Any:
        from aitbc.chain.evm.client import EvmClient

        return EvmClient(self.node.url)

    def escrow(self, client: Any) -> Any:
        from aitbc.chain.evm.escrow import Escrow

        return Escrow(client, self.deployment)

    def evm_wallet(self, home: str, name: str) -> str:
        """Wallet ``name`` under ``root/home`` (made if missing) and its EVM address; the
        home gets a copy of chain.json once the contracts are deployed."""
        from aitbc.ledger.evm_keys import ensure_evm_account
        from aitbc.ledger.wallet import ensure_wallet

        ensure_wallet(self.home(home), name)
        if self.deployment is not None:
            shutil.copy(self.home("coordinator") / "chain.json", self.home(home) / "chain.json")
        return ensure_evm_account(self.home(home), name).address

    def give_gas(self, address: str) -> None:
        with self.client() as c:
            c.rpc.call("anvil_setBalance", address, hex(GAS_WEI))

    def fund(self, address: str, ait: int) -> None:
        """Gas, and ``ait`` AIT minted by the deployer (the token's minter)."""
        from eth_account import Account

        from aitbc.ledger.evm_keys import load_evm_account

        self.give_gas(address)
        minter = Account.from_key(load_evm_account(self.home("coordinator"), DEPLOYER).private_key)
        with self.client() as c:
            self.escrow(c).mint(minter, address, ait * MICRO)

    def balance(self, address: str) -> int:
        with self.client() as c:
            return int(self.escrow(c).token_balance(address))

    def time_travel(self, seconds: int) -> None:
        """Move the dev chain's clock ``seconds`` on and mine a block at that time."""
        with self.client() as c:
            c.rpc.call("evm_increaseTime", hex(seconds))
            c.rpc.call("evm_mine")

    def settlement_nonce(self) -> int:
        """Transactions the settlement key has had mined (reverted ones count too)."""
        with self.client() as c:
            return int(c.mined_nonce(self.deployment.settlement_key))

    # --- the services ------------------------------------------------------------------------

    def start_coordinator(self, *, extra: tuple[str, ...] = (), **kw: Any) -> None:  # type: ignore[override]
        chain = ("--chain", "evm", "--settlement-wallet", OPERATOR, "--chain-confirmations", str(CONFIRMATIONS))
        super().start_coordinator(extra=(*chain, *extra), **kw)

    def start_evm_worker(self, name: str, *, ait: int = 10, max_bond: str = "5", **kw: Any) -> str:
        """A provider funded on chain (gas and ``ait`` AIT for its bonds); its EVM address."""
        address = self.evm_wallet(name, name)
        self.fund(address, ait)
        self.start_worker(name, max_bond=max_bond, **kw)
        return address

    def owner_address(self, ait: int = 100) -> str:
        """The owner's wallet and EVM account, funded on chain."""
        address = self.evm_wallet("owner", OWNER)
        self.fund(address, ait)
        return address

    def init(self, *extra: str, workers: int = 2, model: str = "mlp") -> str:
        r = self.cli(
            "distributed-training", "init", "--wallet", OWNER, "--model-type", model, "--dataset-size", "100GB",
            "--target-workers", str(workers), *extra,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        return re.search(r"Training ID: (training_\w+)", r.stdout).group(1)

    def payments(self, run_id: str) -> dict[str, Any]:
        return self.api(f"/runs/{run_id}/payments")

    def chain_txs(self, run_id: str) -> list[dict[str, Any]]:
        engine = self.engine()
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    text("SELECT * FROM chain_txs WHERE run_id = :r ORDER BY id"), {"r": run_id}
                ).mappings()
                return [dict(r) for r in rows]
        finally:
            engine.dispose()

    def close(self) -> None:
        super().close()
        if self.node is not None:
            self.node.stop()


@contextlib.contextmanager
def started_stack(tmp_path: Path, databases: Any, **backend: str) -> Iterator[EvmStack]:
    """An :class:`EvmStack` with its chain started on a database of its own (``backend``:
    the ``databases`` fixture's, e.g. ``backend="postgresql"``), closed and dropped after."""
    url = databases.new(tmp_path / "coordinator", **backend)
    s = EvmStack(tmp_path, url)
    try:
        s.start_chain()
        yield s
    finally:
        s.close()
        databases.drop(url)


@pytest.fixture
def evm_stack(tmp_path: Path, databases: Any) -> Iterator[EvmStack]:
    with started_stack(tmp_path, databases) as s:
        yield s


def settled_rounds(escrow: Any, key: bytes) -> list[int]:
    """The rounds of run ``key`` with a RoundSettled event, one entry per event (in chain order)."""
    events = escrow.escrow.events("RoundSettled", from_block=escrow.deployment.block)
    return [int(e.args["round"]) for e in events if bytes(e.args["key"]) == key]


def key_of(payments: dict[str, Any]) -> bytes:
    return bytes.fromhex(str(payments["chain"]["key"]).removeprefix("0x"))
