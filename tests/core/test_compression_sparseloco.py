"""``sparseloco``: chunk-wise top-k with low-bit values, and decayed error feedback.

The generic codec properties (round trip, stated size, zeros, dtypes, hostile headers)
run over every codec in test_compression_codecs.py and test_compression_corrupt.py; these
are the ones particular to this codec and to ``error_feedback_decay``."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
import torch

from aitbc.core.compression import ErrorFeedback, build_codec, check_outer, decode, read_header
from aitbc.core.compression.sparse import encode_indices, index_bits
from aitbc.core.compression.sparseloco import chunk_plan
from aitbc.errors import IntegrityError, UsageError


def codec(**options):
    return build_codec("sparseloco", options)


def payload_of(blob: bytes) -> bytes:
    return read_header(blob)[1]


# --- selection and values ----------------------------------------------------------------------


def test_each_chunk_keeps_its_own_largest_entries():
    # Prepare: two chunks of 8; the second chunk's entries are all smaller than the first's
    x = torch.tensor([9.0, -8, 1, 0, 0, 0, 0, 7] + [0.1, 0, -0.3, 0, 0.2, 0, 0, 0])

    # Execute: keep 2 of 8 (density 0.25), 8-bit values
    y = decode(codec(chunk=8, density=0.25, bits=8).encode(x))

    # Assert: chunk 0 keeps 9 and -8; chunk 1 keeps -0.3 and 0.2 (a global top-4 would not)
    assert torch.nonzero(y).flatten().tolist() == [0, 1, 10, 12]
    assert y[0] == 9 and y[1] == -8
    assert torch.allclose(y[[10, 12]], torch.tensor([-0.3, 0.2]), atol=1e-6)


def test_two_bit_values_are_the_chunks_lo_or_hi_magnitude_with_the_sign():
    # one chunk keeping 4: magnitudes 1, 1.2, 3.9 and 4 -> lo 1, hi 4
    x = torch.tensor([1.0, -1.2, 0, 3.9, 0, -4.0, 0.5, 0])

    y = decode(codec(chunk=8, density=0.5, bits=2).encode(x))

    assert y.tolist() == [1.0, -1.0, 0, 4.0, 0, -4.0, 0, 0]


def test_one_bit_sends_the_sign_and_the_chunks_mean_kept_magnitude():
    x = torch.tensor([2.0, 0, -4.0, 0.1] + [0, 0, 0, -1.0])

    y = decode(codec(chunk=4, density=0.5, bits=1).encode(x))

    # chunk 0 keeps 2 and -4 (mean 3); chunk 1 keeps -1 and one zero (mean 0.5)
    assert y[:3].tolist() == [3.0, 0, -3.0]
    assert y[7] == -0.5 and (y[4:7] != 0).sum() == 1


def test_more_bits_lower_the_error_on_the_kept_entries():
    x = torch.randn(5000, generator=torch.Generator().manual_seed(0))
    errors = []
    for bits in (1, 2, 4, 8):
        y = decode(codec(bits=bits).encode(x))
        kept = y != 0
        errors.append(float((y - x)[kept].norm() / x[kept].norm()))
    assert errors == sorted(errors, reverse=True)
    assert errors[-1] < 0.01


def test_the_tail_chunk_keeps_its_share():
    full, k, tail, k_tail = chunk_plan(10_000, 4096, 0.02)
    assert (full, k, tail, k_tail) == (2, 82, 1808, 36)
    y = decode(codec().encode(torch.randn(10_000, generator=torch.Generator().manual_seed(1))))
    counts = np.bincount(torch.nonzero(y).flatten().numpy() // 4096, minlength=3)
    assert counts.tolist() == [82, 82, 36]


def test_stated_size_is_scales_codes_and_elias_fano_indices():
    d = 135_000
    full, k, tail, k_tail = chunk_plan(d, 4096, 0.02)
    kept = full * k + k_tail
    want = 4 * 2 * (full + 1) + math.ceil(kept * 2 / 8) + math.ceil(index_bits(d, kept) / 8)

    blob = codec().encode(torch.randn(d))

    assert codec().expected_bytes(d) == want == len(payload_of(blob))
    # an index costs about log2(chunk / k) + 2 bits: under 8, where stating a position in
    # a 4096-chunk verbatim would take 12
    assert index_bits(d, kept) / kept < 8


def test_same_input_same_bytes_and_ties_are_deterministic():
    x = torch.zeros(9000)
    x[::7] = 1.0  # many ties at the top
    assert codec().encode(x) == codec().encode(x.clone())


def test_non_finite_input_is_refused_by_the_receiver():
    x = torch.ones(100)
    x[3] = math.nan
    with pytest.raises(IntegrityError, match="scales must be finite"):
        decode(codec(density=0.5).encode(x))


# --- hostile blobs -------------------------------------------------------------------------------


def replace(blob: bytes, offset: int, data: bytes) -> bytes:
    return blob[:offset] + data + blob[offset + len(data) :]


@pytest.mark.parametrize(
    ("scales", "message"),
    [
        (np.array([np.nan, 1.0], "<f4"), "finite"),
        (np.array([1.0, np.inf], "<f4"), "finite"),
        (np.array([-1.0, 1.0], "<f4"), "non-negative"),
        (np.array([2.0, 1.0], "<f4"), "lo > hi"),
    ],
)
def test_bad_scales_are_integrity_errors(scales, message):
    blob = codec(chunk=64, density=0.1).encode(torch.randn(64))
    start = len(blob) - len(payload_of(blob))

    with pytest.raises(IntegrityError, match=message) as e:
        decode(replace(blob, start, scales.tobytes()))
    assert "\n" not in str(e.value)


def test_indices_that_break_the_chunk_structure_are_integrity_errors():
    # Prepare: two chunks of 32 keeping 4 each; forge all 8 indices into chunk 0
    c = codec(chunk=32, density=0.125, bits=2)
    blob = c.encode(torch.randn(64))
    payload = payload_of(blob)
    forged = encode_indices(np.arange(8, dtype=np.int64), 64)
    assert len(forged) == math.ceil(index_bits(64, 8) / 8)

    # Execute / Assert
    with pytest.raises(IntegrityError, match="4 a chunk of 32"):
        decode(blob[: len(blob) - len(forged)] + forged)
    assert len(payload) == c.expected_bytes(64)


def test_out_of_range_and_repeated_indices_are_integrity_errors():
    blob = codec(chunk=32, density=0.125).encode(torch.randn(64))
    n = math.ceil(index_bits(64, 8) / 8)
    for junk in (b"\xff" * n, b"\x00" * n):
        with pytest.raises(IntegrityError):
            decode(blob[:-n] + junk)


def reassemble(blob: bytes, *, shape: list[int] | None = None, **params) -> bytes:
    """``blob`` with its header's shape or parameters replaced."""
    header, payload = read_header(blob)
    raw = {
        "codec": header.codec,
        "shape": list(header.shape) if shape is None else shape,
        "dtype": header.dtype,
        "params": {**header.params, **{k.removeprefix("params_"): v for k, v in params.items()}},
        "meta": header.meta,
    }
    hbytes = json.dumps(raw).encode()
    return b"ATBC\x01" + struct.pack("<I", len(hbytes)) + hbytes + payload


