"""Spec strings, option flow, the wrappers (nnm, bucketing), and info through wrappers."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from aitbc.core.aggregation import (
    AGGREGATORS,
    WRAPPERS,
    aggregate,
    aggregate_with_info,
    describe_aggregators,
    parse_aggregator,
)
from aitbc.errors import UsageError

LINE = torch.tensor([[0.0], [1.0], [2.0], [10.0]])  # four 1-D updates


# --- parsing and option flow ---------------------------------------------------------------------


def test_every_rule_and_wrapper_is_registered():
    assert AGGREGATORS.names() == [
        "bulyan",
        "centered-clip",
        "geometric-median",
        "krum",
        "mean",
        "median",
        "multi-krum",
        "sparse-robust",
        "trimmed-mean",
    ]
    assert WRAPPERS.names() == ["bucketing", "nnm", "trend"]


@pytest.mark.parametrize(
    ("spec", "canonical"),
    [
        ("median", "median"),
        ("trimmed-mean:beta=0.25", "trimmed-mean:beta=0.25"),
        ("bucketing:s=2+krum:f=1", "bucketing:s=2,seed=0+krum:f=1"),
        ("nnm:f=1+centered-clip:tau=0.5", "nnm:f=1+centered-clip:tau=0.5,iters=3,start=medoid,norm=None"),
        (" bucketing:s=3 , seed=7 + nnm + multi-krum:f=2,m=3", "bucketing:s=3,seed=7+nnm:f=2+multi-krum:f=2,m=3"),
    ],
)
def test_composite_specs_parse_to_a_canonical_spec(spec, canonical):
    assert str(parse_aggregator(spec)) == canonical


@pytest.mark.parametrize(
    "spec",
    ["mean", "multi-krum:f=2", "geometric-median:eps=1e-8", "bucketing:s=3,seed=4+nnm:f=1+centered-clip:tau=0.1"],
)
def test_the_canonical_spec_parses_to_the_same_pipeline(spec):
    pipeline = parse_aggregator(spec)

    assert parse_aggregator(str(pipeline)) == pipeline


def test_params_go_to_the_final_rule():
    assert str(parse_aggregator("bucketing+krum", {"f": 2})) == "bucketing:s=2,seed=0+krum:f=2"


def test_nnm_takes_f_from_the_rule_the_params_or_default_f():
    assert str(parse_aggregator("nnm+krum:f=2")) == "nnm:f=2+krum:f=2"
    assert str(parse_aggregator("nnm:f=1+krum:f=2")) == "nnm:f=1+krum:f=2"
    assert (
        str(parse_aggregator("nnm+centered-clip", {"f": 2}))
        == "nnm:f=2+centered-clip:tau=auto,iters=3,start=medoid,norm=None"
    )
    assert str(parse_aggregator("nnm+median", default_f=3)) == "nnm:f=3+median"
    assert str(parse_aggregator("nnm+krum", default_f=3)) == "nnm:f=3+krum:f=3"


def test_default_f_is_ignored_by_rules_without_f_and_loses_to_explicit_f():
    assert str(parse_aggregator("median", default_f=3)) == "median"
    assert str(parse_aggregator("krum:f=1", default_f=3)) == "krum:f=1"


def test_aggregate_with_f_for_a_wrapper_only():
    out = aggregate("nnm+centered-clip", LINE, f=1)

    assert out.shape == (1,)


@pytest.mark.parametrize(
    ("spec", "params", "message"),
    [
        (
            "mode",
            {},
            "unknown aggregator 'mode'; allowed: bulyan, centered-clip, geometric-median, krum, mean, "
            "median, multi-krum, sparse-robust, trimmed-mean",
        ),
        ("fancy+median", {}, "unknown aggregator wrapper 'fancy'; allowed: bucketing, nnm, trend"),
        ("nnm", {}, "'nnm' is a pre-aggregation wrapper; end the spec with a rule, e.g. 'nnm+median'"),
        ("krum:f=1+median", {}, "'krum' is a rule; only wrappers (bucketing, nnm, trend) may come before '+'"),
        ("nnm++median", {}, "empty part in aggregator spec 'nnm++median'"),
        ("krum:f=1", {"f": 2}, "aggregator 'krum' option 'f' given twice: '1' in the spec and 2"),
        ("median", {"f": 1}, "unknown aggregator 'median' option 'f'; allowed: none"),
        ("nnm+median", {}, "aggregator wrapper 'nnm' needs option f; give 'nnm:f=K' or end with a rule"),
        ("bucketing:s=0+median", {}, "aggregator wrapper 'bucketing': bucketing needs s >= 1, got s=0"),
        ("median:beta=1", {}, "unknown aggregator 'median' option 'beta'; allowed: none"),
        ("krum:f=x", {}, "aggregator 'krum' option f='x' must be int"),
    ],
)
def test_bad_specs_are_one_clear_error(spec, params, message):
    with pytest.raises(UsageError) as exc:
        parse_aggregator(spec, params)

    assert message in str(exc.value)


def test_conditions_after_bucketing_name_the_bucket_count():
    pipeline = parse_aggregator("bucketing:s=2+krum:f=2")

    with pytest.raises(UsageError) as exc:
        pipeline.check(8)

    assert str(exc.value) == (
        "krum needs n >= f+3 updates (so that n-f-2 >= 1); got n=4, f=2 (needs 5) "
        "(n counts the 4 inputs that bucketing:s=2,seed=0 makes of 8 updates)"
    )
    pipeline.check(10)  # 5 buckets: enough


def test_nnm_condition():
    with pytest.raises(
        UsageError, match=r"nnm needs n >= f\+1 updates \(n-f >= 1 neighbours\); got n=2, f=2 \(needs 3\)"
    ):
        aggregate("nnm:f=2+mean", torch.zeros(2, 3))


def test_non_finite_updates_are_rejected_before_the_conditions():
    with pytest.raises(UsageError, match=r"updates \[0\] contain NaN or Inf"):
        aggregate("bulyan:f=5", torch.tensor([[float("nan")], [0.0]]))


def test_describe_lists_every_name_with_its_options_and_defaults():
    text = describe_aggregators()

    for name in [*AGGREGATORS, *WRAPPERS]:
        assert f"  {name}: " in text
    assert "krum: f: int (required); ignores weights." in text
    assert "trimmed-mean: beta: float = 0.1; ignores weights." in text
    assert "bucketing: s: int = 2, seed: int = 0." in text


# --- nnm -----------------------------------------------------------------------------------------


def test_nnm_hand_computed():
    # f=1: each update becomes the mean of its 3 nearest (itself included):
    # 0 -> {0, 1, 2} = 1;  1 -> {1, 0, 2} = 1;  2 -> {2, 1, 0} = 1;  10 -> {10, 2, 1} = 13/3
    out, info = aggregate_with_info("nnm:f=1+mean", LINE)

    assert_close(out, torch.tensor([(1 + 1 + 1 + 13 / 3) / 4]))
    # weight of update i = sum over mixed j of (1/4) * (1/3) * [i in N(j)]
    assert_close(info.weight, torch.tensor([3, 4, 4, 1], dtype=torch.float64) / 12)
    assert info.kept_fraction is None  # a mixture of neighbourhoods has no per-update kept share


def test_nnm_with_f_zero_makes_every_update_the_mean():
    out = aggregate("nnm:f=0+krum:f=0", LINE)

    assert_close(out, LINE.mean(0))


def test_nnm_selection_maps_back_to_the_neighbourhood():
    _, info = aggregate_with_info("nnm:f=2+krum:f=1", LINE)

    # every mixed update is the mean of 2 updates; Krum picks one mixture (of 0 and 1, or 1 and 2)
    assert len(info.selected) == 2
    assert 10.0 not in LINE[info.selected].flatten().tolist()


# --- bucketing -----------------------------------------------------------------------------------


def test_bucketing_with_one_bucket_is_the_weighted_mean():
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])

    out = aggregate("bucketing:s=4+median", LINE, w)

    assert_close(out, aggregate("mean", LINE, w))


def test_bucketing_with_size_one_keeps_every_update():
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(1))

    assert_close(aggregate("bucketing:s=1+median", x), aggregate("median", x))


def test_bucketing_pairs_updates_and_maps_info_back():
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [100.0]])

    out, info = aggregate_with_info("bucketing:s=2,seed=3+krum:f=0", x)

    # Krum picks one bucket: two original updates whose mean is the result.
    assert len(info.selected) == 2
    assert_close(out, x[info.selected].mean(0))
    assert_close(info.weight[info.selected], torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert info.kept_fraction.tolist() == [1.0 if i in info.selected.tolist() else 0.0 for i in range(6)]


def test_bucketing_is_deterministic_per_seed_and_round():
    x = torch.randn(9, 4, generator=torch.Generator().manual_seed(2))
    pipeline = parse_aggregator("bucketing:s=2+krum:f=1")

    a = pipeline.with_info(x, round_index=0)[1].selected
    b = pipeline.with_info(x, round_index=0)[1].selected
    rounds = {tuple(pipeline.with_info(x, round_index=r)[1].selected.tolist()) for r in range(10)}

    assert torch.equal(a, b)
    assert len(rounds) > 1  # each round draws its own buckets


def test_bucketing_keeps_a_zero_weight_bucket_with_weight_zero():
    w = torch.tensor([1.0, 0.0, 0.0, 1.0])  # with seed 0 and s=2: some bucket may be all zero

    out = aggregate("bucketing:s=2+mean", LINE, w)

    assert_close(out, aggregate("mean", LINE, w))  # a weighted mean of weighted means is the weighted mean


# --- the pipeline object -------------------------------------------------------------------------


def test_a_parsed_pipeline_is_reusable_and_reports_weight_use():
    pipeline = parse_aggregator("trimmed-mean:beta=0.25")
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(3))

    assert torch.equal(pipeline(x), aggregate("trimmed-mean", x, beta=0.25))
    assert not pipeline.uses_weights
    assert parse_aggregator("nnm:f=1+mean").uses_weights
