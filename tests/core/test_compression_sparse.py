"""``topk`` and ``topk-int8``: the k largest magnitudes, Elias-Fano indices."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from aitbc.core.compression import build_codec, decode, read_header
from aitbc.core.compression.sparse import decode_indices, encode_indices, index_bits, topk_count

ratios = st.floats(0.001, 1.0)
vectors = arrays(np.float32, st.integers(0, 300), elements=st.floats(-1e6, 1e6, width=32))


@st.composite
def distinct_magnitudes(draw):
    """Non-zero values whose magnitudes are all different, so the top k is one set."""
    mags = draw(arrays(np.float32, st.integers(1, 300), elements=st.floats(2**-10, 1e6, width=32), unique=True))
    signs = draw(arrays(np.float32, mags.shape, elements=st.sampled_from([-1.0, 1.0])))
    return mags * signs


# --- topk --------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(a=distinct_magnitudes(), ratio=ratios)
def test_topk_keeps_exactly_the_k_largest_magnitudes(a, ratio):
    x = torch.from_numpy(a)
    k = topk_count(x.numel(), ratio)

    y = decode(build_codec("topk", {"ratio": ratio}).encode(x))

    kept = torch.argsort(x.abs(), descending=True)[:k]
    expected = torch.zeros_like(x)
    expected[kept] = x[kept]
    assert torch.equal(y, expected)


@settings(max_examples=60, deadline=None)
@given(a=vectors, ratio=ratios)
def test_topk_with_ties_and_zeros(a, ratio):
    x = torch.from_numpy(a)
    k = topk_count(x.numel(), ratio)

    y = decode(build_codec("topk", {"ratio": ratio}).encode(x))

    assert ((y == x) | (y == 0)).all()  # kept values are exact, the rest zero
    assert int((y != 0).sum()) <= k
    if k:
        t = x.abs().sort(descending=True).values[k - 1]  # the k-th largest magnitude
        assert (y[x.abs() > t] == x[x.abs() > t]).all()
        assert (y[x.abs() < t] == 0).all()


@settings(max_examples=60, deadline=None)
@given(a=distinct_magnitudes(), ratio=ratios)
def test_topk_int8_kept_values_are_within_half_a_step(a, ratio):
    x = torch.from_numpy(a)
    k = topk_count(x.numel(), ratio)

    y = decode(build_codec("topk-int8", {"ratio": ratio}).encode(x)).double()

    exact = decode(build_codec("topk", {"ratio": ratio}).encode(x)).double()
    kept = exact != 0
    scale = exact.abs().max() / 127  # one scale: the largest kept magnitude / 127
    assert int(kept.sum()) == k
    assert ((y - exact).abs()[kept] <= scale / 2 * (1 + 1e-4)).all()
    assert (y[~kept] == 0).all()


@pytest.mark.parametrize(
    ("d", "ratio", "k"), [(0, 0.5, 0), (1, 0.001, 1), (10, 0.25, 3), (1000, 0.01, 10), (7, 1.0, 7)]
)
def test_k_is_round_ratio_d_and_at_least_one(d, ratio, k):
    assert topk_count(d, ratio) == k


def test_ratio_one_is_lossless():
    x = torch.randn(257, generator=torch.Generator().manual_seed(0))

    assert torch.equal(decode(build_codec("topk", {"ratio": 1.0}).encode(x)), x)


def test_nan_is_kept_first_so_the_aggregator_sees_it():
    x = torch.tensor([1.0, float("nan"), -3.0, 2.0])

    y = decode(build_codec("topk", {"ratio": 0.25}).encode(x))

    assert y[1].isnan() and (y[[0, 2, 3]] == 0).all()


# --- Elias-Fano indices ------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5000).flatmap(lambda d: st.tuples(st.just(d), st.sets(st.integers(0, d - 1), max_size=200))))
def test_index_code_round_trips_in_its_stated_bits(case):
    d, chosen = case
    idx = np.array(sorted(chosen), dtype=np.int64)

    raw = encode_indices(idx, d)

    assert len(raw) == math.ceil(index_bits(d, idx.size) / 8)
    assert np.array_equal(decode_indices(np.frombuffer(raw, np.uint8), d, idx.size), idx)


def test_index_code_is_near_the_information_bound():
    d, k = 1_000_000, 10_000

    bits = index_bits(d, k)

    assert bits == k * (6 + 1) + (d >> 6)  # l = floor(log2(100)) = 6
    assert bits / k < 2 + math.log2(d / k)  # 8.56 bits an index
    assert bits / k < 1.5 + math.log2(math.comb(d, k)) / k  # log2 C(d, k) / k = 8.07


def test_topk_payload_is_values_then_index_bits():
    x = torch.tensor([0.0, 5.0, 0.0, 0.0, -6.0, 0.0, 0.0, 1.0])

    payload = read_header(build_codec("topk", {"ratio": 0.25}).encode(x))[1]

    assert np.frombuffer(payload[:8], "<f4").tolist() == [5.0, -6.0]  # by index, not magnitude
    # d=8, k=2: l=2 low bits each (01, 00), then high parts 0, 1 in unary -> 1 0 1 0 0 0 (k + d>>2 = 4 bits)
    assert np.unpackbits(np.frombuffer(payload[8:], np.uint8))[: index_bits(8, 2)].tolist() == [0, 1, 0, 0, 1, 0, 1, 0]


@pytest.mark.parametrize(
    ("bits", "message"),
    [
        # d=10, k=2: l=2 low bits per index, then k + (d >> 2) = 4 high bits
        ([1, 1, 1, 1, 1, 1, 0, 0], "strictly increasing"),  # 3, 3
        ([1, 1, 1, 0, 1, 1, 0, 0], "strictly increasing"),  # 3, 2
        ([0, 1, 1, 1, 1, 0, 0, 1], "below d=10"),  # 1, 11
        ([0, 1, 1, 1, 1, 0, 1, 1], "3 high bits set, expected k=2"),
        ([0, 1, 1, 1, 0, 0, 0, 0], "0 high bits set, expected k=2"),
    ],
    ids=["duplicate", "unsorted", "out-of-range", "too-many", "none"],
)
def test_index_decoder_rejects_invalid_sets(bits, message):
    raw = np.packbits(np.array(bits, dtype=np.uint8))

    with pytest.raises(ValueError, match=message):
        decode_indices(raw, 10, 2)
