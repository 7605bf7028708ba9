"""Scoring near convergence: noise measured from the round lowers nothing and flags nobody
honest; real cheats still stand out by many standard errors."""

from __future__ import annotations

import pytest
import torch

from aitbc.coordinator.verification.scoring import _gain
from aitbc.core.scoring import HARMFUL, OUTLIER, UNASSIGNED, ScoringConfig, score_round, unassigned


def test_converged_honest_round_is_paid_in_full_and_unflagged():
    # The issue's case: near convergence own gain slightly negative while others' is
    # slightly positive, and held-out gains scatter around 0 -- all within their noise.
    gains = [-0.002, 0.001, -0.001, 0.0015]
    own = [-0.003, 0.002, -0.001, 0.001]
    other = [0.002, 0.001, 0.003, -0.001]
    se = [0.002] * 4
    sc = score_round(gains, own, other, [1.0] * 4, [None] * 4, gain_se=se, own_se=se, other_se=se)
    assert all(s.flags == () for s in sc)
    assert all(s.quality == 1.0 for s in sc)
    # Without the measured noise the old rules would have zeroed and flagged them.
    old = score_round(gains, own, other, [1.0] * 4, [None] * 4)
    assert UNASSIGNED in old[0].flags and old[2].quality == 0.0


def test_a_converged_round_of_negative_held_out_gains_pays_on_own_shards():
    # Round 21 of bench/honest_runs.py (4 workers, IID, mean, seed 1), as measured: every
    # held-out gain is negative yet within two standard errors of 0, and every update cuts
    # its own shard's loss alike. Paying on the held-out credits (gain + 2 se) gave the
    # worker with the smallest noise 0.1 of the price: its credit 0.002 against a reference
    # of 0.072 made of the others' noise. The round is converged: own shards decide.
    gains = [-0.01899, -0.0133, -0.04265, -0.07987]
    gain_se = [0.03236, 0.0478, 0.05725, 0.04087]
    own = [0.25784, 0.21894, 0.23112, 0.21435]
    own_se = [0.0717, 0.05146, 0.09667, 0.06414]
    other = [-0.12353, -0.2339, -0.32043, -0.05516]
    sc = score_round(gains, own, other, [1.0] * 4, [None] * 4, gain_se=gain_se, own_se=own_se, other_se=[0.05] * 4)
    assert [s.flags for s in sc] == [()] * 4
    assert [s.quality for s in sc] == [1.0] * 4
    # A free-rider in the same round still earns nothing: no own gain, no noise.
    sc = score_round(
        gains[:3] + [0.0],
        own[:3] + [0.0],
        other[:3] + [0.0],
        [1.0] * 4,
        [None] * 4,
        gain_se=gain_se[:3] + [0.0],
        own_se=own_se[:3] + [0.0],
        other_se=[0.05] * 3 + [0.0],
    )
    assert sc[3].quality == 0.0 and [s.quality for s in sc[:3]] == [1.0] * 3


def test_free_rider_has_no_noise_to_hide_behind():
    # A zero update changes no sample's loss: gain 0 and standard error 0 everywhere, so no
    # credit; in a converged round honest updates are paid on their own shard's gain.
    se = [0.002, 0.002, 0.0]
    own = [0.004, 0.003, 0.0]
    sc = score_round([0.001, -0.001, 0.0], own, [0.0] * 3, [1.0] * 3, [None] * 3, gain_se=se, own_se=se)
    assert sc[2].quality == 0.0 and sc[0].quality == sc[1].quality == 1.0
    # A tiny update earns a tiny share of the round's reference.
    sc = score_round([0.02, 0.02, 1e-5], [0.0] * 3, [0.0] * 3, [1.0] * 3, [None] * 3, gain_se=[0.002, 0.002, 1e-6])
    assert sc[2].quality < 0.01


def test_a_flag_must_clear_its_threshold_by_flag_z_standard_errors():
    cfg = ScoringConfig()
    assert unassigned(0.0, 0.1, cfg, noise=0.01)  # 10 standard errors short: flagged
    assert not unassigned(0.0, 0.1, cfg, noise=0.05)  # 2 standard errors: noise
    assert not unassigned(-0.004, 0.004, cfg, noise=0.003)
    # harmful: a large loss increase far beyond its noise, against the round
    sc = score_round(
        [0.05, 0.05, 0.05, -0.5],
        [0.05] * 4,
        [0.05] * 4,
        [1.0] * 4,
        [None] * 4,
        alignment=[0.8, 0.8, 0.8, -0.9],
        gain_se=[0.01, 0.01, 0.01, 0.02],
    )
    assert HARMFUL in sc[3].flags and sc[3].provable
    sc = score_round(
        [0.05, 0.05, 0.05, -0.15],
        [0.05] * 4,
        [0.05] * 4,
        [1.0] * 4,
        [None] * 4,
        alignment=[0.8, 0.8, 0.8, -0.9],
        gain_se=[0.01, 0.01, 0.01, 0.05],  # 0.15 is within 0.1 + 4 x 0.05: not provable
    )
    assert HARMFUL not in sc[3].flags and not sc[3].provable


def test_non_iid_honest_updates_are_paid_on_their_own_shard():
    # Each update alone fits its own classes: held-out gain slightly negative beyond noise,
    # own-shard gain clearly positive. A free-rider gains nowhere.
    gains = [-0.03, -0.02, -0.04, 0.0]
    own = [0.2, 0.15, 0.25, 0.0]
    other = [-0.05, -0.04, -0.06, 0.0]
    se = [0.005, 0.005, 0.005, 0.0]
    sc = score_round(gains, own, other, [1.0] * 4, [None] * 4, gain_se=se, own_se=se, other_se=se)
    assert [s.quality for s in sc] == [1.0, 1.0, 1.0, 0.0]
    assert all(s.flags == () for s in sc)


def test_measured_gain_and_its_standard_error():
    before = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    after = torch.tensor([0.9, 1.1, 0.8, 1.2], dtype=torch.float64)
    gain, se = _gain(before, after)
    assert gain == pytest.approx(0.0)
    assert se == pytest.approx(float((before - after).std()) / 2)
    assert _gain(before, before) == (0.0, 0.0)  # an update that changes nothing has no noise
    assert _gain(before[:1], after[:1])[1] == 0.0


def test_noise_settings_are_checked():
    with pytest.raises(ValueError):
        ScoringConfig(flag_z=-1)
    with pytest.raises(ValueError):
        ScoringConfig(credit_z=float("nan"))
    with pytest.raises(ValueError):
        score_round([0.1], [0.1], [0.1], [1.0], [None], gain_se=[])


def test_a_robust_rule_leaving_an_honest_update_out_is_no_flag():
    # multi-krum always leaves some out and trimming cuts honest coordinates too: an update
    # the rule dropped but which helps and points the round's way is not an outlier.
    gains, align = [0.05, 0.04, 0.05, -0.02], [0.8, 0.7, 0.8, -0.6]
    own = [0.05, 0.04, 0.05, -0.02]
    sc = score_round(gains, own, [0.05] * 4, [1.0, 0.0, 0.4, 0.0], [None] * 4, alignment=align)
    assert sc[1].flags == () and sc[1].quality == 1.0
    assert sc[2].flags == () and sc[2].quality == 1.0
    assert OUTLIER in sc[3].flags and sc[3].quality == 0.0  # dropped, unhelpful and against the round
