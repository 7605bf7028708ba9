"""``aitbc status``: the local stack (:mod:`aitbc.stack`) as recorded, each process alive or
not, the coordinator's health and its live offers."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from aitbc.client import CoordinatorClient
from aitbc.errors import AitbcError
from aitbc.json_value import JSONObject
from aitbc.stack import is_ours, load


class ProcessStatus(TypedDict):
    """One of the stack's processes as recorded, and whether it is still alive."""

    name: str
    role: str
    pid: int
    alive: bool
    log: str
    address: str | None
    gpu: str | None
    price: str | None


class StackStatus(TypedDict):
    """What :func:`status` finds of HOME's stack."""

    home: str
    coordinator: str
    started_at: float
    running: bool
    healthy: bool
    health_error: str | None
    live_offers: int | None
    processes: list[ProcessStatus]


def status(home: Path) -> StackStatus | None:
    """HOME's stack as recorded, each process alive or not, the coordinator's health and
    the live offers; None if HOME has no stack."""
    stack = load(home)
    if stack is None:
        return None
    procs: list[ProcessStatus] = [
        {
            "name": p.name,
            "role": p.role,
            "pid": p.pid,
            "alive": is_ours(p),
            "log": p.log,
            "address": p.address,
            "gpu": p.gpu,
            "price": p.price,
        }
        for p in stack.processes
    ]
    health: JSONObject | None = None
    offers: int | None = None
    error: str | None = None
    try:
        with CoordinatorClient(stack.coordinator, timeout=2.0, ca_cert=stack.ca_cert) as c:
            health = c.get("/health")
            offers = c.get("/market/offers")["count"]
    except AitbcError as e:
        error = str(e)
    return {
        "home": str(home),
        "coordinator": stack.coordinator,
        "started_at": stack.started_at,
        "running": any(p["alive"] for p in procs),
        "healthy": bool(health and health.get("status") == "ok"),
        "health_error": error,
        "live_offers": offers,
        "processes": procs,
    }
