"""The marketplace's pure logic: GPU classes and scores, offer checks and ranking.

No I/O and no database here: the coordinator stores offers and calls these functions.
``detect_device`` is the one exception, used by the worker to describe its own hardware
(it imports torch only when called).
"""

from __future__ import annotations

from aitbc.market.gpus import (
    GPU_SCORES,
    UNKNOWN_GPU_SCORE,
    check_gpu_class,
    detect_device,
    gpu_score,
    known_gpu_classes,
    normalize_gpu,
)
from aitbc.market.ranking import (
    NEUTRAL_REPUTATION,
    Offer,
    RankedOffer,
    check_offer_fields,
    offer_score,
    price_score,
    rank_offers,
)

__all__ = [
    "GPU_SCORES",
    "NEUTRAL_REPUTATION",
    "UNKNOWN_GPU_SCORE",
    "Offer",
    "RankedOffer",
    "check_gpu_class",
    "check_offer_fields",
    "detect_device",
    "gpu_score",
    "known_gpu_classes",
    "normalize_gpu",
    "offer_score",
    "price_score",
    "rank_offers",
]
