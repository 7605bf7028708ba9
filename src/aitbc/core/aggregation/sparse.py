"""Robust aggregation of sparse updates (top-k and SparseLoCo codecs: each update nonzero on
1-2% of the coordinates, mostly different ones). Needs ``n >= 1``; robust while Byzantine
updates are at most ``f`` and a minority. Uses ``weights``; reads the run's last model step
(``reference``).

Why a rule of its own: coordinate-wise rules see one sender in most coordinates, so the
median or a trim of mostly zeros is zero (nothing trains), and distance rules see updates
that are all about equally far apart (``||x_i - x_j||^2 = ||x_i||^2 + ||x_j||^2`` on disjoint
supports): the medoid is the smallest update and centered clipping keeps every one whole,
the mean. The trend check (``trend``) still separates a sign-flipped update early in a run,
but it is captured late: when the honest updates' cosines with the trend fall to about 0
(the run near its loss floor), an attacker that gets in once becomes part of the next
reference, and its next update, on nearly the same coordinates (an attacker keeps no error
feedback, so its top-k repeats), has a cosine of 0.3 with it against the honest ones' 0
(measured, digits, 2 of 8 sign-flipping): from then on it passes and honest updates are
dropped in its place. This rule, in order:

1. Norm: each update is scaled down to at most ``clip`` x the round's lower median norm
   (the run's norm bound has already cut gross ones at 3x; with an honest majority the
   median is an honest norm). Honest sparse updates' norms sit within about 20% of the
   median, so an attacker's weight in the result is at most that of one honest update.
2. Copies: two updates whose supports (the coordinates they send) overlap with a Jaccard
   index of ``copy`` or more are one update sent twice (Templar's index-overlap check):
   honest workers' top-k supports overlap far less (see ``COPY_JACCARD``). Each connected
   group of copies shares one update's weight.
3. Direction: each update's cosine with the trend (the reference; without one, the sum of
   the round's other clipped updates). An update is a suspect when its cosine is
   ``<= min_cos`` (it points against the trend, as ``trend``), or when it sits above the
   round's median cosine by more than ``band`` median absolute deviations (an update that
   repeats what the last step held: the captured attacker above). At most ``f`` suspects
   are dropped, the farthest from the median first, never the last update.
4. The weighted mean of the kept updates, each scaled as in 1: on disjoint supports of
   equal norm, what the mean of the honest updates would be.

The result is ``c @ U`` for ``(n,)`` coefficients ``c`` computed from the Gram matrix, the
support-overlap counts and the dots with the reference (all ``(n, n)`` or ``(n,)``, float64),
so it streams: one pass for those, one combining pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from aitbc.core.aggregation._distances import mask_far
from aitbc.core.aggregation.base import NO_INFO, AggregationInfo, RuleConfig, check_f, register

# Two honest updates' supports (each the top 2% of a worker's residual) overlapped with a
# Jaccard index of at most 0.27 on digits (8 workers, SparseLoCo 2%, 2-bit, 15 rounds, seed
# 0; the first round, when every worker's largest coordinates are much the same, is the
# worst), and two sign-flipping attackers' (top-k of their own reversed steps, no error
# feedback) at most 0.38; a copy with its values perturbed keeps the index set: 1.0. 0.8
# leaves room both ways.
COPY_JACCARD = 0.8
MAD_FLOOR = 1e-3  # cosines with the trend that differ by less say nothing about direction


@dataclass(kw_only=True, slots=True)
class SparseRobustConfig(RuleConfig):
    f: int  # the most updates it drops in a round (the run's Byzantine count)
    clip: float = 1.0  # each update's norm at most this x the round's lower median norm
    min_cos: float = 0.0  # an update whose cosine with the trend is below this is a suspect
    band: float = 4.0  # ... as is one above the median cosine by more than this many MADs
    copy: float = COPY_JACCARD  # supports overlapping this much (Jaccard) are copies

    def __post_init__(self) -> None:
        check_f(self.f)
        if not (self.clip >= 1 and math.isfinite(self.clip)):
            raise ValueError(f"sparse-robust needs a finite clip >= 1, got clip={self.clip}")
        if not -1.0 <= self.min_cos < 1.0:
            raise ValueError(f"sparse-robust needs -1 <= min_cos < 1, got min_cos={self.min_cos}")
        if not self.band > 0:
            raise ValueError(f"sparse-robust needs band > 0, got band={self.band}")
        if not 0 < self.copy <= 1:
            raise ValueError(f"sparse-robust needs 0 < copy <= 1, got copy={self.copy}")

    @property
    def reads_reference(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class RoundStats:
    """What the rule reads of a round, all float64: the Gram matrix ``(n, n)`` (overflowing
    rows zeroed) and its mask ``far`` ``(n,)``, the support-overlap counts ``(n, n)``
    (``counts_ij``: coordinates both sent), each update's dot with the reference ``(n,)``
    and the reference's norm (None: no usable reference)."""

    gram: Tensor
    far: Tensor
    counts: Tensor
    dots: Tensor | None
    ref_norm: float | None


