"""Centered clipping (Karimireddy, He, Jaggi 2021, "Learning from History for
Byzantine Robust Optimization"). Needs ``tau > 0``, ``iters >= 1`` and ``n >= 1``; robust
while Byzantine updates are a minority (the paper's ``delta < 0.1``-style bound).

Starting from a center ``v``, each of ``iters`` steps moves it by the weighted mean of the
clipped differences::

    v <- v + sum_i w_i (x_i - v) min(1, tau / ||x_i - v||)      (w normalized weights)

The paper starts from the previous round's aggregate (momentum). This rule is stateless,
so ``v`` starts at the coordinate-wise median: one update of any size then moves the
result by at most ``iters * tau * w_i`` from that median. ``tau`` is in the units of the
updates: choose it near the honest updates' typical distance from their center.

Vectorised: the median comes block-wise from ``_sorting``; then, over column blocks, the
centered block ``Y_b = U_b - median_b`` adds ``Y_b Y_b^T`` to the Gram matrix of
``Y = U - median`` (accumulated in float64; no ``(n, d)`` temporary, and centered, so no
cancellation). The center stays
``median + Y^T b``; the iterations update only the ``(n,)`` coefficients ``b``, with
``||y_i - Y^T b||^2 = G_ii - 2 (G b)_i + b^T G b``. The result is
``(1 - sum b) * median + b @ U``: one more pass. Reports no info (its coefficients mix
the median, which is per coordinate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from aitbc.core.aggregation._distances import mask_far
from aitbc.core.aggregation._sorting import ColumnSorter, mean_of_rows
from aitbc.core.aggregation.base import NO_INFO, AggregationInfo, RuleConfig, register

GRAM_BLOCK_ELEMENTS = 1 << 24  # values per centered block: a 64 MiB float32 temporary


@dataclass(kw_only=True, slots=True)
class CenteredClipConfig(RuleConfig):
    tau: float = 1.0  # clipping radius, in the units of the updates
    iters: int = 3

    def __post_init__(self) -> None:
        if not (self.tau > 0 and math.isfinite(self.tau)):
            raise ValueError(f"centered-clip needs tau > 0, got tau={self.tau}")
        if self.iters < 1:
            raise ValueError(f"centered-clip needs iters >= 1, got iters={self.iters}")


@register("centered-clip", CenteredClipConfig, uses_weights=True)
def centered_clip(
    updates: Tensor, weights: Tensor, cfg: CenteredClipConfig, *, with_info: bool
) -> tuple[Tensor, AggregationInfo]:
    """iterated clipping of differences around a center that starts at the median (Karimireddy et al. 2021)"""
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
    sq = g.diagonal()  # (n,) ||y_i||^2
    w = (weights / weights.sum()).to(torch.float64)  # (n,)
    b = torch.zeros_like(w)  # center = start + Y^T b
    for _ in range(cfg.iters):
        gb = g @ b  # (n,)
        dist = (sq - 2.0 * gb + b @ gb).clamp_min(0.0).sqrt()  # (n,) ||y_i - Y^T b||
        clip = (cfg.tau / dist).clamp(max=1.0).masked_fill(far, 0.0)  # dist 0 -> inf -> 1
        step = w * clip  # (n,)
        b = b * (1.0 - step.sum()) + step  # v + sum_i step_i (x_i - v), in coefficients
    # start + Y^T b = (1 - sum b) * start + b @ U; U is finite even where Y overflows.
    out = (1.0 - b.sum()).item() * start + b.to(updates.dtype) @ updates  # (d,)
    return out, NO_INFO
