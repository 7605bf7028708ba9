"""Outer optimizers: how the aggregated update moves the global model.

Shapes: ``d`` is the number of model parameters; ``params`` and ``delta`` are ``(d,)``.
``delta`` is the aggregated pseudo-gradient, ``global - local`` (a descent direction
pointing the same way as a gradient), so every rule *subtracts* it.

- ``fedavg`` (McMahan et al. 2017): ``params - lr * delta`` (lr 1 applies the mean).
- ``diloco`` (Douillard et al. 2023, "DiLoCo"): outer SGD with Nesterov momentum,
  lr 0.7, momentum 0.9 -- the setting the paper and INTELLECT-1 use.

State (the momentum buffer) is a dict of tensors so a coordinator can checkpoint it.

Bounds (a run owner picks these; outside them no honest provider's update could keep the
model sane): ``lr`` in ``(0, MAX_LR]`` (10: ten times a plain average), ``momentum`` in
``[0, MAX_MOMENTUM]`` (0.99).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from aitbc.core.options import build_config
from aitbc.core.registry import Registry

MAX_LR = 10.0
MAX_MOMENTUM = 0.99


def _check_lr(lr: float) -> None:
    if not (0 < lr <= MAX_LR):
        raise ValueError(f"lr must be in (0, {MAX_LR:g}], got {lr}")


class OuterOptimizer(Protocol):
    def step(self, params: Tensor, delta: Tensor) -> Tensor: ...
    def state_dict(self) -> dict[str, Tensor]: ...
    def load_state_dict(self, state: dict[str, Tensor]) -> None: ...


OUTER_OPTIMIZERS: Registry[Any] = Registry("outer optimizer")


@dataclass(kw_only=True, slots=True)
class FedAvgConfig:
    lr: float = 1.0

    def __post_init__(self) -> None:
        _check_lr(self.lr)


@dataclass(kw_only=True, slots=True)
class DiLoCoConfig:
    lr: float = 0.7
    momentum: float = 0.9
    nesterov: bool = True

    def __post_init__(self) -> None:
        _check_lr(self.lr)
        if not 0 <= self.momentum <= MAX_MOMENTUM:
            raise ValueError(f"momentum must be in [0, {MAX_MOMENTUM:g}], got {self.momentum}")


@OUTER_OPTIMIZERS.register("fedavg")
class FedAvg:
    Config = FedAvgConfig

    def __init__(self, cfg: FedAvgConfig) -> None:
        self.cfg = cfg

    def step(self, params: Tensor, delta: Tensor) -> Tensor:
        _check(params, delta)
        return params - self.cfg.lr * delta

    def state_dict(self) -> dict[str, Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        return None


@OUTER_OPTIMIZERS.register("diloco")
class DiLoCo:
    Config = DiLoCoConfig

    def __init__(self, cfg: DiLoCoConfig) -> None:
        self.cfg = cfg
        self.buf: Tensor | None = None

    def step(self, params: Tensor, delta: Tensor) -> Tensor:
        _check(params, delta)
        m = self.cfg.momentum
        # Same update as torch.optim.SGD(nesterov=True): buf = m*buf + g; g' = g + m*buf.
        self.buf = delta.clone() if self.buf is None else self.buf.mul_(m).add_(delta)
        direction = delta + m * self.buf if self.cfg.nesterov else self.buf
        return params - self.cfg.lr * direction

    def state_dict(self) -> dict[str, Tensor]:
        return {} if self.buf is None else {"momentum_buffer": self.buf.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        buf = state.get("momentum_buffer")
        self.buf = None if buf is None else buf.detach().clone()  # step() updates it in place


def _check(params: Tensor, delta: Tensor) -> None:
    if params.shape != delta.shape or params.dim() != 1:
        raise ValueError(
            f"outer step needs flat tensors of equal shape; got {tuple(params.shape)} and {tuple(delta.shape)}"
        )
    if not torch.isfinite(delta).all():
        raise ValueError("outer step got a non-finite delta")


def build_outer(name: str, options: Mapping[str, object] | None = None) -> OuterOptimizer:
    cls = OUTER_OPTIMIZERS.get(name)
    cfg = build_config(cls.Config, options, what=f"outer optimizer {name!r}")
    return cls(cfg)


__all__ = ["MAX_LR", "MAX_MOMENTUM", "OUTER_OPTIMIZERS", "OuterOptimizer", "FedAvg", "DiLoCo", "build_outer"]
