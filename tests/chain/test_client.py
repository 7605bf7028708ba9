"""The EVM client against a real anvil: the contracts deployed, a transfer sent and its
events read back, a revert's reason, confirmations, and a send interrupted after signing
and resent that never pays twice (the nonce, and the escrow's settled view)."""

from __future__ import annotations

import pytest
from eth_account import Account
from tests.chain.anvil import running_anvil

from aitbc.chain.evm.client import EvmClient, SendOutcome, TxReverted
from aitbc.chain.evm.contracts import run_key
from aitbc.chain.evm.deploy import check_deployment, contracts_of, deploy_contracts
from aitbc.chain.evm.escrow import ContractView, Escrow, Payout
from aitbc.errors import AitbcError

pytestmark = pytest.mark.chain


@pytest.fixture
def chain(tmp_path):
    """(client, deployer, deployment) on a fresh anvil with both contracts deployed."""
    with running_anvil(tmp_path / "anvil") as node, EvmClient(node.url) as client:
        deployer = Account.from_key(node.accounts[0].private_key)
        yield client, deployer, deploy_contracts(client, deployer), node


def test_deploy_transfer_and_read_the_events_back(chain):
    client, deployer, deployment, _ = chain
    check_deployment(client, deployment)
    token, escrow = contracts_of(client, deployment)
    assert escrow.call("token") == token.address and escrow.call("settlement_key") == deployer.address
    alice = Account.create()
    token.transact(deployer, "mint", deployer.address, 1_000_000)
    receipt = token.transact(deployer, "transfer", alice.address, 250_000)
    assert token.call("balanceOf", alice.address) == 250_000
    assert token.call("balanceOf", deployer.address) == 750_000

    events = token.events("Transfer", from_block=deployment.block)
    assert [(e.args["sender"], e.args["receiver"], e.args["value"]) for e in events] == [
        ("0x" + "00" * 20, deployer.address, 1_000_000),
        (deployer.address, alice.address, 250_000),
    ]
    assert events[-1].tx_hash == receipt.tx_hash and events[-1].block_number == receipt.block_number
    assert token.receipt_events(receipt) == events[-1:]
    assert token.events("Transfer", from_block=receipt.block_number + 1) == []

    with pytest.raises(TxReverted, match="AIT: ") as refused:  # the contract's reason, before any gas is spent
        token.transact(Account.create(), "transfer", deployer.address, 1)
    assert "\n" not in str(refused.value)


def test_confirmations_count_the_blocks_on_top(chain):
    client, deployer, deployment, _ = chain
    token, _ = contracts_of(client, deployment)
    receipt = token.transact(deployer, "mint", deployer.address, 5)
    client.rpc.call("anvil_mine", "0x2")  # the dev node mines on demand: two blocks on top
    assert client.wait_confirmations(receipt, 3, timeout=30).block_number == receipt.block_number
    with pytest.raises(AitbcError, match="did not reach 4 confirmations"):
        client.wait_confirmations(receipt, 4, timeout=0.5)


def test_a_transfer_signed_then_resent_after_a_crash_moves_once(chain):
    client, deployer, deployment, _ = chain
    token, _ = contracts_of(client, deployment)
    bob = Account.create()
    token.transact(deployer, "mint", deployer.address, 1_000)
    signed = token.sign(deployer, "transfer", bob.address, 100)  # nonce: the pending count
    assert signed.nonce == client.pending_nonce(deployer.address)
    assert client.broadcast(signed).outcome is SendOutcome.SENT
    # the sender crashed here, before it knew the outcome; it resends what it kept
    with EvmClient(client.url) as restarted:
        assert restarted.broadcast(signed).outcome is SendOutcome.ALREADY_SENT
        assert restarted.wait_receipt(signed.tx_hash).status
        # signed anew with the nonce it kept (a new hash: the fee moved): never mined
        again = token.sign(deployer, "transfer", bob.address, 100, nonce=signed.nonce)
        assert again.tx_hash != signed.tx_hash
        assert restarted.broadcast(again).outcome is SendOutcome.NONCE_TAKEN
        restarted.rpc.call("anvil_mine", "0x1")
        assert restarted.receipt(again.tx_hash) is None
    assert token.call("balanceOf", bob.address) == 100


def test_a_transfer_signed_but_not_sent_before_a_crash_is_sent_once_after(chain):
    client, deployer, deployment, _ = chain
    token, _ = contracts_of(client, deployment)
    carol = Account.create()
    token.transact(deployer, "mint", deployer.address, 1_000)
    kept = token.sign(deployer, "transfer", carol.address, 7)  # kept, then the sender crashed
    with EvmClient(client.url) as restarted:
        assert [restarted.broadcast(kept).outcome for _ in range(2)] == [SendOutcome.SENT, SendOutcome.ALREADY_SENT]
        restarted.wait_receipt(kept.tx_hash)
    assert token.call("balanceOf", carol.address) == 7


