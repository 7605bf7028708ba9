"""Nearest-neighbour mixing (Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan 2023,
"Fixing by Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity"; needs
``n >= f + 1``) and bucketing (Karimireddy, He, Jaggi 2022, "Byzantine-Robust Learning on
Heterogeneous Datasets via Bucketing"; needs ``s >= 1``): pre-aggregation wrappers that
replace the ``n`` updates by ``k`` mixtures before any rule runs (``nnm+krum``,
``bucketing:s=2+median``). Each returns a ``(k, n)`` mixing matrix; the pipeline applies
it with one matrix product (one ``(k, d)`` tensor).

- ``nnm`` (``f``): replaces each update by the plain average of its
  ``n - f`` nearest updates (squared L2, from one Gram matrix), itself included even against
  exact duplicates; ties go to the lower index. Keeps ``n`` and the weights. Without an
  ``f`` of its own it takes the rule's ``f`` (see the package docstring).
- ``bucketing`` (``s``, ``seed``): shuffles the updates with a
  generator seeded by ``seed * 100003 + round_index``, cuts them into ``ceil(n/s)`` buckets
  of ``s`` (the last may be smaller) and passes each bucket's weighted mean on, with the
  bucket's total weight. Deterministic for a given seed and round; *not* invariant to the
  order of the updates for a fixed seed (the same positions share a bucket), only in
  distribution over seeds. Give each round its own ``round_index`` for fresh buckets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from aitbc.core.aggregation._distances import sq_distances
from aitbc.core.aggregation.base import Mixing, WrapperConfig, check_f, register_wrapper
from aitbc.errors import UsageError


@dataclass(kw_only=True, slots=True)
class NnmConfig(WrapperConfig):
    f: int

    def __post_init__(self) -> None:
        check_f(self.f)

    def check_n(self, n: int) -> None:
        if n < self.f + 1:
            raise UsageError(
                f"nnm needs n >= f+1 updates (n-f >= 1 neighbours); got n={n}, f={self.f} (needs {self.f + 1})"
            )


@register_wrapper("nnm", NnmConfig)
def nnm(updates: Tensor, weights: Tensor, cfg: NnmConfig, *, round_index: int) -> Mixing:
    """each update becomes the mean of its n-f nearest, itself included (Allouah et al. 2023)"""
    n = updates.shape[0]
    dist = sq_distances(updates)  # (n, n)
    dist.fill_diagonal_(-1.0)  # itself first
    nearest = dist.argsort(dim=1, stable=True)[:, : n - cfg.f]  # (n, n-f)
    mix = torch.zeros(n, n, dtype=torch.float64, device=updates.device)
    mix.scatter_(1, nearest, 1.0 / (n - cfg.f))
    return Mixing(matrix=mix, weights=weights, partition=False)


@dataclass(kw_only=True, slots=True)
class BucketingConfig(WrapperConfig):
    s: int = 2  # bucket size
    seed: int = 0

    def __post_init__(self) -> None:
        if self.s < 1:
            raise ValueError(f"bucketing needs s >= 1, got s={self.s}")

    def out_n(self, n: int) -> int:
        return math.ceil(n / self.s)


@register_wrapper("bucketing", BucketingConfig)
def bucketing(updates: Tensor, weights: Tensor, cfg: BucketingConfig, *, round_index: int) -> Mixing:
    """seeded shuffle into buckets of s, each bucket's mean goes on (Karimireddy et al. 2022)"""
    n = updates.shape[0]
    k = cfg.out_n(n)
    gen = torch.Generator().manual_seed(cfg.seed * 100_003 + round_index)
    order = torch.randperm(n, generator=gen).to(updates.device)  # (n,) position -> update
    bucket = torch.empty(n, dtype=torch.long, device=updates.device)
    bucket[order] = torch.arange(n, device=updates.device) // cfg.s  # (n,) update -> bucket
    member = torch.zeros(k, n, dtype=torch.float64, device=updates.device)
    member[bucket, torch.arange(n, device=updates.device)] = 1.0  # (k, n)
    weighted = member * weights.to(torch.float64)[None, :]  # (k, n)
    total = weighted.sum(1)  # (k,) bucket weights
    # A bucket whose members all have weight 0 still averages them (and carries weight 0).
    mix = torch.where(
        total[:, None] > 0, weighted / total.clamp_min(1e-300)[:, None], member / member.sum(1, keepdim=True)
    )
    return Mixing(matrix=mix, weights=total.to(weights.dtype), partition=True)
