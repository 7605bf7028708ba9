"""RunEscrow, function by function: deposit, post_bond, settle (and its slashes),
finalize, withdraw and refund, each with every way it reverts. The timeout paths are in
test_escrow_timeout.py."""

from __future__ import annotations

from dataclasses import dataclass

import boa
import pytest
from eth.exceptions import Revert
from eth_abi import decode, encode
from eth_utils import to_checksum_address
from tests.chain.evm_env import DAY, Chain, _factory, fresh_chain

from aitbc.chain.evm import contracts
from aitbc.chain.evm.books import ChainEvent
from aitbc.units import MICRO

pytestmark = pytest.mark.chain
OWNER = to_checksum_address("0x" + "0a" * 20)  # fixed, so the run's key is a constant
REF = contracts.run_ref("run-1")
RUN = contracts.run_key(OWNER, "run-1")
PRICE = 1 * MICRO
ESCROW = 5 * MICRO
BOND = 2 * MICRO
ZERO = "0x" + "00" * 20


@dataclass
class Run:
    """A deposited run with two bonded providers (``a`` sorts below ``b``)."""

    chain: Chain
    owner: str
    a: str
    b: str


@pytest.fixture
def chain():
    with fresh_chain() as c:
        yield c


@pytest.fixture
def run(chain) -> Run:
    owner = chain.account(ESCROW, address=OWNER)
    a, b = sorted((chain.account(BOND), chain.account(BOND)), key=lambda x: int(x, 16))
    chain.deposit(owner, REF, ESCROW, price=PRICE)
    chain.bond(a, RUN, BOND)
    chain.bond(b, RUN, BOND)
    return Run(chain, owner, a, b)


def _escrow_holds(chain: Chain) -> int:
    return chain.balance(str(chain.escrow.address))


def test_the_constructor_refuses_an_empty_token_or_key():
    esc, _ = _factory(contracts.RUN_ESCROW)
    with fresh_chain():
        somebody = str(boa.env.generate_address())
        for args, reason in (
            ([ZERO, somebody], "RunEscrow: no token"),
            ([somebody, ZERO], "RunEscrow: no settlement key"),
        ):
            with pytest.raises(Revert) as raised:
                boa.env.deploy_code(bytecode=esc.bytecode + encode(["address", "address"], args))
            assert decode(["string"], raised.value.args[0][4:]) == (reason,)  # Error(string)


def test_the_python_mirrors_of_the_limits_are_the_contracts(chain):
    assert chain.escrow.MAX_SETTLE() == contracts.MAX_SETTLE
    assert chain.escrow.MAX_TIMEOUT() == contracts.MAX_TIMEOUT
    assert chain.escrow.token() == chain.token.address and chain.escrow.settlement_key() == chain.key


def test_deposit_moves_the_escrow_in_and_opens_the_run_under_the_owners_key(chain):
    owner = chain.account(ESCROW, address=OWNER)
    assert chain.deposit(owner, REF, ESCROW, price=PRICE, timeout=3600) == RUN
    assert chain.escrow.key_of(owner, REF) == RUN  # the Python key is the contract's
    r = chain.escrow.runs(RUN)
    assert (r.owner, r.price, r.timeout, r.escrow, r.deposited, r.finalized, r.timed_out) == (
        owner,
        PRICE,
        3600,
        ESCROW,
        ESCROW,
        False,
        False,
    )
    assert r.last_post == boa.env.timestamp and chain.escrow.deadline(RUN) == boa.env.timestamp + 3600
    assert chain.escrow.is_open(RUN) and chain.balance(owner) == 0 and _escrow_holds(chain) == ESCROW
    assert chain.events[-1] == ChainEvent(
        "RunEscrow",
        "Deposited",
        {"key": RUN, "owner": owner, "run_id": REF, "amount": ESCROW, "price": PRICE, "timeout": 3600},
    )
    assert chain.escrow.runs(REF).owner == ZERO  # the ref itself names no run


