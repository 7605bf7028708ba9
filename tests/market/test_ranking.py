"""Offer ranking: the score formula, filters, deterministic order, and field checks."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aitbc.errors import UsageError
from aitbc.market.gpus import GPU_SCORES
from aitbc.market.ranking import (
    NEUTRAL_REPUTATION,
    Offer,
    RankedOffer,
    check_offer_fields,
    offer_score,
    price_score,
    rank_offers,
)

NOW = 1_000_000.0


def offer(worker_id="w", gpu="RTX3090", price=1.0, reputation=NEUTRAL_REPUTATION, availability=1.0, age=0.0):
    return Offer(
        worker_id=worker_id,
        gpu=gpu,
        price=price,
        reputation=reputation,
        availability=availability,
        last_heartbeat=NOW - age,
    )


def test_price_score():
    assert price_score(0.0) == 1.0
    assert price_score(1.0) == 0.5
    assert price_score(3.0) == 0.25


def test_offer_score_hand_computed():
    # Prepare: RTX3090 at 1.2 AIT, neutral reputation, 98% available
    o = offer(gpu="NVIDIA GeForce RTX 3090", price=1.2, reputation=2.5, availability=0.98)

    # Execute
    score = offer_score(o)

    # Assert: 0.4*0.85 + 0.3/2.2 + 0.2*2.5/5 + 0.1*0.98 = 0.34 + 0.13636... + 0.1 + 0.098
    assert score == pytest.approx(0.34 + 0.3 / 2.2 + 0.1 + 0.098)
    assert score == pytest.approx(0.674363636, abs=1e-9)


def test_offer_score_extremes():
    assert offer_score(offer(gpu="H200", price=0.0, reputation=5.0, availability=1.0)) == pytest.approx(1.0)
    # CPU, expensive, no reputation, never up: only the GPU and price terms are left
    assert offer_score(offer(gpu="CPU", price=9.0, reputation=0.0, availability=0.0)) == pytest.approx(0.04 + 0.03)


def test_rank_orders_by_score_and_reports_terms():
    # Prepare
    fast = offer("fast", gpu="RTX4090", price=2.0)
    cheap = offer("cheap", gpu="RTX3070", price=0.0)
    mid = offer("mid", gpu="RTX3090", price=1.0)

    # Execute
    ranked = rank_offers([cheap, mid, fast], now=NOW, max_age=30)

    # Assert: gpu + price + reputation (0.1) + availability (0.1) terms:
    #   cheap 0.26 + 0.3 + 0.2 = 0.76; fast 0.4 + 0.1 + 0.2 = 0.7; mid 0.34 + 0.15 + 0.2 = 0.69
    assert [r.offer.worker_id for r in ranked] == ["cheap", "fast", "mid"]
    assert [r.score for r in ranked] == pytest.approx([0.76, 0.7, 0.69])
    assert ranked[0] == RankedOffer(offer=cheap, score=ranked[0].score, gpu_score=0.65, price_score=1.0)
    assert ranked[1].gpu_score == 1.0 and ranked[1].price_score == pytest.approx(1 / 3)


def test_min_gpu_filter_keeps_equal_and_better():
    # Prepare
    offers = [offer("a", gpu="RTX3070"), offer("b", gpu="RTX3080"), offer("c", gpu="A100"), offer("d", gpu="GTX 1080")]

    # Execute
    ranked = rank_offers(offers, min_gpu="rtx 3080", now=NOW, max_age=30)

    # Assert
    assert sorted(r.offer.worker_id for r in ranked) == ["b", "c"]


def test_unknown_gpu_offer_passes_only_floors_at_or_below_unknown_score():
    offers = [offer("x", gpu="GTX 1080")]

    assert [r.offer.worker_id for r in rank_offers(offers, min_gpu="T4", now=NOW, max_age=30)] == ["x"]
    assert rank_offers(offers, min_gpu="RTX3070", now=NOW, max_age=30) == []


def test_unknown_min_gpu_is_a_usage_error():
    with pytest.raises(UsageError, match=r"^unknown GPU class 'RTX 9999'; known: H100, H200, RTX4090, "):
        rank_offers([offer()], min_gpu="RTX 9999", now=NOW, max_age=30)


def test_stale_heartbeat_filtered_boundary_is_live():
    # Prepare
    offers = [offer("fresh", age=0), offer("edge", age=30), offer("stale", age=30.5), offer("skewed", age=-5)]

    # Execute
    ranked = rank_offers(offers, now=NOW, max_age=30)

    # Assert
    assert sorted(r.offer.worker_id for r in ranked) == ["edge", "fresh", "skewed"]


def test_max_price_filter_is_inclusive():
    offers = [offer("a", price=0.5), offer("b", price=1.0), offer("c", price=1.01)]

    ranked = rank_offers(offers, max_price=1.0, now=NOW, max_age=30)

    assert [r.offer.worker_id for r in ranked] == ["a", "b"]


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_max_price_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="max price must be a finite number >= 0"):
        rank_offers([offer()], max_price=bad, now=NOW, max_age=30)


@pytest.mark.parametrize("bad", [-1.0, math.nan])
def test_bad_max_age_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="max heartbeat age must be >= 0 seconds"):
        rank_offers([offer()], now=NOW, max_age=bad)


def test_ties_break_by_price_then_worker_id():
    # Prepare: equal scores by construction
    #   H100 at 1 AIT:          0.4*1.0 + 0.3*0.5 = 0.55
    #   unknown GPU free, 50%:  0.4*0.5 + 0.3*1.0 + 0.1*0.5 = 0.55
    pricier = offer("a-pricier", gpu="H100", price=1.0, reputation=0.0, availability=0.0)
    free_z = offer("z-free", gpu="GTX 1080", price=0.0, reputation=0.0, availability=0.5)
    free_b = offer("b-free", gpu="GTX 1080", price=0.0, reputation=0.0, availability=0.5)
    assert offer_score(pricier) == offer_score(free_z) == offer_score(free_b) == 0.55

    # Execute
    ranked = rank_offers([pricier, free_z, free_b], now=NOW, max_age=30)

    # Assert
    assert [r.offer.worker_id for r in ranked] == ["b-free", "z-free", "a-pricier"]


def test_rank_is_independent_of_input_order():
    # Prepare
    rng = random.Random(0)
    gpus = ["RTX3070", "RTX3090", "A100", "T4", "GTX 1080"]
    offers = [
        offer(
            f"w{i:02d}", gpu=rng.choice(gpus), price=rng.choice([0.0, 0.5, 1.0]), reputation=rng.choice([0.0, 2.5, 5.0])
        )
        for i in range(40)
    ]
    shuffled = offers[:]
    rng.shuffle(shuffled)

    # Execute
    a = rank_offers(offers, now=NOW, max_age=30)
    b = rank_offers(iter(shuffled), now=NOW, max_age=30)

    # Assert
    assert a == b
    keys = [(-r.score, r.offer.price, r.offer.worker_id) for r in a]
    assert keys == sorted(keys)


def test_check_offer_fields_accepts_valid():
    check_offer_fields("NVIDIA GeForce RTX 3090", 0.0, 0.0)
    check_offer_fields("GTX 1080", 1e6, 1.0)
    check_offer_fields("x" * 64, 3, 1)


@pytest.mark.parametrize("price", [math.nan, -0.01, math.inf, 1e6 + 1, "1.0", True])
def test_check_offer_fields_rejects_price(price):
    with pytest.raises(UsageError) as exc:
        check_offer_fields("RTX3090", price, 0.5)

    assert str(exc.value) == f"price must be a finite number of AIT per round in [0, 1000000], got {price!r}"
    assert exc.value.exit_code == 2


@pytest.mark.parametrize("availability", [math.nan, -0.1, 1.01, None])
def test_check_offer_fields_rejects_availability(availability):
    with pytest.raises(UsageError) as exc:
        check_offer_fields("RTX3090", 1.0, availability)

    assert str(exc.value) == f"availability must be a number in [0, 1], got {availability!r}"


@pytest.mark.parametrize("gpu", ["", "   ", "---", "x" * 65, "RTX\n3090", "RTX\x003090"])
def test_check_offer_fields_rejects_gpu(gpu):
    with pytest.raises(
        UsageError, match=r"^gpu must be a printable name of 1 to 64 characters with a letter or digit, got "
    ):
        check_offer_fields(gpu, 1.0, 0.5)


def test_check_offer_fields_shortens_a_long_gpu_in_the_message():
    with pytest.raises(UsageError) as exc:
        check_offer_fields("y" * 10_000, 1.0, 0.5)

    assert str(exc.value).endswith(repr("y" * 64 + "..."))


gpu_names = st.one_of(st.sampled_from(sorted(GPU_SCORES)), st.text(max_size=20))
prices = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
reputations = st.floats(min_value=0.0, max_value=5.0, allow_nan=False)


@given(gpu=gpu_names, price=prices, reputation=reputations, availability=unit)
def test_score_is_in_unit_interval(gpu, price, reputation, availability):
    score = offer_score(offer(gpu=gpu, price=price, reputation=reputation, availability=availability))

    assert 0.0 <= score <= 1.0


@given(gpu=gpu_names, p1=prices, p2=prices, reputation=reputations, availability=unit)
def test_score_is_non_increasing_in_price(gpu, p1, p2, reputation, availability):
    low, high = sorted((p1, p2))

    cheaper = offer_score(offer(gpu=gpu, price=low, reputation=reputation, availability=availability))
    dearer = offer_score(offer(gpu=gpu, price=high, reputation=reputation, availability=availability))

    assert cheaper >= dearer
