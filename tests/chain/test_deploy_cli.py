"""``aitbc chain deploy`` against a real anvil: the contracts deployed from an encrypted
wallet's EVM account and their addresses written to HOME/chain.json; every refusal one
line, with nothing deployed or written."""

from __future__ import annotations

import json

import pytest
from tests.chain.anvil import running_anvil

from aitbc.chain.evm.client import EvmClient
from aitbc.chain.evm.deploy import chain_file, check_deployment, read_deployment
from aitbc.ledger.evm_keys import evm_address

pytestmark = pytest.mark.chain


def _one_line_error(result, code: int) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def test_deploy_writes_chain_json_and_refuses_in_one_line(aitbc, tmp_path, monkeypatch):
    monkeypatch.setenv("AITBC_WALLET_PASSPHRASE", "ops pass")
    assert aitbc("wallet", "create", "ops", "--encrypt").returncode == 0
    assert evm_address(aitbc.home, "ops") is None  # made at its first on-chain use
    with running_anvil(tmp_path / "anvil") as node:
        rpc = ("--rpc", node.url, "--wallet", "ops")
        bad_key = _one_line_error(aitbc("chain", "deploy", *rpc, "--settlement-key", "0x12"), 2)
        assert "bad --settlement-key '0x12'" in bad_key
        monkeypatch.setenv("AITBC_WALLET_PASSPHRASE", "not it")
        assert _one_line_error(aitbc("chain", "deploy", *rpc, "--fund-gas"), 1) == (
            "error: wrong passphrase for wallet 'ops'\n"
        )
        assert evm_address(aitbc.home, "ops") is None  # nothing made under a passphrase the wallet lacks
        monkeypatch.setenv("AITBC_WALLET_PASSPHRASE", "ops pass")
        no_gas = _one_line_error(aitbc("chain", "deploy", *rpc), 1)  # the EVM account is made, then refused
        assert f"{evm_address(aitbc.home, 'ops')} has no ether" in no_gas and "--fund-gas" in no_gas
        monkeypatch.setenv("AITBC_WALLET_PASSPHRASE", "not it")
        assert _one_line_error(aitbc("chain", "deploy", *rpc, "--fund-gas"), 1) == (
            "error: wrong passphrase for wallet 'ops'\n"
        )
        assert not chain_file(aitbc.home).exists()

        monkeypatch.setenv("AITBC_WALLET_PASSPHRASE", "ops pass")
        done = aitbc("chain", "deploy", *rpc, "--fund-gas", "--json")
        assert done.returncode == 0, done.stderr
        shown = json.loads(done.stdout)
        deployment = read_deployment(aitbc.home)
        assert shown == {**deployment.to_dict(), "path": str(chain_file(aitbc.home))}
        assert deployment.settlement_key == deployment.minter == evm_address(aitbc.home, "ops")
        assert (deployment.rpc, deployment.chain_id) == (node.url, 31337)
        with EvmClient(node.url) as client:
            check_deployment(client, deployment)  # the contracts' code is at both addresses

        again = _one_line_error(aitbc("chain", "deploy", *rpc), 1)
        assert "deployed already; pass --replace" in again
        assert read_deployment(aitbc.home) == deployment
