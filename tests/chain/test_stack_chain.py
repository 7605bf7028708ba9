"""``aitbc up --chain evm`` as a user runs it: a local anvil started with the stack and
recorded as one of its processes, the contracts deployed by the stack's chain-operator
wallet (HOME/chain.json), the coordinator settling there, each worker's EVM account given
gas and AIT for its bonds; ``aitbc wallet fund`` mints on that chain; ``aitbc down`` stops
every process, the node included."""

from __future__ import annotations

import json

import httpx
import psutil
import pytest
from tests.chain.anvil import anvil_binary
from tests.conftest import wait_until

from aitbc import stack as stk
from aitbc.chain.evm.client import EvmClient
from aitbc.chain.evm.deploy import check_deployment, contracts_of, read_deployment
from aitbc.ledger.evm_keys import evm_address

pytestmark = pytest.mark.chain


@pytest.fixture
def home_stack(aitbc):
    anvil_binary()  # skipped (or failed under AITBC_REQUIRE_ANVIL=1) without anvil
    yield aitbc
    if stk.stack_file(aitbc.home).exists():
        stk.down(aitbc.home, grace=5.0)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_up_chain_evm_runs_the_node_deploys_funds_workers_and_down_stops_it_all(home_stack):
    aitbc, home = home_stack, home_stack.home
    up = aitbc("up", "--chain", "evm", "--workers", "2", timeout=240)
    assert up.returncode == 0, up.stderr
    assert "2 workers in the marketplace" in up.stdout and "Money on chain" in up.stdout
    recorded = json.loads((home / "stack.json").read_text())
    assert recorded["chain"] == "evm"
    procs = [stk.Proc(**p) for p in recorded["processes"]]
    assert [(p.name, p.role) for p in procs] == [
        ("anvil", "chain"),
        ("coordinator", "coordinator"),
        ("worker-1", "worker"),
        ("worker-2", "worker"),
    ]
    assert all(stk.is_ours(p) for p in procs)

    deployment = read_deployment(home)
    coordinator = procs[1]
    assert coordinator.cmd[-8:] == [
        *("--chain", "evm", "--chain-file", str(home / "chain.json")),
        *("--settlement-wallet", "chain-operator", "--chain-confirmations", "1"),
    ]
    operator = evm_address(home / "coordinator", "chain-operator")
    assert deployment.minter == deployment.settlement_key == operator
    chain = httpx.get(recorded["coordinator"] + "/v1/chain", timeout=10).json()
    assert chain["chain"] == "evm" and (chain["escrow"], chain["token"]) == (deployment.escrow, deployment.token)

    with EvmClient(deployment.rpc) as client:
        check_deployment(client, deployment)
        token, _ = contracts_of(client, deployment)
        for p in procs[2:]:
            worker = evm_address(home / "workers" / f"w{p.name.removeprefix('worker-')}", p.wallet)
            assert worker is not None
            assert token.call("balanceOf", worker) == 100_000_000  # AIT for its bonds
            assert client.balance(worker) > 0  # and gas

        assert aitbc("wallet", "create", "owner").returncode == 0
        funded = aitbc("wallet", "fund", "owner", "30", "--json")
        assert funded.returncode == 0, funded.stderr
        shown = json.loads(funded.stdout)
        owner = evm_address(home, "owner")
        assert (shown["evm_address"], shown["amount"], shown["balance"]) == (owner, "30", "30")
        assert token.call("balanceOf", owner) == 30_000_000 and client.balance(owner) > 0
        again = aitbc("wallet", "fund", "owner", "2.5")
        assert again.returncode == 0 and "balance 32.5 AIT" in again.stdout
        # aitbc chain fund finds the stack's minter (chain-operator, in HOME/coordinator/wallets)
        by_chain = aitbc("chain", "fund", "owner", "1.5")
        assert by_chain.returncode == 0, by_chain.stderr
        assert token.call("balanceOf", owner) == 34_000_000

    down = aitbc("down", "--json")
    assert down.returncode == 0, down.stderr
    stopped = json.loads(down.stdout)["stopped"]
    assert set(stopped) == {p.name for p in procs} and "not running" not in stopped.values()
    assert all(_gone(p.pid) for p in procs)
    assert not (home / "stack.json").exists()


