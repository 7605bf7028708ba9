"""Byzantine attacks used to evaluate robust aggregation.

An attack turns what a Byzantine worker can see into the update it sends. Colluding
attackers see every honest update of the round (the strongest standard threat model),
so ALIE and IPM can aim just outside what a robust rule would reject.

Shapes: ``h`` honest updates, ``d`` parameters; ``honest`` is ``(h, d)``.

- ``sign-flip``: ``-scale * own`` (the worker trains honestly, then reverses and amplifies;
  scale 4 lets 25% attackers overpower a plain mean).
- ``gaussian``: ``N(mean, std^2)`` noise in place of an update.
- ``label-flip``: trains honestly on labels ``C - 1 - y`` (a data-poisoning attack).
- ``alie``: "A Little Is Enough" (Baruch et al. 2019): ``mu - z * sigma`` per coordinate,
  with ``z`` from ``n`` and ``f`` so the update stays inside the honest spread.
- ``ipm``: inner-product manipulation (Xie et al. 2019): ``-eps * mean(honest)``;
  ``ipm:evade=E`` is trend-aware: it keeps a small positive cosine with the last global update.
- ``free-rider``: no training; sends zeros, or replays the previous round's public
  global update (``mode=stale``).
- ``scale``: trains honestly, then sends ``factor x own`` (``scale:factor=1e10``), or a
  correctly shaped update holding ``value`` in every coordinate (``scale:value=3e38``):
  huge but finite, what a plain mean cannot survive without a norm bound (:mod:`aitbc.core.norms`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from aitbc.core.options import build_config
from aitbc.core.registry import Registry

ATTACKS: Registry[type[Attack]] = Registry("attack")


@dataclass(frozen=True, slots=True)
class AttackView:
    """What a Byzantine worker knows when it crafts its update."""

    own: Tensor | None  # (d,) its own honest update, if the attack trains
    honest: Tensor  # (h, d) honest updates of the round (collusion); h may be 0
    previous: Tensor | None  # (d,) last applied global update (public)
    n: int  # updates the aggregator will see
    f: int  # Byzantine workers among them
    generator: torch.Generator


class Attack(ABC):
    trains: ClassVar[bool] = True  # needs its own honest update
    flips_labels: ClassVar[bool] = False
    Config: ClassVar[type]

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    @abstractmethod
    def craft(self, view: AttackView) -> Tensor:
        """The ``(d,)`` update this Byzantine worker sends."""


def _check_positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be > 0 and finite, got {value}")


@dataclass(kw_only=True, slots=True)
class SignFlipConfig:
    scale: float = 4.0

    def __post_init__(self) -> None:
        _check_positive("scale", self.scale)


@ATTACKS.register("sign-flip")
class SignFlip(Attack):
    Config = SignFlipConfig

    def craft(self, view: AttackView) -> Tensor:
        assert view.own is not None
        return -self.cfg.scale * view.own


@dataclass(kw_only=True, slots=True)
class GaussianConfig:
    std: float = 1.0
    mean: float = 0.0

    def __post_init__(self) -> None:
        if not (self.std >= 0 and math.isfinite(self.std) and math.isfinite(self.mean)):
            raise ValueError(f"std must be >= 0 and finite, got {self.std}")


@ATTACKS.register("gaussian")
class Gaussian(Attack):
    trains = False
    Config = GaussianConfig

    def craft(self, view: AttackView) -> Tensor:
        d = view.honest.shape[1]
        return self.cfg.mean + self.cfg.std * torch.randn(d, generator=view.generator)


@dataclass(kw_only=True, slots=True)
class NoConfig:
    pass


@ATTACKS.register("label-flip")
class LabelFlip(Attack):
    flips_labels = True
    Config = NoConfig

    def craft(self, view: AttackView) -> Tensor:
        assert view.own is not None
        return view.own  # the poison is in the data it trained on


@dataclass(kw_only=True, slots=True)
class AlieConfig:
    z: float | None = None  # None: Baruch et al.'s z_max from n and f

    def __post_init__(self) -> None:
        if self.z is not None and not math.isfinite(self.z):
            raise ValueError(f"z must be finite, got {self.z}")


def alie_z(n: int, f: int) -> float:
    """Baruch et al. 2019, Alg. 3: the largest z whose shifted update still has
    ``s = floor(n/2 + 1) - f`` honest workers 'further' from the mean than it."""
    s = math.floor(n / 2 + 1) - f
    p = (n - s) / n
    p = min(max(p, 1e-6), 1 - 1e-6)
    return float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(p)))


@ATTACKS.register("alie")
class Alie(Attack):
    trains = False
    Config = AlieConfig

    def craft(self, view: AttackView) -> Tensor:
        h = view.honest
        if h.shape[0] == 0:
            return torch.zeros(h.shape[1])
        mu = h.mean(dim=0)  # (d,)
        sigma = h.std(dim=0, unbiased=False) if h.shape[0] > 1 else torch.zeros_like(mu)  # (d,)
        z = self.cfg.z if self.cfg.z is not None else alie_z(view.n, view.f)
        return mu - z * sigma


@dataclass(kw_only=True, slots=True)
class IpmConfig:
    eps: float = 0.5
    evade: float = 0.0  # > 0: keep a cosine of about evade with the last global update (a trend-aware IPM)

    def __post_init__(self) -> None:
        _check_positive("eps", self.eps)
        if not (self.evade >= 0 and math.isfinite(self.evade)):
            raise ValueError(f"evade must be >= 0 and finite, got {self.evade}")


@ATTACKS.register("ipm")
class Ipm(Attack):
    """``-eps * mean(honest)``. With ``evade > 0`` the attacker also knows the last global
    update (public): it removes its update's component along that step and adds back
    ``evade`` times the rest's norm along it, so the cosine with the step is
    ``evade / sqrt(1 + evade^2) > 0`` and a direction check (``trend``) lets it pass."""

    trains = False
    Config = IpmConfig

    def craft(self, view: AttackView) -> Tensor:
        h = view.honest
        u = -self.cfg.eps * h.mean(dim=0) if h.shape[0] else torch.zeros(h.shape[1])
        p = view.previous
        if self.cfg.evade <= 0 or p is None or not float(p.norm()) > 0:
            return u
        p_hat = p.to(u.dtype) / p.to(u.dtype).norm()  # (d,)
        perp = u - (u @ p_hat) * p_hat  # (d,)
        return perp + self.cfg.evade * perp.norm() * p_hat


@dataclass(kw_only=True, slots=True)
class FreeRiderConfig:
    mode: Literal["zeros", "stale"] = "zeros"

    def __post_init__(self) -> None:
        if self.mode not in ("zeros", "stale"):
            raise ValueError(f"mode must be zeros or stale, got {self.mode!r}")


@ATTACKS.register("free-rider")
class FreeRider(Attack):
    trains = False
    Config = FreeRiderConfig

    def craft(self, view: AttackView) -> Tensor:
        sends = self.cfg.mode  # what a free rider sends: zeros, or its previous update again (stale)
        if sends == "stale" and view.previous is not None:
            return view.previous.clone()
        return torch.zeros(view.honest.shape[1])


@dataclass(kw_only=True, slots=True)
class ScaleConfig:
    factor: float = 1e3  # multiplies the worker's own update
    value: float | None = None  # instead: this value in every coordinate

    def __post_init__(self) -> None:
        _check_positive("factor", self.factor)
        if self.value is not None and not math.isfinite(self.value):
            raise ValueError(f"value must be finite, got {self.value}")


@ATTACKS.register("scale")
class Scale(Attack):
    Config = ScaleConfig

    def craft(self, view: AttackView) -> Tensor:
        assert view.own is not None
        if self.cfg.value is not None:
            return torch.full_like(view.own, self.cfg.value)
        return self.cfg.factor * view.own


def build_attack(name: str, options: Mapping[str, object] | None = None) -> Attack:
    cls = ATTACKS.get(name)
    return cls(build_config(cls.Config, options, what=f"attack {name!r}"))


__all__ = ["ATTACKS", "Attack", "AttackView", "alie_z", "build_attack"]
