"""The reference's "Returned structures": every model an agent's method returns, and every
model nested in one, with its keys, their types and their meaning, read from the models
themselves (their fields, annotations and ``Field(description=...)``), so the reference
lists exactly the keys the SDK returns."""

from __future__ import annotations

import enum
import importlib
import inspect
import re
import types
import typing
from typing import Any

from pydantic import BaseModel, WithJsonSchema
from pydantic.fields import FieldInfo

from aitbc.units import AIT
from aitbc_agent_sdk.operations import OPERATIONS
from aitbc_agent_sdk.stub import IMPORTS, returns

_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")

MONEY_NOTE = """\
Every method returns a typed model (or a list of them): read it by attribute
(``pay.escrowed``) or, as the JSON object the coordinator sent, by key (``pay["escrowed"]``).
Below, each model's keys in order. Money is one type everywhere: an amount of AIT is an
``AIT``, a ``decimal.Decimal`` (exact: ``paid + due`` is to the micro-AIT; mixed with a
float it gives a float, as an int does), written as a decimal string of AIT (``"32.8"``) on
the wire and by ``model_dump(mode="json")`` and the CLI's ``--json``. A key ending in
``_micro`` is the same amount in integer micro-AIT (1 AIT = 1000000), kept for clients of
earlier releases; a ledger entry's ``amount`` is in micro-AIT too, as it was signed."""


def _model(name: str) -> type[BaseModel] | None:
    module = IMPORTS.get(name)
    obj = getattr(importlib.import_module(module), name, None) if module else None
    return obj if isinstance(obj, type) and issubclass(obj, BaseModel) else None


def _nested(ann: object) -> list[type[BaseModel]]:
    """The models an annotation names, at any depth (``list[X] | None``)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for a in typing.get_args(ann) for m in _nested(a)]


def returned_models() -> list[type[BaseModel]]:
    """Every model an operation returns or one of those holds, by name."""
    seen: dict[str, type[BaseModel]] = {}
    todo = [m for fn in OPERATIONS.values() for n in _NAME.findall(returns(fn)) if (m := _model(n))]
    while todo:
        m = todo.pop()
        if m.__name__ not in seen:
            seen[m.__name__] = m
            todo += [n for f in m.model_fields.values() for n in _nested(f.annotation)]
    return [seen[n] for n in sorted(seen)]


def _micro(f: FieldInfo) -> bool:
    return any(isinstance(m, WithJsonSchema) and "micro-AIT" in str(m.json_schema) for m in f.metadata)


def type_text(ann: Any) -> str:
    """An annotation as the reference shows it: ``AIT``, ``list[WorkerPay]``, ``float | null``."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return "int (micro-AIT)" if args[0] is int else type_text(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else type_text(a) for a in args)
    if origin is not None:
        name = "object" if origin is dict and args == (str, Any) else origin.__name__
        return name if name == "object" else f"{name}[{', '.join(type_text(a) for a in args)}]"
    if ann is AIT:
        return "AIT"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return f"`{ann.__name__}`"
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return " | ".join(f'"{e.value}"' for e in ann)
    return getattr(ann, "__name__", str(ann))


def _row(name: str, f: FieldInfo) -> str:
    kind = "int (micro-AIT)" if f.annotation is int and _micro(f) else type_text(f.annotation)
    meaning = " ".join((f.description or "").split())
    cells = [f"`{f.alias or name}`", kind, meaning]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def render_models() -> list[str]:
    out = ["## Returned structures", "", MONEY_NOTE, ""]
    for m in returned_models():
        out += [f"### `{m.__name__}`", ""]
        if m.__dict__.get("__doc__"):
            out += [inspect.cleandoc(m.__doc__ or ""), ""]
        fields = [(n, f) for n, f in m.model_fields.items() if not f.exclude]
        if fields:
            out += ["| key | type | meaning |", "| --- | --- | --- |", *(_row(n, f) for n, f in fields), ""]
    return out
