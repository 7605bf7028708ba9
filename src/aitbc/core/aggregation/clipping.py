"""Centered clipping (Karimireddy, He, Jaggi 2021, "Learning from History for
Byzantine Robust Optimization"). Needs ``tau > 0``, ``iters >= 1`` and ``n >= 1``; robust
while Byzantine updates are a minority (the paper's ``delta < 0.1``-style bound).

Starting from a center ``v``, each of ``iters`` steps moves it by the weighted mean of the
clipped differences::

    v <- v + sum_i w_i (x_i - v) min(1, tau / ||x_i - v||)      (w normalized weights)

The paper starts from the previous round's aggregate (momentum). ``start`` picks the
center the iterations start from:

- ``previous``: the paper's stateful start, the run's last model step (the pipeline's
  ``reference``: old minus new global parameters, which under ``fedavg`` at lr 1 is the
  previous round's aggregate itself; the coordinator rebuilds it from the last two
  checkpoints after a restart, the simulator keeps it). A start the attackers of this
  round did not choose: identical Byzantine updates (IPM's ``-eps * mean`` sits at the
  honest updates' centre and forms a zero-distance cluster there) can pull the center
  only by ``tau`` each per step instead of being picked as the start. Without a
  reference (the first round, a round after a skipped one, a zero or non-finite step,
  gossip) it starts from the ``medoid``. The result is ``(1 - sum b) * reference + b @ U``,
  not a convex combination of the updates: ``weight`` reports each update's share of the
  move from the start (``b / sum b``). One extra ``(n, d) @ (d,)`` product.

- ``medoid`` (the default): the update whose summed squared distance to its
  ``k = floor((n - 1) / 2)`` nearest others is smallest (Krum's score with that ``k``).
  While Byzantine updates are at most ``k`` (a minority), an honest update's ``k`` nearest
  can all be honest, so the choice scores at most ``k D^2`` (``D`` the honest diameter);
  a Byzantine choice then has an honest update within ``sqrt(k) D`` among its ``k >= f``
  nearest. Costs one Gram matrix (a BLAS product, ~3x a mean).
- ``median``: the coordinate-wise median (a full sort per coordinate, ~15x a mean).

Either way one update of any size moves the result by at most ``iters * tau * w_i`` from
the start. ``tau`` is the clipping radius:

- ``auto`` (the default): the lower median of the other updates' distances from the start. With an
  honest majority that is an honest update's distance, so the radius follows the run's
  scale (learning rate, local steps, model size, how far apart heterogeneous shards pull)
  and no attacker can raise it past the honest spread.
- a number, in the units of the updates (the paper's fixed ``tau``). Too large and the rule
  is a plain mean; too small and every update is cut to a sliver.

Vectorised: the center stays ``start + Y^T b`` for ``Y = U - start``; the iterations
update only the ``(n,)`` coefficients ``b``, with
``||y_i - Y^T b||^2 = G_ii - 2 (G b)_i + b^T G b`` for the Gram matrix ``G = Y Y^T``
(float64, ``(n, n)``).

- ``medoid``: ``G`` comes from the raw Gram matrix ``U U^T`` (``_distances.gram``)
  re-centered on the start row ``s``: ``G_ij = K_ij - K_is - K_js + K_ss``. Its rounding is
  Krum's (see ``_distances``: a relative error of about ``1e-6 r^2`` in the distances, for
  ``r`` the shared component over the spread), which moves clip factors, never the
  bound above. The result ``(1 - sum b) x_s + b @ U`` is a convex combination of the
  updates, reported as ``weight``.
- ``median``: over column blocks, ``Y_b = U_b - median_b`` adds ``Y_b Y_b^T`` to ``G``
  (no ``(n, d)`` temporary, and centered, so no cancellation); the result is
  ``(1 - sum b) * median + b @ U``. Reports no info (the median is per coordinate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from aitbc.core.aggregation._distances import gram, mask_far
from aitbc.core.aggregation._sorting import ColumnSorter, mean_of_rows
from aitbc.core.aggregation.base import NO_INFO, AggregationInfo, RuleConfig, register
from aitbc.core.aggregation.krum import krum_order

GRAM_BLOCK_ELEMENTS = 1 << 24  # values per centered block: a 64 MiB float32 temporary
STARTS = ("medoid", "median", "previous")


@dataclass(kw_only=True, slots=True)
class CenteredClipConfig(RuleConfig):
    tau: float | Literal["auto"] = "auto"  # clipping radius: in the units of the updates, or auto
    iters: int = 3
    start: Literal["medoid", "median", "previous"] = "medoid"  # the center the iterations start from
    # medoid start only: each update first scaled down to at most this multiple of the
    # round's lower median norm (None: as sent)
    norm: float | None = None

    def __post_init__(self) -> None:
        if self.tau != "auto" and not (isinstance(self.tau, float | int) and self.tau > 0 and math.isfinite(self.tau)):
            raise ValueError(f"centered-clip needs tau > 0 or tau=auto, got tau={self.tau}")
        if self.iters < 1:
            raise ValueError(f"centered-clip needs iters >= 1, got iters={self.iters}")
        if self.start not in STARTS:  # the spec parser checks this too; direct callers get the same line
            raise ValueError(f"centered-clip start must be one of {', '.join(STARTS)}; got start={self.start!r}")
        if self.norm is not None:
            if not (isinstance(self.norm, float | int) and self.norm >= 1 and math.isfinite(self.norm)):
                raise ValueError(f"centered-clip needs norm >= 1 (a multiple of the median norm), got norm={self.norm}")
            if self.start != "medoid":
                raise ValueError(f"centered-clip norm=... works with start=medoid only, got start={self.start!r}")

    @property
    def reads_reference(self) -> bool:
        return self.start == "previous"


@register("centered-clip", CenteredClipConfig, uses_weights=True, reads_reference=True)
def centered_clip(
    updates: Tensor, weights: Tensor, cfg: CenteredClipConfig, *, with_info: bool, reference: Tensor | None = None
) -> tuple[Tensor, AggregationInfo]:
    """iterated clipping of differences around a start: the medoid, the median or the last step (Karimireddy et al. 2021)"""
    if cfg.start == "median":
        return _from_median(updates, weights, cfg), NO_INFO
    ref = usable_reference(reference) if cfg.start == "previous" else None
    if ref is not None:
        v0 = ref.to(device=updates.device, dtype=updates.dtype)  # (d,)
        k, far = gram(updates)
        dots = (updates @ v0).to(torch.float64)  # (n,) each update's dot with the start
        b = previous_coefficients(k, far, dots, float(ref.to(torch.float64).square().sum()), weights, cfg)
        out = (1.0 - b.sum()).item() * v0 + b.to(updates.dtype) @ updates  # (d,)
        return out, (previous_info(b) if with_info else NO_INFO)
    k, far = gram(updates)
    c = medoid_coefficients(k, far, weights, cfg)  # (n,) shares of the norm-clipped updates
    out = (c * norm_scales(k, far, cfg)).to(updates.dtype) @ updates  # (d,)
    if not with_info:
        return out, NO_INFO
    return out, AggregationInfo(kept_fraction=(c > 0).to(torch.float64), weight=c)


def medoid_coefficients(k: Tensor, far: Tensor, weights: Tensor, cfg: CenteredClipConfig) -> Tensor:
    """The ``medoid`` start's result as ``(n,)`` float64 coefficients ``c`` (the result is
    ``c @ U``), from the raw Gram matrix ``k`` ``(n, n)`` and its overflow mask ``far``
    (``_distances.gram``). With ``cfg.norm`` the coefficients are of the norm-clipped
    updates: the result is ``(c * norm_scales(k, far, cfg)) @ U``."""
    n = k.shape[0]
    scale = norm_scales(k, far, cfg)  # (n,)
    k = k * scale[:, None] * scale[None, :]  # the Gram matrix of the scaled updates
    sq = k.diagonal()  # (n,)
    k = 0.5 * (k + k.T)
    dist = (sq[:, None] + sq[None, :] - 2.0 * k).clamp_min(0.0)  # (n, n) squared distances
    dist = dist.masked_fill(far[:, None] | far[None, :], float("inf")).fill_diagonal_(0.0)
    alive = torch.ones(n, dtype=torch.bool, device=k.device)
    neighbours = max(1, (n - 1) // 2)
    s = int(krum_order(dist.nan_to_num(nan=float("inf")), alive, max(0, n - 2 - neighbours))[0])
    # Y = U - x_s: G_ij = K_ij - K_is - K_js + K_ss (the start never overflows while any update is finite)
    g = k - k[:, s : s + 1] - k[s : s + 1, :] + k[s, s]
    b = _iterate(g, far, weights, cfg, start_row=s)
    c = b.clone()  # (n,) the result's coefficients: (1 - sum b) x_s + b @ U
    c[s] += 1.0 - float(b.sum())
    return c


def norm_scales(k: Tensor, far: Tensor, cfg: CenteredClipConfig) -> Tensor:
    """``(n,)`` float64 factors that bring each update's norm down to at most ``cfg.norm``
    times the lower median of the finite norms (all 1 without ``cfg.norm``), from the raw
    Gram matrix ``k`` and its overflow mask ``far``.

    Why: on label-skewed shards honest updates point many ways and largely cancel, so their
    mean is short, while f attackers sending the same direction each pull the center by up
    to ``tau`` per iteration; an attacker sending a long update (sign-flip's ``-4 x own``,
    which the norm bound lets through at 3x the median) is still at the radius after every
    iteration. Scaled to the median norm, it sits among the honest updates' distances and
    weighs as one of them. Honest norms lie within about 1.6x of the median (see
    ``aitbc.core.norms``), so the honest spread is kept in direction, only shortened."""
    n = k.shape[0]
    scales = torch.ones(n, dtype=torch.float64, device=k.device)
    if cfg.norm is None:
        return scales
    norms = k.diagonal().to(torch.float64).clamp_min(0.0).sqrt()  # (n,)
    live = norms[~far]
    if not live.numel():
        return scales
    bound = float(cfg.norm) * float(live.median())  # torch's median of an even count is the lower one
    if not bound > 0:  # most updates are zero: nothing to measure against
        return scales
    # an overflowed row keeps 1: the clipping gives it no weight anyway
    return torch.where(~far & (norms > bound), bound / norms.clamp_min(1e-300), scales)


def usable_reference(reference: Tensor | None) -> Tensor | None:
    """The reference ``start=previous`` starts from; None (the medoid start then) when
    there is none, or it is zero or not finite."""
    if reference is None:
        return None
    sq = float(reference.to(torch.float64).square().sum())
    return reference if math.isfinite(sq) and sq > 0 else None


def previous_coefficients(
    k: Tensor, far: Tensor, dots: Tensor, ref_sq: float, weights: Tensor, cfg: CenteredClipConfig
) -> Tensor:
    """The ``previous`` start's ``(n,)`` float64 coefficients ``b``: the result is
    ``(1 - sum b) * reference + b @ U``. From the raw Gram matrix ``k`` and its overflow
    mask ``far`` (``_distances.gram``), each update's dot with the reference ``dots``
    ``(n,)`` and the reference's squared norm: ``Y = U - reference`` has
    ``G_ij = K_ij - dots_i - dots_j + ref_sq``. A dot that overflows makes its update
    infinitely far (clip factor 0), as an overflowing norm does."""
    far = far | ~torch.isfinite(dots)
    dots = dots.masked_fill(far, 0.0)
    k = 0.5 * (k + k.T)
    g = k - dots[:, None] - dots[None, :] + ref_sq
    g = g.masked_fill(far[:, None] | far[None, :], 0.0)
    return _iterate(g, far, weights, cfg, start_row=None)


def previous_info(b: Tensor) -> AggregationInfo:
    total = float(b.sum())
    return AggregationInfo(kept_fraction=(b > 0).to(torch.float64), weight=b / total if total > 0 else b)


def _iterate(g: Tensor, far: Tensor, weights: Tensor, cfg: CenteredClipConfig, *, start_row: int | None) -> Tensor:
    """The ``iters`` clipping steps in coefficient space: ``b`` ``(n,)`` with the center
    ``start + Y^T b``, for ``g`` the float64 Gram matrix of ``Y = U - start`` (``start_row``:
    the update the start is, left out of the auto radius)."""
    sq = g.diagonal()  # (n,) ||y_i||^2
    w = (weights / weights.sum()).to(torch.float64)  # (n,)
    b = torch.zeros_like(w)
    if cfg.tau == "auto":  # the lower median of the other finite updates' distances from the start
        others = ~far
        if start_row is not None and others.sum() > 1:
            others[start_row] = False
        live = sq[others].clamp_min(0.0).sqrt()
        tau = float(live.median()) if live.numel() else 0.0
    else:
        tau = float(cfg.tau)
    if not tau > 0:  # auto: most updates sit on the start; they win
        return b
    for _ in range(cfg.iters):
        gb = g @ b  # (n,)
        dist = (sq - 2.0 * gb + b @ gb).clamp_min(0.0).sqrt()  # (n,) ||y_i - Y^T b||
        clip = (tau / dist).clamp(max=1.0).masked_fill(far, 0.0)  # dist 0 -> inf -> 1
        step = w * clip  # (n,)
        b = b * (1.0 - step.sum()) + step  # v + sum_i step_i (x_i - v), in coefficients
    return b


def _from_median(updates: Tensor, weights: Tensor, cfg: CenteredClipConfig) -> Tensor:
    n, d = updates.shape
    start = torch.empty(d, dtype=updates.dtype, device=updates.device)  # (d,) the median
    sorter = ColumnSorter(updates, positions=range((n - 1) // 2, n // 2 + 1))
    sorter.run(lambda cols: mean_of_rows(sorter.sort(cols), start[cols]))
    g = torch.zeros(n, n, dtype=torch.float64, device=updates.device)  # Gram of U - median
    c = max(1, GRAM_BLOCK_ELEMENTS // n)
    y_buf = torch.empty(n * min(c, d), dtype=updates.dtype, device=updates.device)
    for lo in range(0, d, c):  # a few big column blocks (not coordinates): few, large BLAS calls
        cols = slice(lo, min(lo + c, d))
        y = torch.sub(updates[:, cols], start[cols], out=y_buf[: n * (cols.stop - lo)].view(n, -1))  # (n, c)
        g += (y @ y.T).to(torch.float64)  # (n, c) @ (c, n) -> (n, n)
    g, far = mask_far(g)  # an update that overflows is infinitely far: clip factor 0
    b = _iterate(g, far, weights, cfg, start_row=None)
    # start + Y^T b = (1 - sum b) * start + b @ U; U is finite even where Y overflows.
    return (1.0 - b.sum()).item() * start + b.to(updates.dtype) @ updates  # (d,)
