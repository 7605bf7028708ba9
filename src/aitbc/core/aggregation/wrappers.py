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
- ``trend`` (``f``, ``min_cos``): drops the updates that do not point along the run's
  trend, at most ``f`` of them; see :func:`trend`. The one stateful stage: it needs the
  ``reference`` the caller passes (the global model's last step) and passes every update
  on without one.

Wrappers take the round's ``round_index`` and ``reference`` (``(d,)`` or ``None``) as
keywords; a wrapper uses what it needs.
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
def nnm(updates: Tensor, weights: Tensor, cfg: NnmConfig, *, round_index: int, reference: Tensor | None) -> Mixing:
    """each update becomes the mean of its n-f nearest, itself included (Allouah et al. 2023)"""
    return nnm_mixing(sq_distances(updates), weights, cfg)


def nnm_mixing(dist: Tensor, weights: Tensor, cfg: NnmConfig) -> Mixing:
    """:func:`nnm`'s mixing from the squared distances ``dist`` ``(n, n)`` (``_distances``)."""
    n = dist.shape[0]
    dist = dist.clone()
    dist.fill_diagonal_(-1.0)  # itself first
    nearest = dist.argsort(dim=1, stable=True)[:, : n - cfg.f]  # (n, n-f)
    mix = torch.zeros(n, n, dtype=torch.float64, device=dist.device)
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
def bucketing(
    updates: Tensor, weights: Tensor, cfg: BucketingConfig, *, round_index: int, reference: Tensor | None
) -> Mixing:
    """seeded shuffle into buckets of s, each bucket's mean goes on (Karimireddy et al. 2022)"""
    return bucket_mixing(updates.shape[0], weights, cfg, round_index=round_index)


def bucket_mixing(n: int, weights: Tensor, cfg: BucketingConfig, *, round_index: int) -> Mixing:
    """:func:`bucketing`'s mixing of ``n`` updates: it reads only their count and weights."""
    k = cfg.out_n(n)
    gen = torch.Generator().manual_seed(cfg.seed * 100_003 + round_index)
    order = torch.randperm(n, generator=gen).to(weights.device)  # (n,) position -> update
    bucket = torch.empty(n, dtype=torch.long, device=weights.device)
    bucket[order] = torch.arange(n, device=weights.device) // cfg.s  # (n,) update -> bucket
    member = torch.zeros(k, n, dtype=torch.float64, device=weights.device)
    member[bucket, torch.arange(n, device=weights.device)] = 1.0  # (k, n)
    weighted = member * weights.to(torch.float64)[None, :]  # (k, n)
    total = weighted.sum(1)  # (k,) bucket weights
    # A bucket whose members all have weight 0 still averages them (and carries weight 0).
    mix = torch.where(
        total[:, None] > 0, weighted / total.clamp_min(1e-300)[:, None], member / member.sum(1, keepdim=True)
    )
    return Mixing(matrix=mix, weights=total.to(weights.dtype), partition=True)


@dataclass(kw_only=True, slots=True)
class TrendConfig(WrapperConfig):
    f: int  # the most updates it drops in a round (the run's Byzantine count)
    min_cos: float = 0.0  # an update passes when its cosine with the trend is above this

    def __post_init__(self) -> None:
        check_f(self.f)
        if not -1.0 <= self.min_cos < 1.0:
            raise ValueError(f"trend needs -1 <= min_cos < 1, got min_cos={self.min_cos}")

    def out_n(self, n: int) -> int:
        return max(1, n - self.f)  # the fewest it passes on: the rule's conditions are checked for that


@register_wrapper("trend", TrendConfig, uses_reference=True)
def trend(updates: Tensor, weights: Tensor, cfg: TrendConfig, *, round_index: int, reference: Tensor | None) -> Mixing:
    """drops up to f updates that point against the run's last model step (cosine <= min_cos)

    ``reference`` ``(d,)`` is the global model's last step, old minus new parameters (the
    sign of an update: ``global - local``): what the previous rounds' robust aggregates
    agreed on. Consecutive rounds' aggregates point the same way (cosine 0.9-0.99 on
    Dirichlet 0.3 digits, each honest update 0.25-0.6), while the attacks that survive
    distance-based rules on heterogeneous data point backwards: IPM's ``-eps * mean`` sits
    at the honest updates' centre, so the medoid, Krum and the median all favour it, but
    its cosine with the trend is about -1; a sign-flipped update's is negative; a zero
    (free-rider) update has no direction (cosine 0). Those with cosine ``<= min_cos`` are
    dropped, lowest first, at most ``f`` and never the last one (so in a clean round at most
    ``f`` honest updates that disagree go, and the rule after it still sees ``max(1, n - f)``:
    a round left with a single accepted update aggregates it, as the rule alone would); the rest pass with
    their weights. Put a robust rule after it (``trend+centered-clip``): the trend is only
    as good as the aggregates it came from, and an attacker that aligns with it is left
    for the rule. Without a reference (the first round, a round after a skipped one, a
    zero or non-finite step) every update passes. Costs one ``(n, d) @ (d,)`` product and
    the ``n`` norms, and a ``(k, d)`` copy of the kept rows only when it drops some.
    """
    dev = updates.device
    ref_norm = trend_reference_norm(reference, cfg)
    if ref_norm is None:
        return trend_mixing(None, None, 0.0, weights, cfg)
    assert reference is not None  # a norm came from it
    dots = (updates @ reference.to(device=dev, dtype=updates.dtype)).to(torch.float64)  # (n,)
    norms = updates.norm(dim=1).to(torch.float64)  # (n,)
    return trend_mixing(dots, norms, ref_norm, weights, cfg)


def trend_reference_norm(reference: Tensor | None, cfg: TrendConfig) -> float | None:
    """The reference's L2 norm when :func:`trend` compares with it; None when every update passes."""
    if reference is None or cfg.f <= 0:
        return None
    ref_norm = float(reference.to(torch.float64).norm())
    return ref_norm if math.isfinite(ref_norm) and ref_norm > 0 else None


def trend_mixing(
    dots: Tensor | None, norms: Tensor | None, ref_norm: float, weights: Tensor, cfg: TrendConfig
) -> Mixing:
    """:func:`trend`'s selection from each update's dot with the reference and its norm
    (``(n,)`` float64 each; None: no reference, every update passes)."""
    n = weights.shape[0]
    dev = weights.device
    keep = torch.ones(n, dtype=torch.bool, device=dev)
    if dots is not None and norms is not None:
        cos = torch.where(norms > 0, dots / (norms * ref_norm).clamp_min(1e-300), torch.zeros_like(dots))
        cos = cos.nan_to_num(nan=0.0, posinf=1.0, neginf=-1.0).clamp(-1.0, 1.0)  # (n,)
        for i in cos.argsort(stable=True)[: min(cfg.f, n - 1)].tolist():  # never the last one
            if not cos[i] > cfg.min_cos:
                keep[i] = False
    kept = keep.nonzero().flatten()  # (k,)
    mix = torch.zeros(kept.numel(), n, dtype=torch.float64, device=dev)
    mix[torch.arange(kept.numel(), device=dev), kept] = 1.0  # (k, n) a selection
    return Mixing(matrix=mix, weights=weights[kept], partition=True, rows=kept)