def test_a_huge_claimed_shape_is_refused_before_allocation():
    blob = codec().encode(torch.randn(100))
    payload = payload_of(blob)
    with pytest.raises(IntegrityError, match="payload is"):
        decode(reassemble(blob, shape=[10**12]))
    with pytest.raises(IntegrityError, match="bad parameters"):
        decode(reassemble(blob, params_chunk=0))
    with pytest.raises(IntegrityError, match="bad parameters"):
        decode(reassemble(blob, params_density=float("nan")))
    with pytest.raises(IntegrityError, match="bad parameters"):
        decode(reassemble(blob, params_bits=9))
    assert len(payload) == codec().expected_bytes(100)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"chunk": 0}, "chunk must be"),
        ({"density": 0}, "density must be"),
        ({"density": 1.5}, "density must be"),
        ({"bits": 0}, "bits must be"),
        ({"bits": 9}, "bits must be"),
        ({"error_feedback_decay": 1.0}, r"error_feedback_decay must be in \[0, 1\)"),
        ({"error_feedback_decay": -0.1}, r"error_feedback_decay must be in \[0, 1\)"),
    ],
)
def test_bad_options_are_usage_errors(options, message):
    with pytest.raises(UsageError, match=message):
        build_codec("sparseloco", options)


# --- decayed error feedback ------------------------------------------------------------------------