def test_nobody_squats_a_run_id_another_deposits_under_the_same_id_into_a_run_of_its_own(chain):
    squatter = chain.account(1)
    theirs = chain.deposit(squatter, REF, 1, price=1, timeout=1)
    owner = chain.account(ESCROW, address=OWNER)
    assert chain.deposit(owner, REF, ESCROW, price=PRICE) == RUN != theirs
    assert chain.escrow.runs(RUN).owner == owner and chain.escrow.runs(RUN).escrow == ESCROW
    assert chain.escrow.runs(theirs).owner == squatter and chain.escrow.runs(theirs).escrow == 1


def test_deposit_reverts_twice_for_a_run_for_nothing_for_a_bad_timeout_or_without_allowance(chain):
    owner = chain.account(3 * ESCROW, address=OWNER)
    chain.deposit(owner, REF, ESCROW, price=PRICE)
    chain.send(owner, chain.token, "approve", str(chain.escrow.address), 2 * ESCROW)
    for run, amount, timeout, reason in (
        (REF, 1, DAY, "RunEscrow: run already deposited"),
        (b"\x02" * 32, 0, DAY, "RunEscrow: deposit must be more than 0"),
        (b"\x02" * 32, 1, 0, "RunEscrow: timeout must be 1 to MAX_TIMEOUT seconds"),
        (b"\x02" * 32, 1, contracts.MAX_TIMEOUT + 1, "RunEscrow: timeout must be 1 to MAX_TIMEOUT seconds"),
        (b"\x02" * 32, 2 * ESCROW + 1, DAY, "AIT: allowance too low"),
    ):
        with boa.reverts(reason):
            chain.send(owner, chain.escrow, "deposit", run, amount, PRICE, timeout)
    assert chain.balance(owner) == 2 * ESCROW and chain.escrow.deadline(chain.escrow.key_of(owner, b"\x02" * 32)) == 0


def test_top_up_adds_to_the_escrow_and_the_deposits_and_keeps_the_deadline(run):
    c = run.chain
    c.send(c.minter, c.token, "mint", run.owner, 3 * PRICE)
    boa.env.time_travel(seconds=60)
    c.settle(RUN, 1, {run.a: PRICE})
    deadline = c.escrow.deadline(RUN)
    boa.env.time_travel(seconds=60)
    c.top_up(run.owner, RUN, 2 * PRICE)
    r = c.escrow.runs(RUN)
    assert (r.escrow, r.deposited) == (ESCROW - PRICE + 2 * PRICE, ESCROW + 2 * PRICE)
    assert c.escrow.deadline(RUN) == deadline  # only the settlement key's posts move it
    assert c.events[-1] == ChainEvent(
        "RunEscrow", "ToppedUp", {"key": RUN, "owner": run.owner, "amount": 2 * PRICE, "deposited": ESCROW + 2 * PRICE}
    )
    assert (
        c.balance(run.owner) == PRICE and _escrow_holds(c) == ESCROW + 2 * PRICE + 2 * BOND
    )  # a's earnings not withdrawn


def test_top_up_reverts_for_anyone_but_the_owner_for_nothing_and_once_closed(run):
    c = run.chain
    c.send(c.minter, c.token, "mint", run.owner, PRICE)
    c.send(run.owner, c.token, "approve", str(c.escrow.address), PRICE)
    for who in (run.a, c.key, c.minter):
        c.send(c.minter, c.token, "mint", who, PRICE)
        c.send(who, c.token, "approve", str(c.escrow.address), PRICE)
        with boa.reverts("RunEscrow: only the run's owner tops up"):
            c.send(who, c.escrow, "top_up", RUN, PRICE)
    with boa.reverts("RunEscrow: only the run's owner tops up"):
        c.send(run.owner, c.escrow, "top_up", b"\x06" * 32, PRICE)  # no such run
    with boa.reverts("RunEscrow: top-up must be more than 0"):
        c.send(run.owner, c.escrow, "top_up", RUN, 0)
    with boa.reverts("AIT: allowance too low"):
        c.send(run.owner, c.escrow, "top_up", RUN, PRICE + 1)
    c.send(c.key, c.escrow, "finalize", RUN)
    with boa.reverts("RunEscrow: run finalized"):
        c.send(run.owner, c.escrow, "top_up", RUN, PRICE)
    assert c.escrow.runs(RUN).deposited == ESCROW and c.balance(run.owner) == PRICE