def round_stats(updates: Tensor, reference: Tensor | None) -> RoundStats:
    g, far = mask_far((updates @ updates.T).to(torch.float64))  # (n, n)
    support = (updates != 0).to(updates.dtype)  # (n, d)
    counts = (support @ support.T).to(torch.float64)  # (n, n) exact in float32 below 2^24 coordinates
    ref_norm = reference_norm(reference)
    dots = None
    if ref_norm is not None and reference is not None:
        dots = (updates @ reference.to(device=updates.device, dtype=updates.dtype)).to(torch.float64)  # (n,)
    return RoundStats(gram=g, far=far, counts=counts, dots=dots, ref_norm=ref_norm)


def reference_norm(reference: Tensor | None) -> float | None:
    if reference is None:
        return None
    norm = float(reference.to(torch.float64).norm())
    return norm if math.isfinite(norm) and norm > 0 else None


@register("sparse-robust", SparseRobustConfig, uses_weights=True, reads_reference=True)
def sparse_robust(
    updates: Tensor, weights: Tensor, cfg: SparseRobustConfig, *, with_info: bool, reference: Tensor | None = None
) -> tuple[Tensor, AggregationInfo]:
    """norm-clipped mean of sparse updates, copies merged, trend outliers on both sides dropped (up to f)"""
    c = coefficients(round_stats(updates, reference), weights, cfg)  # (n,)
    out = c.to(updates.dtype) @ updates  # (d,)
    return out, (coefficient_info(c) if with_info else NO_INFO)


def coefficient_info(c: Tensor) -> AggregationInfo:
    total = float(c.sum())
    return AggregationInfo(kept_fraction=(c > 0).to(torch.float64), weight=c / total if total > 0 else c)


def coefficients(stats: RoundStats, weights: Tensor, cfg: SparseRobustConfig) -> Tensor:
    """The result's ``(n,)`` float64 coefficients (the result is ``c @ U``)."""
    g, far = stats.gram, stats.far
    w = weights.to(torch.float64) * (~far).to(torch.float64)  # an overflowing update has no weight
    norms = g.diagonal().clamp_min(0.0).sqrt()  # (n,)
    scale = clip_factors(norms, far, cfg.clip)  # (n,)
    w = w * copy_shares(stats.counts, cfg.copy)
    keep = ~far & (w > 0)
    cos = cosines(stats, scale, norms)
    if cos is not None:
        keep &= ~suspects(cos, norms, keep, cfg)
    w = w * keep.to(torch.float64)
    total = float(w.sum())
    if not total > 0:
        return torch.zeros_like(w)
    return w / total * scale