def test_decay_option_builds_decayed_error_feedback_for_any_codec():
    ef = build_codec("sparseloco", {"density": "0.05", "error_feedback_decay": "0.95"})
    assert isinstance(ef, ErrorFeedback) and ef.decay == 0.95
    assert build_codec("topk", {"error_feedback_decay": 0.5}).decay == 0.5
    plain = build_codec("sparseloco", {}, error_feedback=True)
    assert isinstance(plain, ErrorFeedback) and plain.decay is None


def test_decayed_residual_is_beta_e_plus_x_minus_what_was_sent():
    # Prepare: integer values so every sum is exact; a codec keeping 1 of 4 at 8 bits
    ef = build_codec("sparseloco", {"chunk": 4, "density": 0.25, "bits": 8, "error_feedback_decay": 0.5})
    x = torch.tensor([4.0, 2.0, 0.0, -2.0])

    # Execute: round 1 sends the 4 and keeps (0, 2, 0, -2); round 2 starts from 0.5 * that
    sent1 = decode(ef.encode(x))
    e1 = ef.residual.clone()
    sent2 = decode(ef.encode(x))

    # Assert
    assert sent1.tolist() == [4.0, 0, 0, 0] and e1.tolist() == [0, 2.0, 0, -2.0]
    corrected = x + 0.5 * e1  # (4, 3, 0, -3): the 4 goes again
    assert sent2.tolist() == [4.0, 0, 0, 0]
    assert ef.residual.tolist() == (corrected - sent2).tolist()


def test_decay_acts_as_momentum_on_a_steady_direction():
    # a coordinate too small to be sent grows in the accumulator towards x / (1 - beta)
    ef = build_codec("topk", {"ratio": 0.5, "error_feedback_decay": 0.9})
    x = torch.tensor([1.0, 0.05])
    for _ in range(3):
        ef.encode(x)
    assert ef.residual[1] == pytest.approx(0.05 * (1 + 0.9 + 0.81), rel=1e-6)


def test_plain_and_zero_decay_are_the_two_ends():
    x = torch.tensor([3.0, 1.0, 0.0, 0.5])
    no_memory = build_codec("topk", {"ratio": 0.25, "error_feedback_decay": 0.0})
    no_memory.encode(x)
    assert decode(no_memory.encode(x)).tolist() == [3.0, 0, 0, 0]  # the residual was dropped
    plain = build_codec("topk", {"ratio": 0.25}, error_feedback=True)
    plain.encode(x)
    plain.encode(x)
    assert plain.residual.tolist() == [0.0, 2.0, 0.0, 1.0]  # kept whole


def test_decayed_feedback_needs_plain_outer_sgd():
    ef = build_codec("sparseloco", {"error_feedback_decay": 0.95})
    check_outer(ef, "fedavg")
    check_outer(build_codec("sparseloco", {}, error_feedback=True), "diloco")  # plain EF: any outer
    with pytest.raises(UsageError, match="outer momentum.*fedavg"):
        check_outer(ef, "diloco")