def test_post_bond_locks_the_bond_once_per_run(run):
    c = run.chain
    assert c.contract(RUN, run.a) == (True, BOND, 0, False)
    assert c.balance(run.a) == 0 and _escrow_holds(c) == ESCROW + 2 * BOND
    assert c.events[-1] == ChainEvent("RunEscrow", "Bonded", {"key": RUN, "provider": run.b, "amount": BOND})
    with boa.reverts("RunEscrow: bond already posted"):
        c.send(run.a, c.escrow, "post_bond", RUN, 0)
    with boa.reverts("RunEscrow: no such run"):
        c.send(run.a, c.escrow, "post_bond", b"\x09" * 32, 0)
    zero_bond = c.account()
    c.send(zero_bond, c.escrow, "post_bond", RUN, 0)  # a contract with no bond
    assert c.contract(RUN, zero_bond) == (True, 0, 0, False)


def test_post_bond_reverts_after_finalization(run):
    c = run.chain
    c.send(c.key, c.escrow, "finalize", RUN)
    with boa.reverts("RunEscrow: run finalized"):
        c.send(c.account(), c.escrow, "post_bond", RUN, 0)


def test_settle_pays_each_contract_from_the_escrow_once_per_round(run):
    c = run.chain
    c.settle(RUN, 1, {run.a: PRICE, run.b: PRICE // 2})
    assert c.escrow.runs(RUN).escrow == ESCROW - PRICE - PRICE // 2
    assert c.contract(RUN, run.a).earned == PRICE and c.contract(RUN, run.b).earned == PRICE // 2
    assert c.escrow.settled(RUN, 1) and not c.escrow.settled(RUN, 2)
    assert c.events[-3:] == [
        ChainEvent("RunEscrow", "Settled", {"key": RUN, "round": 1, "provider": run.a, "amount": PRICE}),
        ChainEvent("RunEscrow", "Settled", {"key": RUN, "round": 1, "provider": run.b, "amount": PRICE // 2}),
        ChainEvent("RunEscrow", "RoundSettled", {"key": RUN, "round": 1, "paid": PRICE + PRICE // 2, "burned": 0}),
    ]
    with boa.reverts("RunEscrow: round already settled"):
        c.settle(RUN, 1, {run.a: 1})
    with boa.reverts("RunEscrow: round already settled"):
        c.settle(RUN, 1, {})
    assert c.contract(RUN, run.a).earned == PRICE


def test_settle_reverts_for_anyone_but_the_settlement_key(run):
    c = run.chain
    for who in (run.owner, run.a, c.minter, c.account()):
        with boa.reverts("RunEscrow: only the settlement key settles"):
            c.settle(RUN, 1, {run.a: 1}, sender=who)
    assert not c.escrow.settled(RUN, 1)


def test_settle_reverts_above_the_price(run):
    c = run.chain
    with boa.reverts("RunEscrow: amount above the run's price"):
        c.settle(RUN, 1, {run.a: PRICE, run.b: PRICE + 1})
    assert not c.escrow.settled(RUN, 1) and c.contract(RUN, run.a).earned == 0


def test_settle_reverts_above_the_escrow_left(chain):
    owner = chain.account(ESCROW, address=OWNER)
    ps = sorted((chain.account() for _ in range(6)), key=lambda x: int(x, 16))
    chain.deposit(owner, REF, ESCROW, price=PRICE)
    for p in ps:
        chain.send(p, chain.escrow, "post_bond", RUN, 0)
    with boa.reverts("RunEscrow: settlement above the escrow left"):
        chain.settle(RUN, 1, dict.fromkeys(ps, PRICE))  # 6 x 1 AIT out of 5
    chain.settle(RUN, 1, dict.fromkeys(ps[:4], PRICE))
    with boa.reverts("RunEscrow: settlement above the escrow left"):
        chain.settle(RUN, 2, dict.fromkeys(ps[:2], PRICE))  # 2 out of the 1 left
    chain.settle(RUN, 2, {ps[0]: PRICE})  # exactly what is left
    assert chain.escrow.runs(RUN).escrow == 0


def test_settle_reverts_for_a_provider_without_a_contract_or_out_of_order(run):
    c = run.chain
    stranger = c.account()
    with boa.reverts("RunEscrow: provider has no contract in this run"):
        c.settle(RUN, 1, {stranger: 0})
    args = (RUN, 1)
    for providers in ([run.b, run.a], [run.a, run.a], [ZERO]):  # no contract paid twice a round
        n = len(providers)
        with boa.reverts("RunEscrow: providers not strictly increasing"):
            c.send(c.key, c.escrow, "settle", *args, providers, [0] * n, [False] * n)
    with boa.reverts("RunEscrow: providers, amounts, slashes differ in length"):
        c.send(c.key, c.escrow, "settle", *args, [run.a, run.b], [0], [False, False])
    with boa.reverts("RunEscrow: providers, amounts, slashes differ in length"):
        c.send(c.key, c.escrow, "settle", *args, [run.a], [0], [])
    with boa.reverts("RunEscrow: no such run"):
        c.send(c.key, c.escrow, "settle", b"\x07" * 32, 1, [], [], [])


def test_settle_takes_at_most_max_settle_contracts(run):
    c = run.chain
    over = contracts.MAX_SETTLE + 1
    with boa.reverts():  # the ABI decoder refuses a longer array
        c.send(c.key, c.escrow, "settle", RUN, 1, [run.a] * over, [0] * over, [False] * over)


def test_a_slash_burns_the_bond_and_pays_it_to_nobody(run):
    c = run.chain
    supply, others = c.token.totalSupply(), [c.balance(x) for x in (run.owner, run.b, c.key, c.minter)]
    c.settle(RUN, 1, {run.a: 0, run.b: PRICE}, slash=frozenset({run.a}))
    assert c.contract(RUN, run.a) == (True, 0, 0, True)
    assert c.token.totalSupply() == supply - BOND and c.escrow.burned() == BOND
    assert [c.balance(x) for x in (run.owner, run.b, c.key, c.minter)] == others
    assert _escrow_holds(c) == ESCROW + BOND  # b's bond; a's is gone; b's earnings are in the escrow's books
    assert ChainEvent("RunEscrow", "Slashed", {"key": RUN, "round": 1, "provider": run.a, "amount": BOND}) in c.events
    assert c.events[-1] == ChainEvent(
        "RunEscrow", "RoundSettled", {"key": RUN, "round": 1, "paid": PRICE, "burned": BOND}
    )
    c.settle(RUN, 2, {run.a: PRICE}, slash=frozenset({run.a}))  # paid for work; nothing left to burn
    assert c.escrow.burned() == BOND and c.contract(RUN, run.a).earned == PRICE
    c.send(c.key, c.escrow, "finalize", RUN)
    c.send(run.a, c.escrow, "withdraw", RUN)
    assert c.balance(run.a) == PRICE  # its earnings, no bond


def test_finalize_by_the_settlement_key_only_and_once(run):
    c = run.chain
    for who in (run.owner, run.a):
        with boa.reverts("RunEscrow: only the settlement key finalizes"):
            c.send(who, c.escrow, "finalize", RUN)
    c.send(c.key, c.escrow, "finalize", RUN)
    assert c.escrow.runs(RUN).finalized and not c.escrow.is_open(RUN)
    assert c.events[-1] == ChainEvent("RunEscrow", "Finalized", {"key": RUN})
    with boa.reverts("RunEscrow: run finalized"):
        c.send(c.key, c.escrow, "finalize", RUN)
    with boa.reverts("RunEscrow: no such run"):
        c.send(c.key, c.escrow, "finalize", b"\x05" * 32)


def test_settle_reverts_after_finalization(run):
    c = run.chain
    c.settle(RUN, 1, {run.a: PRICE})
    c.send(c.key, c.escrow, "finalize", RUN)
    with boa.reverts("RunEscrow: run finalized"):
        c.settle(RUN, 2, {run.a: PRICE})


def test_withdraw_pays_earnings_any_time_and_the_bond_once_finalized(run):
    c = run.chain
    c.settle(RUN, 1, {run.a: PRICE})
    c.send(run.a, c.escrow, "withdraw", RUN)
    assert c.balance(run.a) == PRICE and c.contract(RUN, run.a) == (True, BOND, 0, False)
    assert c.events[-1] == ChainEvent(
        "RunEscrow", "Withdrawn", {"key": RUN, "provider": run.a, "earned": PRICE, "bond": 0}
    )
    with boa.reverts("RunEscrow: nothing to withdraw"):  # the bond waits for the run's close
        c.send(run.a, c.escrow, "withdraw", RUN)
    c.settle(RUN, 2, {run.a: PRICE})
    c.send(c.key, c.escrow, "finalize", RUN)
    c.send(run.a, c.escrow, "withdraw", RUN)
    assert c.balance(run.a) == 2 * PRICE + BOND and c.contract(RUN, run.a) == (True, 0, 0, False)
    assert c.events[-1] == ChainEvent(
        "RunEscrow", "Withdrawn", {"key": RUN, "provider": run.a, "earned": PRICE, "bond": BOND}
    )


def test_a_double_withdraw_pays_nothing_more(run):
    c = run.chain
    c.settle(RUN, 1, {run.a: PRICE, run.b: PRICE})
    c.send(c.key, c.escrow, "finalize", RUN)
    c.send(run.a, c.escrow, "withdraw", RUN)
    with boa.reverts("RunEscrow: nothing to withdraw"):
        c.send(run.a, c.escrow, "withdraw", RUN)
    for nobody in (c.account(), run.owner):
        with boa.reverts("RunEscrow: nothing to withdraw"):
            c.send(nobody, c.escrow, "withdraw", RUN)
    with boa.reverts("RunEscrow: nothing to withdraw"):
        c.send(run.a, c.escrow, "withdraw", b"\x03" * 32)
    assert c.balance(run.a) == PRICE + BOND


def test_refund_reverts_before_finalization_and_for_anyone_but_the_owner(run):
    c = run.chain
    c.settle(RUN, 1, {run.a: PRICE})
    with boa.reverts("RunEscrow: run still open: refund after it is finalized or timed out"):
        c.send(run.owner, c.escrow, "refund", RUN)
    c.send(c.key, c.escrow, "finalize", RUN)
    for who in (run.a, c.key, c.minter):
        with boa.reverts("RunEscrow: only the run's owner is refunded"):
            c.send(who, c.escrow, "refund", RUN)
    with boa.reverts("RunEscrow: only the run's owner is refunded"):
        c.send(run.owner, c.escrow, "refund", b"\x04" * 32)


def test_refund_after_finalization_pays_the_owner_the_escrow_left_once(run):
    c = run.chain
    c.settle(RUN, 1, {run.a: PRICE, run.b: PRICE})
    c.send(c.key, c.escrow, "finalize", RUN)
    c.send(run.owner, c.escrow, "refund", RUN)
    assert c.balance(run.owner) == ESCROW - 2 * PRICE and c.escrow.runs(RUN).escrow == 0
    assert c.events[-1] == ChainEvent(
        "RunEscrow", "Refunded", {"key": RUN, "owner": run.owner, "amount": ESCROW - 2 * PRICE}
    )
    with boa.reverts("RunEscrow: nothing to refund"):
        c.send(run.owner, c.escrow, "refund", RUN)
    for p in (run.a, run.b):
        c.send(p, c.escrow, "withdraw", RUN)
    assert _escrow_holds(c) == 0 and c.token.totalSupply() == ESCROW + 2 * BOND
