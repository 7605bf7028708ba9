"""Coordinate-wise median and trimmed mean (Yin, Chen, Ramchandran, Bartlett 2018,
"Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates").

- ``median``: needs ``n >= 1``; robust while fewer than half the updates are Byzantine
  (``n >= 2f + 1``). Even ``n`` averages the two middle values.
- ``trimmed-mean``: needs ``0 <= beta < 0.5``; drops ``k = floor(beta * n)`` values at each
  end of every coordinate and averages the other ``n - 2k``; robust while ``f <= k``.

Both ignore ``weights``: a weight is a count a worker reports, and a robust rule must not
let one update buy influence (use ``mean`` when weights are trusted).

Both sort each coordinate's ``n`` values block-wise with the sorting network of
``_sorting`` (no Python loop over coordinates, no ``(n, d)`` temporary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from aitbc.core.aggregation._sorting import ColumnSorter, kept_shares, mean_of_rows
from aitbc.core.aggregation.base import NO_INFO, AggregationInfo, RuleConfig, register


def sorted_window_mean(updates: Tensor, lo: int, hi: int, *, with_info: bool) -> tuple[Tensor, AggregationInfo]:
    """Per coordinate, the mean of the sorted values at positions ``[lo, hi)``.

    With ``with_info``, also each update's kept fraction and weight (shares tied values
    at the window's edges; see ``_sorting.kept_shares``)."""
    n, d = updates.shape
    out = torch.empty(d, dtype=updates.dtype, device=updates.device)  # (d,)
    if not with_info:
        sorter = ColumnSorter(updates, positions=range(lo, hi))
        sorter.run(lambda cols: mean_of_rows(sorter.sort(cols), out[cols]))
        return out, NO_INFO
    sorter = ColumnSorter(updates, exact_blocks=True)
    kept = torch.zeros(n, dtype=torch.float64, device=updates.device)  # (n,) kept coordinates

    def block(cols: slice) -> None:
        rows = sorter.sort(cols)  # n sorted (c,) rows
        mean_of_rows(rows[lo:hi], out[cols])
        shares = kept_shares(sorter.block(cols), torch.stack(rows), torch.tensor(lo), torch.tensor(hi))  # (n, c)
        kept.add_(shares.sum(1, dtype=torch.float64))

    sorter.run(block)
    return out, AggregationInfo(kept_fraction=kept / d, weight=kept / (d * (hi - lo)))


@dataclass(kw_only=True, slots=True)
class MedianConfig(RuleConfig):
    pass


@register("median", MedianConfig, uses_weights=False)
def median(updates: Tensor, weights: Tensor, cfg: MedianConfig, *, with_info: bool) -> tuple[Tensor, AggregationInfo]:
    """coordinate-wise median (Yin et al. 2018)"""
    n = updates.shape[0]
    return sorted_window_mean(updates, (n - 1) // 2, n // 2 + 1, with_info=with_info)


@dataclass(kw_only=True, slots=True)
class TrimmedMeanConfig(RuleConfig):
    beta: float = 0.1  # fraction trimmed at each end of every coordinate

    def __post_init__(self) -> None:
        if not 0.0 <= self.beta < 0.5:
            raise ValueError(f"trimmed-mean needs 0 <= beta < 0.5, got beta={self.beta}")

    def trimmed(self, n: int) -> int:
        """``floor(beta * n)``, with a tolerance so that ``0.29 * 100`` trims 29, not 28."""
        return math.floor(self.beta * n + 1e-9)


@register("trimmed-mean", TrimmedMeanConfig, uses_weights=False)
def trimmed_mean(
    updates: Tensor, weights: Tensor, cfg: TrimmedMeanConfig, *, with_info: bool
) -> tuple[Tensor, AggregationInfo]:
    """coordinate-wise trimmed mean, floor(beta*n) dropped at each end (Yin et al. 2018)"""
    n = updates.shape[0]
    k = cfg.trimmed(n)
    return sorted_window_mean(updates, k, n - k, with_info=with_info)
