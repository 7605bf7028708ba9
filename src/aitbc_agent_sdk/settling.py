"""Waiting for a run's settlement. The coordinator scores and pays each closed round behind
the training (on a loaded machine, minutes behind), and books an ended run's end after
that (updates of a round that never closed paid as delivered, honest bonds returned), so
an ended run's payments are final only once ``settled`` (:class:`~aitbc.replies.money.Payments`).
:meth:`get_payments` and :meth:`refund_payments` wait through :class:`SettleWait`, polling
the payments view; the wait is bounded, and its error names the run's state."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aitbc import run_defaults
from aitbc.replies.money import Payments
from aitbc_agent_sdk.errors import SettlementTimeout
from aitbc_agent_sdk.protocol import Http, Meter, Op, Progress, Sleep, ask

SETTLE_TIMEOUT = run_defaults.SETTLE_TIMEOUT  # s
POLL = 0.5  # s between two looks at the payments view
STAGE = "settle"  # the Progress stage: rounds settled of the rounds closed


def payments_now(training_id: str) -> Op[Payments]:
    """The run's payments view as it stands (``GET /runs/{id}/payments``)."""
    return (yield from ask(Payments, Http("GET", f"/runs/{training_id}/payments")))


def rounds_settled(pay: Payments) -> bool:
    """Every closed round is scored and paid: what the coordinator's refund waits for."""
    return pay.finalized or pay.settled_round >= pay.rounds_closed


def books_settled(pay: Payments) -> bool:
    """The coordinator pays nothing more by itself: the run's payments are final."""
    return pay.settled


@dataclass
class SettleWait:
    """One bounded wait, over one or more looks (:meth:`until`): ``timeout`` seconds from its
    making, ``progress`` told ``(STAGE, rounds settled, rounds closed)`` while it waits."""

    training_id: str
    timeout: float
    progress: Progress | None
    started: float = field(default_factory=time.monotonic)
    meter: Meter | None = None
    waits: int = 0  # calls of until so far

    def until(self, done: Callable[[Payments], bool], pay: Payments | None = None) -> Op[Payments]:
        """Look at the run's payments (``pay``: a look just taken) until ``done``; returns the
        last look. A later call pauses before its first look: its caller was refused after
        the last one said done (a state that moved on between the two)."""
        if self.waits:
            yield from self._pause(pay)
            pay = None
        self.waits += 1
        while True:
            if pay is None:
                pay = yield from payments_now(self.training_id)
            if done(pay):
                if self.meter is not None:  # reported only after a wait: a final answer at once shows nothing
                    self.meter.update(pay.settled_round, pay.rounds_closed)
                    self.meter.end()
                return pay
            if self.meter is None:
                self.meter = Meter(self.progress, STAGE, None)
            self.meter.update(pay.settled_round, pay.rounds_closed)
            yield from self._pause(pay)
            pay = None

    def _pause(self, pay: Payments | None) -> Op[None]:
        left = self.timeout - (time.monotonic() - self.started)
        if left <= 0:
            if pay is None:
                pay = yield from payments_now(self.training_id)
            where = self.describe(pay)
            raise SettlementTimeout(
                "unsettled", f"{where}; wait longer (timeout=) or take the payments so far (wait=False)", where
            )
        yield Sleep(min(POLL, left))

    def describe(self, pay: Payments) -> str:
        """How far the run's settlement got in the time allowed, one line."""
        if pay.settled_round < pay.rounds_closed:
            where = f"its rounds are settled through {pay.settled_round} of {pay.rounds_closed}"
        else:
            where = f"its {pay.rounds_closed} closed rounds are settled but its end is not booked yet"
        return (
            f"run {pay.training_id} ({pay.status}): {where} after {self.timeout:g} s of waiting "
            "(the coordinator settles behind the training)"
        )
