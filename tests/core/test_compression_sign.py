"""``sign``: one bit a value and one scale, the mean absolute value (EF-signSGD)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from aitbc.core.compression import build_codec, decode, read_header

vectors = arrays(np.float32, st.integers(0, 300), elements=st.floats(-1e6, 1e6, width=32))


@settings(max_examples=80, deadline=None)
@given(vectors)
def test_sign_reconstructs_sign_times_mean_abs(a):
    x = torch.from_numpy(a)

    y = decode(build_codec("sign").encode(x))

    scale = float(np.abs(a.astype(np.float64)).mean()) if a.size else 0.0
    assert torch.allclose(y.abs(), torch.full_like(y, scale), rtol=1e-6, atol=0)
    if np.float32(scale):  # the scale is sent as a float32: a mean under its smallest value sends zeros
        assert torch.equal(torch.sign(y), torch.where(x < 0, -1.0, 1.0))  # a zero sends +scale


def test_a_mean_below_float32_s_smallest_value_decodes_to_zeros():
    """Found by hypothesis in CI: [1e-45, 0] has mean 7e-46, which float32 rounds to 0."""
    x = torch.tensor([1e-45, 0.0])
    assert torch.equal(decode(build_codec("sign").encode(x)), torch.zeros(2))


def test_sign_payload_is_scale_then_packed_bits():
    x = torch.tensor([1.0, -2.0, 3.0, -4.0, 0.0, -0.5, 0.5, 1.0, -1.0])  # 9 values -> 2 bytes of bits

    payload = read_header(build_codec("sign").encode(x))[1]

    assert np.frombuffer(payload[:4], "<f4")[0] == np.float32(13.0 / 9)
    assert payload[4:] == bytes([0b01010100, 0b10000000])  # set bit = negative, MSB first


def test_non_finite_input_decodes_non_finite():
    y = decode(build_codec("sign").encode(torch.tensor([1.0, float("nan"), -1.0])))

    assert y.isnan().all()
