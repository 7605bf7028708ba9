"""Which owner-named code (``package.module:callable`` models) a machine may import.

Nothing by default: a module being importable is not consent. An operator allows module
prefixes (``aitbc coordinator serve --allow-code mypkg``, ``aitbc worker start
--allow-code mypkg``); ``aitbc simulate`` runs the user's own code on the user's own
machine and allows any (``True``). No torch here: the settings classes import it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

AllowCode = Sequence[str] | bool
"""Module prefixes this machine's operator allowed (``"mypkg"`` allows ``mypkg:f`` and
``mypkg.models:f``, not ``mypkgx:f``), or ``True`` for any module."""

_PREFIX_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def code_allowed(name: str, allow_code: AllowCode) -> bool:
    """True if ``module:callable`` ``name`` may be imported here."""
    if allow_code is True:
        return True
    if allow_code is False:
        return False
    module = name.partition(":")[0]
    return any(module == p or module.startswith(p + ".") for p in allow_code)


def check_prefixes(prefixes: list[str]) -> list[str]:
    """The prefixes, each a dotted module path (``mypkg``, ``mypkg.models``);
    ``ValueError`` naming a bad one (``*``, ``os:system``, an empty string, ...)."""
    for p in prefixes:
        if not isinstance(p, str) or _PREFIX_RE.fullmatch(p) is None:
            raise ValueError(f"allow-code prefix {p!r} is not a dotted module path such as mypkg or mypkg.models")
    return prefixes
