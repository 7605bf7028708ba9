"""``ledger verify --chain evm``'s comparison, on hand-written events and payments views:
a run the chain and the books agree on passes; each kind of disagreement is named once,
with the run, the contract and both amounts; a run with a transaction in flight is not
compared. (Against a real chain and coordinator: tests/chain/e2e.)"""

from __future__ import annotations

import copy

import pytest

from aitbc.chain.evm.books import ChainEvent, replay
from aitbc.cli.ledger_evm import compare_run, tally

KEY = bytes(range(32))
OWNER = "0x" + "0a" * 20
P1, P2, P3 = ("0x" + f"{i:02x}" * 20 for i in (1, 2, 3))
MINTER = "0x" + "0f" * 20
ESCROW = "0x" + "0e" * 20
ZERO = "0x" + "00" * 20


def _ev(contract: str, name: str, **args) -> ChainEvent:
    return ChainEvent(contract, name, args)


def _events() -> list[ChainEvent]:
    """A run of two rounds: P1 and P2 bonded 2 each; round 1 pays both 1, round 2 pays P1 1
    and slashes P2; finalized; P1 withdraws, the owner is refunded."""
    esc = "RunEscrow"
    return [
        _ev("AIT", "Transfer", sender=ZERO, receiver=OWNER, value=10),
        _ev("AIT", "Transfer", sender=ZERO, receiver=P1, value=2),
        _ev("AIT", "Transfer", sender=ZERO, receiver=P2, value=2),
        _ev("AIT", "Transfer", sender=OWNER, receiver=ESCROW, value=10),
        _ev(esc, "Deposited", key=KEY, owner=OWNER, run_id=b"r" * 32, amount=10, price=1, timeout=60),
        _ev("AIT", "Transfer", sender=P1, receiver=ESCROW, value=2),
        _ev(esc, "Bonded", key=KEY, provider=P1, amount=2),
        _ev("AIT", "Transfer", sender=P2, receiver=ESCROW, value=2),
        _ev(esc, "Bonded", key=KEY, provider=P2, amount=2),
        _ev(esc, "Settled", key=KEY, round=1, provider=P1, amount=1),
        _ev(esc, "Settled", key=KEY, round=1, provider=P2, amount=1),
        _ev(esc, "RoundSettled", key=KEY, round=1, paid=2, burned=0),
        _ev(esc, "Settled", key=KEY, round=2, provider=P1, amount=1),
        _ev(esc, "Slashed", key=KEY, round=2, provider=P2, amount=2),
        _ev(esc, "RoundSettled", key=KEY, round=2, paid=1, burned=2),
        _ev("AIT", "Transfer", sender=ESCROW, receiver=ZERO, value=2),
        _ev(esc, "Finalized", key=KEY),
        _ev("AIT", "Transfer", sender=ESCROW, receiver=P1, value=4),
        _ev(esc, "Withdrawn", key=KEY, provider=P1, earned=2, bond=2),
        _ev("AIT", "Transfer", sender=ESCROW, receiver=OWNER, value=7),
        _ev(esc, "Refunded", key=KEY, owner=OWNER, amount=7),
    ]


def _tx(kind: str, rnd: int, status: str = "final") -> dict:
    return {"kind": kind, "round": rnd, "tx_hash": "0x" + "ab" * 32, "status": status, "confirmations": 2}


def _payments() -> dict:
    row = {"price_micro": 1, "slashed_micro": 0}
    return {
        "training_id": "training_a",
        "escrowed": "0.00001",
        "chain": {
            "chain_id": 31337,
            "escrow": ESCROW,
            "key": "0x" + KEY.hex(),
            "owner": OWNER,
            "deposited": 10,
            "final": True,
            "txs": [_tx("settle", 1), _tx("settle", 2), _tx("finalize", 0)],
        },
        "data": [
            {**row, "contract_id": "c1", "evm_address": P1, "paid_micro": 2, "bond": "0.000002"},
            {**row, "contract_id": "c2", "evm_address": P2, "paid_micro": 1, "bond": "0.000002", "slashed_micro": 2},
        ],
    }


