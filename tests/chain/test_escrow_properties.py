"""Random sequences of deposits (several owners under one run id among them), top-ups,
bonds, settlements (with slashes), finalizations, withdrawals, refunds and the clock
moving on, against the contracts and against a model of
the rules written here in Python:

- every call succeeds exactly when the rules allow it, and reverts with the reason of the
  first rule it breaks otherwise;
- tokens are conserved: supply = the parties' balances + what the escrow holds, and
  minted = supply + burned; the escrow holds exactly the runs' escrow left, the bonds and
  the unwithdrawn earnings;
- no party ever ends with more than the rules give it: a provider at most its unslashed
  bonds and the run's price for each round it was paid in, an owner at most its deposits
  less what its runs paid; every balance equals the model's;
- every balance, run and contract rebuilt from the events alone (:func:`books.replay`)
  equals the contracts' own state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import boa
import pytest
from eth_utils import keccak
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from tests.chain.evm_env import Chain, deploy

from aitbc.chain.evm import books

pytestmark = pytest.mark.chain
OWNERS, PROVIDERS, FUNDS = 2, 4, 60  # small amounts, so the escrow and the balances run short often
E = "RunEscrow: "


def key_of(owner: str, ref: bytes) -> bytes:
    """The contract's key of ``owner``'s run ``ref``, computed here: abi.encode is two words."""
    return keccak(bytes(12) + bytes.fromhex(owner[2:]) + ref)


@dataclass
class MRun:
    owner: str
    ref: bytes  # the run id it was deposited under
    price: int
    timeout: int
    escrow: int
    last_post: int
    deposit: int  # every deposit and top-up together
    paid: int = 0  # settled to providers, in all
    finalized: bool = False
    timed_out: bool = False
    rounds: set[int] = field(default_factory=set)


@dataclass
class MContract:
    bond: int
    posted: int
    earned: int = 0
    slashed: bool = False
    paid_rounds: int = 0  # rounds it was paid more than 0 in


class EscrowMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._env = boa.swap_env(boa.Env())
        self._env.__enter__()
        self.c: Chain = deploy()
        self.owners = [self.c.account(FUNDS) for _ in range(OWNERS)]
        self.providers = [self.c.account(FUNDS) for _ in range(PROVIDERS)]
        self.stranger = self.c.account()
        self.minted = FUNDS * (OWNERS + PROVIDERS)
        self.balances = dict.fromkeys([*self.owners, *self.providers], FUNDS) | {self.stranger: 0}
        self.runs: dict[bytes, MRun] = {}
        self.contracts: dict[tuple[bytes, str], MContract] = {}
        self.burned = 0

    def teardown(self) -> None:
        try:
            self._check_state_and_events()
        finally:
            self._env.__exit__(None, None, None)

    # -- the model's view of the rules --------------------------------------------------

    def _expired(self, r: MRun) -> bool:
        return not r.finalized and boa.env.timestamp >= r.last_post + r.timeout

    def _closed(self, r: MRun) -> bool:
        return r.finalized or r.timed_out or self._expired(r)

    def _open_problem(self, run: bytes) -> str | None:
        r = self.runs.get(run)
        if r is None:
            return E + "no such run"
        if r.finalized:
            return E + "run finalized"
        return E + "run timed out" if self._expired(r) else None

    def _run_id(self, data: st.DataObject, *, known_odds: int = 9, prefer_open: bool = False) -> bytes:
        """A deposited run's key ``known_odds`` times in 10 (``prefer_open``: mostly an open
        one), else (mostly) a key no run has."""
        known, live = list(self.runs), self._live()  # in deposit order: keys hash the (fresh) addresses
        if prefer_open and live and data.draw(st.integers(0, 9), label="open run?") < 8:
            return data.draw(st.sampled_from(live), label="run")
        if known and data.draw(st.integers(0, 9), label="known run?") < known_odds:
            return data.draw(st.sampled_from(known), label="run")
        return bytes([data.draw(st.integers(1, 200), label="new run")]) * 32

    def _ref(self, data: st.DataObject) -> bytes:
        """A run id to deposit under: mostly one deposited already (by this owner: refused;
        by another: a run of its own), else a new one."""
        refs = sorted({r.ref for r in self.runs.values()})
        if refs and data.draw(st.integers(0, 9), label="known id?") < 5:
            return data.draw(st.sampled_from(refs), label="id")
        return bytes([data.draw(st.integers(1, 200), label="new id")]) * 32

    def _live(self) -> list[bytes]:
        return [run for run in self.runs if self._open_problem(run) is None]

    def _party(self, data: st.DataObject, likely: list[str], others: list[str]) -> str:
        """One of ``likely`` 4 times in 5 (where there is one), else one of ``others``."""
        if likely and data.draw(st.integers(0, 4), label="likely?"):
            return data.draw(st.sampled_from(likely), label="party")
        return data.draw(st.sampled_from(others), label="party")

    def _bonded(self, run: bytes) -> list[str]:
        return [p for p in self.providers if (run, p) in self.contracts]

    def _expect(self, problem: str | None, sender: str, contract: object, fn: str, *args: object) -> bool:
        """Send; it must revert with ``problem`` when there is one, else succeed."""
        if problem is None:
            self.c.send(sender, contract, fn, *args)
            return True
        with boa.reverts(problem):
            self.c.send(sender, contract, fn, *args)
        return False

    def _close(self, r: MRun) -> None:
        if not (r.finalized or r.timed_out) and self._expired(r):
            r.timed_out = True

    # -- rules ---------------------------------------------------------------------------

    @precondition(lambda self: len(self.runs) < 5)  # the other rules then work on few runs a lot
    @rule(
        data=st.data(),
        who=st.integers(0, OWNERS - 1),
        amount=st.sampled_from([12, 25, 6, 45, 0]),
        price=st.sampled_from([5, 12, 1, 0]),  # up to a whole small escrow a round
    )
    def deposit(self, data: st.DataObject, who: int, amount: int, price: int) -> None:
        owner, ref = self.owners[who], self._ref(data)
        run = key_of(owner, ref)
        timeout = data.draw(st.sampled_from([5, 60, 1000]), label="timeout")
        self.c.send(owner, self.c.token, "approve", str(self.c.escrow.address), amount)
        problem = (
            E + "run already deposited"
            if run in self.runs
            else E + "deposit must be more than 0"
            if amount == 0
            else "AIT: transfer above balance"
            if amount > self.balances[owner]
            else None
        )
        if self._expect(problem, owner, self.c.escrow, "deposit", ref, amount, price, timeout):
            self.runs[run] = MRun(owner, ref, price, timeout, amount, boa.env.timestamp, deposit=amount)
            self.balances[owner] -= amount

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), amount=st.sampled_from([3, 20, 0, 100]))
    def top_up(self, data: st.DataObject, amount: int) -> None:
        run = self._run_id(data, prefer_open=True)
        r = self.runs.get(run)
        caller = self._party(data, [r.owner] if r else [], [*self.owners, self.providers[0]])
        self.c.send(caller, self.c.token, "approve", str(self.c.escrow.address), amount)
        if r is None or r.owner != caller:
            problem: str | None = E + "only the run's owner tops up"
        else:
            problem = self._open_problem(run)
        if problem is None and amount == 0:
            problem = E + "top-up must be more than 0"
        if problem is None and amount > self.balances[caller]:
            problem = "AIT: transfer above balance"
        if self._expect(problem, caller, self.c.escrow, "top_up", run, amount):
            assert r is not None
            r.escrow += amount
            r.deposit += amount
            self.balances[caller] -= amount

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), who=st.integers(0, PROVIDERS - 1), amount=st.integers(0, 20))
    def post_bond(self, data: st.DataObject, who: int, amount: int) -> None:
        provider, run = self.providers[who], self._run_id(data, prefer_open=True)
        self.c.send(provider, self.c.token, "approve", str(self.c.escrow.address), amount)
        problem = self._open_problem(run)
        if problem is None and (run, provider) in self.contracts:
            problem = E + "bond already posted"
        if problem is None and amount > self.balances[provider]:
            problem = "AIT: transfer above balance"
        if self._expect(problem, provider, self.c.escrow, "post_bond", run, amount):
            self.contracts[(run, provider)] = MContract(bond=amount, posted=amount)
            self.balances[provider] -= amount

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), rnd=st.integers(0, 4), by_key=st.integers(0, 9))
    def settle(self, data: st.DataObject, rnd: int, by_key: int) -> None:
        run, sender = self._run_id(data, prefer_open=True), self.c.key if by_key else self.stranger
        bonded = self._bonded(run)
        payees = st.sampled_from(bonded) if bonded and data.draw(st.integers(0, 5)) else st.sampled_from(self.providers)
        slash = st.integers(0, 5).map(lambda n: n == 0)
        price, left = (self.runs[run].price, self.runs[run].escrow) if run in self.runs else (0, 0)
        # at, under and over the price; and all the escrow left, which two contracts then overdraw
        amount = st.sampled_from([price, min(price, left), price // 2, 0, price + 1])
        entries = data.draw(st.dictionaries(payees, st.tuples(amount, slash), max_size=4), label="entries")
        providers = sorted(entries, key=lambda a: int(a, 16))
        amounts, slashes = [entries[p][0] for p in providers], [entries[p][1] for p in providers]
        problem = self._settle_problem(run, rnd, sender, providers, amounts)
        if self._expect(problem, sender, self.c.escrow, "settle", run, rnd, providers, amounts, slashes):
            self._apply_settle(run, rnd, providers, amounts, slashes)

    @precondition(lambda self: any(self._bonded(run) for run in self._live()))
    @rule(data=st.data())
    def settle_within_the_rules(self, data: st.DataObject) -> None:
        """A settlement the rules allow (most random ones break one): a new round of an
        open run, its bonded providers paid at most the price, at most the escrow left."""
        run = data.draw(st.sampled_from([run for run in self._live() if self._bonded(run)]), label="run")
        r = self.runs[run]
        rnd = data.draw(st.integers(0, 20).filter(lambda n: n not in r.rounds), label="round")
        providers = data.draw(st.lists(st.sampled_from(self._bonded(run)), min_size=1, unique=True), label="paid")
        providers.sort(key=lambda a: int(a, 16))
        amounts = [min(r.price, r.escrow // len(providers))] * len(providers)
        slashes = [data.draw(st.integers(0, 4), label="slash?") == 0 for _ in providers]
        self._expect(None, self.c.key, self.c.escrow, "settle", run, rnd, providers, amounts, slashes)
        self._apply_settle(run, rnd, providers, amounts, slashes)

    def _overdrawn(self) -> list[bytes]:
        return [run for run in self._live() if self.runs[run].price * len(self._bonded(run)) > self.runs[run].escrow]

    @precondition(lambda self: self._overdrawn())
    @rule(data=st.data())
    def settle_over_the_escrow(self, data: st.DataObject) -> None:
        """Every contract of a run paid the price, more than its escrow left: refused whole."""
        run = data.draw(st.sampled_from(self._overdrawn()), label="run")
        rnd = data.draw(st.integers(0, 20), label="round")
        providers = sorted(self._bonded(run), key=lambda a: int(a, 16))
        amounts, slashes = [self.runs[run].price] * len(providers), [True] * len(providers)
        problem = self._settle_problem(run, rnd, self.c.key, providers, amounts)
        assert problem is not None
        self._expect(problem, self.c.key, self.c.escrow, "settle", run, rnd, providers, amounts, slashes)

    def _settle_problem(
        self, run: bytes, rnd: int, sender: str, providers: list[str], amounts: list[int]
    ) -> str | None:
        if sender != self.c.key:
            return E + "only the settlement key settles"
        problem = self._open_problem(run)
        if problem is not None:
            return problem
        r = self.runs[run]
        if rnd in r.rounds:
            return E + "round already settled"
        for p, amount in zip(providers, amounts):
            if (run, p) not in self.contracts:
                return E + "provider has no contract in this run"
            if amount > r.price:
                return E + "amount above the run's price"
        return E + "settlement above the escrow left" if sum(amounts) > r.escrow else None

    def _apply_settle(
        self, run: bytes, rnd: int, providers: list[str], amounts: list[int], slashes: list[bool]
    ) -> None:
        r = self.runs[run]
        r.rounds.add(rnd)
        r.escrow -= sum(amounts)
        r.paid += sum(amounts)
        r.last_post = boa.env.timestamp
        for p, amount, slash in zip(providers, amounts, slashes):
            c = self.contracts[(run, p)]
            c.earned += amount
            c.paid_rounds += amount > 0
            if slash and not c.slashed:
                self.burned += c.bond
                c.bond, c.slashed = 0, True

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), by_key=st.integers(0, 4))
    def finalize(self, data: st.DataObject, by_key: int) -> None:
        if data.draw(st.integers(0, 2), label="not now"):  # rarer than the others: runs live a while
            return
        run, sender = self._run_id(data, prefer_open=True), self.c.key if by_key else self.owners[0]
        problem = E + "only the settlement key finalizes" if sender != self.c.key else self._open_problem(run)
        if self._expect(problem, sender, self.c.escrow, "finalize", run):
            self.runs[run].finalized = True

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        run = self._run_id(data)
        caller = self._party(data, self._bonded(run), [*self.providers, self.owners[0]])
        c = self.contracts.get((run, caller), MContract(bond=0, posted=0))
        r = self.runs.get(run)
        bond = c.bond if r is not None and self._closed(r) else 0
        if self._expect(None if c.earned + bond else E + "nothing to withdraw", caller, self.c.escrow, "withdraw", run):
            assert r is not None
            self._close(r)
            self.balances[caller] += c.earned + bond
            c.earned, c.bond = 0, c.bond - bond

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def refund(self, data: st.DataObject) -> None:
        run = self._run_id(data)
        r = self.runs.get(run)
        caller = self._party(data, [r.owner] if r else [], [*self.owners, self.stranger])
        if r is None or r.owner != caller:
            problem: str | None = E + "only the run's owner is refunded"
        elif not self._closed(r):
            problem = E + "run still open: refund after it is finalized or timed out"
        else:
            problem = None if r.escrow else E + "nothing to refund"
        if self._expect(problem, caller, self.c.escrow, "refund", run):
            assert r is not None
            self._close(r)
            self.balances[caller] += r.escrow
            r.escrow = 0

    @precondition(lambda self: self.runs)
    @rule(seconds=st.sampled_from([1, 10, 100]))
    def time_passes(self, seconds: int) -> None:
        boa.env.time_travel(seconds=seconds)

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def tokens_are_conserved_and_every_balance_is_the_rules(self) -> None:
        escrow_holds = self.c.balance(str(self.c.escrow.address))
        supply = self.c.token.totalSupply()
        assert {a: self.c.balance(a) for a in self.balances} == self.balances
        assert supply == sum(self.balances.values()) + escrow_holds
        assert self.minted == supply + self.burned and self.c.escrow.burned() == self.burned
        held = sum(r.escrow for r in self.runs.values())
        held += sum(c.bond + c.earned for c in self.contracts.values())
        assert escrow_holds == held

    @invariant()
    def no_party_has_more_than_the_rules_give(self) -> None:
        for a, balance in self.balances.items():
            ceiling = FUNDS if a != self.stranger else 0
            for run, r in self.runs.items():
                if r.owner == a:  # paid in, and at most what no provider was paid back
                    ceiling += -r.deposit + (r.deposit - r.paid)
                c = self.contracts.get((run, a))
                if c is not None:  # paid in, back unless slashed, and at most the price a round paid
                    ceiling += -c.posted + (0 if c.slashed else c.posted) + r.price * c.paid_rounds
            assert balance <= ceiling, (a, balance, ceiling)

    def _check_state_and_events(self) -> None:
        """The contracts' state is the model's, and the events alone rebuild it."""
        rebuilt = books.replay(self.c.events)
        addresses = [*self.balances, str(self.c.escrow.address)]
        assert {a: rebuilt.balance(a) for a in addresses} == {a: self.c.balance(a) for a in addresses}
        assert rebuilt.supply == self.c.token.totalSupply() and rebuilt.burned == self.burned
        assert rebuilt.runs.keys() == self.runs.keys()
        for run, r in self.runs.items():
            on_chain = self.c.escrow.runs(run)
            assert (on_chain.escrow, on_chain.deposited, on_chain.finalized, on_chain.timed_out) == (
                r.escrow,
                r.deposit,
                r.finalized,
                r.timed_out,
            )
            b = rebuilt.runs[run]
            assert (b.owner, b.run_id, b.escrow, b.deposited, b.finalized, b.timed_out, b.rounds) == (
                r.owner,
                r.ref,
                r.escrow,
                r.deposit,
                r.finalized,
                r.timed_out,
                r.rounds,
            )
            assert all(self.c.escrow.settled(run, n) == (n in r.rounds) for n in range(5))
        assert rebuilt.contracts.keys() == self.contracts.keys()
        for (run, p), c in self.contracts.items():
            b = rebuilt.contracts[(run, p)]
            assert (b.bond, b.earned, b.slashed) == (c.bond, c.earned, c.slashed)
            assert tuple(self.c.contract(run, p)) == (True, c.bond, c.earned, c.slashed)


EscrowMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestEscrowMachine = EscrowMachine.TestCase
