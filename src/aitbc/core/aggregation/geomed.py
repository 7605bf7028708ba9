"""Geometric median by smoothed Weiszfeld iterations (RFA: Pillutla, Kakade, Harchaoui
2022, "Robust Aggregation for Federated Learning"). Needs ``n >= 1``, ``eps > 0``,
``max_iters >= 1``, ``nu > 0``; breakdown point 1/2 (robust while the Byzantine updates
carry less than half the weight). Uses weights (the ``alpha`` of RFA).

Minimizes ``sum_i w_i ||v - x_i||`` by ``v <- sum_i b_i x_i / sum_i b_i`` with
``b_i = w_i / max(nu, ||v - x_i||)`` and stops, as RFA does, when the objective improves
by less than ``eps`` times its value, or after ``max_iters``. The objective is flat at its
minimum, so that tolerance leaves ``v`` within about ``sqrt(eps)`` (relative to the
updates' spread) of the geometric median.

Vectorised: ``v`` is always a combination ``a @ U`` of the updates, so each distance
``||x_i - v||^2 = G_ii - 2 (G a)_i + a^T G a`` comes from the Gram matrix ``G = U U^T``
(one pass over the updates); the iterations touch only ``(n,)`` and ``(n, n)`` tensors,
and the result is one more pass, ``a @ U``. See ``_distances`` for the float32 error of
the Gram distances (relative ``~1e-6 (common norm / spread)^2``).

Start: RFA starts from the mean, which a single huge update drags arbitrarily far; the
relative-objective stop can then fire while ``v`` is still far from the honest updates.
We start from the mean of the half of the updates with the smallest summed distance to
the others (a cheap robust point from the same Gram matrix), so every iterate gives a huge
update a coefficient of about ``1 / ||x||``. The fixed point is the same geometric median.

Info: ``weight`` is the final ``a`` (exact), ``kept_fraction`` is 1 where ``a > 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from aitbc.core.aggregation._distances import gram
from aitbc.core.aggregation.base import NO_INFO, AggregationInfo, RuleConfig, register


@dataclass(kw_only=True, slots=True)
class GeometricMedianConfig(RuleConfig):
    eps: float = 1e-6  # stop when the objective improves by less than eps * objective
    max_iters: int = 100
    nu: float = 1e-6  # smoothing: a distance below nu counts as nu

    def __post_init__(self) -> None:
        for name in ("eps", "nu"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"geometric-median needs {name} > 0, got {name}={value}")
        if self.max_iters < 1:
            raise ValueError(f"geometric-median needs max_iters >= 1, got max_iters={self.max_iters}")


def _distances_to(g: Tensor, a: Tensor) -> Tensor:
    """``(n,)`` distances from every update to ``a @ U``, from the Gram matrix ``g``."""
    ga = g @ a  # (n,)
    return (g.diagonal() - 2.0 * ga + a @ ga).clamp_min(0.0).sqrt()


@register("geometric-median", GeometricMedianConfig, uses_weights=True)
def geometric_median(
    updates: Tensor, weights: Tensor, cfg: GeometricMedianConfig, *, with_info: bool
) -> tuple[Tensor, AggregationInfo]:
    """geometric median by smoothed Weiszfeld (RFA, Pillutla et al. 2022)"""
    a = coefficients(*gram(updates), weights, cfg)  # (n,)
    out = a.to(updates.dtype) @ updates  # (n,) @ (n, d) -> (d,)
    if not with_info:
        return out, NO_INFO
    return out, AggregationInfo(kept_fraction=(a > 0).to(torch.float64), weight=a)


def coefficients(g: Tensor, far: Tensor, weights: Tensor, cfg: GeometricMedianConfig) -> Tensor:
    """The result's ``(n,)`` float64 coefficients ``a`` (the median is ``a @ U``) from the
    Gram matrix ``g`` ``(n, n)`` and its overflow mask ``far`` (``_distances.gram``)."""
    # overflowing updates are infinitely far: weight 0
    w = (weights / weights.sum()).to(torch.float64).masked_fill(far, 0.0)  # (n,)
    if w.sum() <= 0:  # every weighted update overflows: nothing finite to aggregate
        w = (~far).to(torch.float64)
    w = w / w.sum()
    sq = g.diagonal()
    pair = (sq[:, None] + sq[None, :] - 2.0 * g).clamp_min(0.0).sqrt()  # (n, n)
    live = w > 0
    total = (pair * live[None, :]).sum(1).masked_fill(~live, float("inf"))  # (n,) summed distance
    half = total.argsort(stable=True)[: (int(live.sum()) + 1) // 2]
    a = torch.zeros_like(w).index_fill_(0, half, 1.0 / len(half))  # (n,) start
    objective = float((w * _distances_to(g, a)).sum())
    for _ in range(cfg.max_iters):
        b = w / _distances_to(g, a).clamp_min(cfg.nu)  # (n,)
        a = b / b.sum()
        previous, objective = objective, float((w * _distances_to(g, a)).sum())
        if abs(previous - objective) <= cfg.eps * objective:
            break
    return a
