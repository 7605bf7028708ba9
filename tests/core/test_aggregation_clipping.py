"""Centered clipping and the geometric median: hand-computed cases and direct references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from aitbc.core.aggregation import _sorting, aggregate, aggregate_with_info, clipping, parse_aggregator
from aitbc.errors import UsageError


def random_updates(seed: int, n: int, d: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def reference_medoid(x: torch.Tensor) -> torch.Tensor:
    """The update with the smallest summed squared distance to its floor((n-1)/2) nearest
    others (at least one), by brute force; ties (two mutual nearest updates) go to the
    smaller sum over one more neighbour, as Krum's."""
    n = x.shape[0]
    if n == 1:
        return x[0]
    k = max(1, (n - 1) // 2)
    d2 = torch.cdist(x, x).square()  # (n, n)
    d2.fill_diagonal_(float("inf"))
    near = d2.sort(dim=1).values
    score, tie = near[:, :k].sum(1).tolist(), near[:, : min(k + 1, n - 1)].sum(1).tolist()
    return x[min(range(n), key=lambda i: (score[i], tie[i], i))]  # ties: one more neighbour, then index


def reference_centered_clip(
    x: torch.Tensor, w: torch.Tensor, tau: float, iters: int, start: str = "medoid"
) -> torch.Tensor:
    """The paper's iteration on the vectors themselves, from the medoid or the coordinate-wise median."""
    v = reference_medoid(x) if start == "medoid" else torch.from_numpy(np.median(x.numpy(), axis=0))
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


@pytest.mark.parametrize("start", ["medoid", "median"])
def test_centered_clip_hand_computed_one_and_two_iterations(start):
    x = torch.tensor([[0.0], [1.0], [10.0]])
    # medoid (nearest neighbour 1 away, tie broken by the next: 1 + 81 < 1 + 100) and median: 1; differences -1, 0, 9 -> clipped at tau=2: -1, 0, 2 -> mean 1/3 -> 4/3
    # from 4/3: differences -4/3, -1/3, 26/3 -> -4/3, -1/3, 2 -> mean 1/9 -> 13/9
    assert_close(aggregate(f"centered-clip:tau=2,iters=1,start={start}", x), torch.tensor([4 / 3]))
    assert_close(aggregate(f"centered-clip:tau=2,iters=2,start={start}", x), torch.tensor([13 / 9]))


def test_centered_clip_uses_weights():
    x = torch.tensor([[0.0], [1.0], [10.0]])

    out = aggregate("centered-clip:tau=2,iters=1", x, torch.tensor([1.0, 1.0, 2.0]))

    # median 1; clipped -1, 0, 2 weighted 1/4, 1/4, 1/2 -> +0.75
    assert_close(out, torch.tensor([1.75]))


@pytest.mark.parametrize("path", ["medoid", "torch-sort", "network"])
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
    start = "medoid" if path == "medoid" else "median"
    knobs = {
        "medoid": {},
        "torch-sort": {"NETWORK_MAX_ROWS": 0, "BLOCK_ELEMENTS": 16},
        "network": {"NETWORK_MIN_ELEMENTS": 0, "NETWORK_COLUMNS": 5},
    }[path]

    with pytest.MonkeyPatch.context() as mp:
        for k, v in knobs.items():
            mp.setattr(_sorting, k, v)
        mp.setattr(clipping, "GRAM_BLOCK_ELEMENTS", 3 * n)  # several centered blocks
        out = aggregate("centered-clip", x, w, tau=tau, iters=iters, start=start)

    assert_close(out, reference_centered_clip(x, w, tau, iters, start))


@pytest.mark.parametrize("start", ["medoid", "median"])
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 10), d=st.integers(1, 12), iters=st.integers(1, 4))
def test_centered_clip_auto_radius_is_the_median_distance_from_the_start(start, seed, n, d, iters):
    x = random_updates(seed, n, d)
    w = torch.ones(n, dtype=torch.float64)
    v0 = reference_medoid(x) if start == "medoid" else torch.from_numpy(np.median(x.numpy(), axis=0))
    dist = (x - v0).norm(dim=1)
    if start == "medoid" and n > 1:  # the start itself is left out
        dist = dist[[i for i in range(n) if not torch.equal(x[i], v0)]]
    tau = float(dist.sort().values[(dist.numel() - 1) // 2])  # the lower median

    out = aggregate(f"centered-clip:start={start},iters={iters}", x)

    if tau > 0:
        assert_close(out, reference_centered_clip(x, w, tau, iters, start))
    else:
        assert_close(out, v0)


@pytest.mark.parametrize("scale", [1e-6, 1e-2, 1e3])
def test_centered_clip_auto_radius_follows_the_scale_of_the_updates(scale):
    x = random_updates(5, 9, 30)
    x[1] = -40 * x[1]  # an outlier at every scale

    assert_close(aggregate("centered-clip", scale * x), scale * aggregate("centered-clip", x))


def test_centered_clip_from_the_medoid_reports_the_convex_combination_it_returns():
    x = random_updates(3, 9, 40)
    x[2] *= 1e6  # a far outlier: clipped to a small step, never the start

    out, info = aggregate_with_info("centered-clip:tau=0.5,iters=4", x)

    assert info.weight is not None and info.kept_fraction is not None
    assert bool((info.weight >= 0).all())
    assert_close(info.weight.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert_close(info.weight @ x, out)
    assert float(info.weight[2]) < 1e-6  # at most iters * tau / ||x_2 - v|| of a 1/9 weight


def test_centered_clip_from_the_medoid_gives_an_overflowing_update_no_weight():
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(1))  # float32
    x[4] = 1e30  # finite, but its squared norm overflows float32

    out, info = aggregate_with_info("centered-clip", x)

    assert bool(torch.isfinite(out).all())
    assert info.weight is not None and float(info.weight[4]) == 0.0
    assert_close(out, aggregate("centered-clip", torch.cat([x[:4], x[5:]])), rtol=0, atol=2.0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tau": 0.0}, "centered-clip needs tau > 0 or tau=auto, got tau=0.0"),
        ({"tau": "big"}, "aggregator 'centered-clip' option tau='big' must be float or auto"),
        ({"iters": 0}, "centered-clip needs iters >= 1, got iters=0"),
        ({"start": "mean"}, "aggregator 'centered-clip' option start='mean' must be one of: medoid, median, previous"),
    ],
)
def test_centered_clip_rejects_bad_options(options, message):
    with pytest.raises(UsageError, match=message):
        aggregate("centered-clip", torch.zeros(3, 2), **options)


# --- centered clipping from the previous step (start=previous) -----------------------------------


def reference_from(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor, tau: float | None, iters: int) -> torch.Tensor:
    """The paper's iteration from the given start ``v``; ``tau`` None: the lower median of
    every update's distance from ``v``."""
    if tau is None:
        dist = (x - v).norm(dim=1)
        tau = float(dist.sort().values[(dist.numel() - 1) // 2])
    w = w / w.sum()
    for _ in range(iters):
        diff = x - v  # (n, d)
        norm = diff.norm(dim=1)
        scale = torch.where(norm > 0, (tau / norm).clamp(max=1.0), torch.ones_like(norm))
        v = v + (w[:, None] * diff * scale[:, None]).sum(0)
    return v


def from_previous(spec: str, x: torch.Tensor, reference: torch.Tensor | None, w: torch.Tensor | None = None):
    return parse_aggregator(spec).with_info(x, w, reference=reference)


def test_centered_clip_from_the_previous_step_hand_computed():
    x = torch.tensor([[0.0], [1.0], [10.0]])
    # from 2: differences -2, -1, 8 -> clipped at tau=2: -2, -1, 2 -> mean -1/3 -> 5/3
    # from 5/3: -5/3, -2/3, 25/3 -> -5/3, -2/3, 2 -> mean -1/9 -> 14/9
    out1, _ = from_previous("centered-clip:tau=2,iters=1,start=previous", x, torch.tensor([2.0]))
    out2, _ = from_previous("centered-clip:tau=2,iters=2,start=previous", x, torch.tensor([2.0]))
    assert_close(out1, torch.tensor([5 / 3]))
    assert_close(out2, torch.tensor([14 / 9]))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(1, 10),
    d=st.integers(1, 12),
    tau=st.one_of(st.none(), st.floats(0.05, 5.0)),
    iters=st.integers(1, 4),
    weighted=st.booleans(),
    shift=st.sampled_from([0.0, 1.0, 30.0]),
)
def test_centered_clip_from_the_previous_step_matches_the_direct_iteration(seed, n, d, tau, iters, weighted, shift):
    g = torch.Generator().manual_seed(seed)
    x = random_updates(seed, n, d) + shift * torch.randn(d, generator=g, dtype=torch.float64)  # a shared component
    ref = torch.randn(d, generator=g, dtype=torch.float64) + shift * 0.9 * x.mean(0) / max(shift, 1.0)
    w = torch.rand(n, generator=g, dtype=torch.float64) + 0.1 if weighted else torch.ones(n, dtype=torch.float64)
    spec = f"centered-clip:start=previous,iters={iters}" + ("" if tau is None else f",tau={tau}")

    out, info = from_previous(spec, x, ref, w)

    expected = reference_from(x, w, ref, tau, iters)
    assert_close(out, expected, atol=1e-9 * (1 + shift**2), rtol=1e-7)
    # each step moves the center by a weighted mean of differences clipped to tau: at most tau
    radius = tau if tau is not None else float((x - ref).norm(dim=1).sort().values[(n - 1) // 2])
    assert float((out - ref).norm()) <= iters * radius * (1 + 1e-9) + 1e-9
    assert info.weight is not None and info.kept_fraction is not None
    assert bool((info.weight >= 0).all())
    if float(info.weight.sum()) > 0:
        assert_close(info.weight.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_identical_updates_pull_less_from_the_previous_step_than_from_the_medoid():
    # nine spread honest updates around (1, 0) and three identical ones at -0.5 times the
    # honest centre (IPM): their zero-distance cluster makes the medoid start one of them;
    # from the previous step (here the honest centre itself) they are clipped like the rest
    g = torch.Generator().manual_seed(0)
    honest = torch.tensor([1.0, 0.0]) + 1.5 * torch.randn(9, 2, generator=g, dtype=torch.float64)
    centre = honest.mean(0)
    x = torch.cat([honest, (-0.5 * centre).expand(3, 2)])

    from_medoid, _ = from_previous("centered-clip", x, None)
    from_step, _ = from_previous("centered-clip:start=previous", x, centre)

    # progress along the honest direction: the mean 0.059, the medoid start 0.076, the step 0.082 (of 0.095)
    assert float(from_step @ centre) > float(from_medoid @ centre) > float(x.mean(0) @ centre)


@pytest.mark.parametrize(
    "reference",
    [None, torch.zeros(5), torch.full((5,), float("nan")), torch.full((5,), 3e38)],
    ids=["none", "zero", "nan", "overflowing-norm"],
)
def test_centered_clip_without_a_usable_previous_step_starts_from_the_medoid(reference):
    x = random_updates(7, 8, 5)
    spec = "centered-clip:start=previous"

    assert_close(parse_aggregator(spec)(x, reference=reference), aggregate("centered-clip", x))


def test_centered_clip_from_the_previous_step_gives_an_overflowing_update_no_weight():
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(1))  # float32
    x[4] = 1e30  # finite, but its squared norm (and its dot with the reference) overflows float32
    ref = x[[0, 1, 2, 3, 5, 6]].mean(0)

    out, info = from_previous("centered-clip:start=previous", x, ref)

    assert bool(torch.isfinite(out).all())
    assert info.weight is not None and float(info.weight[4]) == 0.0
    # it counts in no radius and pulls nothing: 3 steps of at most the others' median distance
    finite = torch.cat([x[:4], x[5:]])
    radius = float((finite - ref).norm(dim=1).sort().values[(6 - 1) // 2])
    assert float((out - ref).norm()) <= 3 * radius * (1 + 1e-5)


def test_only_start_previous_makes_the_pipeline_read_the_reference():
    assert parse_aggregator("centered-clip:start=previous").uses_reference
    assert parse_aggregator("nnm:f=1+centered-clip:start=previous").uses_reference
    assert not parse_aggregator("centered-clip").uses_reference
    assert not parse_aggregator("centered-clip:start=median").uses_reference
    with pytest.raises(UsageError, match=r"reference must have shape \(3,\) like one update, got \(2,\)"):
        parse_aggregator("centered-clip:start=previous")(torch.zeros(4, 3), reference=torch.zeros(2))


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
