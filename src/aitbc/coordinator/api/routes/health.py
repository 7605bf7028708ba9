from __future__ import annotations

import time

from fastapi import APIRouter

from aitbc import __version__

router = APIRouter(tags=["health"])


@router.get("/health")
def health() -> dict:
    """Liveness of the coordinator, and its clock (clients sign with timestamps)."""
    return {"status": "ok", "version": __version__, "time": time.time()}
