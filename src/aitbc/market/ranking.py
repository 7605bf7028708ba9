"""Ranking provider offers for ``discover-workers``.

Pure functions over offer records: no I/O, no clock (the caller passes ``now``). The
coordinator stores offers, checks what a provider sends with ``check_offer_fields``, and
calls ``rank_offers`` to choose whom to hire.

An offer's score, each term in ``[0, 1]``, weights in the design's order of importance::

    score = 0.4 * gpu_score(gpu) + 0.3 / (price + 1) + 0.2 * reputation / 5 + 0.1 * availability

``price`` is AIT per round; ``reputation`` is in ``[0, 5]`` (``NEUTRAL_REPUTATION`` for a
worker with no history yet); ``availability`` is the fraction of time the worker was up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from aitbc.errors import UsageError
from aitbc.market.gpus import check_gpu_class, gpu_score

NEUTRAL_REPUTATION = 2.5
MAX_PRICE = 1e6
MAX_GPU_NAME = 64

W_GPU, W_PRICE, W_REPUTATION, W_AVAILABILITY = 0.4, 0.3, 0.2, 0.1


@dataclass(frozen=True, slots=True)
class Offer:
    """A worker's standing offer as the coordinator stores it (fields checked on entry)."""

    worker_id: str
    gpu: str
    price: float  # AIT per round, >= 0
    reputation: float  # 0..5
    availability: float  # 0..1
    last_heartbeat: float  # unix seconds
    max_params: int | None = None  # the largest model it trains (market.capacity); None: not stated


@dataclass(frozen=True, slots=True)
class RankedOffer:
    offer: Offer
    score: float
    gpu_score: float
    price_score: float


def price_score(price: float) -> float:
    """``1 / (price + 1)``: 1 for a free offer, falling towards 0; needs ``price >= 0``."""
    return 1.0 / (price + 1.0)


def _score(gpu: float, price: float, offer: Offer) -> float:
    return W_GPU * gpu + W_PRICE * price + W_REPUTATION * offer.reputation / 5.0 + W_AVAILABILITY * offer.availability


def offer_score(offer: Offer) -> float:
    """The offer's score in ``[0, 1]`` (see the module docstring)."""
    return _score(gpu_score(offer.gpu), price_score(offer.price), offer)


def rank_offers(
    offers: Iterable[Offer],
    *,
    min_gpu: str | None = None,
    max_price: float | None = None,
    now: float,
    max_age: float,
) -> list[RankedOffer]:
    """The live offers that pass the filters, best first.

    Kept: ``gpu_score(gpu) >= gpu_score(min_gpu)`` (``min_gpu`` must be a known class),
    ``price <= max_price``, and ``now - last_heartbeat <= max_age`` (a heartbeat from
    the future, clock skew, counts as live). Order: score descending, then price
    ascending, then ``worker_id`` ascending, so equal inputs always rank the same.
    """
    floor = gpu_score(check_gpu_class(min_gpu)) if min_gpu is not None else None
    if max_price is not None and not (max_price >= 0 and math.isfinite(max_price)):
        raise UsageError(f"max price must be a finite number >= 0, got {max_price!r}")
    if not (max_age >= 0):  # also rejects NaN; inf means "any heartbeat"
        raise UsageError(f"max heartbeat age must be >= 0 seconds, got {max_age!r}")

    ranked: list[RankedOffer] = []
    for offer in offers:
        if now - offer.last_heartbeat > max_age:
            continue
        if max_price is not None and offer.price > max_price:
            continue
        g = gpu_score(offer.gpu)
        if floor is not None and g < floor:
            continue
        p = price_score(offer.price)
        ranked.append(RankedOffer(offer=offer, score=_score(g, p, offer), gpu_score=g, price_score=p))
    ranked.sort(key=lambda r: (-r.score, r.offer.price, r.offer.worker_id))
    return ranked


def _short(text: str) -> str:
    return repr(text if len(text) <= MAX_GPU_NAME else text[:MAX_GPU_NAME] + "...")


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_offer_fields(gpu: str, price: float, availability: float) -> None:
    """Check what a provider sends; ``UsageError`` names the field and its allowed range."""
    if (
        not isinstance(gpu, str)
        or not gpu.strip()
        or len(gpu) > MAX_GPU_NAME
        or not gpu.isprintable()
        or not any(c.isalnum() for c in gpu)
    ):
        shown = _short(gpu) if isinstance(gpu, str) else repr(gpu)
        raise UsageError(
            f"gpu must be a printable name of 1 to {MAX_GPU_NAME} characters with a letter or digit, got {shown}"
        )
    if not (_is_number(price) and math.isfinite(price) and 0 <= price <= MAX_PRICE):
        raise UsageError(f"price must be a finite number of AIT per round in [0, {MAX_PRICE:.0f}], got {price!r}")
    if not (_is_number(availability) and 0 <= availability <= 1):
        raise UsageError(f"availability must be a number in [0, 1], got {availability!r}")
