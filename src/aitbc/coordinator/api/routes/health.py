from __future__ import annotations

import time

from fastapi import APIRouter

from aitbc import __version__
from aitbc.coordinator.api.responses import Health

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
def health() -> dict:
    """Liveness of the coordinator, and its clock (clients sign with timestamps)."""
    return {"status": "ok", "version": __version__, "time": time.time()}
