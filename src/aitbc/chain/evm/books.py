"""Every balance of the EVM contracts, rebuilt from their events alone.

:func:`replay` reads the token's ``Transfer`` events and the escrow's events, in chain
order, into :class:`Books`: each address's token balance and the supply, each run's
(by its key) deposits, escrow left and state, each contract's (run key, provider) bond and
unwithdrawn earnings, the rounds settled and what was burned. Anyone holding the logs can so check what the
contracts hold and what a coordinator says it paid, trusting neither (the contracts'
interface: :mod:`aitbc.chain.evm.contracts`). Pure: no node, no decoding of raw logs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aitbc.errors import AitbcError

ZERO = "0x" + "00" * 20


@dataclass(frozen=True, slots=True)
class ChainEvent:
    """One decoded log: ``contract`` is "AIT" or "RunEscrow", ``args`` its named arguments
    (addresses as checksummed strings, ``bytes32`` as bytes, integers as ints)."""

    contract: str
    name: str
    args: Mapping[str, Any]


@dataclass(slots=True)
class RunBook:
    owner: str
    run_id: bytes  # the ref the owner deposited under (contracts.run_ref of the run id)
    price: int
    timeout: int
    escrow: int  # deposited, not yet settled or refunded
    deposited: int  # every deposit and top-up together
    finalized: bool = False
    timed_out: bool = False
    rounds: set[int] = field(default_factory=set)


@dataclass(slots=True)
class ContractBook:
    bond: int = 0  # held: 0 once burned or withdrawn
    earned: int = 0  # settled, not yet withdrawn
    slashed: bool = False


@dataclass(slots=True)
class Books:
    balances: dict[str, int] = field(default_factory=dict)  # token balance by address
    supply: int = 0
    burned: int = 0  # slashed bonds the escrow burned
    runs: dict[bytes, RunBook] = field(default_factory=dict)
    contracts: dict[tuple[bytes, str], ContractBook] = field(default_factory=dict)

    def balance(self, address: str) -> int:
        return self.balances.get(address, 0)


class BooksError(AitbcError):
    """Events that no run of the contracts could have logged (a gap, or a forged log)."""


def replay(events: Iterable[ChainEvent]) -> Books:
    """The books after ``events``, applied in the order the chain logged them."""
    books = Books()
    for e in events:
        handler = _HANDLERS.get((e.contract, e.name))
        if handler is not None:  # Approval, MinterChanged: no balance moves
            handler(books, e.args)
    return books


def _transfer(b: Books, a: Mapping[str, Any]) -> None:
    sender, receiver, value = a["sender"], a["receiver"], int(a["value"])
    if sender == ZERO:
        b.supply += value
    else:
        _take(b.balances, sender, value, "balance of " + sender)
    if receiver == ZERO:
        b.supply -= value
    else:
        b.balances[receiver] = b.balances.get(receiver, 0) + value


def _deposited(b: Books, a: Mapping[str, Any]) -> None:
    if a["key"] in b.runs:
        raise BooksError(f"run 0x{a['key'].hex()} deposited twice")
    b.runs[a["key"]] = RunBook(
        owner=a["owner"],
        run_id=a["run_id"],
        price=a["price"],
        timeout=a["timeout"],
        escrow=a["amount"],
        deposited=a["amount"],
    )


def _topped_up(b: Books, a: Mapping[str, Any]) -> None:
    run = _run(b, a)
    run.escrow += a["amount"]
    run.deposited += a["amount"]
    if run.deposited != a["deposited"]:
        raise BooksError(f"run 0x{a['key'].hex()}: deposits add up to {run.deposited}, the event says {a['deposited']}")


def _bonded(b: Books, a: Mapping[str, Any]) -> None:
    b.contracts[(a["key"], a["provider"])] = ContractBook(bond=a["amount"])


def _settled(b: Books, a: Mapping[str, Any]) -> None:
    run = _run(b, a)
    if a["amount"] > run.price:
        raise BooksError(f"run 0x{a['key'].hex()} round {a['round']}: {a['amount']} paid above the price")
    run.escrow = _less(run.escrow, a["amount"], "escrow of run 0x" + a["key"].hex())
    _contract(b, a).earned += a["amount"]


def _slashed(b: Books, a: Mapping[str, Any]) -> None:
    c = _contract(b, a)
    c.bond, c.slashed = _less(c.bond, a["amount"], f"bond of {a['provider']}"), True
    b.burned += a["amount"]


def _round_settled(b: Books, a: Mapping[str, Any]) -> None:
    run = _run(b, a)
    if a["round"] in run.rounds:
        raise BooksError(f"run 0x{a['key'].hex()}: round {a['round']} settled twice")
    run.rounds.add(a["round"])


def _finalized(b: Books, a: Mapping[str, Any]) -> None:
    _run(b, a).finalized = True


def _timed_out(b: Books, a: Mapping[str, Any]) -> None:
    _run(b, a).timed_out = True


def _withdrawn(b: Books, a: Mapping[str, Any]) -> None:
    c = _contract(b, a)
    c.earned = _less(c.earned, a["earned"], f"earnings of {a['provider']}")
    c.bond = _less(c.bond, a["bond"], f"bond of {a['provider']}")


def _refunded(b: Books, a: Mapping[str, Any]) -> None:
    run = _run(b, a)
    run.escrow = _less(run.escrow, a["amount"], "escrow of run 0x" + a["key"].hex())


def _run(b: Books, a: Mapping[str, Any]) -> RunBook:
    run = b.runs.get(a["key"])
    if run is None:
        raise BooksError(f"an event of run 0x{a['key'].hex()}, which was never deposited")
    return run


def _contract(b: Books, a: Mapping[str, Any]) -> ContractBook:
    c = b.contracts.get((a["key"], a["provider"]))
    if c is None:
        raise BooksError(f"an event of {a['provider']} in run 0x{a['key'].hex()}, which it never bonded")
    return c


def _less(held: int, amount: int, what: str) -> int:
    if amount > held:
        raise BooksError(f"{what}: {amount} moved out of {held}")
    return held - amount


def _take(balances: dict[str, int], address: str, amount: int, what: str) -> None:
    balances[address] = _less(balances.get(address, 0), amount, what)


_HANDLERS: dict[tuple[str, str], Callable[[Books, Mapping[str, Any]], None]] = {
    ("AIT", "Transfer"): _transfer,
    ("RunEscrow", "Deposited"): _deposited,
    ("RunEscrow", "ToppedUp"): _topped_up,
    ("RunEscrow", "Bonded"): _bonded,
    ("RunEscrow", "Settled"): _settled,
    ("RunEscrow", "Slashed"): _slashed,
    ("RunEscrow", "RoundSettled"): _round_settled,
    ("RunEscrow", "Finalized"): _finalized,
    ("RunEscrow", "TimedOut"): _timed_out,
    ("RunEscrow", "Withdrawn"): _withdrawn,
    ("RunEscrow", "Refunded"): _refunded,
}
