"""Weighted mean (FedAvg, McMahan et al. 2017, "Communication-Efficient Learning of Deep
Networks from Decentralized Data"). Needs ``n >= 1``. Not robust: one bad update moves
it arbitrarily far. Uses ``weights``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from aitbc.core.aggregation.base import NO_INFO, AggregationInfo, RuleConfig, register


@dataclass(kw_only=True, slots=True)
class MeanConfig(RuleConfig):
    pass


@register("mean", MeanConfig, uses_weights=True)
def mean(updates: Tensor, weights: Tensor, cfg: MeanConfig, *, with_info: bool) -> tuple[Tensor, AggregationInfo]:
    """weighted mean (FedAvg); not robust"""
    w = weights / weights.sum()  # (n,)
    out = w @ updates  # (n,) @ (n, d) -> (d,)
    if not with_info:
        return out, NO_INFO
    w = w.to(torch.float64)
    return out, AggregationInfo(kept_fraction=(w > 0).to(w.dtype), weight=w)
