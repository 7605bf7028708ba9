"""shard_indices: IID and Dirichlet label-skewed splits of a dataset into ``k`` shards."""

from __future__ import annotations

import math

import pytest
import torch

from aitbc.errors import UsageError
from aitbc.training.sharding import shard_indices


@pytest.fixture(scope="module")
def digit_labels() -> torch.Tensor:
    from sklearn.datasets import load_digits

    return torch.from_numpy(load_digits().target).long()  # (1797,), 10 balanced classes


def assert_partition(shards: list[torch.Tensor], n: int) -> None:
    """Disjoint, covering 0..n-1, each non-empty, sorted and int64."""
    for s in shards:
        assert s.dtype == torch.int64 and s.numel() > 0
        assert torch.equal(s, s.sort().values)
    assert torch.equal(torch.cat(shards).sort().values, torch.arange(n))


def mean_label_entropy(shards: list[torch.Tensor], labels: torch.Tensor) -> float:
    """Mean over shards of the entropy (nats) of the shard's label histogram."""
    total = 0.0
    for s in shards:
        p = torch.bincount(labels[s], minlength=10).double() / s.numel()
        p = p[p > 0]
        total += float(-(p * p.log()).sum())
    return total / len(shards)


# --- IID -------------------------------------------------------------------------------------


def test_iid_hand_sized():
    shards = shard_indices(10, 3, seed=0)

    assert [len(s) for s in shards] == [4, 3, 3]
    assert_partition(shards, 10)


@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 7), (100, 7), (1797, 10)])
def test_iid_partition_with_near_equal_sizes(n, k):
    shards = shard_indices(n, k, seed=3)

    sizes = [len(s) for s in shards]
    assert len(shards) == k
    assert max(sizes) - min(sizes) <= 1
    assert_partition(shards, n)


def test_iid_is_deterministic_by_seed():
    a = shard_indices(50, 4, seed=7)
    b = shard_indices(50, 4, seed=7)
    c = shard_indices(50, 4, seed=8)

    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_ignores_labels_without_alpha():
    labels = torch.zeros(20, dtype=torch.long)

    a = shard_indices(20, 4, seed=1, labels=labels)
    b = shard_indices(20, 4, seed=1)

    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# --- Dirichlet label skew ----------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.1, 1.0, 100.0])
def test_dirichlet_partition(digit_labels, alpha):
    shards = shard_indices(len(digit_labels), 8, seed=0, labels=digit_labels, alpha=alpha)

    assert len(shards) == 8
    assert_partition(shards, len(digit_labels))


def test_dirichlet_is_deterministic_by_seed(digit_labels):
    n = len(digit_labels)
    a = shard_indices(n, 5, seed=4, labels=digit_labels, alpha=0.5)
    b = shard_indices(n, 5, seed=4, labels=digit_labels, alpha=0.5)
    c = shard_indices(n, 5, seed=5, labels=digit_labels, alpha=0.5)

    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_single_shard_gets_everything_with_alpha(digit_labels):
    (shard,) = shard_indices(len(digit_labels), 1, seed=0, labels=digit_labels, alpha=0.1)

    assert torch.equal(shard, torch.arange(len(digit_labels)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_smaller_alpha_means_more_label_skew(digit_labels, seed):
    n = len(digit_labels)
    skewed = shard_indices(n, 5, seed=seed, labels=digit_labels, alpha=0.1)
    mixed = shard_indices(n, 5, seed=seed, labels=digit_labels, alpha=100.0)

    h_skewed = mean_label_entropy(skewed, digit_labels)
    h_mixed = mean_label_entropy(mixed, digit_labels)

    # alpha=100: each shard close to uniform over 10 labels, entropy near log(10) = 2.30
    assert h_mixed > 0.95 * math.log(10)
    assert h_skewed < 0.7 * h_mixed


def test_dirichlet_gives_up_when_shards_stay_empty():
    labels = torch.zeros(3, dtype=torch.long)  # one class, 3 samples, 3 shards, tiny alpha

    with pytest.raises(UsageError, match="could not draw 3 non-empty label-skewed shards with alpha=0.0001"):
        shard_indices(3, 3, seed=0, labels=labels, alpha=1e-4)


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "k", "kwargs", "message"),
    [
        (10, 0, {}, "number of shards must be at least 1, got 0"),
        (10, -2, {}, "number of shards must be at least 1, got -2"),
        (3, 4, {}, "cannot split 3 samples into 4 non-empty shards"),
        (10, 2, {"alpha": 0.0, "labels": torch.zeros(10, dtype=torch.long)}, "--alpha must be > 0"),
        (10, 2, {"alpha": -1.0, "labels": torch.zeros(10, dtype=torch.long)}, "--alpha must be > 0"),
        (10, 2, {"alpha": float("nan"), "labels": torch.zeros(10, dtype=torch.long)}, "--alpha must be > 0"),
        (10, 2, {"alpha": 0.5}, "needs a labelled dataset"),
    ],
)
def test_bad_arguments(n, k, kwargs, message):
    with pytest.raises(UsageError) as exc:
        shard_indices(n, k, seed=0, **kwargs)

    assert message in str(exc.value)


def test_labels_must_match_n():
    labels = torch.arange(10) % 2

    with pytest.raises(UsageError):
        shard_indices(3, 2, seed=0, labels=labels, alpha=1.0)
