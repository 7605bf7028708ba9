"""A coordinator started with --chain evm against a real anvil: GET /v1/chain names the
deployment; every start that cannot settle on it stops with one line, before serving."""

from __future__ import annotations

import pytest
from tests.chain.evm_coordinator import coordinator, evm_stack

from aitbc.coordinator.app import create_app
from aitbc.coordinator.config import Settings
from aitbc.errors import AitbcError
from aitbc.ledger.evm_keys import ensure_evm_account
from aitbc.ledger.wallet import create_wallet

pytestmark = pytest.mark.chain


def test_chain_reply_and_one_line_start_errors(tmp_path):
    with evm_stack(tmp_path) as stack:
        with coordinator(stack.settings()) as coord, coord.http() as http:
            d = stack.deployment
            assert http.get("/v1/chain").json() == {
                "chain": "evm",
                "chain_id": 31337,
                "rpc": stack.node.url,
                "token": d.token,
                "escrow": d.escrow,
                "settlement_key": d.settlement_key,
                "confirmations": 1,
            }
        create_wallet(stack.home, "other")
        other = ensure_evm_account(stack.home, "other").address
        refused = [
            ({"settlement_wallet": None}, "give --settlement-wallet NAME"),
            ({"settlement_wallet": "other"}, f"wallet 'other''s EVM account {other} is not the settlement key"),
            ({"chain_file": tmp_path / "none.json"}, "deploy the contracts first"),
            ({"rpc": "http://127.0.0.1:9"}, "did not answer eth_chainId"),
        ]
        for over, words in refused:
            with pytest.raises(AitbcError) as e:
                create_app(stack.settings(**over))
            assert words in str(e.value) and "\n" not in str(e.value), (over, str(e.value))
    with pytest.raises(AitbcError, match="did not answer eth_chainId"):  # the node gone: refused at start
        create_app(stack.settings())


def test_a_local_coordinator_says_local(tmp_path):
    with coordinator(Settings(home=tmp_path / "coord")) as coord, coord.http() as http:
        assert http.get("/v1/chain").json() == {"chain": "local"}
        assert coord.ctx.chain is None
