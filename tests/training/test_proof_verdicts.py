"""Issue 33: a failed replay accuses only with proof. Each check's outcome is one of three
classes (training/checks.py): PASSED (paid), DRIFT (a miss honest drift could explain:
unpaid, never slashed) and FAULT (what drift cannot make: slashed). Here each class is
reached from real training, with the boundaries between them."""

from __future__ import annotations

import math

import pytest
import torch

from aitbc.training.checks import (
    BOUND_CHAOS,
    BOUND_FLOOR,
    DEFAULT_TOLERANCE,
    DRIFT,
    DRIFT_MARGIN,
    FAULT,
    PASSED,
    Verdict,
    check_interval,
    drift_bound,
    null_intervals,
    probe_drift,
    replay,
    replay_threads,
)
from aitbc.training.proof import Commitment, Recorder, TrainState

from .test_proof import replayer, trained

STEPS = 8  # commit_every(8) = 1: 8 one-step intervals


def _moved_end(rec: Recorder, index: int, share: float) -> tuple[Commitment, TrainState, TrainState]:
    """The commitment of a worker whose state at boundary ``index + 1`` is the honest one
    moved by ``share`` of the interval's own move (committed as such: its digests match)."""
    start, end = rec.states[index], rec.states[index + 1]
    direction = torch.randn(end.params.shape, generator=torch.Generator().manual_seed(3))
    move = torch.linalg.vector_norm(end.params - start.params)
    moved = end.params + direction * (share * move / torch.linalg.vector_norm(direction))
    rec.states[index + 1] = TrainState(end.step, moved, end.optim)
    return rec.commitment(None, None), rec.states[index], rec.states[index + 1]


def test_an_honest_interval_passes_bit_exact_on_the_threads_its_commitment_states():
    tr, _, rec, *_ = trained(steps=STEPS)
    c = rec.commitment(None, None, threads=1)
    assert Commitment.from_json(c.to_json(), steps=STEPS).threads == 1
    v = check_interval(c, 2, rec.states[2], rec.states[3], replayer(tr, 2))
    assert (v.outcome, v.error, v.ok, v.provable) == (PASSED, 0.0, True, False), v


def test_a_miss_within_the_drift_band_is_drift_never_a_fault():
    """3% of the interval's move off: past the 1e-2 tolerance (the old check slashed this),
    within the drift bound (at least BOUND_FLOOR): the update is unpaid, nobody is accused."""
    tr, _, rec, *_ = trained(steps=STEPS)
    c, start, end = _moved_end(rec, 4, 0.03)
    v = check_interval(c, 4, start, end, replayer(tr, 2))
    assert v.outcome == DRIFT and not v.ok and not v.provable, v
    assert DEFAULT_TOLERANCE < v.error < v.bound and v.bound >= BOUND_FLOOR, v
    assert "could be drift, not proof" in v.detail, v
    # the probe re-ran it: counted in what the check cost
    assert v.steps_replayed >= 2


def test_a_replay_far_past_the_drift_bound_is_a_fault():
    tr, _, rec, *_ = trained(steps=STEPS)
    c, start, end = _moved_end(rec, 4, 0.5)
    v = check_interval(c, 4, start, end, replayer(tr, 2))
    assert v.outcome == FAULT and v.provable and v.error > v.bound, v
    assert "past the drift bound" in v.detail, v


def test_a_revealed_state_that_is_not_the_committed_one_is_a_fault():
    tr, _, rec, *_ = trained(steps=STEPS)
    c = rec.commitment(None, None)
    forged = TrainState(3, rec.states[3].params + 1e-6, rec.states[3].optim)  # tiny: still not the digest
    v = check_interval(c, 2, rec.states[2], forged, replayer(tr, 2))
    assert (v.outcome, v.check) == (FAULT, "reveal"), v


def test_an_optimizer_step_count_no_kernel_changes_is_a_fault():
    """A state whose optimizer took other steps than the interval's: no drift does that."""
    tr, _, rec, *_ = trained(steps=STEPS)
    end = rec.states[5]
    rec.states[5] = TrainState(5, end.params, {k: v + 1 if k.endswith(".step") else v for k, v in end.optim.items()})
    c = rec.commitment(None, None)
    v = check_interval(c, 4, rec.states[4], rec.states[5], replayer(tr, 2))
    assert v.outcome == FAULT and "other tensors or steps" in v.detail, v


def test_the_drift_bound_follows_the_measured_drift():
    assert drift_bound(0.0) == BOUND_FLOOR  # re-runs that agree: the floor
    assert drift_bound(BOUND_CHAOS) == pytest.approx(max(BOUND_FLOOR, DRIFT_MARGIN * BOUND_CHAOS))
    assert drift_bound(BOUND_CHAOS * 1.01) == math.inf  # re-runs that diverge: no distance is proof
    assert drift_bound(float("nan")) == math.inf


def test_the_probe_measures_the_interval_and_counts_its_reruns():
    """probe_drift re-runs the interval from a nudged start (and on one thread where the
    verifier has more): a distance above 0 for a real interval, and the re-runs it took."""
    tr, _, rec, *_ = trained(steps=STEPS)
    r = replayer(tr, 2)
    got = replay(r, rec.states[4], 1)
    probe, reruns = probe_drift(r, rec.states[4], 1, got)
    assert 0 < probe < BOUND_CHAOS and reruns == (2 if torch.get_num_threads() > 1 else 1)
    assert drift_bound(probe) >= BOUND_FLOOR


def test_replay_threads_uses_the_stated_count_up_to_the_cap_and_restores():
    before = torch.get_num_threads()
    with replay_threads(2, cap=1) as n:
        assert n == 1 and torch.get_num_threads() == 1
    with replay_threads(None) as n:
        assert n == before
    assert torch.get_num_threads() == before


def test_a_commitment_states_a_sane_thread_count():
    tr, _, rec, *_ = trained(steps=4)
    d = rec.commitment(None, None).to_json()
    for bad in (0, -1, 1025, True, "2", 2.0):
        with pytest.raises(Exception, match="proof.threads must be an integer in"):
            Commitment.from_json({**d, "threads": bad}, steps=4)
    assert Commitment.from_json({**d, "threads": None}, steps=4).threads is None


def test_null_intervals_are_those_whose_end_is_their_start():
    tr, _, rec, *_ = trained(steps=STEPS)
    assert null_intervals(rec.commitment(None, None)) == []
    rec.states[6] = TrainState(6, rec.states[5].params.clone(), dict(rec.states[5].optim))
    assert null_intervals(rec.commitment(None, None)) == [5]


def test_verdict_outcomes_are_closed():
    with pytest.raises(ValueError, match="outcome must be"):
        Verdict("maybe", "interval", 0, None, "x")
