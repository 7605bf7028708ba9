"""Aggregation rules over a round's updates.

Shapes: ``n`` updates of ``d`` parameters; ``updates`` is ``(n, d)``, ``weights`` is
``(n,)`` (e.g. sample counts), and every rule returns ``(d,)``.

One public entry point, :func:`aggregate`, looks the rule up by name in
:data:`AGGREGATORS`, builds its typed config from ``params`` (unknown parameters are an
error naming the allowed ones), rejects non-finite updates before any arithmetic, and
calls the rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aitbc.core.options import build_config
from aitbc.core.registry import Registry
from aitbc.errors import UsageError


@dataclass(frozen=True, slots=True)
class Aggregator:
    name: str
    fn: Callable[..., Tensor]  # fn(updates (n, d), weights (n,), cfg) -> (d,)
    config: type


AGGREGATORS: Registry[Aggregator] = Registry("aggregator")


def register(name: str, config: type) -> Callable[[Callable[..., Tensor]], Callable[..., Tensor]]:
    def deco(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        AGGREGATORS.register(name)(Aggregator(name=name, fn=fn, config=config))
        return fn

    return deco


def check_updates(updates: Tensor, weights: Tensor | None) -> Tensor:
    """Validate shapes and finiteness; return weights as a float ``(n,)`` tensor."""
    if updates.dim() != 2 or updates.shape[0] == 0:
        raise UsageError(f"updates must be a non-empty (n, d) tensor, got shape {tuple(updates.shape)}")
    n = updates.shape[0]
    bad = (~torch.isfinite(updates)).any(dim=1).nonzero().flatten().tolist()
    if bad:
        raise UsageError(f"updates {bad} contain NaN or Inf; reject them before aggregation")
    if weights is None:
        return torch.ones(n, dtype=updates.dtype)
    w = torch.as_tensor(weights, dtype=updates.dtype).flatten()
    if w.shape != (n,):
        raise UsageError(f"weights must have shape ({n},), got {tuple(w.shape)}")
    if not torch.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise UsageError("weights must be finite, non-negative and not all zero")
    return w


def aggregate(name: str, updates: Tensor, weights: Tensor | None = None, **params: Any) -> Tensor:
    """Aggregate ``updates`` ``(n, d)`` with rule ``name``; returns ``(d,)``."""
    agg = AGGREGATORS.get(name)
    cfg = build_config(agg.config, params, what=f"aggregator {name!r}")
    w = check_updates(updates, weights)
    return agg.fn(updates, w, cfg)


# Rules register themselves on import.
from aitbc.core.aggregation import mean as _mean  # noqa: E402,F401

__all__ = ["AGGREGATORS", "aggregate", "register", "check_updates"]
