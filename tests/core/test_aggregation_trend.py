"""The ``trend`` wrapper: drops at most ``f`` updates that do not point along the run's
last model step, then the rule runs on the rest."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from aitbc.core.aggregation import aggregate, parse_aggregator
from aitbc.errors import UsageError


def _updates(seed: int, n: int, d: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _brute_force(updates: torch.Tensor, reference: torch.Tensor, f: int, min_cos: float) -> list[int]:
    """The indices trend keeps, by its definition: the f lowest cosines (ties to the
    lower index), of which those <= min_cos go."""
    cos = [float(u @ reference / (u.norm() * reference.norm())) if float(u.norm()) > 0 else 0.0 for u in updates]
    lowest = sorted(range(len(cos)), key=lambda i: (cos[i], i))[: min(f, len(cos) - 1)]
    return [i for i in range(len(cos)) if not (i in lowest and not cos[i] > min_cos)]


def test_ipm_updates_at_the_honest_centre_are_dropped_and_the_rule_sees_the_honest_ones():
    # Heterogeneous honest updates around a common direction m; IPM sends -0.5 * their
    # mean, three times: the closest point to all of them, so the medoid start favours it.
    g = torch.Generator().manual_seed(0)
    m = torch.zeros(50, dtype=torch.float64)
    m[0] = 1.0
    honest = m + 1.5 * torch.randn(9, 50, generator=g, dtype=torch.float64)  # (9, 50) spread > signal
    ipm = (-0.5 * honest.mean(0)).expand(3, 50)
    updates = torch.cat([honest[:4], ipm, honest[4:]])  # (12, 50) attackers in the middle
    pipe = parse_aggregator("trend+centered-clip", default_f=3)

    out, info = pipe.with_info(updates, reference=m)

    assert_close(out, aggregate("centered-clip", honest))
    assert info.kept_fraction is not None and info.weight is not None
    assert info.kept_fraction[4:7].tolist() == [0.0, 0.0, 0.0]
    assert info.weight[4:7].tolist() == [0.0, 0.0, 0.0]
    assert float(info.kept_fraction.sum()) == pytest.approx(9.0, abs=1e-9)
    # without the trend the same rule lets them pull the result backwards
    stateless = aggregate("centered-clip", updates)
    assert float(stateless @ m) < float(out @ m)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(1, 10),
    d=st.integers(1, 6),
    f=st.integers(0, 12),
    min_cos=st.sampled_from([-0.5, 0.0, 0.3]),
)
def test_trend_keeps_exactly_what_its_definition_says(seed, n, d, f, min_cos):
    updates = _updates(seed, n, d)
    reference = _updates(seed + 1, 1, d)[0]
    keep = _brute_force(updates, reference, f, min_cos)
    pipe = parse_aggregator(f"trend:f={f},min_cos={min_cos}+mean")

    out, info = pipe.with_info(updates, reference=reference)

    assert_close(out, updates[keep].mean(0))
    assert info.kept_fraction is not None
    assert [i for i, k in enumerate(info.kept_fraction.tolist()) if k > 0] == keep
    assert n - len(keep) <= f and keep


def test_at_most_f_go_lowest_cosine_first_even_when_more_point_backwards():
    ref = torch.tensor([1.0, 0.0], dtype=torch.float64)
    updates = torch.tensor([[-1.0, 0.1], [-1.0, 0.0], [1.0, 0.0], [-1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)

    out = parse_aggregator("trend:f=2+mean")(updates, reference=ref)

    assert_close(out, updates[[2, 3, 4]].mean(0))  # rows 0 and 1 (cos -0.995, -1) go; row 3 (-0.45) stays


def test_zero_updates_have_no_direction_and_go_unless_min_cos_is_negative():
    ref = torch.tensor([1.0, 1.0], dtype=torch.float64)
    updates = torch.tensor([[1.0, 2.0], [0.0, 0.0], [2.0, 1.0], [0.0, 0.0]], dtype=torch.float64)

    dropped = parse_aggregator("trend:f=2+mean")(updates, reference=ref)
    kept = parse_aggregator("trend:f=2,min_cos=-0.1+mean")(updates, reference=ref)

    assert_close(dropped, torch.tensor([1.5, 1.5], dtype=torch.float64))
    assert_close(kept, updates.mean(0))


@pytest.mark.parametrize(
    "reference",
    [None, torch.zeros(3), torch.tensor([float("nan"), 1.0, 0.0]), torch.tensor([float("inf"), 1.0, 0.0])],
    ids=["none", "zero", "nan", "inf"],
)
def test_without_a_usable_reference_every_update_passes(reference):
    updates = -_updates(3, 6, 3).abs()
    pipe = parse_aggregator("trend:f=2+mean")

    out, info = pipe.with_info(updates.float(), reference=reference)

    assert_close(out, updates.float().mean(0))
    assert info.kept_fraction is not None and info.kept_fraction.tolist() == [1.0] * 6


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), scale=st.sampled_from([1e-8, 1e-3, 1.0, 1e4, 1e12]))
def test_only_the_direction_of_the_reference_counts(seed, scale):
    updates = _updates(seed, 8, 5)
    reference = _updates(seed + 7, 1, 5)[0]
    pipe = parse_aggregator("trend:f=3+centered-clip")

    assert_close(pipe(updates, reference=scale * reference), pipe(updates, reference=reference))


def test_weights_follow_the_kept_updates():
    ref = torch.tensor([1.0, 0.0], dtype=torch.float64)
    updates = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    weights = torch.tensor([1.0, 100.0, 3.0], dtype=torch.float64)

    out = parse_aggregator("trend:f=1+mean")(updates, weights, reference=ref)

    assert_close(out, torch.tensor([2.5, 0.0], dtype=torch.float64))  # (1*1 + 3*3) / 4


def test_f_comes_from_the_rule_or_the_run_and_the_rule_is_checked_for_n_minus_f():
    assert parse_aggregator("trend+krum:f=2").wrappers[0].config.f == 2
    assert parse_aggregator("trend+centered-clip", default_f=3).wrappers[0].config.f == 3
    assert parse_aggregator("trend+centered-clip", default_f=1).uses_reference
    assert not parse_aggregator("nnm:f=1+centered-clip").uses_reference
    # krum:f=2 needs f+3 = 5 inputs; trend may leave n - f = 7 - 2 = 5 of 7
    parse_aggregator("trend+krum:f=2").check(7)
    with pytest.raises(UsageError, match=r"krum needs n >= f\+3 .*the 4 inputs that trend:f=2,min_cos=0.0 makes of 6"):
        parse_aggregator("trend+krum:f=2").check(6)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("trend+mean", "aggregator wrapper 'trend' needs option f"),
        ("trend:f=-1+mean", "f .* must be >= 0"),
        ("trend:f=1,min_cos=1+mean", "trend needs -1 <= min_cos < 1, got min_cos=1"),
        ("trend:f=1,min_cos=-2+mean", "trend needs -1 <= min_cos < 1"),
        ("trend:f=1,min_cos=high+mean", "min_cos"),
        ("trend:f=1,beta=2+mean", "beta"),
    ],
)
def test_bad_trend_options_are_one_clear_line(spec, message):
    with pytest.raises(UsageError, match=message) as e:
        parse_aggregator(spec)
    assert "\n" not in str(e.value)


def test_the_last_update_always_passes():
    """A round left with fewer updates than f (others rejected): trend never drops the
    last one, so the rule aggregates what there is, as it would without the trend."""
    ref = torch.tensor([1.0, 0.0], dtype=torch.float64)
    one = torch.tensor([[-1.0, 0.5]], dtype=torch.float64)
    two = torch.tensor([[-1.0, 0.5], [-2.0, 0.0]], dtype=torch.float64)
    pipe = parse_aggregator("trend:f=3+centered-clip")

    assert_close(pipe(one, reference=ref), one[0])
    assert_close(pipe(two, reference=ref), two[0])  # the lower cosine (-1) goes, the other stays
    pipe.check(1)  # centered-clip is checked for max(1, n - f) inputs


def test_a_misshapen_reference_is_refused():
    with pytest.raises(UsageError, match=r"reference must have shape \(3,\) like one update, got \(4,\)"):
        parse_aggregator("trend:f=1+mean")(torch.ones(4, 3), reference=torch.ones(4))
