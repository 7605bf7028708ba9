"""Aggregator specs: parse once, check, call every round.

A spec is ``[WRAPPER[:k=v,...]+]...RULE[:k=v,...]``: zero or more wrappers, applied left
to right, then one rule (see the package docstring for how options and ``f`` flow).
:func:`parse_aggregator` builds every config up front (unknown names, unknown options and
bad values fail here); :meth:`AggregatorPipeline.check` checks the conditions on ``n``;
calling the pipeline checks the updates, then the conditions, then aggregates.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from torch import Tensor

from aitbc.core.aggregation.base import (
    AGGREGATORS,
    WRAPPERS,
    AggregationInfo,
    Aggregator,
    Mixing,
    Wrapper,
    check_updates,
)
from aitbc.core.options import build_config, parse_spec
from aitbc.errors import UsageError

E = TypeVar("E", Aggregator, Wrapper)


@dataclass(frozen=True, slots=True)
class Stage(Generic[E]):
    entry: E
    config: Any

    @property
    def spec(self) -> str:
        """Canonical ``name[:k=v,...]`` with every option, defaults included."""
        opts = ",".join(f"{f.name}={getattr(self.config, f.name)}" for f in dataclasses.fields(self.config))
        return f"{self.entry.name}:{opts}" if opts else self.entry.name


@dataclass(frozen=True, slots=True)
class AggregatorPipeline:
    """A validated aggregator: wrappers, then one rule. Build it with
    :func:`parse_aggregator`; call it like ``aggregate`` without the name."""

    wrappers: tuple[Stage[Wrapper], ...]
    rule: Stage[Aggregator]

    @property
    def spec(self) -> str:
        return "+".join([*(s.spec for s in self.wrappers), self.rule.spec])

    def __str__(self) -> str:
        return self.spec

    @property
    def uses_weights(self) -> bool:
        """Whether the final rule uses ``weights`` (wrappers pass them on)."""
        return self.rule.entry.uses_weights

    def check(self, n: int) -> None:
        """Raise :class:`UsageError` unless every stage can run on ``n`` updates."""
        seen = n
        for stage in self.wrappers:
            stage.config.check_n(seen)
            seen = stage.config.out_n(seen)
        try:
            self.rule.config.check_n(seen)
        except UsageError as e:
            if seen == n:
                raise
            stages = "+".join(s.spec for s in self.wrappers)
            raise UsageError(f"{e} (n counts the {seen} inputs that {stages} makes of {n} updates)") from None

    @property
    def uses_reference(self) -> bool:
        """Whether a stage reads the run's trend (``trend``, ``centered-clip:start=previous``):
        callers then pass ``reference``."""
        return any(s.entry.uses_reference for s in self.wrappers) or self.rule.config.reads_reference

    def __call__(
        self,
        updates: Tensor,
        weights: Tensor | None = None,
        *,
        round_index: int = 0,
        reference: Tensor | None = None,
    ) -> Tensor:
        """Aggregate ``updates`` ``(n, d)`` -> ``(d,)``. ``round_index`` seeds bucketing;
        ``reference`` ``(d,)`` is the global model's last step (old minus new parameters),
        which ``trend`` compares each update with and ``centered-clip:start=previous``
        starts from (``None``: no step yet)."""
        return self._run(updates, weights, round_index, reference, with_info=False)[0]

    def with_info(
        self,
        updates: Tensor,
        weights: Tensor | None = None,
        *,
        round_index: int = 0,
        reference: Tensor | None = None,
    ) -> tuple[Tensor, AggregationInfo]:
        """Like calling the pipeline, plus what happened to each of the ``n`` updates."""
        return self._run(updates, weights, round_index, reference, with_info=True)

    def _run(
        self,
        updates: Tensor,
        weights: Tensor | None,
        round_index: int,
        reference: Tensor | None,
        *,
        with_info: bool,
    ) -> tuple[Tensor, AggregationInfo]:
        w = check_updates(updates, weights)
        if reference is not None and tuple(reference.shape) != (updates.shape[1],):
            raise UsageError(
                f"reference must have shape ({updates.shape[1]},) like one update, got {tuple(reference.shape)}"
            )
        self.check(updates.shape[0])
        x, mixes = updates, []
        for stage in self.wrappers:
            mix = stage.entry.fn(x, w, stage.config, round_index=round_index, reference=reference)
            if mix.rows is None:
                x = mix.matrix.to(x.dtype) @ x  # (k, n) @ (n, d) -> (k, d)
            elif mix.rows.numel() < x.shape[0]:
                x = x.index_select(0, mix.rows)  # (n, d) -> (k, d): a selection, no product
            # else: every row kept in order, x passes as it is
            w = mix.weights
            mixes.append(mix)
        rule = self.rule
        if rule.config.reads_reference and rule.entry.fn_reference is not None:
            out, info = rule.entry.fn_reference(x, w, rule.config, with_info=with_info, reference=reference)
        else:
            out, info = rule.entry.fn(x, w, rule.config, with_info=with_info)
        for mix in reversed(mixes):
            info = _through(info, mix)
        return out, info


def _through(info: AggregationInfo, mix: Mixing) -> AggregationInfo:
    """Map a stage's info on its ``k`` inputs back to the ``n`` updates mixed into them."""
    m = mix.matrix  # (k, n)
    used = (m > 0).to(m.dtype)  # (k, n)
    selected = None
    if info.selected is not None:
        selected = used[info.selected].amax(0).nonzero().flatten()  # (s,) ascending
    kept = None
    if info.kept_fraction is not None and mix.partition:
        kept = info.kept_fraction.to(m.dtype) @ used  # (n,) the kept share of its bucket
    weight = None if info.weight is None else info.weight.to(m.dtype) @ m  # (n,)
    return AggregationInfo(selected=selected, kept_fraction=kept, weight=weight)


