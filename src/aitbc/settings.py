"""Settings from three places, in one order: a flag given on the command line wins over an
``AITBC_...`` environment variable, which wins over the default written in the settings
class (the only place a default lives).

Each service has one pydantic-settings class (``coordinator.config.Settings``,
``worker.config.WorkerSettings``); :func:`load_settings` builds it from the flags that
were given and turns a bad value into one :class:`~aitbc.errors.UsageError` line naming
the flag or the environment variable it came from and what is allowed. A field's
``description`` is its flag's help; a :class:`Flag` in its annotation says how the flag
differs from ``--field-name`` (``aitbc.cli.settings_flags`` builds the flags from both).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsError

from aitbc.errors import UsageError

S = TypeVar("S", bound=BaseSettings)

KIB = 1 << 10
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Flag:
    """How a settings field is given on the command line, where that is not ``--field-name``
    in the field's own unit: ``Annotated[int, Flag("--max-blob-mb", per=MIB, unit="MiB")]``."""

    name: str | None = None  # the flag (None: --field-name)
    per: int = 1  # one unit of the flag is this many of the field's (a MiB flag: 1 << 20 bytes)
    unit: str = ""  # the flag's unit, where per is not 1 (its default is shown in it)
    field_unit: str = ""  # the field's unit, where per is not 1 (a refused value is shown in it)
    hidden: bool = False  # testing knobs: left out of --help
    bounded: bool = False  # the parser checks the field's ge/le bounds (and --help shows the range)


def env_name(cls: type[BaseSettings], field: str) -> str:
    """The environment variable that sets ``field`` of ``cls`` (``AITBC_LEASE_SECONDS``)."""
    return f"{cls.model_config.get('env_prefix', '')}{field}".upper()


def load_settings(cls: type[S], flags: Mapping[str, Any], *, flag_names: Mapping[str, str] | None = None) -> S:
    """``cls`` from the flags that were given (``None``: not given, so the environment or
    the default decides). ``flag_names`` maps a field to its flag where the two differ
    (``lease_seconds`` -> ``--lease``); otherwise the flag is ``--field-name``."""
    given = {k: v for k, v in flags.items() if v is not None}
    names = flag_names or {}
    try:
        return cls(**given)
    except ValidationError as e:
        raise UsageError("; ".join(_describe(cls, err, given, names) for err in e.errors())) from None
    except SettingsError as e:  # an environment value pydantic-settings could not even parse
        raise UsageError(str(e).splitlines()[0]) from None


def _describe(cls: type[BaseSettings], err: Any, given: Mapping[str, Any], names: Mapping[str, str]) -> str:
    field = str(err["loc"][0]) if err["loc"] else ""
    flag = names.get(field, "--" + field.replace("_", "-"))
    if err["type"] == "missing":
        return f"{field} is required: give {flag} or set {env_name(cls, field)}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    msg = msg[:1].lower() + msg[1:]
    if field in given:
        return f"{flag} {err['input']!r} is not allowed: {msg}"
    return f"{env_name(cls, field)}={err['input']!r} is not allowed: {msg}"