def _open_run(client, deployer, deployment, run_id: str, providers) -> bytes:
    """A run with escrow 1000 at price 100 and each provider bonded with 10, through the
    Escrow wrapper (which approves first); its key."""
    escrow = Escrow(client, deployment)
    escrow.mint(deployer, deployer.address, 10_000)
    escrow.deposit(deployer, run_id, 1_000, 100, 3600)
    key = run_key(deployer.address, run_id)
    for p in providers:
        client.rpc.call("anvil_setBalance", p.address, hex(10**18))
        escrow.mint(deployer, p.address, 10)
        escrow.post_bond(p, key, 10)
    return key


def test_a_settlement_resent_after_a_crash_is_paid_once(chain):
    client, deployer, deployment, _ = chain
    providers = [Account.create() for _ in range(3)]
    key = _open_run(client, deployer, deployment, "run-1", providers)
    escrow = Escrow(client, deployment)
    assert escrow.find_key("run-1") == (key, deployer.address)
    payouts = [Payout(p.address, 40, slash=i == 2) for i, p in enumerate(providers)]

    assert not escrow.settled(key, 0)
    signed = escrow.sign_settlement(deployer, key, 0, payouts)
    client.broadcast(signed)
    # crashed after broadcasting, before recording it: the restarted sender checks the chain
    with EvmClient(client.url) as restarted:
        again = Escrow(restarted, deployment)
        restarted.wait_receipt(signed.tx_hash)
        assert again.settled(key, 0)
        assert restarted.broadcast(signed).outcome is SendOutcome.ALREADY_SENT  # the kept one: no-op
        with pytest.raises(TxReverted, match="round already settled"):  # a fresh one: refused by the contract
            again.sign_settlement(deployer, key, 0, payouts)
    events = escrow.escrow.events("Settled", from_block=deployment.block)
    assert sorted((e.args["provider"], e.args["amount"]) for e in events) == sorted((p.address, 40) for p in providers)
    assert [e.args["round"] for e in escrow.escrow.events("RoundSettled")] == [0]
    assert escrow.run(key).escrow == 1_000 - 120  # the escrow left
    assert [e.args["provider"] for e in escrow.escrow.events("Slashed")] == [providers[2].address]


def test_the_escrow_wrapper_reads_runs_and_contracts_finds_keys_and_says_a_revert_in_one_line(chain):
    client, deployer, deployment, node = chain
    escrow = Escrow(client, deployment)
    other = Account.from_key(node.accounts[1].private_key)
    provider = Account.create()
    key = _open_run(client, deployer, deployment, "run-w", [provider])
    escrow.mint(deployer, other.address, 50)
    escrow.deposit(other, "run-w", 5, 1, 60)  # the same id: a run of its own, under another key
    theirs = run_key(other.address, "run-w")
    assert [(d.key, d.owner, d.amount) for d in escrow.deposits("run-w")] == [
        (key, deployer.address, 1_000),
        (theirs, other.address, 5),
    ]
    assert escrow.find_key("run-w") == (key, deployer.address)  # the first deposit
    assert escrow.find_key("run-w", other.address) == (theirs, other.address)
    assert escrow.find_key("run-w", provider.address) is None and escrow.find_key("nope") is None

    escrow.top_up(deployer, key, 500)
    view = escrow.run(key)
    assert (view.owner, view.price, view.timeout, view.escrow, view.deposited) == (
        deployer.address,
        100,
        3600,
        1_500,
        1_500,
    )
    assert view.open and view.exists and view.state == "open" and view.deadline == view.last_post + 3600
    assert escrow.contract(key, provider.address) == ContractView(bonded=True, bond=10, earned=0, slashed=False)
    assert escrow.contract(key, other.address) == ContractView(bonded=False, bond=0, earned=0, slashed=False)
    assert not escrow.run(b"\x01" * 32).exists and escrow.run(b"\x01" * 32).state == "none"

    for call, reason in (
        (lambda: escrow.withdraw(provider, key), "withdraw from run 0x"),
        (lambda: escrow.top_up(other, key, 1), "top-up of run 0x"),
        (lambda: escrow.deposit(deployer, "run-w", 1, 1, 60), "deposit for 'run-w' refused: RunEscrow: run already"),
        (lambda: escrow.refund(deployer, key), "refund of run 0x"),
        (lambda: escrow.mint(other, other.address, 1), "minting 1 micro-AIT to"),
    ):
        with pytest.raises(TxReverted) as refused:
            call()
        assert reason in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    with pytest.raises(TxReverted, match="refused: RunEscrow: only the run's owner tops up"):
        escrow.top_up(other, key, 1)
    with pytest.raises(TxReverted, match="refused: RunEscrow: nothing to withdraw"):
        escrow.withdraw(provider, key)

    signed = escrow.sign_finalize(deployer, key)
    client.broadcast(signed)
    client.wait_receipt(signed.tx_hash)
    assert escrow.run(key).state == "finalized" and not escrow.run(key).open
    escrow.refund(deployer, key)
    assert escrow.token_balance(deployer.address) == 10_000 - 1_000 - 500 + 1_500  # every deposit back