def _required(cls: type) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _build(entry: Aggregator | Wrapper, options: Mapping[str, object]) -> Any:
    """The stage's config; a missing required option is named (unknown ones first)."""
    kind = "aggregator wrapper" if isinstance(entry, Wrapper) else "aggregator"
    if not set(options) - _field_names(entry.config):
        for name in _required(entry.config):
            if name in options:
                continue
            if isinstance(entry, Wrapper) and name == "f":
                hint = f"give '{entry.name}:f=K' or end with a rule that has f (e.g. '{entry.name}+krum:f=K')"
            else:
                hint = f"e.g. '{entry.name}:{name}=1'"
            raise UsageError(f"{kind} {entry.name!r} needs option {name}; {hint}")
    return build_config(entry.config, options, what=f"{kind} {entry.name!r}")


def parse_aggregator(
    spec: str, options: Mapping[str, Any] | None = None, *, default_f: int | None = None
) -> AggregatorPipeline:
    """Parse and validate ``spec`` once; the result is called every round.

    ``options`` go to the final rule (a key also set in the spec is an error), except an
    ``f`` the rule does not take, which goes to the wrappers that do. ``default_f`` (the
    run's Byzantine count) fills ``f`` in every stage that takes one and was given none;
    stages without ``f`` ignore it."""
    parts = [p.strip() for p in spec.split("+")]
    if any(not p for p in parts):
        raise UsageError(f"empty part in aggregator spec {spec!r}; expected [WRAPPER[:k=v,...]+]...RULE[:k=v,...]")
    parsed = [parse_spec(p, what="aggregator") for p in parts]
    *wrapper_parts, (rule_name, rule_opts) = parsed
    if rule_name in WRAPPERS:
        raise UsageError(
            f"{rule_name!r} is a pre-aggregation wrapper; end the spec with a rule, e.g. "
            f"'{rule_name}+median' (rules: {', '.join(AGGREGATORS)})"
        )
    rule = AGGREGATORS.get(rule_name)
    wrappers: list[tuple[Wrapper, dict[str, object]]] = []
    for name, opts in wrapper_parts:
        if name in AGGREGATORS:
            raise UsageError(
                f"{name!r} is a rule; only wrappers ({', '.join(WRAPPERS)}) may come before '+' in {spec!r}"
            )
        wrappers.append((WRAPPERS.get(name), dict(opts)))

    extra = dict(options or {})
    twice = sorted(set(rule_opts) & set(extra))
    if twice:
        k = twice[0]
        raise UsageError(
            f"aggregator {rule_name!r} option {k!r} given twice: {rule_opts[k]!r} in the spec and {extra[k]!r}"
        )
    rule_takes_f = "f" in _field_names(rule.config)
    wrapper_takes_f = any("f" in _field_names(w.config) for w, _ in wrappers)
    shared_f: Any = None
    if "f" in extra and not rule_takes_f and wrapper_takes_f:
        shared_f = extra.pop("f")  # nnm+centered-clip with f=2: the wrappers' f
    rule_options: dict[str, object] = {**rule_opts, **extra}
    if rule_takes_f and "f" not in rule_options and default_f is not None:
        rule_options["f"] = default_f
    rule_stage = Stage(rule, _build(rule, rule_options))

    inherited = getattr(rule_stage.config, "f", None) if rule_takes_f else shared_f
    if inherited is None:
        inherited = default_f
    stages = []
    for wrapper, wrapper_opts in wrappers:
        if "f" in _field_names(wrapper.config) and "f" not in wrapper_opts and inherited is not None:
            wrapper_opts["f"] = inherited
        stages.append(Stage(wrapper, _build(wrapper, wrapper_opts)))
    return AggregatorPipeline(wrappers=tuple(stages), rule=rule_stage)


def describe_options(config: type) -> str:
    """``"f: int (required), m: int | None = None"`` for ``--help`` and errors."""
    hints = typing.get_type_hints(config)
    out = []
    for f in dataclasses.fields(config):
        tp = hints[f.name]
        name = tp.__name__ if isinstance(tp, type) else str(tp)
        if f.default is dataclasses.MISSING:
            out.append(f"{f.name}: {name} (required)")
        else:
            out.append(f"{f.name}: {name} = {f.default}")
    return ", ".join(out) or "no options"


def describe_aggregators() -> str:
    """Every rule and wrapper with its options, defaults and use of weights, one per line."""
    lines = ["rules (the last part of a spec):"]
    for name in AGGREGATORS:
        a = AGGREGATORS.get(name)
        weights = "uses weights" if a.uses_weights else "ignores weights"
        lines.append(f"  {name}: {describe_options(a.config)}; {weights}. {a.summary}")
    lines.append("wrappers (before '+', applied left to right; nnm takes the rule's f unless given its own):")
    for name in WRAPPERS:
        w = WRAPPERS.get(name)
        lines.append(f"  {name}: {describe_options(w.config)}. {w.summary}")
    return "\n".join(lines)


def aggregate(name: str, updates: Tensor, weights: Tensor | None = None, **params: Any) -> Tensor:
    """Aggregate ``updates`` ``(n, d)`` with spec ``name``; returns ``(d,)``."""
    return parse_aggregator(name, params)(updates, weights)


def aggregate_with_info(
    name: str, updates: Tensor, weights: Tensor | None = None, **params: Any
) -> tuple[Tensor, AggregationInfo]:
    """Like :func:`aggregate`, plus each update's selection / kept fraction / weight."""
    return parse_aggregator(name, params).with_info(updates, weights)