def clip_factors(norms: Tensor, far: Tensor, clip: float) -> Tensor:
    """Each update's scale: down to ``clip`` x the lower median of the finite non-zero norms."""
    live = norms[~far & (norms > 0)]
    scale = torch.ones_like(norms)
    if live.numel():
        bound = clip * float(live.median())
        scale = torch.where(norms > bound, bound / norms.clamp_min(1e-300), scale)
    return scale.masked_fill(far, 0.0)


def copy_shares(counts: Tensor, threshold: float) -> Tensor:
    """``(n,)``: 1 / the size of each update's group of copies (supports overlapping with a
    Jaccard index >= ``threshold``, joined transitively); 1 for an update with no copy."""
    return 1.0 / copy_groups(counts, threshold).sum(1).to(torch.float64)


def copy_groups(counts: Tensor, threshold: float) -> Tensor:
    """``(n, n)`` bool: ``[i, j]`` when updates ``i`` and ``j`` are in one group of copies
    (each update is in its own group). ``counts`` ``(n, n)``: coordinates both sent."""
    size = counts.diagonal()  # (n,)
    union = size[:, None] + size[None, :] - counts  # (n, n)
    near = (counts >= threshold * union) & (union > 0)  # empty supports copy nothing
    near.fill_diagonal_(True)
    reach = near
    for _ in range(max(1, counts.shape[0].bit_length())):  # transitive closure by squaring
        reach = (reach.to(torch.float64) @ reach.to(torch.float64)) > 0
    return reach


def cosines(stats: RoundStats, scale: Tensor, norms: Tensor) -> Tensor | None:
    """``(n,)`` each update's cosine with the trend: the reference, or without one the sum of
    the round's other updates (each scaled as clipped). None when there is nothing to compare with."""
    g = stats.gram
    if stats.dots is not None and stats.ref_norm is not None:
        dots, other = stats.dots.masked_fill(~torch.isfinite(stats.dots), 0.0), torch.full_like(norms, stats.ref_norm)
    else:
        gs = g * scale[None, :]  # (n, n) G_ij s_j
        dots = gs.sum(1) - gs.diagonal()  # (n,) <u_i, sum_{j != i} s_j u_j>
        total = float(scale @ g @ scale)  # ||sum_j s_j u_j||^2
        # ||S - s_i u_i||^2 = ||S||^2 - 2 s_i <u_i, S> + s_i^2 ||u_i||^2
        other_sq = total - 2.0 * scale * (gs.sum(1)) + scale.square() * g.diagonal()
        other = other_sq.clamp_min(0.0).sqrt()
        if not bool((other > 0).any()):
            return None
    cos = torch.where((norms > 0) & (other > 0), dots / (norms * other).clamp_min(1e-300), torch.zeros_like(dots))
    return cos.nan_to_num(nan=0.0, posinf=1.0, neginf=-1.0).clamp(-1.0, 1.0)


def suspects(cos: Tensor, norms: Tensor, keep: Tensor, cfg: SparseRobustConfig) -> Tensor:
    """``(n,)`` bool: the updates dropped for their direction, at most ``f``, never the last kept."""
    n = cos.shape[0]
    out = torch.zeros(n, dtype=torch.bool, device=cos.device)
    live = keep.nonzero().flatten()
    if cfg.f <= 0 or live.numel() <= 1:
        return out
    c = cos[live]
    med = float(c.median())
    mad = float((c - med).abs().median())
    spread = max(mad, MAD_FLOOR)  # cosines closer than this are one direction
    dev = (c - med).abs() / spread  # (k,)
    flagged = (c < cfg.min_cos) | (norms[live] == 0) | ((c - med) > cfg.band * spread)
    # the farthest from the median first; ties by index (a stable sort of the negated deviation)
    order = (-dev).argsort(stable=True)
    budget = min(cfg.f, live.numel() - 1)
    for j in order.tolist():
        if budget == 0:
            break
        if bool(flagged[j]):
            out[int(live[j])] = True
            budget -= 1
    return out
