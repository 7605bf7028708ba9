"""Krum, Multi-Krum and Bulyan: hand-computed cases, a loop-based reference, conditions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from aitbc.core.aggregation import aggregate, aggregate_with_info
from aitbc.errors import UsageError

# Five 2-D points; with f=1 each is scored on its n-f-2 = 2 nearest others (squared L2):
#   a=(0,0): b 1, c 4        -> 5      d=(3,3): c 10, b 13  -> 23
#   b=(1,0): a 1, c 5        -> 6      e=(10,10): d 98, c 164 -> 262
#   c=(0,2): a 4, b 5        -> 9
POINTS = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [10.0, 10.0]])


def random_updates(seed: int, n: int, d: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def reference_scores(x: torch.Tensor, alive: list[int], f: int, extra: int = 0) -> dict[int, float]:
    """Krum scores by loops, as in the paper (neighbour count clamped to [1, r-1]);
    ``extra`` more neighbours for the tie-break."""
    r = len(alive)
    k = max(1, min(r - f - 2, r - 1))
    out = {}
    for i in alive:
        dists = sorted(float(((x[i] - x[j]) ** 2).sum()) for j in alive if j != i)
        out[i] = sum(dists[: k + extra])
    return out


def reference_bulyan(x: torch.Tensor, f: int) -> torch.Tensor:
    alive, chosen = list(range(len(x))), []
    for _ in range(len(x) - 2 * f):
        scores, tie = reference_scores(x, alive, f), reference_scores(x, alive, f, extra=1)
        best = min(alive, key=lambda i: (scores[i], tie[i], i))
        chosen.append(best)
        alive.remove(best)
    sel = x[chosen]  # (theta, d)
    beta = len(chosen) - 2 * f
    out = torch.empty(x.shape[1], dtype=x.dtype)
    for j in range(x.shape[1]):  # the reference may loop over coordinates; the rule does not
        col = sel[:, j]
        med = col.median() if len(col) % 2 else col.sort().values[len(col) // 2 - 1 : len(col) // 2 + 1].mean()
        nearest = sorted(col.tolist(), key=lambda v: abs(v - float(med)))[:beta]
        out[j] = sum(nearest) / beta
    return out


# --- krum ----------------------------------------------------------------------------------------


def test_krum_hand_computed():
    out, info = aggregate_with_info("krum:f=1", POINTS)

    assert torch.equal(out, POINTS[0])
    assert info.selected.tolist() == [0]
    assert info.weight.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_krum_returns_a_copy():
    out = aggregate("krum", POINTS, f=1)
    out += 1

    assert POINTS[0].tolist() == [0.0, 0.0]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(3, 12), d=st.integers(1, 8), data=st.data())
def test_krum_returns_one_of_its_inputs_with_the_lowest_reference_score(seed, n, d, data):
    f = data.draw(st.integers(0, n - 3))
    x = random_updates(seed, n, d)
    scores = reference_scores(x, list(range(n)), f)

    out, info = aggregate_with_info("krum", x, f=f)

    (i,) = info.selected.tolist()
    assert torch.equal(out, x[i])
    assert scores[i] == pytest.approx(min(scores.values()), rel=1e-9)


def test_krum_ignores_weights():
    assert torch.equal(aggregate("krum:f=1", POINTS, [1, 1, 1, 1, 1000]), POINTS[0])


# --- multi-krum ----------------------------------------------------------------------------------


def test_multi_krum_hand_computed():
    out = aggregate("multi-krum:f=1,m=2", POINTS)  # a (5) and b (6)

    assert_close(out, torch.tensor([0.5, 0.0]))


def test_multi_krum_weights_the_chosen_updates():
    out = aggregate("multi-krum:f=1,m=2", POINTS, torch.tensor([1.0, 3.0, 1.0, 1.0, 1.0]))

    assert_close(out, torch.tensor([0.75, 0.0]))  # (1 * (0, 0) + 3 * (1, 0)) / 4


def test_multi_krum_default_m_is_n_minus_f():
    out, info = aggregate_with_info("multi-krum", POINTS, f=1)

    assert info.selected.tolist() == [0, 1, 2, 3]
    assert_close(out, POINTS[:4].mean(0))


# --- bulyan --------------------------------------------------------------------------------------


def test_bulyan_hand_computed():
    # n=7, f=1: theta = 5 chosen by repeated Krum, beta = 3 closest to the median.
    # Krum rounds, k = r-f-2 clamped to [1, r-1]; an exact tie goes to the smaller sum
    # over k+1 neighbours, then to the lower index:
    #   r=7, k=4: 2 and 3 score 1+1+4+4 = 10; over 5: 19 and 19 -> index 2
    #   r=6, k=3: 3 scores 1+4+4 = 9 (lowest) -> 3
    #   r=5, k=2: 1 and 4 score 10; over 3: 26 and 26 -> index 1
    #   r=4, k=1: 4 and 5 score 1; over 2: 17 and 26 -> 4
    #   r=3, k=1: 0 and 5 score 25; over 2: 10025 and 9050 -> 5
    # Chosen values {1, 2, 3, 4, 5}; median 3; the 3 closest to it are 2, 3, 4 -> 3.
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0], [100.0]])

    out, info = aggregate_with_info("bulyan:f=1", x)

    assert_close(out, torch.tensor([3.0]))
    assert info.selected.tolist() == [1, 2, 3, 4, 5]
    assert_close(info.kept_fraction, torch.tensor([0, 0, 1, 1, 1, 0, 0], dtype=torch.float64))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), f=st.integers(0, 2), extra=st.integers(0, 4), d=st.integers(1, 6))
def test_bulyan_matches_the_loop_reference(seed, f, extra, d):
    x = random_updates(seed, 4 * f + 3 + extra, d)

    out, info = aggregate_with_info("bulyan", x, f=f)

    assert_close(out, reference_bulyan(x, f))
    assert len(info.selected) == len(x) - 2 * f
    assert_close(info.kept_fraction.sum(), torch.tensor(float(len(x) - 4 * f), dtype=torch.float64))


def test_bulyan_with_f_zero_is_the_mean():
    x = random_updates(0, 5, 7)

    assert_close(aggregate("bulyan:f=0", x), x.mean(0))


# --- conditions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "n", "message"),
    [
        ("krum:f=2", 4, "krum needs n >= f+3 updates (so that n-f-2 >= 1); got n=4, f=2 (needs 5)"),
        ("multi-krum:f=2", 4, "multi-krum needs n >= f+3 updates (so that n-f-2 >= 1); got n=4, f=2 (needs 5)"),
        ("multi-krum:f=2,m=9", 10, "multi-krum needs 1 <= m <= n-f; got m=9, n=10, f=2 (n-f=8)"),
        ("multi-krum:f=2,m=0", 10, "multi-krum needs 1 <= m <= n-f; got m=0, n=10, f=2 (n-f=8)"),
        ("bulyan:f=2", 10, "bulyan needs n >= 4f+3 updates; got n=10, f=2 (needs 11)"),
    ],
)
def test_conditions_on_n_are_named_with_the_numbers(spec, n, message):
    with pytest.raises(UsageError) as exc:
        aggregate(spec, torch.zeros(n, 3))

    assert str(exc.value) == message


@pytest.mark.parametrize("name", ["krum", "multi-krum", "bulyan"])
def test_f_is_required_and_non_negative(name):
    with pytest.raises(UsageError, match=rf"aggregator '{name}' needs option f; e.g. '{name}:f=1'"):
        aggregate(name, torch.zeros(12, 2))
    with pytest.raises(UsageError, match="f \\(the number of Byzantine updates\\) must be >= 0, got f=-1"):
        aggregate(name, torch.zeros(12, 2), f=-1)
