"""``centered-clip:norm=C``: each update scaled down to at most C times the round's lower
median norm before centered clipping from the medoid, and the default rule that uses it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from aitbc import run_defaults
from aitbc.core.aggregation import aggregate, aggregate_with_info, parse_aggregator
from aitbc.errors import UsageError


def _updates(seed: int, n: int, d: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _norm_clipped(x: torch.Tensor, c: float) -> torch.Tensor:
    norms = x.norm(dim=1)
    bound = c * float(norms.sort().values[(norms.numel() - 1) // 2])  # the lower median
    return x * (bound / norms).clamp(max=1.0)[:, None] if bound > 0 else x


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(1, 10),
    d=st.integers(1, 12),
    c=st.sampled_from([1.0, 1.5, 3.0]),
    iters=st.integers(1, 3),
    tau=st.sampled_from(["auto", "0.7"]),
)
def test_norm_is_centered_clipping_of_the_norm_clipped_updates(seed, n, d, c, iters, tau):
    x = _updates(seed, n, d)
    x[: n // 3] *= 10.0  # a few long updates
    w = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.1

    out, info = aggregate_with_info(f"centered-clip:norm={c},iters={iters},tau={tau}", x, w)

    assert_close(out, aggregate(f"centered-clip:iters={iters},tau={tau}", _norm_clipped(x, c), w))
    assert info.weight is not None  # each update's share of the clipped updates' combination
    assert_close(info.weight.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_norm_leaves_updates_within_the_bound_as_they_are():
    x = _updates(2, 7, 9)
    assert_close(aggregate("centered-clip:norm=100", x), aggregate("centered-clip", x))


def test_norm_gives_an_overflowing_update_no_weight():
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(1))  # float32
    x[4] = 1e30  # finite, but its squared norm overflows float32

    out, info = aggregate_with_info("centered-clip:norm=1", x)

    assert bool(torch.isfinite(out).all())
    assert info.weight is not None and float(info.weight[4]) == 0.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"norm": 0.5}, "centered-clip needs norm >= 1 .*, got norm=0.5"),
        ({"norm": 1.5, "start": "previous"}, "centered-clip norm=... works with start=medoid only"),
        ({"norm": 1.5, "start": "median"}, "centered-clip norm=... works with start=medoid only"),
    ],
)
def test_norm_rejects_bad_options(options, message):
    with pytest.raises(UsageError, match=message):
        aggregate("centered-clip", torch.zeros(3, 2), **options)


def test_the_default_rule_is_not_led_by_long_updates_that_agree_when_honest_ones_cancel():
    # Label-skewed shards: nine honest updates share a small direction m under a large
    # spread, so they mostly cancel; three attackers send one long direction a (sign-flip
    # sends -4x its own update, which the norm bound lets through at 3x the median). The
    # first round has no trend to check them against.
    g = torch.Generator().manual_seed(0)
    d = 200
    m = torch.zeros(d, dtype=torch.float64)
    m[0] = 1.0
    honest = 0.3 * m + torch.randn(9, d, generator=g, dtype=torch.float64)  # norms ~14, their mean's 4.5
    a = torch.zeros(d, dtype=torch.float64)
    a[1] = 3.0 * float(honest.norm(dim=1).median())
    attackers = a + 0.1 * torch.randn(3, d, generator=g, dtype=torch.float64)
    updates = torch.cat([honest, attackers])  # (12, d)
    pipe = parse_aggregator(run_defaults.AGGREGATOR, default_f=3)

    out = pipe(updates, reference=None)

    old = parse_aggregator("trend+centered-clip", default_f=3)(updates)  # three steps of full updates
    # each attacker moves the result by at most its weight times the radius per step: the old
    # default went 6.2 along a (the mean 10.3); scaled to 1.5x the median norm and one step, 4.1
    assert float(out[1]) < 0.7 * float(old[1])
    assert float((out - honest.mean(0)).norm()) < 0.75 * float((old - honest.mean(0)).norm())
