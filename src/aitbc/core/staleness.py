"""How much an update computed on an old global model still counts.

``s`` is the staleness: how many aggregations happened between the model a worker
started from and the one its update is applied to. Each rule maps ``s >= 0`` to a
weight in ``(0, 1]``; the update is scaled by it. Rules from FedAsync (Xie et al. 2019).

- ``constant``: 1.
- ``polynomial`` (``a``): ``(1 + s)^-a``.
- ``hinge`` (``a``, ``b``): 1 while ``s <= b``, then ``1 / (a (s - b) + 1)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aitbc.core.options import build_config
from aitbc.core.registry import Registry

STALENESS: Registry[tuple[type[Any], Callable[[Any, int], float]]] = Registry("staleness rule")


@dataclass(kw_only=True, slots=True)
class ConstantConfig:
    pass


@dataclass(kw_only=True, slots=True)
class PolynomialConfig:
    a: float = 0.5

    def __post_init__(self) -> None:
        if not (self.a >= 0 and math.isfinite(self.a)):
            raise ValueError(f"a must be >= 0 and finite, got {self.a}")


@dataclass(kw_only=True, slots=True)
class HingeConfig:
    a: float = 10.0
    b: int = 4

    def __post_init__(self) -> None:
        if not (self.a >= 0 and math.isfinite(self.a)) or self.b < 0:
            raise ValueError(f"hinge needs a >= 0 and b >= 0, got a={self.a}, b={self.b}")


STALENESS.register("constant")((ConstantConfig, lambda cfg, s: 1.0))
STALENESS.register("polynomial")((PolynomialConfig, lambda cfg, s: (1.0 + s) ** -cfg.a))
STALENESS.register("hinge")((HingeConfig, lambda cfg, s: 1.0 if s <= cfg.b else 1.0 / (cfg.a * (s - cfg.b) + 1.0)))


def build_staleness(name: str, options: Mapping[str, object] | None = None) -> Callable[[int], float]:
    cfg_cls, fn = STALENESS.get(name)
    cfg = build_config(cfg_cls, options, what=f"staleness rule {name!r}")

    def weight(s: int) -> float:
        if s < 0:
            raise ValueError(f"staleness must be >= 0, got {s}")
        return fn(cfg, s)

    return weight


def buffer_size(buffer: int | None, workers: int) -> int:
    """Updates per aggregation in async mode (FedBuff's K): as given, else half the workers."""
    return buffer or max(1, workers // 2)


def async_weight(rule: Callable[[int], float], staleness: int, max_staleness: int) -> float | None:
    """What an update ``staleness`` aggregations old counts for in async mode: ``rule``'s
    weight, or None (refused) past ``max_staleness``. The simulator and the live
    coordinator both decide with this."""
    if staleness > max_staleness:
        return None
    return rule(staleness)
