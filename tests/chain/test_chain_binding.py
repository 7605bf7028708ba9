"""A coordinator's database keeps the money of one chain: the first start records it, and a
start on another (local on an EVM database, EVM on a local one, another deployment, a node
reset and redeployed at the same addresses) stops with one line naming both, nothing
written. The stack's own chain (``aitbc up --chain evm``) survives ``down`` and ``up``."""

from __future__ import annotations

import sqlite3

import pytest
from tests.chain.anvil import running_anvil
from tests.chain.evm_coordinator import GAS_WEI, coordinator, evm_stack

from aitbc.chain.evm.client import EvmClient
from aitbc.chain.evm.deploy import deploy_contracts, write_deployment
from aitbc.coordinator.app import create_app
from aitbc.coordinator.config import Settings
from aitbc.errors import AitbcError

pytestmark = pytest.mark.chain


def _binding(db) -> list[tuple]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT chain, chain_id, escrow, token, anchor, created_at FROM chain_binding").fetchall()


def _refused(settings: Settings, *words: str) -> str:
    with pytest.raises(AitbcError) as e:
        create_app(settings)
    line = str(e.value)
    assert "\n" not in line and all(w in line for w in words), line
    return line


def test_a_database_settles_on_the_chain_it_was_first_started_with(tmp_path):
    with evm_stack(tmp_path) as stack:
        d = stack.deployment
        db = stack.home / "coordinator.db"
        with coordinator(stack.settings()):
            pass
        recorded = _binding(db)
        assert [r[:4] for r in recorded] == [("evm", 31337, d.escrow, d.token)] and recorded[0][4].startswith("0x")

        # --chain local on it: the mirrored escrows would be spendable in the local books
        _refused(Settings(home=stack.home), f"EVM chain 31337 (escrow {d.escrow}", "--chain local", "--chain evm")

        # another deployment (other addresses) named by a swapped chain.json
        with EvmClient(stack.node.url) as client:
            other = deploy_contracts(client, stack.minter)
        write_deployment(tmp_path / "other", other)
        other_file = tmp_path / "other" / "chain.json"
        _refused(stack.settings(chain_file=other_file), f"escrow {d.escrow}", f"escrow {other.escrow}")

        # a node reset and redeployed from the same key: the same chain id and addresses, another chain
        with running_anvil(tmp_path / "anvil2") as node, EvmClient(node.url) as client:
            client.rpc.call("anvil_setBalance", stack.minter.address, hex(GAS_WEI))
            client.rpc.call("evm_mine")  # the contracts in another block than on the first node
            again = deploy_contracts(client, stack.minter)
            assert (again.escrow, again.token) == (d.escrow, d.token)
            write_deployment(tmp_path / "again", again)
            _refused(
                stack.settings(chain_file=tmp_path / "again" / "chain.json"),
                f"the node at {node.url} is not the chain",
                recorded[0][4],
            )
        assert _binding(db) == recorded  # nothing written by a refused start

        # the chain it was started with: accepted
        with coordinator(stack.settings()) as coord, coord.http() as http:
            assert http.get("/v1/chain").json()["escrow"] == d.escrow

        # a local database, then an EVM start on it
        local = tmp_path / "local"
        with coordinator(Settings(home=local)):
            pass
        assert [r[:4] for r in _binding(local / "coordinator.db")] == [("local", None, None, None)]
        _refused(
            stack.settings(db_url=f"sqlite:///{local / 'coordinator.db'}"),
            "the coordinator's own ledger (--chain local)",
            f"EVM chain 31337 (escrow {d.escrow}",
        )
        assert [r[0] for r in _binding(local / "coordinator.db")] == ["local"]
