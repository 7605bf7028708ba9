"""The settlement outbox and the chain sender against a real anvil: a coordinator's books on
SQLite (rows written as the books write them), the escrow deployed, the owner's deposit and
the providers' bonds posted on chain. Each round goes out as one transaction, exactly once:
across a sender killed between storing its transaction and broadcasting it, for a round
already settled on chain, and with two replicas of which only the lease holder sends."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from rich.console import Console
from sqlalchemy import select
from tests.chain.anvil import running_anvil

from aitbc.chain.evm.client import EvmClient
from aitbc.chain.evm.contracts import run_key
from aitbc.chain.evm.deploy import deploy_contracts
from aitbc.chain.evm.escrow import Escrow, Payout
from aitbc.cli.training.results import chain_table, payments_table
from aitbc.coordinator.chain_backend import ChainBackend
from aitbc.coordinator.config import Settings
from aitbc.coordinator.context import Context, build_context
from aitbc.coordinator.money import outbox
from aitbc.coordinator.money.sender import ChainSender
from aitbc.coordinator.observability.metrics import _chain_families
from aitbc.coordinator.runs.dashboard import run_page
from aitbc.coordinator.runs.views import payments_view
from aitbc.coordinator.store.models import ChainTx, Contract, Offer, Run, Score, Settlement
from aitbc.coordinator.verification import settlement
from aitbc.ledger.chain import escrow_account, mint_account
from aitbc.states import ContractStatus, RunStatus

pytestmark = pytest.mark.chain

PRICE = 1_000_000  # micro-AIT a round at full quality
DEPOSIT = 50_000_000
BOND = 2_000_000


@dataclass
class World:
    client: EvmClient
    escrow: Escrow
    minter: LocalAccount
    key: LocalAccount  # the settlement key
    owner: LocalAccount
    providers: list[LocalAccount]
    home: Path

    def backend(self, confirmations: int = 1) -> ChainBackend:
        return ChainBackend(
            client=self.client,
            escrow=self.escrow,
            deployment=self.escrow.deployment,
            account=self.key,
            confirmations=confirmations,
        )

    def coordinator(self, confirmations: int = 1, *, drive: bool = True) -> Context:
        """A coordinator replica on the world's database; ``drive``: it takes the driver lease."""
        ctx = build_context(Settings(home=self.home, driver_lease_seconds=60.0))
        ctx.chain = self.backend(confirmations)
        if drive:
            assert ctx.lease.tick(steal=True)
        return ctx

    def key_txs(self) -> int:
        """Transactions the settlement key has had mined: each one a nonce."""
        return self.client.mined_nonce(self.key.address)


@pytest.fixture
def world(tmp_path) -> Iterator[World]:
    with running_anvil(tmp_path / "anvil") as node, EvmClient(node.url, poll=0.02) as client:
        minter, key, owner, *providers = (Account.from_key(a.private_key) for a in node.accounts[:6])
        deployment = deploy_contracts(client, minter, settlement_key=key.address)
        escrow = Escrow(client, deployment)
        yield World(client, escrow, minter, key, owner, providers, tmp_path / "coord")


def open_run(w: World, ctx: Context, *, bonded: int = 3, on_chain_bonds: int | None = None) -> tuple[str, list[str]]:
    """A training run deposited on chain by the owner with ``bonded`` providers bonded in the
    books (the first ``on_chain_bonds`` of them on chain too: all by default); its id and
    contract ids (in the providers' order)."""
    run_id = f"training_{time.monotonic_ns():x}"
    w.escrow.mint(w.minter, w.owner.address, DEPOSIT)
    w.escrow.deposit(w.owner, run_id, DEPOSIT, PRICE, 3600)
    key = run_key(w.owner.address, run_id)
    now = time.time()
    contracts = []
    with ctx.session() as s:
        s.add(
            Run(
                id=run_id,
                owner="owner",
                owner_key="00" * 32,
                status=RunStatus.TRAINING,
                model_type="mlp",
                dataset_size="1MB",
                dataset_size_bytes=1 << 20,
                target_workers=bonded,
                owner_evm=w.owner.address,
                chain_deposited=DEPOSIT,
                escrowed=DEPOSIT,
                created_at=now,
                updated_at=now,
            )
        )
        s.flush()
        ctx.ledger.post(
            s, kind="chain-deposit", debit=mint_account("local"), credit=escrow_account(run_id), amount=DEPOSIT
        )
        for i, p in enumerate(w.providers[:bonded]):
            if on_chain_bonds is None or i < on_chain_bonds:
                w.escrow.mint(w.minter, p.address, BOND)
                w.escrow.post_bond(p, key, BOND)
            worker = f"worker_{run_id}_{i}"
            if s.get(Offer, worker) is None:
                s.add(
                    Offer(
                        id=worker,
                        public_key="00" * 32,
                        gpu="cpu",
                        price=PRICE,
                        availability=1.0,
                        reputation=3.0,
                        status="online",
                        evm_address=p.address,
                        last_heartbeat=now,
                        registered_at=now,
                    )
                )
                s.flush()  # the contract names it: no relationship tells the flush to insert it first
            cid = f"contract_{run_id}_{i}"
            s.add(
                Contract(
                    id=cid,
                    run_id=run_id,
                    worker_id=worker,
                    price=PRICE,
                    score=1.0,
                    status=ContractStatus.WORKING,
                    bond=BOND,
                    evm_address=p.address,
                    chain_bonded=True,
                    created_at=now + i,
                )
            )
            contracts.append(cid)
        s.commit()
    return run_id, contracts


