"""The type stub of the agents' methods: ``python -m aitbc_agent_sdk.stub`` prints
``_methods.pyi``, generated from :data:`~aitbc_agent_sdk.operations.OPERATIONS` (``--write``
writes it; a test keeps the file equal to this output).

``Agent`` and ``AsyncAgent`` get their methods at import, which type checkers and IDEs
cannot see; under ``TYPE_CHECKING`` they inherit them from the stub's ``AgentMethods`` and
``AsyncAgentMethods`` instead: the operation's parameters, what it returns (``Op[T]``
becomes ``T``; ``async def`` on the async side) and its docstring."""

from __future__ import annotations

import builtins
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel

import aitbc.replies
from aitbc_agent_sdk import clients as _clients  # noqa: F401 - registers every operation
from aitbc_agent_sdk import results, use
from aitbc_agent_sdk.operations import OPERATIONS

STUB = Path(__file__).with_name("_methods.pyi")


def _models(*modules: ModuleType) -> dict[str, str]:
    """The models the modules define (what the agents return), by name: their module."""
    return {
        name: m.__name__
        for m in modules
        for name, obj in vars(m).items()
        if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == m.__name__
    }


_REPLIES = [importlib.import_module(f"aitbc.replies.{m.name}") for m in pkgutil.iter_modules(aitbc.replies.__path__)]
# Names an annotation may use besides builtins: the stub imports exactly these.
IMPORTS = {
    "Any": "typing",
    "Decimal": "decimal",
    "Literal": "typing",
    "Mapping": "collections.abc",
    "Sequence": "collections.abc",
    "Path": "pathlib",
    "Progress": "aitbc_agent_sdk.protocol",
    "JsonObject": "aitbc.replies.base",
    **_models(*_REPLIES, results, use),
}
_RETURN = re.compile(r"^Op\[(?P<t>.+)\]$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_STRING = re.compile(r"\"[^\"]*\"|'[^']*'")


def returns(fn: Callable[..., Any]) -> str:
    """``T`` of the operation's ``Op[T]`` return annotation (what the agents return)."""
    ann = inspect.signature(fn).return_annotation
    m = _RETURN.match(ann) if isinstance(ann, str) else None
    if m is None:
        raise TypeError(f"operation {fn.__name__} must be annotated '-> Op[T]', got {ann!r}")
    return m.group("t")


def parameters(fn: Callable[..., Any], *, defaults: bool) -> list[str]:
    """The operation's parameters after the agent, as source text: ``name: type = default``
    (when ``defaults`` is false, as a stub writes them: a literal default as itself, any
    other as ``...``), with ``*`` before the keyword-only ones."""
    out: list[str] = []
    star = False
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        if p.annotation is inspect.Parameter.empty:
            raise TypeError(f"operation {fn.__name__}: parameter {p.name} has no annotation")
        ann = p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)
        if p.kind is p.VAR_POSITIONAL:
            out.append(f"*{p.name}: {ann}")
            star = True
            continue
        if p.kind is p.VAR_KEYWORD:
            out.append(f"**{p.name}: {ann}")
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        text = f"{p.name}: {ann}"
        if p.default is not inspect.Parameter.empty:
            simple = p.default is None or type(p.default) in (bool, int, float, str)
            text += f" = {p.default!r}" if defaults or simple else " = ..."
        out.append(text)
    return out


def _names(fn: Callable[..., Any]) -> set[str]:
    anns = [returns(fn), *(p.split(":", 1)[1].split("=")[0] for p in parameters(fn, defaults=False) if ":" in p)]
    return {n for a in anns for n in _NAME.findall(_STRING.sub("", a))} - {"None"}


def _docstring(fn: Callable[..., Any], indent: str) -> str:
    doc = inspect.cleandoc(fn.__doc__ or "")
    if '"""' in doc or doc.endswith('"'):
        raise ValueError(f"operation {fn.__name__}: its docstring cannot be quoted in the stub")
    prefix = "r" if "\\" in doc else ""
    lines = doc.splitlines() or [""]
    body = "\n".join((indent + line) if line else "" for line in lines[1:])
    return f'{indent}{prefix}"""{lines[0]}' + (f"\n{body}\n{indent}" if body else "") + '"""'


def _method(name: str, fn: Callable[..., Any], *, asynchronous: bool) -> str:
    params = ", ".join(["self", *parameters(fn, defaults=False)])
    head = f"    {'async ' if asynchronous else ''}def {name}({params}) -> {returns(fn)}:"
    return head + "\n" + _docstring(fn, " " * 8)


def _source() -> str:
    used = set().union(*(_names(fn) for fn in OPERATIONS.values()))
    unknown = sorted(n for n in used if n not in IMPORTS and not hasattr(builtins, n))
    if unknown:
        raise TypeError(f"annotations use {', '.join(unknown)}; add them to aitbc_agent_sdk.stub.IMPORTS")
    by_module: dict[str, list[str]] = {}
    for n in sorted(used & IMPORTS.keys(), key=str.lower):  # as ruff sorts imports
        by_module.setdefault(IMPORTS[n], []).append(n)
    out = [
        "# Generated by `python -m aitbc_agent_sdk.stub --write` from aitbc_agent_sdk.operations.OPERATIONS;",
        "# do not edit. Agent and AsyncAgent (aitbc_agent_sdk.clients) inherit these classes when type",
        "# checked; at run time each method is the operation driven by the client.",
        "",
        *(f"from {m} import {', '.join(ns)}" for m, ns in sorted(by_module.items()) if not m.startswith("aitbc")),
        "",
        *(f"from {m} import {', '.join(ns)}" for m, ns in sorted(by_module.items()) if m.startswith("aitbc")),
        "",
    ]
    for cls, asynchronous in (("AgentMethods", False), ("AsyncAgentMethods", True)):
        kind = "awaitable" if asynchronous else "blocking"
        out += [f"class {cls}:", f'    """The {kind} methods of the agent, one per operation."""', ""]
        for name in sorted(OPERATIONS):
            out += [_method(name, OPERATIONS[name], asynchronous=asynchronous), ""]
    return "\n".join(out)


def render() -> str:
    """The stub's text, formatted as the repository's ``ruff format`` leaves it (so the
    generated file passes the format check)."""
    p = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(STUB), "-"],
        input=_source(),
        capture_output=True,
        text=True,
        check=False,
    )
    if p.returncode != 0:
        raise RuntimeError(f"ruff format failed on the generated stub: {p.stderr.strip()}")
    return p.stdout


if __name__ == "__main__":
    text = render()
    if sys.argv[1:] == ["--write"]:
        STUB.write_text(text)
    else:
        print(text, end="")
