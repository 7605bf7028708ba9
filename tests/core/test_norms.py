"""The norm bound (aitbc.core.norms): hand-computed rounds, Prepare / Execute / Assert."""

from __future__ import annotations

import math

import pytest
import torch

from aitbc.core.attacks import AttackView, build_attack
from aitbc.core.norms import CLIP, KEEP, REJECT, NormBound, apply_verdict, judge_norms, update_norms


def test_update_norms_do_not_overflow_on_huge_finite_updates():
    u = torch.full((2, 1000), 3e38)  # (n, d) finite float32; its float32 norm is inf
    assert not math.isfinite(float(u[0].norm()))
    norms = update_norms(u)
    assert all(math.isfinite(x) for x in norms)
    assert norms[0] == pytest.approx(3e38 * math.sqrt(1000), rel=1e-6)


def test_honest_round_is_kept_untouched():
    v = judge_norms([1.0, 1.2, 0.9, 1.5], NormBound())
    assert v.actions == (KEEP,) * 4 and v.factors == (1.0,) * 4
    assert v.reference == 1.0  # lower median of 0.9, 1.0, 1.2, 1.5


def test_large_update_is_clipped_gross_one_rejected_non_finite_rejected():
    v = judge_norms([1.0, 1.0, 50.0, 5e3, math.inf, 1.0, 1.0], NormBound(clip=10, reject=1000))
    assert v.actions == (KEEP, KEEP, CLIP, REJECT, REJECT, KEEP, KEEP)
    assert v.factors[2] == pytest.approx(10 / 50)
    assert v.rejected == [3, 4] and v.clipped == [2]
    assert "5e+03 x the round's median" in (v.reasons[3] or "")


def test_attacker_cannot_set_the_reference_by_arriving_first_or_by_majority_of_one():
    # Two of three honest: the lower median is honest whatever order the norms come in.
    for order in ([1e30, 1.0, 1.1], [1.0, 1e30, 1.1], [1.1, 1.0, 1e30]):
        v = judge_norms(order, NormBound())
        assert [order[i] for i in v.rejected] == [1e30]
    # Two updates: the smaller one is the reference.
    assert judge_norms([1e30, 2.0], NormBound()).rejected == [0]


def test_single_update_and_zero_reference_judge_nothing():
    assert judge_norms([1e30], NormBound()).actions == (KEEP,)
    v = judge_norms([0.0, 0.0, 5.0], NormBound())  # free riders' zeros: no scale to judge by
    assert v.actions == (KEEP,) * 3 and v.reference is None


def test_scales_judge_each_update_by_the_config_it_was_given():
    # The owner gave job 2 a learning rate 2000 x the run's: its 2000 x larger update is no fault
    # (clipped, as any large update, but not rejected).
    v = judge_norms([1.0, 1.1, 2000.0], NormBound(), scales=[1.0, 1.0, 2000.0])
    assert v.actions == (KEEP, KEEP, CLIP)
    assert judge_norms([1.0, 1.1, 2000.0], NormBound()).actions[2] == REJECT
    # The owner cannot frame job 2 by giving the others a tiny lr (their tiny updates are expected).
    v = judge_norms([1e-5, 1.1e-5, 1.0], NormBound(), scales=[1e-5, 1e-5, 1.0])
    assert REJECT not in v.actions
    # Nor shield an attacker: 3e38 per coordinate is gross as sent and as scaled.
    v = judge_norms([1.0, 1.1, 1e40], NormBound(), scales=[1.0, 1.0, 1e5])
    assert v.actions[2] == REJECT


def test_apply_verdict_drops_rejected_rows_and_scales_clipped_ones():
    U = torch.tensor([[1.0, 0.0], [0.0, 1.0], [30.0, 40.0], [1e30, 0.0]])  # (n, d) norms 1, 1, 50, 1e30
    v = judge_norms(update_norms(U), NormBound(clip=10, reject=1000))
    out, keep = apply_verdict(U, v)
    assert keep == [0, 1, 2]
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0], [0.0, 1.0], [6.0, 8.0]]))
    assert U[2, 0] == 30.0  # the input is left alone


@pytest.mark.parametrize(("clip", "reject"), [(0.5, 10), (10, 5), (math.inf, math.inf), (math.nan, 10)])
def test_bad_bounds_are_refused(clip, reject):
    with pytest.raises(ValueError, match="clip <= reject"):
        NormBound(clip=clip, reject=reject)


def test_scale_attack_multiplies_or_fills():
    own = torch.tensor([0.5, -1.0])  # (d,)
    view = AttackView(own=own, honest=torch.zeros(0, 2), previous=None, n=3, f=1, generator=torch.Generator())
    torch.testing.assert_close(build_attack("scale", {"factor": "1e3"}).craft(view), torch.tensor([500.0, -1000.0]))
    filled = build_attack("scale", {"value": "3e38"}).craft(view)
    assert filled.dtype == torch.float32 and torch.isfinite(filled).all() and (filled == 3e38).all()
