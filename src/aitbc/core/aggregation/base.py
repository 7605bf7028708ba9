"""The aggregation registries, the config base classes, and input checks.

Shapes: ``n`` updates of ``d`` parameters; ``updates`` ``(n, d)``, ``weights`` ``(n,)``.

A *rule* (``AGGREGATORS``) turns ``(n, d)`` updates into one ``(d,)`` aggregate. A
*wrapper* (``WRAPPERS``) runs before a rule and replaces the ``n`` updates by ``k`` linear
mixtures of them (``k x n`` mixing matrix): nearest-neighbour mixing, bucketing. Each has
a typed config; a config checks its own values when built and the conditions on ``n`` in
``check_n``, with errors that name the condition and the numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch import Tensor

from aitbc.core.registry import Registry
from aitbc.errors import UsageError


@dataclass(frozen=True, slots=True)
class AggregationInfo:
    """What a rule did with each update, for contribution scoring. ``None`` where a rule
    does not report it (see each rule's docstring).

    - ``selected``: ``(k,)`` int64, ascending: the updates that entered the result (Krum's
      one, Multi-Krum's ``m``, Bulyan's ``n - 2f``; through a wrapper, every update mixed
      into a selected input).
    - ``kept_fraction``: ``(n,)`` in ``[0, 1]``: the share of coordinates in which the update
      entered the result (1 for every update of a weighted mean with positive weight; ties
      at a trimming boundary share the kept slots).
    - ``weight``: ``(n,)``, sums to 1: the update's coefficient in the result, averaged over
      coordinates (the result is ``sum_i c_ij x_ij`` per coordinate ``j``; this is
      ``mean_j c_ij``). It maps exactly through wrappers (``weight @ mixing``).
    """

    selected: Tensor | None = None
    kept_fraction: Tensor | None = None
    weight: Tensor | None = None


NO_INFO = AggregationInfo()


class RuleConfig:
    """Base of every rule's config: the conditions the rule needs on ``n``."""

    __slots__ = ()

    def check_n(self, n: int) -> None:
        """Raise :class:`UsageError` naming the condition when ``n`` updates are too few."""

    @property
    def reads_reference(self) -> bool:
        """Whether the rule, so configured, reads the run's last model step (``reference``):
        callers then pass it, and the pipeline calls the rule's ``fn_reference``."""
        return False


class WrapperConfig(RuleConfig):
    __slots__ = ()

    def out_n(self, n: int) -> int:
        """How many inputs the next stage sees when this wrapper gets ``n``."""
        return n


class RuleFn(Protocol):
    def __call__(
        self, updates: Tensor, weights: Tensor, cfg: Any, *, with_info: bool
    ) -> tuple[Tensor, AggregationInfo]: ...


@dataclass(frozen=True, slots=True)
class Mixing:
    """A wrapper's output: input ``i`` of the next stage is ``matrix[i] @ updates``."""

    matrix: Tensor  # (k, n), rows sum to 1
    weights: Tensor  # (k,) the next stage's weights
    partition: bool  # every update feeds at most one output (kept_fraction maps back; one that feeds none kept 0)
    rows: Tensor | None = None  # (k,) when the matrix only selects these rows: gathered, not multiplied


class ReferenceRuleFn(Protocol):
    """A rule that may read the run's last model step ``reference`` ``(d,)`` (None: none yet)."""

    def __call__(
        self, updates: Tensor, weights: Tensor, cfg: Any, *, with_info: bool, reference: Tensor | None
    ) -> tuple[Tensor, AggregationInfo]: ...


class WrapperFn(Protocol):
    def __call__(
        self, updates: Tensor, weights: Tensor, cfg: Any, *, round_index: int, reference: Tensor | None
    ) -> Mixing: ...


@dataclass(frozen=True, slots=True)
class Aggregator:
    name: str
    fn: RuleFn  # fn(updates (n, d), weights (n,), cfg, with_info=...) -> ((d,), info)
    config: type
    uses_weights: bool
    summary: str
    fn_reference: ReferenceRuleFn | None = None  # the same rule given the reference (configs that read it)


@dataclass(frozen=True, slots=True)
class Wrapper:
    name: str
    fn: WrapperFn
    config: type
    summary: str
    uses_reference: bool = False  # reads the run's trend: callers pass the model's last step


AGGREGATORS: Registry[Aggregator] = Registry("aggregator")
WRAPPERS: Registry[Wrapper] = Registry("aggregator wrapper")


def _summary(fn: Callable[..., Any]) -> str:
    return (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""


def register(
    name: str, config: type, *, uses_weights: bool, reads_reference: bool = False
) -> Callable[[RuleFn], RuleFn]:
    """Register rule ``fn`` under ``name``; its docstring's first line is its summary.
    ``reads_reference``: ``fn`` also takes ``reference=`` (a :class:`ReferenceRuleFn`),
    which the pipeline passes when the rule's config :attr:`~RuleConfig.reads_reference`."""

    def deco(fn: RuleFn) -> RuleFn:
        AGGREGATORS.register(name)(
            Aggregator(
                name=name,
                fn=fn,
                config=config,
                uses_weights=uses_weights,
                summary=_summary(fn),
                fn_reference=cast(ReferenceRuleFn, fn) if reads_reference else None,
            )
        )
        return fn

    return deco


def register_wrapper(name: str, config: type, *, uses_reference: bool = False) -> Callable[[WrapperFn], WrapperFn]:
    def deco(fn: WrapperFn) -> WrapperFn:
        WRAPPERS.register(name)(
            Wrapper(name=name, fn=fn, config=config, summary=_summary(fn), uses_reference=uses_reference)
        )
        return fn

    return deco


def check_updates(updates: Tensor, weights: Tensor | None) -> Tensor:
    """Validate shapes and finiteness; return weights as a float ``(n,)`` tensor on the
    updates' device."""
    if updates.dim() != 2 or updates.shape[0] == 0:
        raise UsageError(f"updates must be a non-empty (n, d) tensor, got shape {tuple(updates.shape)}")
    n = updates.shape[0]
    # A NaN or Inf makes its row's sum non-finite, so one reduction (no (n, d) temporary)
    # clears the common case; only a non-finite sum (or an overflow) pays the exact check.
    if not bool(torch.isfinite(updates.sum(dim=1)).all()):
        bad = (~torch.isfinite(updates)).any(dim=1).nonzero().flatten().tolist()
        if bad:
            raise UsageError(f"updates {bad} contain NaN or Inf; reject them before aggregation")
    return check_weights(n, weights, dtype=updates.dtype, device=updates.device)


def check_weights(n: int, weights: Tensor | None, *, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``weights`` as a float ``(n,)`` tensor (ones when None); refused unless finite,
    non-negative and not all zero."""
    if weights is None:
        return torch.ones(n, dtype=dtype, device=device)
    w = torch.as_tensor(weights, dtype=dtype).flatten().to(device)
    if w.shape != (n,):
        raise UsageError(f"weights must have shape ({n},), got {tuple(w.shape)}")
    if not torch.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise UsageError("weights must be finite, non-negative and not all zero")
    return w


def check_f(f: int) -> None:
    """Shared config check for rules and wrappers that take ``f`` (Byzantine updates)."""
    if f < 0:
        raise ValueError(f"f (the number of Byzantine updates) must be >= 0, got f={f}")