def score(ctx: Context, run_id: str, r: int, qualities: dict[str, float]) -> None:
    """Round ``r``'s scores as the books thread writes them, then the books' settlement."""
    with ctx.session() as s:
        for cid, q in qualities.items():
            c = s.get(Contract, cid)
            assert c is not None
            s.add(Score(run_id=run_id, round=r, contract_id=cid, worker_id=c.worker_id, status="accepted", quality=q))
        s.commit()
    settlement.settle(ctx, run_id, r)


def rows(ctx: Context, run_id: str) -> list[ChainTx]:
    with ctx.session() as s:
        found = outbox.run_txs(s, run_id)
        s.expunge_all()
    return found


def until(sender: ChainSender, ctx: Context, run_id: str, done, what: str, bound: float = 60.0) -> list[ChainTx]:
    """Step ``sender`` until ``done(rows)`` holds (a condition, bounded generously)."""
    deadline = time.monotonic() + bound
    while not done(found := rows(ctx, run_id)):
        assert time.monotonic() < deadline, f"{what}: rows {[(t.kind, t.round, t.status) for t in found]}"
        sender.tick()
    return found


def all_final(found: list[ChainTx]) -> bool:
    return bool(found) and all(t.status == outbox.FINAL for t in found)


def test_each_round_is_one_transaction_then_the_run_is_finalized(world):
    ctx = world.coordinator()
    run_id, (a, b, c) = open_run(world, ctx)
    key = run_key(world.owner.address, run_id)
    score(ctx, run_id, 1, {a: 1.0, b: 0.5, c: 0.0})
    score(ctx, run_id, 2, {a: 0.25, b: 1.0, c: 1.0})
    queued = rows(ctx, run_id)
    assert [(t.kind, t.round, t.status) for t in queued] == [("settle", 1, "queued"), ("settle", 2, "queued")]

    sender = ChainSender(ctx, ctx.chain)
    found = until(sender, ctx, run_id, all_final, "both rounds final")
    assert world.key_txs() == 2  # one transaction a round, nothing more
    assert all(world.escrow.settled(key, r) for r in (1, 2))
    with ctx.session() as s:
        for cid, p in zip((a, b, c), world.providers, strict=False):
            paid = sum(x.paid for x in s.scalars(select(Settlement).where(Settlement.contract_id == cid)))
            assert world.escrow.contract(key, p.address).earned == paid  # the chain pays what the books paid
    assert all(t.gas_used and t.block and t.final_at for t in found)

    with ctx.session() as s:  # the books finalize the run: the chain's finalize follows
        run = s.get(Run, run_id)
        assert run is not None
        run.status, run.finalized, run.bonds_returned = RunStatus.COMPLETE, True, True
        s.commit()
    found = until(sender, ctx, run_id, lambda f: len(f) == 3 and all_final(f), "finalize final")
    assert found[-1].kind == "finalize" and world.escrow.run(key).finalized
    assert world.key_txs() == 3

    with ctx.session() as s:
        families = {m.name: m for m in _chain_families(s)}
    final = [x.value for x in families["aitbc_chain_txs"].samples if x.labels["status"] == "final"]
    assert final == [3]
    assert families["aitbc_chain_gas_used"].samples[0].value == sum(t.gas_used or 0 for t in found)
    assert ctx.metrics.chain_tx_final._sum.get() > 0  # observed at each final


