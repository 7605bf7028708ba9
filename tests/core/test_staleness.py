"""Staleness rules: 1 for fresh updates, non-increasing in staleness, in (0, 1]."""

from __future__ import annotations

import pytest

from aitbc.core.staleness import build_staleness
from aitbc.errors import UsageError


@pytest.mark.parametrize("name", ["constant", "polynomial", "hinge"])
def test_fresh_updates_count_fully_and_older_ones_no_more(name):
    w = build_staleness(name)

    weights = [w(s) for s in range(20)]

    assert weights[0] == 1.0
    assert all(0 < b <= a <= 1 for a, b in zip(weights, weights[1:]))


def test_polynomial_and_hinge_values():
    assert build_staleness("polynomial", {"a": "1"})(3) == pytest.approx(0.25)
    hinge = build_staleness("hinge", {"a": "2", "b": "1"})
    assert (hinge(1), hinge(3)) == (1.0, pytest.approx(1 / 5))


def test_bad_rules_are_usage_errors():
    with pytest.raises(UsageError, match="unknown staleness rule 'linear'"):
        build_staleness("linear")
    with pytest.raises(UsageError, match="a must be >= 0"):
        build_staleness("polynomial", {"a": "-1"})
