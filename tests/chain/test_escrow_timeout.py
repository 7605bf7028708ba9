"""Liveness without the coordinator: a run whose settlement key posts nothing for
``timeout`` seconds (since the deposit or the last settlement) closes by itself; the owner
then takes the unsettled escrow back and each provider its bond and earnings, with no
other signature, and the key can settle or finalize that run no more. Not a second before."""

from __future__ import annotations

import boa
import pytest
from eth_utils import to_checksum_address
from tests.chain.evm_env import fresh_chain

from aitbc.chain.evm import contracts
from aitbc.chain.evm.books import ChainEvent
from aitbc.units import MICRO

pytestmark = pytest.mark.chain
OWNER = to_checksum_address("0x" + "0a" * 20)  # fixed, so the run's key is a constant
REF = contracts.run_ref("run-t")
RUN = contracts.run_key(OWNER, "run-t")
PRICE, ESCROW, BOND, TIMEOUT = MICRO, 5 * MICRO, 2 * MICRO, 3600


@pytest.fixture
def run():
    with fresh_chain() as c:
        owner, a, b = c.account(ESCROW, address=OWNER), c.account(BOND), c.account(BOND)
        c.deposit(owner, REF, ESCROW, price=PRICE, timeout=TIMEOUT)
        c.bond(a, RUN, BOND)
        c.bond(b, RUN, BOND)
        yield c, owner, a, b


def _timed_out_events(c) -> int:
    return c.events.count(ChainEvent("RunEscrow", "TimedOut", {"key": RUN}))


def test_before_the_timeout_neither_the_owner_nor_a_provider_takes_anything_back(run):
    c, owner, a, _ = run
    boa.env.time_travel(seconds=TIMEOUT - 1)
    assert c.escrow.is_open(RUN)
    with boa.reverts("RunEscrow: run still open: refund after it is finalized or timed out"):
        c.send(owner, c.escrow, "refund", RUN)
    with boa.reverts("RunEscrow: nothing to withdraw"):  # its bond stays locked
        c.send(a, c.escrow, "withdraw", RUN)
    assert c.contract(RUN, a).bond == BOND and _timed_out_events(c) == 0


def test_after_the_timeout_the_owner_reclaims_the_unsettled_escrow_alone(run):
    c, owner, a, _ = run
    c.settle(RUN, 1, {a: PRICE})
    boa.env.time_travel(seconds=TIMEOUT)
    assert not c.escrow.is_open(RUN) and boa.env.timestamp == c.escrow.deadline(RUN)
    c.send(owner, c.escrow, "refund", RUN)
    assert c.balance(owner) == ESCROW - PRICE and c.escrow.runs(RUN).timed_out
    assert [e for e in c.events if e.contract == "RunEscrow"][-2:] == [
        ChainEvent("RunEscrow", "TimedOut", {"key": RUN}),
        ChainEvent("RunEscrow", "Refunded", {"key": RUN, "owner": owner, "amount": ESCROW - PRICE}),
    ]
    with boa.reverts("RunEscrow: nothing to refund"):
        c.send(owner, c.escrow, "refund", RUN)


def test_after_the_timeout_each_provider_reclaims_its_bond_and_earnings_alone(run):
    c, owner, a, b = run
    c.settle(RUN, 1, {a: PRICE})
    boa.env.time_travel(seconds=TIMEOUT + 5)
    c.send(a, c.escrow, "withdraw", RUN)  # first after the timeout: logs it
    c.send(b, c.escrow, "withdraw", RUN)
    assert (c.balance(a), c.balance(b)) == (PRICE + BOND, BOND)
    c.send(owner, c.escrow, "refund", RUN)
    assert c.balance(owner) == ESCROW - PRICE and _timed_out_events(c) == 1
    assert c.balance(str(c.escrow.address)) == 0
    with boa.reverts("RunEscrow: nothing to withdraw"):
        c.send(a, c.escrow, "withdraw", RUN)


def test_a_slashed_provider_gets_no_bond_back_after_the_timeout(run):
    c, _, a, _ = run
    c.settle(RUN, 1, {}, slash=frozenset({a}))
    boa.env.time_travel(seconds=TIMEOUT)
    with boa.reverts("RunEscrow: nothing to withdraw"):
        c.send(a, c.escrow, "withdraw", RUN)


def test_after_the_timeout_the_settlement_key_can_do_nothing_more(run):
    c, owner, a, _ = run
    boa.env.time_travel(seconds=TIMEOUT)
    with boa.reverts("RunEscrow: run timed out"):
        c.settle(RUN, 1, {a: PRICE})
    with boa.reverts("RunEscrow: run timed out"):
        c.send(c.key, c.escrow, "finalize", RUN)
    with boa.reverts("RunEscrow: run timed out"):
        c.bond(c.account(1), RUN, 1)
    c.send(c.minter, c.token, "mint", owner, 1)
    with boa.reverts("RunEscrow: run timed out"):  # nor the owner put more money in
        c.top_up(owner, RUN, 1)


def test_each_settlement_restarts_the_clock(run):
    c, owner, a, _ = run
    for rnd in (1, 2, 3):
        boa.env.time_travel(seconds=TIMEOUT - 1)
        c.settle(RUN, rnd, {a: PRICE})
        assert c.escrow.deadline(RUN) == boa.env.timestamp + TIMEOUT
    boa.env.time_travel(seconds=TIMEOUT - 1)
    with boa.reverts("RunEscrow: run still open: refund after it is finalized or timed out"):
        c.send(owner, c.escrow, "refund", RUN)
    boa.env.time_travel(seconds=1)
    c.send(owner, c.escrow, "refund", RUN)
    assert c.balance(owner) == ESCROW - 3 * PRICE


def test_a_finalized_run_never_times_out(run):
    c, owner, a, _ = run
    c.send(c.key, c.escrow, "finalize", RUN)
    boa.env.time_travel(seconds=10 * TIMEOUT)
    c.send(owner, c.escrow, "refund", RUN)
    c.send(a, c.escrow, "withdraw", RUN)
    assert _timed_out_events(c) == 0 and not c.escrow.runs(RUN).timed_out
