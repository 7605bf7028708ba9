"""A provider's offer on the market and its heartbeats."""

from __future__ import annotations

from pydantic import Field

from aitbc.replies.base import JsonObject, Reply
from aitbc.states import OfferStatus


class OfferView(Reply):
    worker_id: str
    gpu_type: str
    price: float = Field(description="AIT per round, a number (price_micro / 1e6)")
    price_micro: int = Field(description="the exact price in micro-AIT")
    reputation: float
    availability: float
    status: OfferStatus
    live: bool
    last_heartbeat: float
    max_bond: str
    max_params: int | None = Field(
        None, description="the largest model this provider trains, in parameters (none: no stated limit)"
    )
    last_heartbeat_age: float
    device: JsonObject
    flags: int


class MarketOffer(OfferView):
    busy: bool = Field(description="hired by or working for a run that has not ended")


class Heartbeat(Reply):
    ok: bool
    time: float
    version: int
