"""The project's error types.

Every error a user can cause is an ``AitbcError``: its message is one line that says
what was wrong and what is allowed. The CLI prints it without a traceback and exits
with ``exit_code`` (2 for bad usage, 1 for a runtime failure).
"""

from __future__ import annotations


class AitbcError(Exception):
    """A runtime failure the user can act on (missing file, corrupt blob, ...)."""

    exit_code = 1


class UsageError(AitbcError, ValueError):
    """A bad option value: unknown name, impossible shape, out-of-range number."""

    exit_code = 2


class NotFoundError(AitbcError, KeyError):
    """A named thing (blob, file, run) does not exist."""

    exit_code = 1

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else ""


class IntegrityError(AitbcError):
    """Content does not match its content address (tampered or corrupt)."""

    exit_code = 1
