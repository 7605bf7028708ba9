"""Coordinate-wise rules (median, trimmed-mean) and the block-wise sorting network under them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from aitbc.core.aggregation import _sorting, aggregate, aggregate_with_info
from aitbc.errors import UsageError


@pytest.fixture(params=["torch-sort", "network"])
def sort_path(request, monkeypatch):
    """Run a test through both sorting paths, each over many tiny blocks (so the block loop
    is exercised too): ``torch.sort`` per block, and the sorting network."""
    for k, v in PATHS[request.param].items():
        monkeypatch.setattr(_sorting, k, v)
    return request.param


PATHS = {
    "torch-sort": {"NETWORK_MAX_ROWS": 0, "BLOCK_ELEMENTS": 40},
    "network": {"NETWORK_MIN_ELEMENTS": 0, "NETWORK_COLUMNS": 7},
}


def random_updates(seed: int, n: int, d: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- the sorting network -------------------------------------------------------------------------


@pytest.mark.parametrize("m", [*range(1, 40), 64, 100, 128, 200, 256])
def test_network_sorts_every_column_with_ties(m):
    x = torch.randint(0, 5, (m, 50), generator=torch.Generator().manual_seed(m)).float()  # many ties
    expected = torch.sort(x, dim=0).values

    rows = list(x.clone().unbind(0))
    spare = torch.empty(50)
    for i, j in _sorting.sorting_network(m):
        lo, hi = rows[i], rows[j]
        torch.minimum(lo, hi, out=spare)
        torch.maximum(lo, hi, out=hi)
        rows[i], spare = spare, lo

    assert torch.equal(torch.stack(rows), expected)


@pytest.mark.parametrize("m", [2, 5, 16, 31, 32, 33])
def test_pruned_network_gives_the_requested_positions(monkeypatch, m):
    monkeypatch.setattr(_sorting, "NETWORK_MIN_ELEMENTS", 0)
    x = torch.randn(m, 64, generator=torch.Generator().manual_seed(m))
    positions = ((m - 1) // 2, m // 2)
    sorter = _sorting.ColumnSorter(x, positions=positions)

    out = torch.stack(sorter.sort(slice(0, 64)))

    assert sorter.network
    assert torch.equal(out, torch.sort(x, dim=0).values[list(positions)])
    assert torch.equal(x, torch.randn(m, 64, generator=torch.Generator().manual_seed(m)))  # input untouched
    assert len(_sorting.pruned_network(m, positions)) <= len(_sorting.sorting_network(m))


def test_kept_shares_split_tied_boundary_values():
    # One column [5, 5, 1, 5], keep sorted positions [1, 3) of [1, 5, 5, 5]:
    # the two kept slots hold the value 5, which three updates share: 2/3 each.
    x = torch.tensor([[5.0], [5.0], [1.0], [5.0]])
    s = torch.sort(x, dim=0).values

    shares = _sorting.kept_shares(x, s, torch.tensor(1), torch.tensor(3))

    assert_close(shares.flatten(), torch.tensor([2 / 3, 2 / 3, 0.0, 2 / 3]))


# --- median --------------------------------------------------------------------------------------


def test_median_odd_n_hand_computed(sort_path):
    updates = torch.tensor([[1.0, 10.0], [2.0, 30.0], [9.0, 20.0]])

    out = aggregate("median", updates)

    assert_close(out, torch.tensor([2.0, 20.0]))


def test_median_even_n_averages_the_two_middle_values(sort_path):
    updates = torch.tensor([[1.0], [10.0], [2.0], [4.0]])

    out = aggregate("median", updates)

    assert_close(out, torch.tensor([3.0]))  # (2 + 4) / 2


def test_median_ignores_weights():
    updates = torch.tensor([[1.0], [2.0], [9.0]])

    out = aggregate("median", updates, torch.tensor([1.0, 1.0, 100.0]))

    assert_close(out, torch.tensor([2.0]))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 9).map(lambda k: 2 * k - 1), d=st.integers(1, 30))
def test_median_of_odd_n_is_an_input_value_per_coordinate(seed, n, d):
    updates = random_updates(seed, n, d)

    out = aggregate("median", updates)

    assert bool((updates == out).any(dim=0).all())
    assert torch.equal(out, torch.from_numpy(np.median(updates.numpy(), axis=0)))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 12), d=st.integers(1, 40))
def test_median_matches_numpy_on_both_paths(seed, n, d):
    updates = random_updates(seed, n, d, torch.float32)
    expected = torch.from_numpy(np.median(updates.numpy(), axis=0))

    for knobs in PATHS.values():
        with pytest.MonkeyPatch.context() as mp:
            for k, v in knobs.items():
                mp.setattr(_sorting, k, v)
            out = aggregate("median", updates)
        assert_close(out, expected, rtol=1e-6, atol=1e-6)


# --- trimmed mean --------------------------------------------------------------------------------


def test_trimmed_mean_hand_computed(sort_path):
    updates = torch.tensor([[1.0, -50.0], [2.0, 0.0], [4.0, 1.0], [100.0, 2.0]])

    out = aggregate("trimmed-mean:beta=0.25", updates)

    # floor(0.25 * 4) = 1 dropped at each end: mean(2, 4) = 3 and mean(0, 1) = 0.5
    assert_close(out, torch.tensor([3.0, 0.5]))


def test_trimmed_mean_floor_is_tolerant_of_float_rounding():
    updates = torch.arange(100.0)[:, None]  # one coordinate 0..99

    out = aggregate("trimmed-mean", updates, beta=0.29)  # 0.29 * 100 = 28.999999999999996

    assert_close(out, torch.tensor([49.5]))
    assert aggregate_with_info("trimmed-mean", updates, beta=0.29)[1].kept_fraction.sum() == 42


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 12), d=st.integers(1, 30))
def test_trimmed_mean_with_beta_zero_is_the_unweighted_mean(seed, n, d):
    updates = random_updates(seed, n, d)

    out = aggregate("trimmed-mean", updates, beta=0.0)

    assert_close(out, aggregate("mean", updates))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 12), d=st.integers(1, 30), beta=st.floats(0.0, 0.49))
def test_trimmed_mean_matches_a_sorted_reference(seed, n, d, beta):
    updates = random_updates(seed, n, d)
    k = int(np.floor(beta * n + 1e-9))
    expected = torch.sort(updates, dim=0).values[k : n - k].mean(0)

    out = aggregate("trimmed-mean", updates, beta=beta)

    assert_close(out, expected)


@pytest.mark.parametrize("beta", [0.5, -0.1, 0.7, float("nan")])
def test_trimmed_mean_rejects_beta_outside_0_to_half(beta):
    with pytest.raises(UsageError) as exc:
        aggregate("trimmed-mean", torch.zeros(4, 2), beta=beta)

    assert f"trimmed-mean needs 0 <= beta < 0.5, got beta={beta}" in str(exc.value)


# --- info ----------------------------------------------------------------------------------------


def test_trimmed_mean_info_hand_computed(sort_path):
    updates = torch.tensor([[1.0, 9.0], [2.0, 0.0], [4.0, 1.0], [100.0, 2.0]])

    _, info = aggregate_with_info("trimmed-mean:beta=0.25", updates)

    # coordinate 0 keeps rows 1, 2; coordinate 1 keeps rows 2, 3
    assert_close(info.kept_fraction, torch.tensor([0.0, 0.5, 1.0, 0.5], dtype=torch.float64))
    assert_close(info.weight, torch.tensor([0.0, 0.25, 0.5, 0.25], dtype=torch.float64))
    assert info.selected is None


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 10), d=st.integers(1, 20), ties=st.booleans())
def test_coordinate_info_counts_every_kept_slot(seed, n, d, ties):
    updates = random_updates(seed, n, d)
    if ties:
        updates = updates.round()
    k = n // 4

    for spec, kept_per_coordinate in (("median", 2 - n % 2), (f"trimmed-mean:beta={k / n + 1e-6}", n - 2 * k)):
        out, info = aggregate_with_info(spec, updates)
        assert_close(out, aggregate(spec, updates))
        assert_close(info.kept_fraction.sum(), torch.tensor(float(kept_per_coordinate), dtype=torch.float64))
        assert_close(info.weight.sum(), torch.tensor(1.0, dtype=torch.float64))
        assert bool(((info.kept_fraction >= 0) & (info.kept_fraction <= 1 + 1e-12)).all())
