"""Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer 2017, "Machine Learning
with Adversaries: Byzantine Tolerant Gradient Descent") and Bulyan (El Mhamdi, Guerraoui,
Rouault 2018, "The Hidden Vulnerability of Distributed Learning in Byzantium").

- ``krum`` (``f``): needs ``n >= f + 3`` (so every update has ``n - f - 2 >= 1`` neighbours
  to score against). Score of update ``i`` = the sum of its squared L2 distances to its
  ``n - f - 2`` nearest other updates; returns (a copy of) the lowest-scoring update.
  Ignores weights.
- ``multi-krum`` (``f``, ``m``): needs ``n >= f + 3`` and ``1 <= m <= n - f`` (default
  ``m = n - f``); the weighted mean of the ``m`` lowest-scoring updates (scores computed
  once, as in the paper). Uses weights among the selected updates.
- ``bulyan`` (``f``): needs ``n >= 4f + 3``. Selects ``theta = n - 2f`` updates by Krum,
  removing each choice and re-scoring the rest; then per coordinate averages the
  ``beta = theta - 2f`` selected values closest to the coordinate's median. Ignores weights.

Distances come from one Gram matrix (``_distances``); Bulyan's repeated Krum re-scores
the same ``(n, n)`` distance matrix with the chosen updates masked out. Exact ties in
score go to the smaller sum over one more neighbour, then to the lower index (see
``krum_order``). When fewer than ``f + 3`` candidates remain in Bulyan's selection,
Krum's neighbour count is clamped to ``[1, r - 1]`` for ``r`` remaining (as Flower does).

Bulyan's second stage sorts the selected rows block-wise (``_sorting``). The median of an
even count is the mean of its two middle values. The ``beta`` values closest to the
median form a contiguous window of the sorted column, found without a Python loop over
coordinates: it starts at ``a = #{i < 2f : med - s_i > s_{i+beta} - med}`` (the window
slides right while its left value is farther from the median than the next right one;
on a tie the smaller value is kept).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from aitbc.core.aggregation._distances import sq_distances
from aitbc.core.aggregation._sorting import ColumnSorter, kept_shares, mean_of_rows
from aitbc.core.aggregation.base import NO_INFO, AggregationInfo, RuleConfig, check_f, register
from aitbc.errors import UsageError


def krum_order(dist: Tensor, alive: Tensor, f: int) -> Tensor:
    """``(n,)`` indices by Krum score among the ``alive`` updates, best first; removed
    updates last.

    ``dist`` ``(n, n)`` squared distances; the score of an alive update is the sum of its
    ``k = r - f - 2`` smallest distances to the other alive ones (``r`` alive; ``k`` clamped
    to ``[1, r - 1]``). Exact ties go to the smaller sum over ``k + 1`` neighbours, then to
    the lower index: with ``k = 1`` (always so in Bulyan's last rounds) two mutual nearest
    updates tie exactly, and this keeps the choice independent of the updates' order."""
    r = int(alive.sum())
    big = torch.finfo(torch.float64).max
    if r == 1:
        return (~alive).to(torch.int8).argsort(stable=True)
    k = max(1, min(r - f - 2, r - 1))
    masked = dist.masked_fill(~alive[None, :], float("inf"))  # (n, n) others only
    masked.fill_diagonal_(float("inf"))
    near = masked.sort(dim=1).values[:, : min(k + 1, r - 1)].cumsum(dim=1)  # (n, k or k+1)
    # An alive update whose score overflowed still ranks before removed ones.
    score = torch.where(alive, near[:, k - 1].nan_to_num(posinf=big), float("inf"))  # (n,)
    tie = torch.where(alive, near[:, -1].nan_to_num(posinf=big), float("inf"))  # (n,)
    by_tie = tie.argsort(stable=True)
    return by_tie[score[by_tie].argsort(stable=True)]  # lexicographic (score, tie, index)


def _one_hot(n: int, index: Tensor, like: Tensor) -> Tensor:
    return torch.zeros(n, dtype=torch.float64, device=like.device).index_fill_(0, index, 1.0)


@dataclass(kw_only=True, slots=True)
class KrumConfig(RuleConfig):
    f: int  # Byzantine updates to tolerate

    def __post_init__(self) -> None:
        check_f(self.f)

    def check_n(self, n: int) -> None:
        if n < self.f + 3:
            raise UsageError(
                f"krum needs n >= f+3 updates (so that n-f-2 >= 1); got n={n}, f={self.f} (needs {self.f + 3})"
            )


@register("krum", KrumConfig, uses_weights=False)
def krum(updates: Tensor, weights: Tensor, cfg: KrumConfig, *, with_info: bool) -> tuple[Tensor, AggregationInfo]:
    """the update closest to its n-f-2 nearest others (Blanchard et al. 2017)"""
    n = updates.shape[0]
    alive = torch.ones(n, dtype=torch.bool, device=updates.device)
    best = krum_order(sq_distances(updates), alive, cfg.f)[0]
    out = updates[best].clone()  # (d,) a copy: callers may update it in place
    if not with_info:
        return out, NO_INFO
    hot = _one_hot(n, best.view(1), updates)
    return out, AggregationInfo(selected=best.view(1), kept_fraction=hot, weight=hot)


@dataclass(kw_only=True, slots=True)
class MultiKrumConfig(RuleConfig):
    f: int
    m: int | None = None  # updates averaged; None: n - f

    def __post_init__(self) -> None:
        check_f(self.f)

    def chosen(self, n: int) -> int:
        return n - self.f if self.m is None else self.m

    def check_n(self, n: int) -> None:
        if n < self.f + 3:
            raise UsageError(
                f"multi-krum needs n >= f+3 updates (so that n-f-2 >= 1); got n={n}, f={self.f} (needs {self.f + 3})"
            )
        m = self.chosen(n)
        if not 1 <= m <= n - self.f:
            raise UsageError(f"multi-krum needs 1 <= m <= n-f; got m={m}, n={n}, f={self.f} (n-f={n - self.f})")


@register("multi-krum", MultiKrumConfig, uses_weights=True)
def multi_krum(
    updates: Tensor, weights: Tensor, cfg: MultiKrumConfig, *, with_info: bool
) -> tuple[Tensor, AggregationInfo]:
    """weighted mean of the m lowest Krum scores, m = n-f by default (Blanchard et al. 2017)"""
    n = updates.shape[0]
    alive = torch.ones(n, dtype=torch.bool, device=updates.device)
    chosen = krum_order(sq_distances(updates), alive, cfg.f)[: cfg.chosen(n)]  # (m,)
    w = torch.zeros(n, dtype=torch.float64, device=updates.device)
    w[chosen] = weights[chosen].to(torch.float64)
    if w.sum() <= 0:  # every chosen update has weight 0: average them unweighted
        w[chosen] = 1.0
    w /= w.sum()
    out = w.to(updates.dtype) @ updates  # (n,) @ (n, d) -> (d,), zero for the others
    if not with_info:
        return out, NO_INFO
    return out, AggregationInfo(selected=chosen.sort().values, kept_fraction=_one_hot(n, chosen, updates), weight=w)


@dataclass(kw_only=True, slots=True)
class BulyanConfig(RuleConfig):
    f: int

    def __post_init__(self) -> None:
        check_f(self.f)

    def check_n(self, n: int) -> None:
        if n < 4 * self.f + 3:
            raise UsageError(f"bulyan needs n >= 4f+3 updates; got n={n}, f={self.f} (needs {4 * self.f + 3})")


def bulyan_select(dist: Tensor, f: int) -> Tensor:
    """``(n - 2f,)`` indices chosen by repeated Krum, in the order chosen."""
    n = dist.shape[0]
    alive = torch.ones(n, dtype=torch.bool, device=dist.device)
    chosen = []
    for _ in range(n - 2 * f):  # a loop over updates (n), never over coordinates
        best = krum_order(dist, alive, f)[0]
        alive[best] = False
        chosen.append(best)
    return torch.stack(chosen)


@register("bulyan", BulyanConfig, uses_weights=False)
def bulyan(updates: Tensor, weights: Tensor, cfg: BulyanConfig, *, with_info: bool) -> tuple[Tensor, AggregationInfo]:
    """repeated Krum picks n-2f, then per coordinate the n-4f values nearest the median (El Mhamdi et al. 2018)"""
    n, d = updates.shape
    chosen = bulyan_select(sq_distances(updates), cfg.f)  # (theta,)
    out, kept = bulyan_window(updates, chosen, cfg.f, with_info=with_info)
    if not with_info:
        return out, NO_INFO
    beta = chosen.numel() - 2 * cfg.f
    kept_n = torch.zeros(n, dtype=torch.float64, device=updates.device).index_put_((chosen,), kept / d)
    return out, AggregationInfo(selected=chosen.sort().values, kept_fraction=kept_n, weight=kept_n / beta)


def bulyan_window(updates: Tensor, chosen: Tensor, f: int, *, with_info: bool) -> tuple[Tensor, Tensor]:
    """Bulyan's second stage: per coordinate, the mean of the ``beta = theta - 2f`` values
    of the ``chosen`` rows ``(theta,)`` nearest the coordinate's median. Returns the
    ``(d,)`` result and, with ``with_info``, each chosen row's kept coordinates
    ``(theta,)`` float64 (zeros without)."""
    d = updates.shape[1]
    theta = chosen.numel()
    beta = theta - 2 * f
    out = torch.empty(d, dtype=updates.dtype, device=updates.device)  # (d,)
    kept = torch.zeros(theta, dtype=torch.float64, device=updates.device)  # (theta,) kept coordinates
    sorter = ColumnSorter(updates, rows=chosen.tolist(), exact_blocks=with_info)

    def block(cols: slice) -> None:
        # (c,) row ops only: the sorter may run blocks on several threads
        s = sorter.sort(cols)  # theta sorted (c,) rows
        c = cols.stop - cols.start
        med = mean_of_rows(s[(theta - 1) // 2 : theta // 2 + 1], s[0].new_empty(c))  # (c,)
        left, right = s[0].new_empty(c), s[0].new_empty(c)
        start = torch.zeros(c, dtype=torch.int64, device=updates.device)  # (c,) window start in [0, 2f]
        for i in range(2 * f):
            # Differences, not sums: cannot overflow into a wrong answer with huge values.
            torch.sub(med, s[i], out=left)
            torch.sub(s[i + beta], med, out=right)
            start.add_(left > right)
        acc = out[cols].zero_()
        for p in range(theta):  # sorted position p is in the window iff start <= p < start + beta
            keep = (start <= p) if p < 2 * f else None
            if p >= beta:
                keep = (start > p - beta) if keep is None else keep & (start > p - beta)
            acc.add_(s[p] if keep is None else torch.where(keep, s[p], 0.0))
        acc.div_(beta)
        if with_info:
            shares = kept_shares(sorter.block(cols), torch.stack(s), start, start + beta)  # (theta, c)
            kept.add_(shares.sum(1, dtype=torch.float64))

    sorter.run(block)
    return out, kept
