"""Which coordinator holds a run this HOME started, when the URL it was started at is gone.

A run is remembered with its coordinator's URL and id (``/v1/health``'s ``coordinator_id``,
its database's). ``aitbc down`` and ``up`` may move the local stack's coordinator to
another port; the run is then found on the stack's coordinator, but only when that one
is the same coordinator (same id) and has the run: never another coordinator's run under
the same id.
"""

from __future__ import annotations

from pathlib import Path

from aitbc.client import ApiError, CoordinatorClient, ca_cert_path
from aitbc.errors import AitbcError

PROBE_TIMEOUT = 2.0  # s: a health request to a local or nearby coordinator


def identity(url: str, home: Path, ca_cert: str | Path | None = None) -> str | None:
    """The id of the coordinator answering at ``url``; None when nothing answers as one."""
    try:
        with CoordinatorClient(url, timeout=PROBE_TIMEOUT, ca_cert=ca_cert or ca_cert_path(None, home)) as c:
            found = c.get("/health").get("coordinator_id")
    except AitbcError:  # unreachable, not a coordinator, or refused
        return None
    return found if isinstance(found, str) and found else None


def moved_to(home: Path, run_id: str, url: str, coordinator_id: str) -> str | None:
    """The local stack's coordinator URL when the run's coordinator no longer answers at
    ``url`` but is the stack's (the same ``coordinator_id``) and holds ``run_id``; else None
    (the caller keeps ``url``, and its command says what it finds there)."""
    from aitbc import stack as stk  # psutil: only for a run whose URL moved

    if identity(url, home) == coordinator_id:
        return None
    try:
        stack = stk.load(home)
    except stk.StackError:
        return None
    if stack is None or stack.coordinator.rstrip("/") == url.rstrip("/"):
        return None
    if identity(stack.coordinator, home, stack.ca_cert) != coordinator_id:
        return None
    try:
        with CoordinatorClient(stack.coordinator, timeout=PROBE_TIMEOUT, ca_cert=stack.ca_cert) as c:
            c.get(f"/runs/{run_id}")
    except ApiError:  # not there (404): another coordinator's run, or one since deleted
        return None
    except AitbcError:
        return None
    return stack.coordinator
