"""Centered clipping and the geometric median: hand-computed cases and direct references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from aitbc.core.aggregation import _sorting, aggregate, aggregate_with_info, clipping
from aitbc.errors import UsageError


def random_updates(seed: int, n: int, d: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def reference_centered_clip(x: torch.Tensor, w: torch.Tensor, tau: float, iters: int) -> torch.Tensor:
    """The paper's iteration on the vectors themselves, from the coordinate-wise median."""
    v = torch.from_numpy(np.median(x.numpy(), axis=0))
    w = w / w.sum()
    for _ in range(iters):
        diff = x - v  # (n, d)
        norm = diff.norm(dim=1)
        scale = torch.where(norm > 0, (tau / norm).clamp(max=1.0), torch.ones_like(norm))
        v = v + (w[:, None] * diff * scale[:, None]).sum(0)
    return v


def reference_geometric_median(x: torch.Tensor, w: torch.Tensor, iters: int = 500) -> torch.Tensor:
    """Plain Weiszfeld from the weighted mean."""
    v = (w / w.sum()) @ x
    for _ in range(iters):
        dist = (x - v).norm(dim=1).clamp_min(1e-12)
        b = w / dist
        v_next = (b / b.sum()) @ x
        if float((v_next - v).norm()) < 1e-13:
            return v_next
        v = v_next
    return v


def objective(v: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    return float((w * (x - v).norm(dim=1)).sum())


# --- centered clipping ---------------------------------------------------------------------------


def test_centered_clip_hand_computed_one_and_two_iterations():
    x = torch.tensor([[0.0], [1.0], [10.0]])
    # median 1; differences -1, 0, 9 -> clipped at tau=2: -1, 0, 2 -> mean 1/3 -> 4/3
    # from 4/3: differences -4/3, -1/3, 26/3 -> -4/3, -1/3, 2 -> mean 1/9 -> 13/9
    assert_close(aggregate("centered-clip:tau=2,iters=1", x), torch.tensor([4 / 3]))
    assert_close(aggregate("centered-clip:tau=2,iters=2", x), torch.tensor([13 / 9]))


def test_centered_clip_uses_weights():
    x = torch.tensor([[0.0], [1.0], [10.0]])

    out = aggregate("centered-clip:tau=2,iters=1", x, torch.tensor([1.0, 1.0, 2.0]))

    # median 1; clipped -1, 0, 2 weighted 1/4, 1/4, 1/2 -> +0.75
    assert_close(out, torch.tensor([1.75]))


@pytest.mark.parametrize("path", ["torch-sort", "network"])
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(1, 10),
    d=st.integers(1, 12),
    tau=st.floats(0.05, 5.0),
    iters=st.integers(1, 4),
    weighted=st.booleans(),
)
def test_centered_clip_matches_the_direct_iteration(path, seed, n, d, tau, iters, weighted):
    x = random_updates(seed, n, d)
    w = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.1
    w = w if weighted else torch.ones(n, dtype=torch.float64)
    knobs = (
        {"NETWORK_MAX_ROWS": 0, "BLOCK_ELEMENTS": 16}
        if path == "torch-sort"
        else {"NETWORK_MIN_ELEMENTS": 0, "NETWORK_COLUMNS": 5}
    )

    with pytest.MonkeyPatch.context() as mp:
        for k, v in knobs.items():
            mp.setattr(_sorting, k, v)
        mp.setattr(clipping, "GRAM_BLOCK_ELEMENTS", 3 * n)  # several centered blocks
        out = aggregate("centered-clip", x, w, tau=tau, iters=iters)

    assert_close(out, reference_centered_clip(x, w, tau, iters))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tau": 0.0}, "centered-clip needs tau > 0, got tau=0.0"),
        ({"iters": 0}, "centered-clip needs iters >= 1, got iters=0"),
    ],
)
def test_centered_clip_rejects_bad_options(options, message):
    with pytest.raises(UsageError, match=message):
        aggregate("centered-clip", torch.zeros(3, 2), **options)


# --- geometric median ----------------------------------------------------------------------------


def test_geometric_median_of_collinear_points_is_the_middle_one():
    x = torch.tensor([[0.0], [1.0], [10.0]], dtype=torch.float64)

    out = aggregate("geometric-median", x, eps=1e-12, max_iters=1000)

    assert_close(out, torch.tensor([1.0], dtype=torch.float64), atol=1e-5, rtol=0)


def test_geometric_median_of_an_equilateral_triangle_is_its_center():
    x = torch.tensor([[0.0, 0.0], [2.0, 0.0], [1.0, math.sqrt(3.0)]], dtype=torch.float64)

    out = aggregate("geometric-median", x, eps=1e-12, max_iters=1000)

    # The objective is flat at its minimum: a relative objective tolerance of 1e-12 leaves
    # the point within about sqrt(1e-12) = 1e-6 of it.
    assert_close(out, torch.tensor([1.0, 1.0 / math.sqrt(3.0)], dtype=torch.float64), atol=1e-5, rtol=0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(3, 10), d=st.integers(2, 8), weighted=st.booleans())
def test_geometric_median_matches_plain_weiszfeld(seed, n, d, weighted):
    x = random_updates(seed, n, d)
    w = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.1
    w = w if weighted else torch.ones(n, dtype=torch.float64)

    out, info = aggregate_with_info("geometric-median", x, w, eps=1e-12, max_iters=2000, nu=1e-12)

    # At least as good a minimizer as plain Weiszfeld. (Not compared by position: where the
    # objective is flat, e.g. a minimum at one of the updates, both stop at different points
    # of nearly equal objective.)
    assert objective(out, x, w) <= objective(reference_geometric_median(x, w), x, w) * (1 + 1e-7)
    assert_close(info.weight @ x, out)  # the result is exactly this combination
    assert_close(info.weight.sum(), torch.tensor(1.0, dtype=torch.float64))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"eps": 0.0}, "geometric-median needs eps > 0, got eps=0.0"),
        ({"nu": -1.0}, "geometric-median needs nu > 0, got nu=-1.0"),
        ({"max_iters": 0}, "geometric-median needs max_iters >= 1, got max_iters=0"),
    ],
)
def test_geometric_median_rejects_bad_options(options, message):
    with pytest.raises(UsageError, match=message):
        aggregate("geometric-median", torch.zeros(3, 2), **options)


def test_an_update_whose_squared_norm_overflows_is_infinitely_far():
    # 1e30 is a finite float32, but its squared norm is not: it must not turn into NaN.
    x = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.5, 0.5], [1e30, -1e30]])

    for spec in ("krum:f=1", "multi-krum:f=1", "bulyan:f=0", "geometric-median", "centered-clip", "nnm:f=1+median"):
        out = aggregate(spec, x if spec != "bulyan:f=0" else x[:4])
        assert bool(torch.isfinite(out).all()), spec
        assert float(out.abs().max()) <= 1.0 + 1e-6, spec
