"""The clients' deposit and bond against a real anvil (aitbc.chain_clients, and the
worker's WorkerChain): each sent once however often it is asked for, a shortfall topped
up, and a party without AIT or gas refused in one line naming the command that funds it,
with nothing sent."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from eth_account import Account
from tests.chain.anvil import running_anvil

from aitbc.chain.evm.client import EvmClient
from aitbc.chain.evm.contracts import run_key
from aitbc.chain.evm.deploy import contracts_of, deploy_contracts
from aitbc.chain_clients import ChainRefused, DepositPlan, ensure_deposit, open_escrow
from aitbc.ledger.evm_keys import ensure_evm_account
from aitbc.ledger.wallet import create_wallet
from aitbc.replies.base import parse
from aitbc.replies.chain import EvmChain
from aitbc.replies.jobs import BondRequired
from aitbc.worker.chain_bonds import WorkerChain

pytestmark = pytest.mark.chain

GAS = hex(10**19)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """(view, client, minter) on a fresh anvil with both contracts deployed."""
    with running_anvil(tmp_path_factory.mktemp("anvil")) as node, EvmClient(node.url) as client:
        minter = Account.from_key(node.accounts[0].private_key)
        d = deploy_contracts(client, minter)
        view = EvmChain(
            chain="evm",
            chain_id=d.chain_id,
            rpc=d.rpc,
            token=d.token,
            escrow=d.escrow,
            settlement_key=d.settlement_key,
            confirmations=1,
        )
        yield view, client, minter


def _fund(chain, address: str, micro: int, *, gas: bool = True) -> None:
    view, client, minter = chain
    token, _ = contracts_of(client, open_escrow(view).deployment)
    if micro:
        token.transact(minter, "mint", address, micro)
    if gas:
        client.rpc.call("anvil_setBalance", address, GAS)


def _tx_count(client: EvmClient, address: str) -> int:
    return client.mined_nonce(address)


def test_a_deposit_is_sent_once_and_a_shortfall_topped_up(chain):
    view, client, _ = chain
    owner = Account.create()
    _fund(chain, owner.address, 50_000_000)
    escrow = open_escrow(view)
    plan = DepositPlan(run_id="training_once", amount=20_000_000, price=2_000_000, timeout=3600)

    first = ensure_deposit(escrow, owner, plan, wallet="owner")
    assert (first.added, first.deposited) == (20_000_000, 20_000_000) and first.tx_hash is not None
    sent = _tx_count(client, owner.address)  # approve + deposit
    assert sent == 2

    again = ensure_deposit(escrow, owner, plan, wallet="owner")  # a second distribute
    assert (again.added, again.deposited, again.tx_hash) == (0, 20_000_000, None)
    assert _tx_count(client, owner.address) == sent  # nothing sent

    more = ensure_deposit(escrow, owner, replace(plan, amount=26_000_000), wallet="owner")
    assert (more.added, more.deposited) == (6_000_000, 26_000_000)
    run = escrow.run(run_key(owner.address, "training_once"))
    assert (run.deposited, run.escrow, run.price, run.timeout) == (26_000_000, 26_000_000, 2_000_000, 3600)
    assert escrow.token_balance(owner.address) == 24_000_000


def test_a_deposit_without_ait_or_gas_is_refused_in_one_line_and_nothing_sent(chain):
    view, client, _ = chain
    escrow = open_escrow(view)
    plan = DepositPlan(run_id="training_poor", amount=10_000_000, price=1_000_000, timeout=3600)
    poor = Account.create()
    _fund(chain, poor.address, 4_000_000)
    with pytest.raises(ChainRefused) as refused:
        ensure_deposit(escrow, poor, plan, wallet="alice")
    line = str(refused.value)
    assert "\n" not in line
    assert "needs 10 AIT" in line and "holds 4 AIT" in line and poor.address in line
    assert "aitbc wallet fund alice AMOUNT" in line and "aitbc chain fund alice AMOUNT" in line
    assert _tx_count(client, poor.address) == 0

    no_gas = Account.create()
    _fund(chain, no_gas.address, 10_000_000, gas=False)
    with pytest.raises(ChainRefused, match="no ether .* to pay for gas") as refused:
        ensure_deposit(escrow, no_gas, plan, wallet="bob")
    assert "--gas" in str(refused.value) and "\n" not in str(refused.value)
    assert not escrow.run(run_key(no_gas.address, "training_poor")).exists


def _worker(tmp_path, view) -> WorkerChain:
    home = tmp_path / "worker"
    create_wallet(home, "provider-1")
    ensure_evm_account(home, "provider-1")
    return WorkerChain(view, home=home, wallet="provider-1", max_bond=5_000_000)


def test_a_worker_posts_its_bond_once_and_logs_one_line_when_it_cannot(chain, tmp_path, caplog):
    view, client, _ = chain
    owner = Account.create()
    _fund(chain, owner.address, 11_000_000)
    escrow = open_escrow(view)
    key = ensure_deposit(
        escrow, owner, DepositPlan(run_id="training_bond", amount=10_000_000, price=1_000_000, timeout=3600), wallet="o"
    ).key
    worker = _worker(tmp_path, view)
    order = _order(view, key, 3_000_000)

    caplog.set_level(logging.INFO, logger="aitbc.worker")
    assert worker.post_bond(order) is False  # no AIT yet: logged, tried again at the next pickup
    refusal = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(refusal) == 1 and "\n" not in refusal[0] and "needs 3 AIT" in refusal[0]
    assert not escrow.contract(key, worker.address).bonded

    _fund(chain, worker.address, 5_000_000)
    assert worker.post_bond(order) is True
    held = escrow.contract(key, worker.address)
    assert (held.bonded, held.bond) == (True, 3_000_000)
    sent = _tx_count(client, worker.address)
    assert worker.post_bond(order) is True  # asked again (a lost reply): nothing sent
    assert _tx_count(client, worker.address) == sent
    assert escrow.token_balance(worker.address) == 2_000_000

    other = _other_run(escrow, owner)
    assert worker.post_bond(_order(view, other, 0)) is True
    assert escrow.contract(other, worker.address).bonded  # 0 is a bond too

    elsewhere = _order(view, key, 3_000_000, chain_id=view.chain_id + 1)
    assert worker.post_bond(elsewhere) is False  # not the coordinator's chain: refused, logged
    assert worker.post_bond(_order(view, "0x12", 0)) is False  # no run key: refused, logged
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR][-1] == (
        "bond not posted: bond_required names no run key: '0x12' is not 0x and 64 hex digits"
    )


def _order(view: EvmChain, key: bytes | str, amount: int, *, chain_id: int | None = None) -> BondRequired:
    """A job's bond_required as the coordinator's JSON has it."""
    raw = {"chain_id": chain_id or view.chain_id, "escrow": view.escrow, "token": view.token, "amount_micro": amount}
    return parse(BondRequired, {**raw, "key": key if isinstance(key, str) else "0x" + key.hex()})


def _other_run(escrow, owner) -> bytes:
    plan = DepositPlan(run_id="training_zero", amount=1_000_000, price=1_000_000, timeout=3600)
    return ensure_deposit(escrow, owner, plan, wallet="o").key


def test_the_sdk_deposit_refuses_a_wallet_without_an_evm_account_or_not_the_owner(chain, tmp_path):
    from aitbc_agent_sdk.chain import _deposit
    from aitbc_agent_sdk.errors import AgentError, Forbidden
    from aitbc_agent_sdk.protocol import Meter

    view, _, _ = chain
    home = tmp_path / "owner"
    wallet = create_wallet(home, "owner")
    plan = DepositPlan(run_id="training_nokey", amount=1_000_000, price=1_000_000, timeout=3600)
    with pytest.raises(AgentError) as refused:
        _deposit(home, "owner", wallet.address, view, plan, Meter(None, "deposit"))
    assert refused.value.code == "chain_error" and "\n" not in refused.value.detail
    assert "wallet 'owner' has no EVM account" in refused.value.detail
    assert "aitbc wallet evm owner" in refused.value.detail

    with pytest.raises(Forbidden, match="is owned by ait1someone, not wallet 'owner'"):
        _deposit(home, "owner", "ait1someone", view, plan, Meter(None, "deposit"))
