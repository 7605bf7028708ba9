"""aggregate() entry point, check_updates, and the weighted mean over ``(n, d)`` updates."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from aitbc.core.aggregation import AGGREGATORS, aggregate, check_updates
from aitbc.errors import UsageError

NAN, INF = float("nan"), float("inf")


def test_mean_is_registered():
    assert "mean" in AGGREGATORS


def test_unweighted_mean_hand_computed():
    updates = torch.tensor([[1.0, 2.0], [3.0, 6.0]])

    out = aggregate("mean", updates)

    assert_close(out, torch.tensor([2.0, 4.0]))


def test_weighted_mean_hand_computed():
    updates = torch.tensor([[1.0, 2.0], [3.0, 6.0]])

    out = aggregate("mean", updates, torch.tensor([1.0, 3.0]))

    # (1*[1, 2] + 3*[3, 6]) / 4 = [10, 20] / 4
    assert_close(out, torch.tensor([2.5, 5.0]))


def test_weights_as_python_ints_and_scale_invariance():
    updates = torch.tensor([[0.0, 4.0], [2.0, 0.0], [4.0, 8.0]])

    a = aggregate("mean", updates, [1, 2, 1])
    b = aggregate("mean", updates, torch.tensor([10.0, 20.0, 10.0]))

    # ([0, 4] + 2*[2, 0] + [4, 8]) / 4 = [8, 12] / 4
    assert_close(a, torch.tensor([2.0, 3.0]))
    assert_close(b, a)


def test_zero_weight_excludes_an_update():
    updates = torch.tensor([[1.0, 1.0], [100.0, -100.0]])

    out = aggregate("mean", updates, torch.tensor([5.0, 0.0]))

    assert_close(out, torch.tensor([1.0, 1.0]))


def test_single_update_is_returned_with_shape_d():
    updates = torch.tensor([[1.5, -2.0, 0.25]])

    out = aggregate("mean", updates)

    assert out.shape == (3,)
    assert_close(out, updates[0])


def test_float64_is_kept():
    out = aggregate("mean", torch.ones(2, 3, dtype=torch.float64))

    assert out.dtype == torch.float64


def test_check_updates_defaults_to_unit_weights():
    w = check_updates(torch.zeros(3, 2), None)

    assert_close(w, torch.ones(3))


@pytest.mark.parametrize(
    ("rows", "bad"),
    [
        ([[0.0, 1.0], [NAN, 1.0], [0.0, 1.0]], [1]),
        ([[INF, 1.0], [0.0, 1.0], [0.0, -INF]], [0, 2]),
    ],
)
def test_non_finite_updates_are_rejected_with_their_row_index(rows, bad):
    with pytest.raises(UsageError) as exc:
        aggregate("mean", torch.tensor(rows))

    assert f"updates {bad} contain NaN or Inf" in str(exc.value)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([1.0, 2.0], "weights must have shape (3,), got (2,)"),
        ([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], "weights must have shape (3,), got (6,)"),
        ([1.0, -1.0, 1.0], "non-negative"),
        ([0.0, 0.0, 0.0], "not all zero"),
        ([1.0, NAN, 1.0], "finite"),
        ([1.0, INF, 1.0], "finite"),
    ],
)
def test_bad_weights(weights, message):
    with pytest.raises(UsageError) as exc:
        aggregate("mean", torch.zeros(3, 2), torch.tensor(weights))

    assert message in str(exc.value)


@pytest.mark.parametrize("updates", [torch.zeros(4), torch.zeros(0, 3), torch.zeros(2, 2, 2)])
def test_updates_must_be_non_empty_2d(updates):
    with pytest.raises(UsageError, match=r"non-empty \(n, d\) tensor"):
        aggregate("mean", updates)


def test_unknown_aggregator_lists_names():
    with pytest.raises(UsageError) as exc:
        aggregate("mode", torch.zeros(2, 2))

    assert str(exc.value).startswith("unknown aggregator 'mode'; allowed: ")
    assert "mean" in str(exc.value)


def test_unknown_parameter_is_named():
    with pytest.raises(UsageError) as exc:
        aggregate("mean", torch.zeros(2, 2), f=1)

    assert str(exc.value) == "unknown aggregator 'mean' option 'f'; allowed: none"