def test_a_sender_killed_after_storing_its_transaction_resends_the_same_one(world):
    ctx = world.coordinator()
    run_id, (a, b, _) = open_run(world, ctx)
    score(ctx, run_id, 1, {a: 1.0, b: 1.0})

    first = ChainSender(ctx, ctx.chain)

    def killed(*_args: object) -> None:
        raise KeyboardInterrupt("killed between the commit and the broadcast")

    first._broadcast = killed  # type: ignore[method-assign]
    (tx,) = rows(ctx, run_id)
    with pytest.raises(KeyboardInterrupt):
        first.step(tx.id)
    (stored,) = rows(ctx, run_id)
    assert stored.status == "signed" and stored.tx_hash and stored.raw_tx and stored.nonce == 0
    assert world.key_txs() == 0  # nothing reached the node

    again = ChainSender(ctx, ctx.chain)  # the restarted coordinator's
    (done,) = until(again, ctx, run_id, all_final, "the stored transaction final")
    assert done.tx_hash == stored.tx_hash and done.nonce == 0
    assert world.key_txs() == 1  # the same transaction, never a second one


def test_a_round_already_settled_on_chain_is_not_sent_again(world):
    ctx = world.coordinator()
    run_id, (a, _, _) = open_run(world, ctx)
    key = run_key(world.owner.address, run_id)
    # the round went out before a crash that lost the row's update (or another sender's)
    signed = world.escrow.sign_settlement(world.key, key, 1, [Payout(world.providers[0].address, PRICE)])
    world.client.broadcast(signed)
    world.client.wait_receipt(signed.tx_hash)
    score(ctx, run_id, 1, {a: 1.0})

    (done,) = until(ChainSender(ctx, ctx.chain), ctx, run_id, all_final, "the round found on chain")
    assert done.tx_hash == signed.tx_hash and done.nonce is None  # never signed here
    assert world.key_txs() == 1


def test_a_settlement_the_contract_refuses_is_failed_with_its_reason(world):
    ctx = world.coordinator()
    run_id, (a, b) = open_run(world, ctx, bonded=2, on_chain_bonds=1)  # b's bond never reached the chain
    score(ctx, run_id, 1, {a: 1.0, b: 1.0})

    (failed,) = until(ChainSender(ctx, ctx.chain), ctx, run_id, lambda f: f[0].status == "failed", "failed")
    assert "RunEscrow: provider has no contract in this run" in (failed.error or "")
    assert failed.tx_hash is None and world.key_txs() == 0  # refused at its estimate: no gas spent


def test_only_the_replica_holding_the_driver_lease_sends(world):
    driver = world.coordinator()
    standby = world.coordinator(drive=False)  # the same database, a second replica
    assert not standby.lease.tick()  # the driver holds the lease
    run_id, (a, _, _) = open_run(world, driver)
    score(driver, run_id, 1, {a: 1.0})
    idle = ChainSender(standby, standby.chain)
    for _ in range(3):
        idle.tick()
    # a replica that still believes it holds a lease it lost: its writes are fenced
    standby.lease.held_until = standby.lease.clock() + 60
    idle.tick()
    (tx,) = rows(driver, run_id)
    assert tx.status == "queued" and tx.tx_hash is None and world.key_txs() == 0

    (done,) = until(ChainSender(driver, driver.chain), driver, run_id, all_final, "sent by the driver")
    assert done.sender == driver.lease.me and world.key_txs() == 1


def test_confirmations_are_counted_until_final_and_payments_settle_only_then(world):
    ctx = world.coordinator(confirmations=3)
    run_id, (a, _, _) = open_run(world, ctx)
    score(ctx, run_id, 1, {a: 1.0})
    with ctx.session() as s:
        run = s.get(Run, run_id)
        assert run is not None
        run.status, run.finalized, run.bonds_returned = RunStatus.COMPLETE, True, True
        s.commit()
    sender = ChainSender(ctx, ctx.chain)

    def payments():
        with ctx.session() as s:
            return payments_view(ctx, s, s.get(Run, run_id))

    (mined,) = until(sender, ctx, run_id, lambda f: f[0].status == "mined", "the settle mined")
    assert mined.confirmations == 1
    pay = payments()
    assert pay.chain is not None and not pay.chain.final and not pay.settled  # the books are done, the chain not
    assert pay.chain.owner == world.owner.address and pay.chain.deposited == DEPOSIT
    assert [(t.kind, t.round, t.tx_hash, t.confirmations) for t in pay.chain.txs] == [("settle", 1, mined.tx_hash, 1)]
    world.client.rpc.call("anvil_mine", "0x2")  # two blocks on top: three confirmations
    found = until(sender, ctx, run_id, lambda f: len(f) == 2 and f[1].status == "mined", "finalize mined")
    assert found[0].status == "final" and found[0].confirmations == 3
    assert not payments().settled  # the finalize is not final yet
    world.client.rpc.call("anvil_mine", "0x2")
    until(sender, ctx, run_id, lambda f: len(f) == 2 and all_final(f), "finalize final")
    pay = payments()
    assert pay.settled and pay.chain is not None and pay.chain.final
    assert [t.status for t in pay.chain.txs] == ["final", "final"]
    with ctx.session() as s:  # the dashboard's payments show each transaction's hash and depth
        shown = run_page(ctx, s, s.get(Run, run_id)).payments.chain_txs
    assert [(t.kind, t.tx_hash, t.status) for t in shown] == [(t.kind, t.tx_hash, "final") for t in pay.chain.txs]
    assert shown[0].confirmations >= 3
    console = Console(record=True, width=200)  # and `payments` prints them
    console.print(chain_table(pay.chain))
    printed = console.export_text()
    assert all(t.tx_hash and t.tx_hash in printed for t in pay.chain.txs) and "finalize" in printed
    console.print(payments_table(pay.model_dump(mode="json")))  # its title names the chain, not the local ledger
    titled = console.export_text()
    assert f"EVM chain {pay.chain.chain_id}, AIT" in titled and "local network" not in titled


