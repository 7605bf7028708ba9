"""A provider's offer on the market and its heartbeats."""

from __future__ import annotations

from pydantic import Field

from aitbc.replies.base import JsonObject, MicroAIT, Money, Reply
from aitbc.states import OfferStatus


class OfferView(Reply):
    worker_id: str
    gpu_type: str
    price: Money = Field(description="AIT per round it asks")
    price_micro: MicroAIT = Field(description="price in micro-AIT")
    reputation: float
    availability: float
    status: OfferStatus
    live: bool
    last_heartbeat: float
    max_bond: Money = Field(description="the most AIT it posts as bond for one contract")
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
