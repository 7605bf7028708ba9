"""The training run's state machine (coordinator/store/states.py), on plain Run rows: which moves
are allowed, what a refusal says, and that pause/resume returns to where the run was."""

from __future__ import annotations

import itertools

import pytest

from aitbc.coordinator.errors import ApiError
from aitbc.coordinator.store import states
from aitbc.coordinator.store.models import Run
from aitbc.coordinator.store.states import ENDED, check_transition, require_status, transition
from aitbc.states import RunStatus

INITIALIZING, DISTRIBUTING, TRAINING, AGGREGATING = (
    RunStatus.INITIALIZING,
    RunStatus.DISTRIBUTING,
    RunStatus.TRAINING,
    RunStatus.AGGREGATING,
)
COMPLETE, FAILED, PAUSED, STOPPED = RunStatus.COMPLETE, RunStatus.FAILED, RunStatus.PAUSED, RunStatus.STOPPED
STATES = tuple(RunStatus)

# Written from the design (DESIGN.md and the module docstring), not copied from the table:
#   initializing -> distributing -> training <-> aggregating -> complete
#   any live state -> failed | stopped;  training/initializing -> paused -> (where it was)
ALLOWED = {
    (INITIALIZING, DISTRIBUTING),
    (DISTRIBUTING, TRAINING),
    (TRAINING, AGGREGATING),
    (AGGREGATING, TRAINING),
    (AGGREGATING, COMPLETE),
    (INITIALIZING, PAUSED),
    (TRAINING, PAUSED),
    (PAUSED, INITIALIZING),
    (PAUSED, TRAINING),
    *((s, end) for s in (INITIALIZING, DISTRIBUTING, TRAINING, AGGREGATING, PAUSED) for end in (FAILED, STOPPED)),
}


def make_run(status: str, **kw) -> Run:
    return Run(
        id="training_test",
        status=status,
        paused_from=kw.pop("paused_from", None),
        started_at=kw.pop("started_at", None),
        finished_at=None,
        updated_at=0.0,
        **kw,
    )


def fields(run: Run) -> tuple:
    return run.status, run.paused_from, run.started_at, run.finished_at, run.updated_at


def test_the_table_is_the_design():
    table = {(a, b) for a, tos in states.TRANSITIONS.items() for b in tos}
    assert table == ALLOWED
    assert set(states.TRANSITIONS) == set(STATES)
    assert {COMPLETE, FAILED, STOPPED} == ENDED


@pytest.mark.parametrize(("src", "dst"), sorted(ALLOWED - {(PAUSED, INITIALIZING), (PAUSED, TRAINING)}))
def test_allowed_transition(src, dst):
    run = make_run(src)
    transition(run, dst, now=100.0)
    assert run.status == dst and run.updated_at == 100.0
    assert run.finished_at == (100.0 if dst in ENDED else None)


REFUSED = sorted(set(itertools.product(STATES, STATES)) - ALLOWED)


@pytest.mark.parametrize(("src", "dst"), REFUSED)
def test_refused_transition_changes_nothing(src, dst):
    run = make_run(src, paused_from=TRAINING if src == PAUSED else None)
    before = fields(run)
    with pytest.raises(ApiError) as e:
        transition(run, dst, now=100.0)
    assert e.value.status == 409
    if src in ENDED:
        assert e.value.code == "run_ended"
        assert f"has ended ({src})" in e.value.detail
    else:
        assert e.value.code == "bad_state"
        assert f"is {src}" in e.value.detail and f"not {dst}" in e.value.detail
        for allowed in states.TRANSITIONS[src]:  # the refusal names what is possible
            assert allowed in e.value.detail
    assert fields(run) == before
    with pytest.raises(ApiError):
        check_transition(run, dst)


def test_refused_transitions_cover_the_notable_cases():
    refused = set(REFUSED)
    # No skipping ahead, no going back, no pausing mid-distribution or mid-aggregation, no
    # pausing twice (that would overwrite where the run was), and nothing stays put.
    for pair in [
        (INITIALIZING, TRAINING),
        (INITIALIZING, COMPLETE),
        (TRAINING, COMPLETE),
        (TRAINING, INITIALIZING),
        (DISTRIBUTING, PAUSED),
        (AGGREGATING, PAUSED),
        (PAUSED, PAUSED),
        (PAUSED, COMPLETE),
        (PAUSED, AGGREGATING),
        *((s, s) for s in STATES),
    ]:
        assert pair in refused, pair


@pytest.mark.parametrize("ended", sorted(ENDED))
def test_ended_states_refuse_everything(ended):
    for dst in STATES:
        run = make_run(ended)
        with pytest.raises(ApiError) as e:
            transition(run, dst)
        assert (e.value.status, e.value.code) == (409, "run_ended")
        assert run.status == ended
        with pytest.raises(ApiError) as e:
            require_status(run, INITIALIZING, TRAINING, action="do anything")
        assert e.value.code == "run_ended" and "cannot do anything" in e.value.detail


@pytest.mark.parametrize("where", [INITIALIZING, TRAINING])
def test_pause_and_resume_return_to_where_it_was(where):
    run = make_run(where, started_at=5.0 if where == TRAINING else None)
    transition(run, PAUSED, now=10.0)
    assert (run.status, run.paused_from) == (PAUSED, where)
    other = TRAINING if where == INITIALIZING else INITIALIZING
    with pytest.raises(ApiError) as e:
        transition(run, other, now=11.0)
    assert (e.value.status, e.value.code) == (409, "bad_state")
    assert f"paused while {where}" in e.value.detail
    assert (run.status, run.paused_from, run.updated_at) == (PAUSED, where, 10.0)
    transition(run, where, now=12.0)
    assert (run.status, run.paused_from, run.updated_at) == (where, None, 12.0)
    # pausing again works the same way
    transition(run, PAUSED, now=13.0)
    assert run.paused_from == where


def test_a_paused_run_can_fail_and_forgets_where_it_was():
    run = make_run(TRAINING)
    transition(run, PAUSED, now=1.0)
    transition(run, FAILED, now=2.0)
    assert (run.status, run.paused_from, run.finished_at) == (FAILED, None, 2.0)


def test_started_at_is_the_first_training():
    run = make_run(DISTRIBUTING)
    transition(run, TRAINING, now=1.0)
    transition(run, AGGREGATING, now=2.0)
    transition(run, TRAINING, now=3.0)
    transition(run, PAUSED, now=4.0)
    transition(run, TRAINING, now=5.0)
    assert run.started_at == 1.0
    transition(run, AGGREGATING, now=6.0)
    transition(run, COMPLETE, now=7.0)
    assert (run.started_at, run.finished_at) == (1.0, 7.0)


def test_require_status():
    run = make_run(TRAINING)
    require_status(run, TRAINING, action="x")
    require_status(run, INITIALIZING, TRAINING, action="x")
    with pytest.raises(ApiError) as e:
        require_status(run, INITIALIZING, action="hire workers")
    assert (e.value.status, e.value.code) == (409, "bad_state")
    assert e.value.detail == "cannot hire workers: run training_test is training (needs initializing)"
