"""The coordinator's state groups (each defined once) and the training run's state machine,
over the statuses of :mod:`aitbc.states`.

::

    initializing -> distributing -> training <-> aggregating -> complete
          any live state -> failed | stopped;  training/initializing -> paused -> (where it was)

``initializing``: created; data uploaded and workers hired while here.
``distributing``: shards being assigned and the initial model written.
``training``: a round is open; workers train and send updates.
``aggregating``: the round is closed; the coordinator is aggregating (a restart in this
state redoes the aggregation from the round's accepted updates, which are persisted).
``complete``, ``failed``, ``stopped`` (ended by its owner's stop): the ends; each is
finalized the same way (closed rounds settled, honest bonds returned, escrow refunded).

Each transition is made by :func:`transition` inside the caller's transaction, so the
status and everything that goes with it are committed together or not at all.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from aitbc.coordinator.errors import conflict
from aitbc.states import ContractStatus, RunStatus

if TYPE_CHECKING:
    from aitbc.coordinator.store.models import Run


# --- state groups (each defined here only) ------------------------------------------------

ENDED = frozenset({RunStatus.COMPLETE, RunStatus.FAILED, RunStatus.STOPPED})
# Not ended: a run that still holds its contracts.
LIVE = (RunStatus.INITIALIZING, RunStatus.DISTRIBUTING, RunStatus.TRAINING, RunStatus.AGGREGATING, RunStatus.PAUSED)
# Distributed and not ended: jobs exist and may be controlled.
RUNNING = (RunStatus.DISTRIBUTING, RunStatus.TRAINING, RunStatus.AGGREGATING, RunStatus.PAUSED)
# What the round driver moves forward on its own (an automatic run that is not paused).
ADVANCING = (RunStatus.DISTRIBUTING, RunStatus.TRAINING, RunStatus.AGGREGATING)
# Not ended and not paused: a manual run in these can go idle.
ACTIVE = (RunStatus.INITIALIZING, RunStatus.DISTRIBUTING, RunStatus.TRAINING, RunStatus.AGGREGATING)
# Contracts that still bind their worker to the run.
ENGAGED = (ContractStatus.HIRED, ContractStatus.WORKING)

# An owner may stop a run in any live state; only the machine's own moves differ per state.
_ENDS = frozenset({RunStatus.FAILED, RunStatus.STOPPED})
TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.INITIALIZING: frozenset({RunStatus.DISTRIBUTING, RunStatus.PAUSED}) | _ENDS,
    RunStatus.DISTRIBUTING: frozenset({RunStatus.TRAINING}) | _ENDS,
    RunStatus.TRAINING: frozenset({RunStatus.AGGREGATING, RunStatus.PAUSED}) | _ENDS,
    RunStatus.AGGREGATING: frozenset({RunStatus.TRAINING, RunStatus.COMPLETE}) | _ENDS,
    RunStatus.PAUSED: frozenset({RunStatus.INITIALIZING, RunStatus.TRAINING}) | _ENDS,
    RunStatus.COMPLETE: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.STOPPED: frozenset(),
}


def check_transition(run: Run, to: RunStatus) -> None:
    """Refuse (409) a move the machine does not allow, naming where the run is."""
    if to not in TRANSITIONS[RunStatus(run.status)]:
        if run.status in ENDED:
            raise conflict("run_ended", f"run {run.id} has ended ({run.status}); it cannot become {to}")
        allowed = ", ".join(sorted(TRANSITIONS[RunStatus(run.status)])) or "nothing"
        raise conflict("bad_state", f"run {run.id} is {run.status}; it can become {allowed}, not {to}")


def transition(run: Run, to: RunStatus, *, now: float | None = None) -> None:
    check_transition(run, to)
    now = time.time() if now is None else now
    if to == RunStatus.PAUSED:
        run.paused_from = run.status
    elif run.status == RunStatus.PAUSED:
        if to not in _ENDS and to != run.paused_from:
            raise conflict("bad_state", f"run {run.id} was paused while {run.paused_from}; it resumes there")
        run.paused_from = None
    if to in ENDED:
        run.finished_at = now
    if to == RunStatus.TRAINING and run.started_at is None:
        run.started_at = now
    run.status = to
    run.updated_at = now


def require_status(run: Run, *allowed: RunStatus, action: str) -> None:
    """409 unless the run is in one of ``allowed``: ``action`` says what was attempted."""
    if run.status in allowed:
        return
    if run.status in ENDED:
        raise conflict("run_ended", f"run {run.id} has ended ({run.status}); cannot {action}")
    raise conflict("bad_state", f"cannot {action}: run {run.id} is {run.status} (needs {' or '.join(allowed)})")