def _one_line(proc, code: int = 1) -> str:
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.long  # about 110 s on a loaded two-core machine: the stack, the data and a short run
def test_distribute_deposits_once_and_the_workers_post_their_bonds(home_stack):
    from aitbc.chain.evm.escrow import Escrow

    aitbc, home = home_stack, home_stack.home
    assert aitbc("up", "--chain", "evm", "--workers", "2", timeout=240).returncode == 0
    assert aitbc("wallet", "create", "owner").returncode == 0
    init = aitbc(
        "distributed-training", "init", "--wallet", "owner", "--model-type", "mlp", "--dataset-size", "1MB",
        "--target-workers", "2", "--bond", "1",
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    run_id = next(w for w in init.stdout.split() if w.startswith("training_"))
    owner = evm_address(home, "owner")  # made by init on an EVM coordinator, named as the run's owner
    assert owner is not None
    assert aitbc("wallet", "fund", "owner", "30").returncode == 0  # hiring counts the owner's AIT on chain
    data = aitbc("distributed-training", "upload-data", "--training-id", run_id, "--data-path", "digits")
    assert data.returncode == 0, data.stderr
    hired = aitbc("distributed-training", "discover-workers", "--training-id", run_id, "--required-workers", "2")
    assert hired.returncode == 0, hired.stderr
    distribute = ("distributed-training", "distribute", "--training-id", run_id, "--rounds", "2", "--local-steps", "5")

    short = aitbc(*distribute, "--chain-timeout", "60")  # under four deadlines: refused before anything is sent
    assert "--chain-timeout must be at least 2400 s" in _one_line(short, 2)
    poor = _one_line(aitbc(*distribute, "--rounds", "20"))  # 56 AIT: more than the owner holds on chain
    assert "needs 56 AIT" in poor and "holds 30 AIT" in poor and owner in poor, poor
    assert "aitbc wallet fund owner AMOUNT" in poor, poor

    deployment = read_deployment(home)
    with EvmClient(deployment.rpc) as client:
        escrow = Escrow(client, deployment)
        assert escrow.find_key(run_id, owner) is None and client.mined_nonce(owner) == 0  # nothing sent
        first = aitbc(*distribute)
        assert first.returncode == 0, first.stderr
        assert "depositing 5.6 AIT" in first.stderr and "deposited on chain" in first.stderr, first.stderr
        key, _ = escrow.find_key(run_id, owner)
        run = escrow.run(key)
        cost = 5_600_000  # (1.60 + 1.20) AIT a round x 2 rounds
        assert (run.deposited, run.price, run.timeout) == (cost, 1_600_000, 3600)
        sent = client.mined_nonce(owner)

        again = aitbc(*distribute)  # the coordinator refuses a second distribute: nothing deposited twice
        assert again.returncode != 0 and "depositing" not in again.stderr
        assert escrow.run(key).deposited == cost and client.mined_nonce(owner) == sent

        workers = [evm_address(home / "workers" / f"w{k}", f"provider-{k}") for k in (1, 2)]
        wait_until(lambda: all(escrow.contract(key, w).bonded for w in workers), "both bonds on chain", timeout=120)
        assert [escrow.contract(key, w).bond for w in workers] == [1_000_000, 1_000_000]


@pytest.mark.long  # about 60 s on a loaded two-core machine: three stacks started
def test_the_stack_keeps_its_chain_across_down_and_up(home_stack):
    aitbc, home = home_stack, home_stack.home
    assert aitbc("up", "--chain", "evm", "--workers", "1", timeout=240).returncode == 0
    assert aitbc("wallet", "create", "owner").returncode == 0
    assert aitbc("wallet", "fund", "owner", "30").returncode == 0
    first = read_deployment(home)
    assert aitbc("down").returncode == 0
    assert (home / "chain-state.json").exists()  # written by the node as down stopped it

    local = aitbc("up", "--workers", "1")  # its database keeps the money of a chain
    assert "keeps its money on an EVM chain" in _one_line(local) and "aitbc up --chain evm" in local.stderr
    assert not (home / "stack.json").exists()

    again = aitbc("up", "--chain", "evm", "--workers", "1", timeout=240)
    assert again.returncode == 0, again.stderr  # the coordinator started on the same database
    second = read_deployment(home)
    assert (second.escrow, second.token, second.block) == (first.escrow, first.token, first.block)
    with EvmClient(second.rpc) as client:
        token, _ = contracts_of(client, second)
        assert token.call("balanceOf", evm_address(home, "owner")) == 30_000_000
        worker = evm_address(home / "workers" / "w1", "provider-1")
        assert token.call("balanceOf", worker) == 100_000_000  # topped up to its bonds' AIT, not minted twice
    assert aitbc("down").returncode == 0

    (home / "chain-state.json").unlink()  # the chain lost: the contracts deployed anew, the database refused
    lost = aitbc("up", "--chain", "evm", "--workers", "1", timeout=240)
    assert lost.returncode == 1 and "Traceback" not in lost.stderr, lost.stderr
    errors = [ln for ln in lost.stderr.splitlines() if ln.startswith("error: ")]  # after "Starting ..."
    assert len(errors) == 1 and "the stack's chain is gone" in errors[0] and "chain-state.json" in errors[0]
    assert not (home / "stack.json").exists()
