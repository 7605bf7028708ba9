"""Verification of work in simulation (aitbc.sim.verification): every kind of cheat fails the
coordinator's real checks, no honest worker ever does, and the same seed gives the same run."""

from __future__ import annotations

import pytest

from aitbc.errors import UsageError
from aitbc.sim.drift import DriftConfig, drift_trial
from aitbc.sim.verification import VerifyResult, run_verification
from aitbc.sim.verify_config import CHEATS, VerifyConfig

SMALL = dict(workers=6, cheaters=2, rounds=3, local_steps=8, rate=1.0, eval_samples=256)


def _run(**options) -> VerifyResult:
    return run_verification(VerifyConfig(**{**SMALL, **options}))


@pytest.mark.parametrize("cheat", CHEATS)
def test_every_cheat_is_caught_and_no_honest_worker_is(cheat):
    r = _run(cheat=cheat)

    assert len(r.cheaters) == 2
    assert r.false_accusations == []
    assert sorted(r.caught_round) == r.cheaters  # every cheater caught...
    if cheat == "stale":  # round 1 has no older model: its first stale round is round 2, caught for free
        assert set(r.caught_round.values()) == {2} and set(r.caught_by.values()) == {"start"}
        assert r.cheater_updates_accepted == 2
    else:  # ... on its first update, by a replayed interval
        assert set(r.caught_round.values()) == {1} and set(r.caught_by.values()) == {"interval"}
        assert r.cheater_updates_accepted == 0
    # every honest update was replayed in full and its encoding checked (rate 1)
    assert r.honest_updates == 4 * 3
    assert r.honest_replayed_steps == r.honest_trained_steps == 4 * 3 * 8
    assert r.update_checks >= r.honest_updates


def test_one_faked_interval_is_caught_when_every_interval_is_checked():
    r = _run(cheat="skip", skip_fraction=0.01)  # 1 of 8 intervals faked a round

    assert r.false_accusations == [] and set(r.caught_round.values()) == {1}


def test_honest_run_learns_and_every_check_passes():
    r = _run(cheat=None, rounds=4)

    assert r.cheaters == [] and r.false_accusations == []
    assert r.honest_updates == 6 * 4 and r.update_checks == 6 * 4
    assert r.replay_share == 1.0
    assert r.final_val_accuracy is not None and r.initial_val_accuracy is not None
    assert r.final_val_accuracy > r.initial_val_accuracy + 0.2


def test_error_feedback_residuals_are_committed_and_checked():
    """topk with error feedback: honest workers' check_update (residual in and out) passes
    every round; cheaters still fail their replayed intervals."""
    r = _run(cheat="copy", compression="topk:ratio=0.1", error_feedback=True)

    assert r.false_accusations == []
    assert sorted(r.caught_round) == r.cheaters
    assert r.update_checks == r.honest_updates == 4 * 3


def test_without_spot_checks_only_the_free_start_check_catches():
    """Rate 0: nothing is replayed, so copiers go unnoticed and are aggregated (the detection
    comes from the checks, not from the simulator knowing who cheats); a stale worker is
    still caught by the first-state check, which costs nothing."""
    copied = _run(cheat="copy", rate=0.0)
    assert copied.caught_round == {} and copied.cheater_updates_accepted == 2 * 3
    assert copied.replayed_steps == 0 and copied.update_checks == 0

    stale = _run(cheat="stale", rate=0.0)
    assert set(stale.caught_round.values()) == {2} and set(stale.caught_by.values()) == {"start"}


def test_same_seed_same_outcome():
    def outcome(r: VerifyResult) -> tuple:
        return (r.cheaters, r.caught_round, r.caught_by, r.update_checks, r.final_val_loss, r.final_val_accuracy)

    a = _run(cheat="skip", rate=0.25, rounds=4, seed=3)
    b = _run(cheat="skip", rate=0.25, rounds=4, seed=3)
    c = _run(cheat="skip", rate=0.25, rounds=4, seed=4)
    assert outcome(a) == outcome(b)
    assert outcome(a) != outcome(c)
    assert a.false_accusations == [] and c.false_accusations == []


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(cheat="bribe"), "unknown cheat"),
        (dict(cheat="copy", cheaters=6), "cheaters must be between"),
        (dict(rate=1.5), "verification rate"),
    ],
)
def test_bad_options_say_what_is_allowed(options, message):
    with pytest.raises(UsageError, match=message):
        VerifyConfig(**{**SMALL, **options})


def test_a_skipper_of_one_interval_in_ten_is_caught_the_round_it_skips_at_a_low_rate():
    """Issue 33: a skipped interval commits a no-op (its end is its start); the verifier
    re-runs every such interval besides its draw, so at r = 0.1 the skipper is caught, with
    proof, in its first round, not at ~10% a round."""
    r = _run(cheat="skip", skip_fraction=0.1, rate=0.1, local_steps=20)
    assert r.false_accusations == [] and r.honest_drift == []
    assert set(r.caught_round.values()) == {1} and r.proved_round == r.caught_round
    assert r.replay_share <= 0.2  # honest updates still cost about r (no no-op intervals of theirs)


def test_workers_on_other_threads_than_the_verifier_are_never_accused():
    r = _run(cheat="wrong-random", worker_threads=2, verify_threads=1, state_threads=False)
    assert r.false_accusations == []
    assert sorted(r.caught_round) == r.cheaters


@pytest.mark.parametrize("model", ["mlp", "cnn", "transformer"])
def test_a_drift_trial_accuses_no_honest_interval_and_judges_the_cheater(model):
    out = drift_trial(DriftConfig(model=model, optimizer="adamw", lr=0.3, worker_threads=2, local_steps=6))
    assert out["honest"]["fault"] == 0 and out["honest"]["intervals"] == 6
    assert out["cheat"]["passed"] + out["cheat"]["drift"] + out["cheat"]["fault"] == 6
    assert out["cheat"]["fault"] + out["cheat"]["drift"] > 0


def test_drift_options_say_what_is_allowed():
    with pytest.raises(UsageError, match="unknown model"):
        DriftConfig(model="rnn")
    with pytest.raises(UsageError, match="unknown size"):
        DriftConfig(size="huge")
    with pytest.raises(UsageError, match="threads must be at least 1"):
        VerifyConfig(**{**SMALL, "worker_threads": 0})
