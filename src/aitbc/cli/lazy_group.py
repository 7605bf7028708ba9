"""A typer group whose listed commands are built only when named, for commands whose
options are generated from a class that is costly to import (a service's settings).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperGroup


def lazy_group(**commands: Callable[[], Callable[..., None]]) -> type[TyperGroup]:
    """A typer group class with extra commands built only when looked up (run, completed, or
    listed by ``--help``): ``name=maker``, ``maker()`` the command's callback. They come
    first, before the group's other commands."""

    class LazyGroup(TyperGroup):
        def list_commands(self, ctx: Any) -> list[str]:
            return [*commands, *super().list_commands(ctx)]

        def get_command(self, ctx: Any, cmd_name: str) -> Any:
            if cmd_name in commands:
                return _built(cmd_name, commands[cmd_name])
            return super().get_command(ctx, cmd_name)

    return LazyGroup


@functools.cache
def _built(name: str, maker: Callable[[], Callable[..., None]]) -> Any:
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    one.command(name)(maker())
    return typer.main.get_command(one)
