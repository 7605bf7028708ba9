"""Contribution scoring: hand-computed cases for each signal and the quality rule."""

from __future__ import annotations

import math

import pytest
import torch

from aitbc.core.scoring import (
    COPY,
    HARMFUL,
    OUTLIER,
    UNASSIGNED,
    ScoringConfig,
    alignments,
    copies,
    relative_gain,
    reputation_update,
    score_round,
    unassigned,
)


def test_relative_gain():
    assert relative_gain(2.0, 1.5) == 0.25
    assert relative_gain(2.0, 3.0) == -0.5
    assert relative_gain(0.0, 1.0) == 0.0  # no meaningful baseline
    assert relative_gain(1.0, math.inf) == -math.inf


def test_copies_finds_replays_but_not_zero_updates():
    a = torch.tensor([1.0, 2.0, 3.0])
    u = torch.stack([a, torch.tensor([3.0, 2.0, 1.0]), a * 1.0000001, torch.zeros(3), torch.zeros(3)])  # (5, 3)
    assert copies(u) == [None, None, 0, None, None]


def test_alignments_point_a_reversed_update_back():
    honest = torch.tensor([[1.0, 1.0], [1.2, 0.9], [0.9, 1.1]])
    u = torch.cat([honest, -4 * honest[:1]])  # (4, 2): the last is sign-flipped
    al = alignments(u)
    assert all(a > 0.5 for a in al[:3]) and al[3] < -0.9
    assert alignments(honest[:1]) == [1.0]


def test_quality_is_full_for_typical_honest_gains_and_zero_for_flags():
    # Prepare: three honest updates, one free-rider (gain 0), one reversed (harmful and against the others).
    gains = [0.10, 0.12, 0.08, 0.0, -0.5]
    own = [0.12, 0.13, 0.10, 0.0, -0.6]
    other = [0.10, 0.11, 0.08, 0.0, -0.5]
    kept = [1.0, 1.0, 1.0, 1.0, 0.2]
    align = [0.9, 0.9, 0.9, 0.0, -0.95]
    # Execute
    sc = score_round(gains, own, other, kept, [None] * 5, ScoringConfig(), align)
    # Assert: median positive gain 0.10, full credit from 0.025.
    assert [s.quality for s in sc[:3]] == [1.0, 1.0, 1.0]
    assert sc[3].quality == 0.0 and sc[3].flags == ()
    assert HARMFUL in sc[4].flags and OUTLIER in sc[4].flags and sc[4].provable and sc[4].quality == 0.0


def test_partial_credit_below_full_credit_gain():
    sc = score_round([0.1, 0.1, 0.0125], [0.1, 0.1, 0.02], [0.1, 0.1, 0.01], [1.0] * 3, [None] * 3)
    assert sc[2].quality == pytest.approx(0.5)  # 0.0125 / (0.25 * 0.1)


def test_harm_needs_both_loss_and_direction():
    # An honest update that alone costs 30% near convergence but points with the others: not provable harm.
    sc = score_round(
        [-0.3, 0.01, 0.02], [0.5, 0.5, 0.5], [0.1, 0.1, 0.1], [1.0] * 3, [None] * 3, alignment=[0.6, 0.7, 0.7]
    )
    assert HARMFUL not in sc[0].flags and sc[0].quality == 0.0 and not sc[0].provable


def test_copy_is_provable_and_unassigned_is_not():
    sc = score_round([0.1, 0.1], [0.1, 0.01], [0.1, 0.2], [1.0, 1.0], [None, 0])
    assert COPY in sc[1].flags and UNASSIGNED in sc[1].flags and sc[1].provable
    sc = score_round([0.1, 0.1], [0.1, 0.01], [0.1, 0.2], [1.0, 1.0], [None, None])
    assert sc[1].flags == (UNASSIGNED,) and not sc[1].provable and sc[1].quality == 0.0


def test_unassigned_tolerates_noise():
    cfg = ScoringConfig()
    assert not unassigned(0.14, 0.16, cfg)  # honest noise
    assert unassigned(0.0, 0.1, cfg)  # does not help its own data at all
    assert unassigned(0.02, 0.2, cfg)  # helps others' data ten times more


def test_reputation_is_an_ema_on_a_0_to_5_scale():
    assert reputation_update(2.5, 1.0) == pytest.approx(5 * (0.3 + 0.7 * 0.5))
    assert reputation_update(5.0, 0.0) == pytest.approx(3.5)
    with pytest.raises(ValueError):
        reputation_update(2.5, 1.5)


def test_config_and_lengths_are_checked():
    with pytest.raises(ValueError):
        ScoringConfig(full_credit=0)
    with pytest.raises(ValueError):
        score_round([0.1], [], [], [], [])


def test_pay_judges_the_share_and_where_held_out_decides_also_the_assigned_shard():
    # alone every update costs held-out and own-shard loss (a converged round's noise): unpaid
    alone = score_round([-0.01] * 4, [-0.005] * 4, [-0.006] * 4, [1.0] * 4, [None] * 4)
    assert [s.quality for s in alone] == [0.0] * 4
    # at their shares all four help both: paid in full; the record keeps the gains alone
    share = dict(share_gain_se=[0.0] * 4, share_own_se=[0.0] * 4)
    paid = score_round(
        [-0.01] * 4, [-0.005] * 4, [-0.006] * 4, [1.0] * 4, [None] * 4,
        share_gains=[0.006, 0.005, 0.007, 0.006], share_own=[0.006, 0.007, 0.005, 0.006], **share,
    )  # fmt: skip
    assert [s.quality for s in paid] == [1.0] * 4 and all(s.gain == -0.01 for s in paid)
    # one trained on a neighbour's shard: it helps held-out data as much, its own shard little
    wrong = score_round(
        [0.02] * 4, [0.02, 0.02, 0.02, 0.001], [0.02] * 4, [1.0] * 4, [None] * 4,
        share_gains=[0.006] * 4, share_own=[0.006, 0.006, 0.006, 0.0003], **share,
    )  # fmt: skip
    assert [s.quality for s in wrong][:3] == [1.0] * 3
    assert wrong[3].quality == pytest.approx(0.0003 / (0.25 * 0.006))  # its own-shard credit, the lesser
    # without the share lists the held-out gains alone decide, as before
    before = score_round([0.02] * 4, [0.02, 0.02, 0.02, 0.001], [0.02] * 4, [1.0] * 4, [None] * 4)
    assert before[3].quality == 1.0


def test_the_share_lists_come_all_or_none():
    with pytest.raises(ValueError, match="share_"):
        score_round([0.1], [0.1], [0.1], [1.0], [None], share_gains=[0.1])
    with pytest.raises(ValueError, match="share_"):
        score_round([0.1], [0.1], [0.1], [1.0], [None], share_gains=[], share_gain_se=[], share_own=[], share_own_se=[])
