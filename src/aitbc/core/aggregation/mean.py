"""Weighted mean (FedAvg, McMahan et al. 2017). Not robust: one bad update moves it
arbitrarily far. Needs ``n >= 1``."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from aitbc.core.aggregation import register


@dataclass(kw_only=True, slots=True)
class MeanConfig:
    pass


@register("mean", MeanConfig)
def mean(updates: Tensor, weights: Tensor, cfg: MeanConfig) -> Tensor:
    w = weights / weights.sum()  # (n,)
    return w @ updates  # (n,) @ (n, d) -> (d,)
