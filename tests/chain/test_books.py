"""Every balance rebuilt from the contracts' events alone (books.replay), equal to what
the contracts hold; and a sequence of events no run of the contracts could log (a gap, a
forged log) refused with what is wrong."""

from __future__ import annotations

import boa
import pytest
from tests.chain.evm_env import fresh_chain

from aitbc.chain.evm import books, contracts
from aitbc.chain.evm.books import BooksError, ChainEvent

pytestmark = pytest.mark.chain
REF1, REF2 = contracts.run_ref("r1"), contracts.run_ref("r2")


def test_every_balance_run_and_contract_is_rebuilt_from_the_events_alone():
    with fresh_chain() as c:
        owner, a, b, d = c.account(100), c.account(10), c.account(10), c.account(10)
        R1 = c.deposit(owner, REF1, 25, price=8, timeout=100)
        R2 = c.deposit(owner, REF2, 20, price=5, timeout=50)
        c.top_up(owner, R1, 5)
        other = c.account(3)
        R3 = c.deposit(other, REF1, 3, price=1, timeout=100)  # the same id, another owner's run
        for p in (a, b, d):
            c.bond(p, R1, 4)
        c.bond(a, R2, 3)
        c.settle(R1, 1, {a: 8, b: 3, d: 0}, slash=frozenset({d}))
        c.settle(R1, 2, {a: 8, b: 8})
        c.settle(R2, 1, {a: 5})
        c.send(a, c.escrow, "withdraw", R1)  # earnings only: R1 is open
        c.send(c.key, c.escrow, "finalize", R1)
        c.send(b, c.escrow, "withdraw", R1)  # d was slashed and earned nothing: nothing to withdraw
        c.send(owner, c.escrow, "refund", R1)
        boa.env.time_travel(seconds=50)
        c.send(a, c.escrow, "withdraw", R2)  # R2 timed out: earnings and bond
        c.send(c.minter, c.token, "mint", d, 7)
        c.send(d, c.token, "transfer", b, 2)

        rebuilt = books.replay(c.events)
        everyone = [owner, a, b, d, c.minter, c.key, str(c.escrow.address)]
        assert {x: rebuilt.balance(x) for x in everyone} == {x: c.balance(x) for x in everyone}
        assert rebuilt.supply == c.token.totalSupply() and rebuilt.burned == c.escrow.burned() == 4
        for run in (R1, R2, R3):
            on_chain, book = c.escrow.runs(run), rebuilt.runs[run]
            fields = (book.owner, book.price, book.timeout, book.escrow, book.deposited, book.finalized)
            assert (*fields, book.timed_out) == (
                on_chain.owner,
                on_chain.price,
                on_chain.timeout,
                on_chain.escrow,
                on_chain.deposited,
                on_chain.finalized,
                on_chain.timed_out,
            )
        assert (rebuilt.runs[R1].run_id, rebuilt.runs[R3].run_id, rebuilt.runs[R1].deposited) == (REF1, REF1, 30)
        assert rebuilt.runs[R1].rounds == {1, 2} and rebuilt.runs[R2].rounds == {1}
        assert rebuilt.runs[R2].timed_out and rebuilt.runs[R1].escrow == 0
        for (run, p), book in rebuilt.contracts.items():
            assert (True, book.bond, book.earned, book.slashed) == tuple(c.contract(run, p))
        assert len(rebuilt.contracts) == 4 and rebuilt.contracts[(R1, d)].slashed


OWNER, P = "0x" + "11" * 20, "0x" + "22" * 20
R1 = contracts.run_key(OWNER, "r1")


def _deposit(run: bytes = R1, amount: int = 10, price: int = 4) -> ChainEvent:
    return ChainEvent(
        "RunEscrow", "Deposited", dict(key=run, owner=OWNER, run_id=REF1, amount=amount, price=price, timeout=9)
    )


def _settled(amount: int, rnd: int = 1) -> ChainEvent:
    return ChainEvent("RunEscrow", "Settled", dict(key=R1, round=rnd, provider=P, amount=amount))


BONDED = ChainEvent("RunEscrow", "Bonded", dict(key=R1, provider=P, amount=2))


@pytest.mark.parametrize(
    "events, problem",
    [
        ([_settled(1)], "an event of run 0x.*, which was never deposited"),
        ([_deposit(), _settled(1)], f"an event of {P} in run 0x.*, which it never bonded"),
        ([_deposit(), BONDED, _settled(5)], "round 1: 5 paid above the price"),
        ([_deposit(amount=3), BONDED, _settled(4)], "escrow of run 0x.*: 4 moved out of 3"),
        (
            [
                _deposit(),
                BONDED,
                *[ChainEvent("RunEscrow", "RoundSettled", dict(key=R1, round=1, paid=0, burned=0))] * 2,
            ],
            "round 1 settled twice",
        ),
        (
            [_deposit(), BONDED, ChainEvent("RunEscrow", "Withdrawn", dict(key=R1, provider=P, earned=0, bond=3))],
            f"bond of {P}: 3 moved out of 2",
        ),
        ([_deposit(), _deposit()], "run 0x.* deposited twice"),
        (
            [_deposit(), ChainEvent("RunEscrow", "ToppedUp", dict(key=R1, owner=OWNER, amount=2, deposited=13))],
            "deposits add up to 12, the event says 13",
        ),
        ([ChainEvent("AIT", "Transfer", dict(sender=P, receiver=OWNER, value=1))], f"balance of {P}: 1 moved out of 0"),
    ],
)
def test_events_no_run_could_log_are_refused(events, problem):
    with pytest.raises(BooksError, match=problem):
        books.replay(events)