def _check(payments: dict, events: list[ChainEvent] | None = None):
    events = _events() if events is None else events
    return compare_run(payments, replay(events), tally(events))


def test_a_run_the_books_and_the_chain_agree_on_passes():
    check = _check(_payments())
    assert check.differences == [] and check.in_flight == 0
    assert (check.paid, check.contracts) == (3, 2)


def _changed(path: tuple, value) -> dict:
    p = copy.deepcopy(_payments())
    at = p
    for k in path[:-1]:
        at = at[k]
    at[path[-1]] = value
    return p


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (
            ("data", 0, "paid_micro"),
            3,
            "run training_a, contract c1 (" + P1 + "): paid 0.000003 AIT in the "
            "coordinator's books, 0.000002 AIT on chain",
        ),
        (
            ("data", 1, "bond"),
            "0.000001",
            "contract c2 (" + P2 + "): bond 0.000001 AIT in the coordinator's books, 0.000002 AIT on chain",
        ),
        (("data", 1, "slashed_micro"), 0, "contract c2 (" + P2 + "): slashed 0 AIT in the coordinator's books"),
        (
            ("chain", "deposited"),
            11,
            "run training_a: chain.deposited 0.000011 AIT in the coordinator's view, 0.00001 AIT deposited on chain",
        ),
        (("escrowed",), "0.00002", "escrowed 0.00002 AIT in the coordinator's view"),
        (("chain", "owner"), P3, f"owner {P3} in the coordinator's view, {OWNER} on chain"),
        (
            ("data", 0, "evm_address"),
            P3,
            f"{P1} bonded 0.000002 AIT and was paid 0.000002 AIT on chain, and has no "
            "contract in the coordinator's view",
        ),
        (
            ("chain", "txs"),
            [_tx("settle", 1), _tx("finalize", 0)],
            "round 2 settled on chain, with no mined settlement in the coordinator's view",
        ),
        (
            ("chain", "txs"),
            [_tx("settle", 1), _tx("settle", 2), _tx("settle", 3), _tx("finalize", 0)],
            "round 3's settlement is mined in the coordinator's view, not settled on chain",
        ),
        (
            ("chain", "txs"),
            [_tx("settle", 1), _tx("settle", 2), _tx("finalize", 0, "failed")],
            "its finalize transaction of round 0 failed on chain",
        ),
    ],
)
def test_each_disagreement_is_named(path, value, said):
    check = _check(_changed(path, value))
    assert check.differences, "no difference found"
    assert any(said in d for d in check.differences), check.differences


def test_a_run_with_a_transaction_in_flight_is_not_compared():
    p = _changed(("data", 0, "paid_micro"), 99)
    p["chain"]["txs"][1]["status"] = "sent"
    check = _check(p)
    assert check.differences == [] and check.in_flight == 1


def test_escrow_held_in_the_books_with_no_deposit_on_chain_is_named():
    check = _check(_payments(), events=[])
    assert check.differences == [
        "run training_a: the coordinator holds an escrow for it, but nothing was deposited on chain under key 0x"
        + KEY.hex()
    ]


def test_the_tally_sums_every_movement_of_a_contract():
    runs = tally(_events())
    p1, p2 = runs[KEY].providers[P1], runs[KEY].providers[P2]
    assert (p1.bonded, p1.settled, p1.withdrawn, p1.bond_returned, p1.slashed) == (2, 2, 2, 2, 0)
    assert (p2.bonded, p2.settled, p2.slashed) == (2, 1, 2)
    assert (runs[KEY].deposited, runs[KEY].refunded) == (10, 7)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--chain", "ethereum"], "--chain 'ethereum': allowed are local, evm"),
        (["--chain", "evm", "--db", "sqlite:////x.db"], "--chain evm reads the coordinator's API and the chain"),
        (["--chain-file", "chain.json"], "--chain-file goes with --chain evm"),
    ],
)
def test_options_that_do_not_go_together_are_one_line(aitbc, args, said):
    proc = aitbc("ledger", "verify", *args)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
