"""Typed component configs built from ``key=value`` option strings.

Every component (model, optimizer, codec, aggregator, ...) takes one dataclass config.
Options arrive from the edge (CLI flags, JSON) as strings or plain values; this module
converts them to the field types and rejects unknown keys with an error that lists the
allowed ones.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from aitbc.errors import UsageError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")


def parse_kv(pairs: Iterable[str], *, what: str) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``; also accepts ``"a=1,b=x"`` items."""
    out: dict[str, str] = {}
    for item in pairs:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"bad {what} option {part!r}; expected KEY=VALUE")
            out[key.strip().replace("-", "_")] = value.strip()
    return out


def _convert(value: Any, tp: Any, *, name: str, what: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise UsageError(f"{what} option {name}={value!r} must be one of: {', '.join(map(str, allowed))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        none = value is None or (isinstance(value, str) and value.lower() in ("none", "null", ""))
        if none and type(None) in typing.get_args(tp):
            return None
        for arg in args[:-1]:  # the first type that takes the value (float | Literal["auto"])
            try:
                return _convert(value, arg, name=name, what=what)
            except UsageError:
                continue
        try:
            return _convert(value, args[-1], name=name, what=what)
        except UsageError:
            if len(args) == 1:
                raise
            kinds = " or ".join(_describe(a) for a in args)
            raise UsageError(f"{what} option {name}={value!r} must be {kinds}") from None
    if origin is tuple:
        (inner, *_rest) = typing.get_args(tp)
        items: Sequence[Any]
        if isinstance(value, str):
            items = value.replace("x", " ").replace(":", " ").split()
        elif isinstance(value, (list, tuple)):
            items = value
        else:
            items = [value]
        return tuple(_convert(v, inner, name=name, what=what) for v in items)
    if not isinstance(value, str):
        if isinstance(value, bool) and tp is not bool:
            raise UsageError(f"{what} option {name}={value!r} must be {tp.__name__}, not a boolean")
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, tp):
            return value
        raise UsageError(f"{what} option {name}={value!r} must be {tp.__name__}")
    try:
        if tp is bool:
            low = value.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        return tp(value)
    except ValueError:
        raise UsageError(f"{what} option {name}={value!r} must be {tp.__name__}") from None


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return " or ".join(map(str, typing.get_args(tp)))
    return getattr(tp, "__name__", str(tp))


def build_config(cls: type[C], options: Mapping[str, Any] | None, *, what: str) -> C:
    """Instantiate dataclass ``cls`` from ``options``; unknown keys and bad types are errors."""
    options = dict(options or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(options) - set(fields))
    if unknown:
        allowed = ", ".join(fields) or "none"
        raise UsageError(f"unknown {what} option {unknown[0]!r}; allowed: {allowed}")
    kwargs = {k: _convert(v, hints[k], name=k, what=what) for k, v in options.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{what}: {e}") from None


def parse_spec(text: str, *, what: str) -> tuple[str, dict[str, str]]:
    """``"trimmed-mean:beta=0.25"`` -> ``("trimmed-mean", {"beta": "0.25"})``.

    The CLI names a component and its options in one string: ``NAME`` or
    ``NAME:KEY=VALUE[,KEY=VALUE...]``. Option keys use ``_`` or ``-`` alike."""
    name, _, rest = text.strip().partition(":")
    if not name:
        raise UsageError(f"empty {what} name in {text!r}; expected NAME or NAME:KEY=VALUE,...")
    return name, parse_kv([rest], what=what) if rest else {}
