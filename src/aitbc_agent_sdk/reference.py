"""The SDK's API reference, generated from the docstrings and the returned models' fields
(:mod:`~aitbc_agent_sdk.reference_models`): ``python -m aitbc_agent_sdk.reference`` prints it
as Markdown (``docs/SDK.md`` is this output; a test keeps them equal)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from aitbc_agent_sdk import errors
from aitbc_agent_sdk.clients import Agent
from aitbc_agent_sdk.config import AgentConfig
from aitbc_agent_sdk.operations import OPERATIONS
from aitbc_agent_sdk.protocol import PROGRESS_DOC
from aitbc_agent_sdk.reference_models import render_models
from aitbc_agent_sdk.stub import parameters, returns


def _doc(obj: object) -> str:
    return inspect.cleandoc(obj.__doc__ or "(no description)")


def _signature(name: str, fn: Callable[..., Any]) -> str:
    return f"{name}({', '.join(parameters(fn, defaults=True))}) -> {returns(fn)}"


def render() -> str:
    out = [
        "# `aitbc_agent_sdk` API reference",
        "",
        "Generated from the docstrings by `python -m aitbc_agent_sdk.reference`; do not edit by hand.",
        "",
        _doc(__import__("aitbc_agent_sdk")),
        "",
        "## `AgentConfig`",
        "",
        "```python",
        f"AgentConfig{inspect.signature(AgentConfig)}",
        "```",
        "",
        _doc(AgentConfig),
        "",
        "## Methods of `Agent` and `AsyncAgent`",
        "",
        "Both clients have every method below with the same signature; on `AsyncAgent` each is `async def`.",
        "",
    ]
    for name in sorted(OPERATIONS):
        out += [
            f"### `{name}`",
            "",
            "```python",
            _signature(name, OPERATIONS[name]),
            "```",
            "",
            _doc(getattr(Agent, name)),
            "",
        ]
    out += render_models()
    out += [
        "## Progress",
        "",
        "```python",
        "Progress = Callable[[str, int, int], None]  # aitbc_agent_sdk.Progress",
        "```",
        "",
        inspect.cleandoc(PROGRESS_DOC),
        "",
    ]
    out += ["## Errors", ""]
    for name, cls in sorted(vars(errors).items()):
        if isinstance(cls, type) and issubclass(cls, errors.AgentError):
            bases = ", ".join(b.__name__ for b in cls.__bases__)
            out += [f"### `{name}` ({bases})", "", _doc(cls), ""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
