"""How far a run's books (scoring and settlement) may fall behind its rounds, and who
catches them up.

The books thread runs below the coordinator's priority (``books_nice``) so that it takes
only the CPU the workers leave; on a machine whose cores are all busy it gets almost none,
and settlement fell minutes behind the rounds. The bound: a round is settled within
``settle_within_rounds`` later closed rounds or ``settle_within_seconds`` of its close,
whichever is longer. Two things keep it:

- the driver's catch-up thread, at the coordinator's own priority (an unprivileged thread
  cannot raise its priority again once lowered), scores and settles a run's oldest rounds
  once they are half-way to the bound (:meth:`SettleBound.urgent`), and the rounds of a run
  whose books cost too much CPU a round for the low-priority thread (:data:`HEAVY_SECONDS`);
- the rounds thread does not close a run's round that would put the books past the bound
  (:meth:`SettleBound.holds`): the run waits for its settlement, as a worker waits for a
  round's close.

Shape: ``behind`` is the number of closed rounds not yet settled.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from aitbc.coordinator.store.models import RoundRecord, Run
from aitbc.states import RunStatus

# A run whose round took the books more CPU seconds than this is left to the catch-up
# thread: at a low priority it could hold the books for minutes mid-round (a transformer's
# scoring is seconds of forward passes), and the catch-up thread would wait on it.
HEAVY_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Backlog:
    """A run's closed rounds not yet settled: the oldest, the newest closed, and when the
    oldest closed."""

    run_id: str
    oldest: int
    newest: int
    oldest_closed_at: float
    training: bool  # rounds still close: a run that ended has only its tail to settle

    @property
    def behind(self) -> int:
        return self.newest - self.oldest + 1


@dataclass(frozen=True, slots=True)
class SettleBound:
    """Settled within ``rounds`` later closed rounds or ``seconds`` of a close, whichever is
    longer."""

    rounds: int
    seconds: float

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"settle_within_rounds must be at least 1, got {self.rounds}")
        if self.seconds < 0:
            raise ValueError(f"settle_within_seconds must be >= 0, got {self.seconds}")

    def urgent(self, b: Backlog, now: float) -> bool:
        """Whether the catch-up thread takes ``b``'s oldest round now: it is half-way to the
        bound in time, and either as many rounds behind as the bound allows (one more close
        would pass it) or the run no longer closes rounds (its tail is bounded by time alone)."""
        return now - b.oldest_closed_at >= self.seconds / 2 and (b.behind >= self.rounds or not b.training)

    def holds(self, b: Backlog | None, now: float) -> bool:
        """Whether closing the run's open round would put its books past the bound: more
        than ``rounds`` behind, the oldest closed more than ``seconds`` ago."""
        if b is None:
            return False
        return b.behind + 1 > self.rounds and now - b.oldest_closed_at > self.seconds


def backlog(s: Session, run: Run) -> Backlog | None:
    """Run ``run``'s unsettled closed rounds, or None when the books are level with its rounds."""
    newest = s.scalar(select(func.max(RoundRecord.round)).where(RoundRecord.run_id == run.id)) or 0
    oldest = run.settled_round + 1
    if newest < oldest:
        return None
    closed_at = s.scalar(select(RoundRecord.closed_at).where(RoundRecord.run_id == run.id, RoundRecord.round == oldest))
    if closed_at is None:  # a round with no record (never closed): nothing of it to settle
        return None
    training = run.status in (RunStatus.TRAINING, RunStatus.AGGREGATING)  # paused or ended: no close to come
    return Backlog(run.id, oldest, newest, closed_at, training)


def backlogs(s: Session) -> list[Backlog]:
    """Every unfinalized run's backlog (runs whose books are level are left out)."""
    runs = s.scalars(select(Run).where(Run.finalized.is_(False), Run.config.is_not(None))).all()
    return [b for b in (backlog(s, run) for run in runs) if b is not None]
