"""``int8`` and ``int4``: per-chunk absmax scales, error <= scale / 2 in every chunk."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from aitbc.core.compression import build_codec, decode, read_header

LEVELS = {"int8": 127, "int4": 7}
BOUND = float(np.float32(1e30))

vectors = arrays(np.float32, st.integers(0, 300), elements=st.floats(-BOUND, BOUND, width=32))


def chunk_scales(x: np.ndarray, chunk: int, levels: int) -> np.ndarray:
    """The per-element scale absmax(chunk) / L, computed independently in float64."""
    a = np.abs(x.astype(np.float64))
    c = math.ceil(len(a) / chunk)
    padded = np.zeros(c * chunk)
    padded[: len(a)] = a
    return np.repeat(padded.reshape(c, chunk).max(axis=1) / levels, chunk)[: len(a)]  # (c,) -> (d,)


@pytest.mark.parametrize("name", ["int8", "int4"])
@settings(max_examples=60, deadline=None)
@given(a=vectors, chunk=st.integers(1, 70))
def test_error_is_at_most_half_a_step_of_the_chunk_scale(name, a, chunk):
    x = torch.from_numpy(a)

    y = decode(build_codec(name, {"chunk_size": chunk}).encode(x)).double().numpy()

    scale = chunk_scales(a, chunk, LEVELS[name])
    # float32 arithmetic adds a few ulps of absmax, and the subnormal range a step of 2**-149
    assert np.all(np.abs(y - a) <= scale / 2 + scale * 1e-4 + 1e-42)


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_chunk_absmax_is_exact(name):
    # Prepare: two chunks of 4, each with its own largest magnitude
    x = torch.tensor([0.5, -2.0, 1.0, 0.0, 30.0, 3.0, -7.5, 1.5])

    y = decode(build_codec(name, {"chunk_size": 4}).encode(x))

    assert y[1] == -2.0 and y[4] == 30.0  # the absmax of each chunk is a code +-L
    assert y[3] == 0.0
    if name == "int4":  # steps 2/7 and 30/7; 1.0 is 3.5 steps, rounded to even
        assert torch.allclose(y, torch.tensor([2, -7, 4, 0, 7, 1, -2, 0]) * torch.tensor([2 / 7] * 4 + [30 / 7] * 4))


def test_int4_packs_two_values_a_byte_low_nibble_first():
    x = torch.tensor([7.0, -7.0, 0.0])  # codes 7, -7, 0 -> nibbles 15, 1, 8 (+ pad 8)

    payload = read_header(build_codec("int4", {"chunk_size": 4}).encode(x))[1]

    assert payload[:4] == np.float32(1.0).tobytes()  # one scale, 7 / 7
    assert payload[4:] == bytes([15 | 1 << 4, 8 | 8 << 4])


def test_int8_layout_scales_then_codes():
    x = torch.tensor([127.0, -63.5, 0.0, 254.0, 1.0])

    payload = read_header(build_codec("int8", {"chunk_size": 3}).encode(x))[1]

    scales = np.frombuffer(payload[:8], "<f4")
    assert scales.tolist() == [1.0, 2.0]
    assert np.frombuffer(payload[8:], np.int8).tolist() == [127, -64, 0, 127, 0]  # -63.5 rounds to even


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_non_finite_values_poison_only_their_chunk(name):
    x = torch.tensor([1.0, float("nan"), 2.0, float("inf"), 3.0, -4.0])

    y = decode(build_codec(name, {"chunk_size": 2}).encode(x))

    assert y[:4].isnan().all()
    assert torch.allclose(y[4:], torch.tensor([3.0, -4.0]), rtol=0.1)


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_subnormal_and_huge_chunks(name):
    x = torch.tensor([1e-40, -2e-40, 3e38, -3e38], dtype=torch.float32)

    y = decode(build_codec(name, {"chunk_size": 2}).encode(x))

    assert y[2] == x[2] and y[3] == x[3]  # no overflow: codes are x / absmax * L, not x / scale
    half_step = 2e-40 / LEVELS[name] / 2
    assert (y[:2] - x[:2]).abs().max() <= half_step + 1e-44  # a subnormal scale keeps fewer bits


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_chunk_bigger_than_the_tensor_is_one_chunk(name):
    codec = build_codec(name, {"chunk_size": 10**12})

    blob = codec.encode(torch.arange(5.0))

    assert len(read_header(blob)[1]) == codec.expected_bytes(5) == 4 + (5 if name == "int8" else 3)
    assert decode(blob)[4] == 4.0
