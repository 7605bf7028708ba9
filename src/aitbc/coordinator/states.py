"""The training run's state machine.

::

    initializing -> distributing -> training <-> aggregating -> complete
          any live state -> failed;  training/initializing -> paused -> (where it was)

``initializing``: created; data uploaded and workers hired while here.
``distributing``: shards being assigned and the initial model written.
``training``: a round is open; workers train and send updates.
``aggregating``: the round is closed; the coordinator is aggregating (a restart in this
state redoes the aggregation from the round's accepted updates, which are persisted).

Each transition is made by :func:`transition` inside the caller's transaction, so the
status and everything that goes with it are committed together or not at all.
"""

from __future__ import annotations

import time

from aitbc.coordinator.errors import conflict
from aitbc.coordinator.models import Run

INITIALIZING = "initializing"
DISTRIBUTING = "distributing"
TRAINING = "training"
AGGREGATING = "aggregating"
COMPLETE = "complete"
FAILED = "failed"
PAUSED = "paused"

STATES = (INITIALIZING, DISTRIBUTING, TRAINING, AGGREGATING, COMPLETE, FAILED, PAUSED)
ENDED = frozenset({COMPLETE, FAILED})

TRANSITIONS: dict[str, frozenset[str]] = {
    INITIALIZING: frozenset({DISTRIBUTING, PAUSED, FAILED}),
    DISTRIBUTING: frozenset({TRAINING, FAILED}),
    TRAINING: frozenset({AGGREGATING, PAUSED, FAILED}),
    AGGREGATING: frozenset({TRAINING, COMPLETE, FAILED}),
    PAUSED: frozenset({INITIALIZING, TRAINING, FAILED}),
    COMPLETE: frozenset(),
    FAILED: frozenset(),
}


def check_transition(run: Run, to: str) -> None:
    """Refuse (409) a move the machine does not allow, naming where the run is."""
    if to not in TRANSITIONS[run.status]:
        if run.status in ENDED:
            raise conflict("run_ended", f"run {run.id} has ended ({run.status}); it cannot become {to}")
        allowed = ", ".join(sorted(TRANSITIONS[run.status])) or "nothing"
        raise conflict("bad_state", f"run {run.id} is {run.status}; it can become {allowed}, not {to}")


def transition(run: Run, to: str, *, now: float | None = None) -> None:
    check_transition(run, to)
    now = time.time() if now is None else now
    if to == PAUSED:
        run.paused_from = run.status
    elif run.status == PAUSED:
        if to != FAILED and to != run.paused_from:
            raise conflict("bad_state", f"run {run.id} was paused while {run.paused_from}; it resumes there")
        run.paused_from = None
    if to in ENDED:
        run.finished_at = now
    if to == TRAINING and run.started_at is None:
        run.started_at = now
    run.status = to
    run.updated_at = now


def require_status(run: Run, *allowed: str, action: str) -> None:
    """409 unless the run is in one of ``allowed``: ``action`` says what was attempted."""
    if run.status in allowed:
        return
    if run.status in ENDED:
        raise conflict("run_ended", f"run {run.id} has ended ({run.status}); cannot {action}")
    raise conflict("bad_state", f"cannot {action}: run {run.id} is {run.status} (needs {' or '.join(allowed)})")
