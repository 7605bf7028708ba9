from __future__ import annotations

import time

from fastapi import APIRouter

from aitbc import __version__
from aitbc.coordinator.api.deps import CtxDep
from aitbc.replies.health import Health

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
def health(ctx: CtxDep) -> Health:
    """Liveness of the coordinator, and its clock (clients sign with timestamps); which
    replica answered and whether it drives the rounds (several coordinators on one database)."""
    now = time.time()
    return Health(
        status="ok",
        version=__version__,
        time=now,
        replica=ctx.lease.me,
        driving=ctx.lease.holds(),
        coordinator_id=ctx.coordinator_id,
    )
