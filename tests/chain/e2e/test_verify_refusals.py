"""``aitbc ledger verify --chain evm`` against what it cannot check, each one line and exit 1:
no deployment record, and a coordinator that keeps its money on its own ledger (a real
coordinator process with a run)."""

from __future__ import annotations

import json

import pytest
from tests.ledger.test_cli_money import coordinator, ok, one_line_error  # noqa: F401 - the fixture

pytestmark = pytest.mark.chain

RECORD = {
    "version": 1,
    "rpc": "http://127.0.0.1:9",
    "chain_id": 31337,
    "token": "0x" + "11" * 20,
    "escrow": "0x" + "22" * 20,
    "settlement_key": "0x" + "33" * 20,
    "minter": "0x" + "44" * 20,
    "block": 1,
    "compiler": "0.4.3",
    "deployed_at": "2026-12-05T00:00:00+00:00",
}


def test_verify_on_chain_refuses_what_it_cannot_check(aitbc, coordinator):  # noqa: F811
    one_line_error(aitbc("ledger", "verify", "--chain", "evm"), 1, "chain.json", "aitbc chain deploy")
    ok(
        aitbc(
            "distributed-training", "init", "--wallet", "alice", "--model-type", "mlp", "--dataset-size", "1MB",
            "--target-workers", "1",
        )
    )  # fmt: skip
    record = aitbc.home / "chain.json"
    record.write_text(json.dumps(RECORD))
    one_line_error(
        aitbc("ledger", "verify", "--chain", "evm"), 1, "holds its 1 run(s)' money on its own ledger", "ledger verify"
    )