def end(ctx: Context, run_id: str, **settlements: int) -> None:
    """The books finalize the run (stopped), paying ``settlements`` (contract -> round) as
    delivered first, as their finalize pays an update of a round that never closed."""
    with ctx.session() as s:
        for cid, r in settlements.items():
            worker = s.get(Contract, cid).worker_id
            s.add(
                Settlement(
                    run_id=run_id,
                    contract_id=cid,
                    worker_id=worker,
                    round=r,
                    quality=1.0,
                    due=PRICE,
                    paid=PRICE,
                    created_at=time.time(),
                )
            )
        run = s.get(Run, run_id)
        run.status, run.finalized, run.bonds_returned = RunStatus.STOPPED, True, True
        s.commit()


def slash(ctx: Context, cid: str) -> None:
    with ctx.session() as s:
        s.get(Contract, cid).status = ContractStatus.SLASHED
        s.commit()


def lines(tx: ChainTx) -> list[tuple[list[str], int, bool]]:
    return [(x.contracts, x.amount, x.slash) for x in outbox.SettlePayload.of(tx.payload).lines]


def test_a_slash_burns_the_bond_once_and_one_after_the_last_round_gets_a_round_of_its_own(world):
    ctx = world.coordinator()
    run_id, (a, b, c) = open_run(world, ctx)
    key = run_key(world.owner.address, run_id)
    slash(ctx, c)  # a spot check slashed c before round 1 was settled: nothing paid, its bond burns
    score(ctx, run_id, 1, {a: 1.0, b: 1.0})
    score(ctx, run_id, 2, {a: 1.0, b: 0.5})
    first, second = rows(ctx, run_id)
    assert ([c], 0, True) in lines(first) and not any(slashed for _, _, slashed in lines(second))  # burned once
    slash(ctx, b)  # after its last round
    end(ctx, run_id)

    found = until(ChainSender(ctx, ctx.chain), ctx, run_id, lambda f: len(f) == 4 and all_final(f), "all final")
    assert [(t.kind, t.round) for t in found] == [("settle", 1), ("settle", 2), ("settle", 3), ("finalize", 0)]
    assert lines(found[2]) == [([b], 0, True)]
    for p in world.providers[1:3]:  # b's and c's bonds burned on chain
        assert world.escrow.contract(key, p.address).slashed and world.escrow.contract(key, p.address).bond == 0
    assert world.escrow.run(key).finalized and world.key_txs() == 4


def test_a_finalized_run_first_sends_the_rounds_its_finalize_paid(world):
    ctx = world.coordinator()
    run_id, (a, b, _) = open_run(world, ctx)
    key = run_key(world.owner.address, run_id)
    score(ctx, run_id, 1, {a: 1.0, b: 1.0})
    end(ctx, run_id, **{a: 2})  # a's update of round 2, which never closed, paid as delivered

    found = until(ChainSender(ctx, ctx.chain), ctx, run_id, lambda f: len(f) == 3 and all_final(f), "all final")
    assert [(t.kind, t.round) for t in found] == [("settle", 1), ("settle", 2), ("finalize", 0)]
    assert lines(found[1]) == [([a], PRICE, False)]
    assert world.escrow.contract(key, world.providers[0].address).earned == 2 * PRICE
    assert world.escrow.run(key).finalized
