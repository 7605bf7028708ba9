"""What a party with its own ends can do to the money of a run on a real anvil, and what
it cannot: each test is one attack, held off."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from threading import Barrier
from typing import Any

import pytest
from eth_account import Account
from tests.chain.anvil import running_anvil
from tests.chain.evm_coordinator import coordinator, evm_stack
from tests.chain.test_client_money import GAS, _fund, _order
from tests.chain.test_coordinator_money import AIT, BOND, _d, _entries, _hired, _offer, _proof, _refused, _run
from tests.coordinator.conftest import MODEL_OPTIONS

from aitbc.chain.evm.client import EvmClient
from aitbc.chain.evm.contracts import run_key
from aitbc.chain.evm.deploy import contracts_of, deploy_contracts
from aitbc.chain_clients import DepositPlan, ensure_deposit, open_escrow
from aitbc.coordinator.money.onchain import sync_bond, sync_deposit
from aitbc.coordinator.store.models import Contract, Run
from aitbc.coordinator.workforce.hiring import stop_long_pauses
from aitbc.errors import AitbcError
from aitbc.ledger.evm_keys import ensure_evm_account
from aitbc.ledger.wallet import create_wallet
from aitbc.replies.chain import EvmChain
from aitbc.worker.chain_bonds import WorkerChain

pytestmark = pytest.mark.chain


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """(view, client, minter) on a fresh anvil with both contracts deployed."""
    with running_anvil(tmp_path_factory.mktemp("anvil")) as node, EvmClient(node.url) as client:
        minter = Account.from_key(node.accounts[0].private_key)
        d = deploy_contracts(client, minter)
        fields = ("chain_id", "rpc", "token", "escrow", "settlement_key")
        yield EvmChain(chain="evm", confirmations=1, **{f: getattr(d, f) for f in fields}), client, minter


def _provider(coord, acct: Any) -> Any:
    c = coord.client("provider")
    c.post("/workers", _offer(acct.address, _proof(coord, c, acct)))
    return c


def test_an_evm_account_holds_one_contract_of_a_run(tmp_path):
    # On chain a contract is (run, account): two contracts of one run naming one account
    # would share one bond (the books minting it twice), one slash would burn it for both,
    # and their settlement (one line per account) could never be sent.
    with evm_stack(tmp_path) as stack, coordinator(stack.settings()) as coord:
        shared = stack.account(5 * AIT)
        _provider(coord, shared)
        _provider(coord, shared)  # a second wallet of the account's holder naming it too
        owner, _, run_id = _run(stack, coord, 2)
        _refused(
            coord,
            lambda: owner.post(f"/runs/{run_id}/discover", {"required_workers": 2}),
            409,
            "not_enough_workers",
        )
        other = stack.account(5 * AIT)
        third = _provider(coord, other)
        hired = owner.post(f"/runs/{run_id}/discover", {"required_workers": 2})
        assert hired["count"] == 2
        rows = coord.rows("SELECT worker_id, evm_address FROM contracts WHERE run_id = :r", r=run_id)
        assert sorted(r["evm_address"] for r in rows) == sorted([shared.address, other.address])
        assert third.wallet.address in {r["worker_id"] for r in rows}
        twin = next(
            o["worker_id"]
            for o in coord.rows("SELECT id AS worker_id, evm_address FROM offers")
            if o["evm_address"] == shared.address and o["worker_id"] not in {r["worker_id"] for r in rows}
        )
        _refused(
            coord,
            lambda: owner.post(f"/runs/{run_id}/contracts", {"worker_id": twin, "price": "1"}),
            409,
            "evm_account_in_run",
            shared.address,
        )


def _allowance(view, client, owner: str, spender: str) -> int:
    token, _ = contracts_of(client, open_escrow(view).deployment)
    return int(token.call("allowance", owner, spender))


def test_a_worker_bonds_no_more_than_its_max_bond_and_only_in_our_escrow(chain, tmp_path, caplog):
    # The coordinator says where and how much to bond; a malicious one could name a contract
    # of its own (that takes what it is approved for) or a bond above what the provider allowed.
    view, client, minter = chain
    owner = Account.create()
    _fund(chain, owner.address, 2_000_000)
    key = ensure_deposit(
        open_escrow(view),
        owner,
        DepositPlan(run_id="training_h7", amount=1_000_000, price=1_000_000, timeout=3600),
        wallet="o",
    ).key
    home = tmp_path / "worker"
    create_wallet(home, "provider-1")
    ensure_evm_account(home, "provider-1")
    worker = WorkerChain(view, home=home, wallet="provider-1", max_bond=2_000_000)
    _fund(chain, worker.address, 10_000_000)
    caplog.set_level(logging.INFO, logger="aitbc.worker")

    assert worker.post_bond(_order(view, key, 3_000_000)) is False
    assert "max_bond" in [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR][-1]
    assert not open_escrow(view).contract(key, worker.address).bonded
    assert _allowance(view, client, worker.address, view.escrow) == 0

    # another escrow of the same code, on a token and a key of the attacker's
    attacker = Account.create()
    client.rpc.call("anvil_setBalance", attacker.address, GAS)
    theirs = deploy_contracts(client, attacker)
    for fake in (
        view.model_copy(update={"escrow": theirs.escrow}),  # the real token, their escrow: it pays in its own token
        view.model_copy(update={"escrow": view.token}),  # not an escrow at all
        view.model_copy(update={"escrow": theirs.escrow, "token": theirs.token}),  # all theirs, settled by their key
    ):
        with pytest.raises(AitbcError, match="escrow|RunEscrow|settlement key"):
            open_escrow(fake)
        duped = WorkerChain(fake, home=home, wallet="provider-1", max_bond=2_000_000)
        assert duped.post_bond(_order(fake, key, 1_000_000)) is False
        assert _allowance(view, client, worker.address, fake.escrow) == 0
    assert worker.post_bond(_order(view, key, 2_000_000)) is True  # the real one, within max_bond


def test_a_bond_posted_short_is_one_line_not_a_loop(chain, tmp_path, caplog):
    # A bond is posted once a run; one below the run's is never mirrored, so a worker that
    # took "bonded" for "done" would ask for its job again at once, forever.
    view, _, _ = chain
    owner = Account.create()
    _fund(chain, owner.address, 2_000_000)
    plan = DepositPlan(run_id="training_short", amount=1_000_000, price=1_000_000, timeout=3600)
    escrow = open_escrow(view)
    key = ensure_deposit(escrow, owner, plan, wallet="o").key
    home = tmp_path / "worker"
    create_wallet(home, "provider-1")
    worker = WorkerChain(view, home=home, wallet="provider-1", max_bond=2_000_000)
    _fund(chain, worker.address, 2_000_000)
    escrow.post_bond(worker.account, key, 500_000)
    caplog.set_level(logging.INFO, logger="aitbc.worker")
    assert worker.post_bond(_order(view, key, 1_000_000)) is False
    line = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR][-1]
    assert "0.5 AIT" in line and "1 AIT" in line and "\n" not in line


def test_concurrent_mirrors_count_the_chains_money_once(tmp_path):
    # Every pickup, update and distribute may mirror at once: each read the run before
    # any wrote, then all post. The books must hold the chain's deposit and bond once.
    threads = 6
    with evm_stack(tmp_path) as stack, coordinator(stack.settings()) as coord:
        _, acct, run_id, providers = _hired(stack, coord, 1)
        key = run_key(acct.address, run_id)
        cid = coord.rows("SELECT id FROM contracts WHERE run_id = :r", r=run_id)[0]["id"]

        def mirror(barrier: Barrier) -> None:
            with coord.ctx.session() as s:
                run, contract = s.get(Run, run_id), s.get(Contract, cid)
                assert run is not None and contract is not None
                barrier.wait(timeout=60)
                sync_deposit(coord.ctx, s, run)
                sync_bond(coord.ctx, s, run, contract)
                s.commit()

        def race() -> None:
            barrier = Barrier(threads)
            with ThreadPoolExecutor(threads) as pool:
                for f in [pool.submit(mirror, barrier) for _ in range(threads)]:
                    f.result(timeout=120)

        stack.escrow.deposit(acct, run_id, 4 * AIT, AIT, 3600)
        stack.escrow.post_bond(providers[0][1], key, BOND)
        race()
        stack.escrow.top_up(acct, key, 2 * AIT)
        race()
        assert [e["amount"] for e in _entries(coord, "chain-deposit")] == [4 * AIT, 2 * AIT]
        assert [e["amount"] for e in _entries(coord, "chain-bond")] == [BOND]
        assert coord.rows("SELECT escrowed, chain_deposited FROM runs WHERE id = :r", r=run_id) == [
            {"escrowed": 6 * AIT, "chain_deposited": 6 * AIT}
        ]


def test_an_owners_pause_ends_before_the_chain_would_let_it_take_the_escrow_back(tmp_path):
    # An owner who pauses a run after its providers delivered, for longer than the chain's
    # timeout, could refund the escrow before the round is settled: honest work unpaid.
    with evm_stack(tmp_path) as stack, coordinator(stack.settings()) as coord:
        owner, acct, run_id, _ = _hired(stack, coord, 1)
        stack.escrow.deposit(acct, run_id, 10 * AIT, AIT, 800)  # pause_seconds: a day
        owner.post(f"/runs/{run_id}/distribute", {"rounds": 3, "max_cost": "3", "deadline": 150})
        _d(coord, run_id)  # training
        owner.post(f"/runs/{run_id}/pause", {})
        with coord.ctx.session() as s:
            assert not stop_long_pauses(coord.ctx, s, now=time.time() + 350)  # under half the timeout
            assert stop_long_pauses(coord.ctx, s, now=time.time() + 450)  # settled with 350 s still to go
            s.commit()
        assert coord.rows("SELECT status FROM runs WHERE id = :r", r=run_id) == [{"status": "stopped"}]


def test_the_zero_address_is_nobodys_account(tmp_path):
    # Nobody signs for it: a run or a contract paid there could never deposit or bond.
    zero = "0x" + "00" * 20
    with evm_stack(tmp_path) as stack, coordinator(stack.settings()) as coord:
        owner, provider = coord.client("owner"), coord.client("provider")
        body = {"model_type": "mlp", "model_options": MODEL_OPTIONS, "dataset_size": "1GB", "target_workers": 1}
        _refused(
            coord, lambda: owner.post("/runs", {**body, "evm_address": zero}), 422, "bad_evm_address", "zero address"
        )
        _refused(coord, lambda: provider.post("/workers", _offer(zero)), 422, "bad_evm_address", "zero address")
