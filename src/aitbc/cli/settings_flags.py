"""Command-line options generated from a service's pydantic-settings class, so a new
setting is one field (``coordinator.config.Settings``, ``worker.config.WorkerSettings``).

Each field a command does not declare itself becomes one option: its flag
(``--field-name``, or the name its :class:`~aitbc.settings.Flag` gives), its help (the
field's description, then its default and its ``AITBC_...`` variable), its type (the
field's, or a float in the flag's unit). Every such option defaults to ``None`` (not
given), so :func:`aitbc.settings.load_settings` lets the environment or the class's
default decide, and its bounds are the class's to check: a bad value is one line naming
the flag. A settings class imports what its checks need (and this module pydantic), so
a command built here is registered through :func:`aitbc.cli.lazy_group.lazy_group`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from aitbc.settings import Flag, env_name

# A command body: its declared options as keywords, and ``flags``: field -> value in the
# field's unit (None: not given).
Body = Callable[..., None]


@dataclass(frozen=True, slots=True)
class SettingFlag:
    """One settings field as a command-line option."""

    field: str
    flag: str
    help: str
    type: Any  # what the parser hands over (a MiB flag of a bytes field: float)
    per: int  # one unit of the flag is this many of the field's
    field_unit: str
    hidden: bool
    min: float | None  # checked by the parser only where the field's Flag says bounded
    max: float | None

    @property
    def error_name(self) -> str:
        """How a refused value given by this flag is named (it is shown in the field's unit)."""
        return self.flag if self.per == 1 else f"{self.flag} (in {self.field_unit})"

    def parameter(self) -> inspect.Parameter:
        option = typer.Option(self.flag, help=self.help, hidden=self.hidden, min=self.min, max=self.max)
        return inspect.Parameter(
            self.field, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[self.type | None, option]
        )

    def value(self, given: Any) -> Any:
        """The field's value from what the parser handed over (None or no items: not given)."""
        if given is None or given == []:
            return None
        return given if self.per == 1 else round(given * self.per)


def setting_flags(cls: type[BaseSettings], *, declared: Collection[str] = ()) -> list[SettingFlag]:
    """An option for each field of ``cls`` but those named in ``declared``, in field order."""
    return [_flag(cls, name, info) for name, info in cls.model_fields.items() if name not in declared]


def flag_names(cls: type[BaseSettings]) -> dict[str, str]:
    """Field -> how a value its flag gave is named in an error (``load_settings``'s ``flag_names``)."""
    return {f.field: f.error_name for f in setting_flags(cls)}


def _flag(cls: type[BaseSettings], name: str, info: FieldInfo) -> SettingFlag:
    meta = next((m for m in info.metadata if isinstance(m, Flag)), Flag())
    bounds = {k: getattr(m, k) for m in info.metadata for k in ("ge", "le") if getattr(m, k, None) is not None}
    default = info.default
    if default is None:
        shown = "none"
    elif meta.per != 1:
        shown = f"{default / meta.per:g} {meta.unit}"
    else:
        shown = str(default)
    return SettingFlag(
        field=name,
        flag=meta.name or "--" + name.replace("_", "-"),
        help=f"{info.description or ''} (default {shown}; env {env_name(cls, name)})".strip(),
        type=float if meta.per != 1 else _parsed_type(info.annotation),
        per=meta.per,
        field_unit=meta.field_unit,
        hidden=meta.hidden,
        min=bounds.get("ge") if meta.bounded else None,
        max=bounds.get("le") if meta.bounded else None,
    )


def _parsed_type(annotation: Any) -> Any:
    """The type the parser reads a field as: the field's, without ``None``; a fixed set of
    words as a plain string (the settings class names the allowed ones when it refuses)."""
    if get_origin(annotation) in (Union, UnionType):
        (annotation,) = [a for a in get_args(annotation) if a is not type(None)]
    return str if get_origin(annotation) is Literal else annotation


def with_setting_flags(body: Body, cls: type[BaseSettings]) -> Callable[..., None]:
    """``body`` as a typer command: its own options (every parameter but ``flags``) and one
    option per field of ``cls`` it does not declare; ``body`` gets ``flags`` in field units."""
    own = [p for p in inspect.signature(body, eval_str=True).parameters.values() if p.name != "flags"]
    table = setting_flags(cls, declared={p.name for p in own})

    @functools.wraps(body)
    def command(**given: Any) -> None:
        flags = {f.field: f.value(given.pop(f.field)) for f in table}
        body(**given, flags=flags)

    params = [*own, *(f.parameter() for f in table)]
    command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command
