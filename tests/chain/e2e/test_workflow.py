"""End to end on a real chain: the documented workflow on ``aitbc up --chain evm`` (anvil, the
contracts, a coordinator settling on them and two workers, started by the command), typed as
a user types it. The run is paid on chain, and every on-chain balance is what ``payments``
says: the run's deposit and escrow left, each provider's bond and earnings, each party's
token balance. ``aitbc ledger verify --chain evm`` agrees; after someone edits a settlement
row in the coordinator's database it exits 1 naming the contract."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
from tests.chain.anvil import anvil_binary
from tests.chain.e2e.conftest import key_of, settled_rounds
from tests.conftest import AITBC

from aitbc.units import MICRO

pytestmark = [pytest.mark.chain, pytest.mark.long]

ROUNDS = 3
OWNER_AIT = 100


def _micro(money: str) -> int:
    return int(Decimal(money) * MICRO)


@pytest.fixture
def user(tmp_path):
    """``aitbc ARGS`` on a fresh HOME, anvil on PATH; the stack stopped at the end."""
    home = tmp_path / "home"
    env = dict(
        os.environ,
        AITBC_HOME=str(home),
        OMP_NUM_THREADS="1",
        COLUMNS="200",
        PATH=f"{anvil_binary().parent}:{os.environ['PATH']}",
    )

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(AITBC), *args], capture_output=True, text=True, env=env, timeout=timeout)

    run.home = home
    yield run
    run("down", timeout=60)


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"{proc.args}: {proc.stderr[-3000:]}"
    return proc.stdout


def test_the_documented_workflow_is_paid_on_chain_and_verified(user):
    _ok(user("up", "--chain", "evm", "--workers", "2", timeout=300))
    _ok(user("wallet", "create", "my-agent-wallet"))
    _ok(user("wallet", "fund", "my-agent-wallet", str(OWNER_AIT)))
    out = _ok(
        user(
            "distributed-training", "init", "--wallet", "my-agent-wallet", "--model-type", "mlp",
            "--dataset-size", "100GB", "--target-workers", "2", "--bond", "1",
        )
    )  # fmt: skip
    run_id = next(w for w in out.split() if w.startswith("training_"))
    _ok(user("distributed-training", "upload-data", "--training-id", run_id, "--data-path", "digits"))
    _ok(user("distributed-training", "discover-workers", "--training-id", run_id, "--required-workers", "2"))
    _ok(
        user(
            "distributed-training", "distribute", "--training-id", run_id, "--strategy", "data-parallel",
            "--rounds", str(ROUNDS), "--local-steps", "5",
        )
    )  # fmt: skip
    _ok(user("distributed-training", "monitor", "--training-id", run_id, timeout=600))
    pay = json.loads(_ok(user("distributed-training", "payments", "--training-id", run_id, "--json", timeout=600)))

    assert pay["settled"] and pay["chain"]["final"], pay
    assert all(row["paid_micro"] > 0 for row in pay["data"]), pay["data"]
    txs = pay["chain"]["txs"]
    assert sorted(t["round"] for t in txs if t["kind"] == "settle") == list(range(1, len(txs)))
    assert [t["kind"] for t in txs].count("finalize") == 1 and {t["status"] for t in txs} == {"final"}
    _balances_match(user.home, pay)

    verified = user("ledger", "verify", "--chain", "evm")
    assert verified.returncode == 0, verified.stderr
    assert "1 EVM run(s)" in verified.stdout and "agree with the chain" in verified.stdout
    as_json = json.loads(_ok(user("ledger", "verify", "--chain", "evm", "--json")))
    assert as_json["ok"] and as_json["differences"] == [] and [r["run_id"] for r in as_json["runs"]] == [run_id]

    # someone with the database raises one settlement's amount: the books no longer match the chain
    (db,) = Path(user.home).rglob("coordinator.db")
    with sqlite3.connect(db) as conn:
        sid, contract = conn.execute(
            "SELECT id, contract_id FROM settlements WHERE run_id = ? AND paid > 0 ORDER BY id LIMIT 1", (run_id,)
        ).fetchone()
        conn.execute("UPDATE settlements SET paid = paid + 1 WHERE id = ?", (sid,))
    conn.close()
    tampered = user("ledger", "verify", "--chain", "evm")
    assert tampered.returncode == 1, tampered.stdout
    assert f"run {run_id}, contract {contract}" in tampered.stderr and "paid" in tampered.stderr, tampered.stderr
    assert len(tampered.stderr.strip().splitlines()) == 1 and "Traceback" not in tampered.stderr
    as_json = user("ledger", "verify", "--chain", "evm", "--json")
    assert as_json.returncode == 1 and not json.loads(as_json.stdout)["ok"]
    assert any(f"contract {contract}" in d for d in json.loads(as_json.stdout)["differences"]), as_json.stdout


def _balances_match(home: Path, pay: dict) -> None:
    """Every on-chain balance of the run equals the payments view."""
    from aitbc.chain.evm.client import EvmClient
    from aitbc.chain.evm.deploy import read_deployment
    from aitbc.chain.evm.escrow import Escrow
    from aitbc.stack_chain import WORKER_AIT

    deployment = read_deployment(home)
    key = key_of(pay)
    with EvmClient(deployment.rpc) as client:
        escrow = Escrow(client, deployment)
        run = escrow.run(key)
        paid = sum(row["paid_micro"] for row in pay["data"])
        assert run.deposited == pay["chain"]["deposited"] == _micro(pay["escrowed"])
        assert run.escrow == run.deposited - paid  # nothing refunded yet: the owner's to take back
        assert run.finalized
        assert settled_rounds(escrow, key) == sorted(t["round"] for t in pay["chain"]["txs"] if t["kind"] == "settle")
        owner = pay["chain"]["owner"]
        assert escrow.token_balance(owner) == OWNER_AIT * MICRO - run.deposited
        for row in pay["data"]:
            c = escrow.contract(key, row["evm_address"])
            bond = _micro(row["bond"])
            assert c.bonded and c.earned == row["paid_micro"], row
            assert c.bond == bond - row["slashed_micro"] and c.slashed == (row["slashed_micro"] > 0), row
            assert escrow.token_balance(row["evm_address"]) == int(WORKER_AIT * MICRO) - bond, row
