"""Every codec: the registry, shapes and dtypes, stated sizes, determinism, config errors.

Per-family error bounds live in test_compression_{dense,quantize,sparse,sign,powersgd}.py;
error feedback in test_compression_feedback.py; hostile blobs in test_compression_corrupt.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest
import torch

from aitbc.core.compression import (
    CODEC_NAMES,
    CODECS,
    Codec,
    ErrorFeedback,
    build_codec,
    compression_ratio,
    decode,
    read_header,
)
from aitbc.errors import UsageError


def codec_for(name: str, shape: tuple[int, ...], **options) -> Codec:
    """powersgd needs a layout for a flat tensor; here the tensor is its one parameter."""
    return build_codec(name, options, layout=[shape] if name == "powersgd" else None)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# --- the registry ------------------------------------------------------------------------------


def test_every_codec_of_the_issue_is_registered():
    assert set(CODEC_NAMES) == {
        "none",
        "fp16",
        "bf16",
        "int8",
        "int4",
        "topk",
        "topk-int8",
        "sign",
        "powersgd",
        "sparseloco",
    }
    assert set(CODEC_NAMES) <= set(CODECS.names())


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_header_names_codec_shape_dtype_and_params(name):
    codec = codec_for(name, (6, 5))

    header, _ = read_header(codec.encode(randn(6, 5)))

    assert header.codec == name
    assert header.shape == (6, 5)
    assert header.dtype == "float32"
    assert header.params == asdict(codec.cfg)


# --- shapes, sizes, dtypes ---------------------------------------------------------------------

SHAPES = [(0,), (1,), (7,), (17,), (3, 5), (), (2, 0, 3), (1001,), (4, 3, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_round_trip_keeps_shape_and_payload_is_the_stated_size(name, shape):
    codec = codec_for(name, shape)
    x = randn(*shape, seed=len(shape))  # () is a 0-d tensor

    blob = codec.encode(x)
    header, payload = read_header(blob)
    y = decode(blob)

    assert y.shape == x.shape and y.dtype == torch.float32
    assert len(payload) == codec.expected_bytes(shape)
    assert torch.equal(codec.decode(blob), y)


@pytest.mark.parametrize("shape", [(0,), (1,), (13,), (4, 6)], ids=str)
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_zeros_decode_to_zeros(name, shape):
    y = decode(codec_for(name, shape).encode(torch.zeros(shape)))

    assert torch.equal(y, torch.zeros(shape))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_decode_restores_the_input_dtype(name, dtype):
    x = randn(9, 4).to(dtype)

    y = decode(codec_for(name, (9, 4)).encode(x))

    assert y.dtype == dtype and y.shape == x.shape
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_non_float_input_is_a_usage_error(name):
    with pytest.raises(UsageError, match="floating-point"):
        codec_for(name, (3,)).encode(torch.arange(3))


@pytest.mark.parametrize(
    ("name", "options", "d", "payload"),
    [
        ("none", {}, 1000, 4 * 1000),
        ("fp16", {}, 1001, 2 * 1001),
        ("bf16", {}, 3, 2 * 3),
        ("int8", {"chunk_size": 64}, 1000, 4 * math.ceil(1000 / 64) + 1000),
        ("int4", {"chunk_size": 64}, 1001, 4 * math.ceil(1001 / 64) + math.ceil(1001 / 2)),
        ("sign", {}, 1001, 4 + math.ceil(1001 / 8)),
        # k = 10 of d = 1000: l = floor(log2(100)) = 6 low bits, k*(l+1) + (d >> l) = 70 + 15 bits
        ("topk", {"ratio": 0.01}, 1000, 4 * 10 + math.ceil((10 * 7 + (1000 >> 6)) / 8)),
        ("topk-int8", {"ratio": 0.01}, 1000, 4 + 10 + math.ceil((10 * 7 + (1000 >> 6)) / 8)),
    ],
)
def test_stated_sizes(name, options, d, payload):
    codec = build_codec(name, options)

    blob = codec.encode(randn(d))

    assert codec.expected_bytes(d) == payload
    assert len(read_header(blob)[1]) == payload
    assert codec.bits_per_value(d) == pytest.approx(8 * payload / d)


def test_powersgd_stated_size_per_parameter():
    layout = [(32, 16), (32,), (8, 2, 4), (2, 50)]  # matrix, bias, 3-D (8 x 8), rank >= min dim
    codec = build_codec("powersgd", {"rank": 2}, layout=layout)
    x = randn(32 * 16 + 32 + 64 + 100)

    payload = read_header(codec.encode(x))[1]

    assert len(payload) == 4 * (2 * (32 + 16) + 32 + 2 * (8 + 8) + 100)
    assert codec.expected_bytes(x.numel()) == len(payload)


def test_bits_per_value_defaults():
    d = 1 << 20
    assert build_codec("int8").bits_per_value(d) == pytest.approx(8 + 32 / 1024)
    assert build_codec("int4").bits_per_value(d) == pytest.approx(4 + 32 / 128)
    assert build_codec("sign").bits_per_value(d) == pytest.approx(1, abs=1e-3)
    assert build_codec("topk", {"ratio": 0.01}).bits_per_value(d) < 0.01 * (32 + 2 + math.log2(100)) + 1e-3


@pytest.mark.parametrize(
    ("name", "options", "low", "high"),
    [
        ("none", {}, 0.99, 1.0),
        ("fp16", {}, 1.99, 2.0),
        ("bf16", {}, 1.99, 2.0),
        ("int8", {}, 3.95, 4.0),
        ("int4", {}, 7.4, 8.0),
        ("sign", {}, 31.5, 32.0),
        ("topk", {"ratio": 0.01}, 75, 85),
        ("topk-int8", {"ratio": 0.01}, 180, 200),
    ],
)
def test_compression_ratio_on_real_bytes(name, options, low, high):
    d = 100_000
    blob = build_codec(name, options).encode(randn(d))

    assert low <= compression_ratio(d, len(blob)) <= high


def test_compression_ratio_helper():
    assert compression_ratio(1000, 500) == 8.0
    with pytest.raises(ValueError, match="positive"):
        compression_ratio(10, 0)


# --- determinism -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_same_input_same_bytes(name):
    x = randn(40, 30, seed=3)

    first = codec_for(name, (40, 30)).encode(x)
    again = codec_for(name, (40, 30)).encode(x.clone())

    assert first == again


@pytest.mark.parametrize("name", [n for n in CODEC_NAMES if n != "powersgd"])
def test_stateless_codecs_repeat_themselves(name):
    codec, x = build_codec(name), randn(300)

    assert codec.encode(x) == codec.encode(x)


# --- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("int8", {"chunk_size": "0"}, "chunk_size must be a positive integer, got 0"),
        ("int4", {"chunk_size": -3}, "chunk_size must be a positive integer, got -3"),
        ("int8", {"chunk_size": "big"}, "chunk_size='big' must be int"),
        ("topk", {"ratio": "0"}, r"ratio must be in \(0, 1\], got 0.0"),
        ("topk-int8", {"ratio": 1.5}, r"ratio must be in \(0, 1\], got 1.5"),
        ("powersgd", {"rank": 0}, "rank must be a positive integer, got 0"),
        ("int8", {"bits": 4}, "unknown codec 'int8' option 'bits'; allowed: chunk_size"),
        ("sign", {"scale": 1}, "unknown codec 'sign' option 'scale'; allowed: none"),
        ("powersgd", {"iters": 2}, "allowed: rank, seed, warm_start"),
    ],
)
def test_bad_options_are_usage_errors(name, options, message):
    with pytest.raises(UsageError, match=message) as exc:
        build_codec(name, options)

    assert "\n" not in str(exc.value)


def test_options_as_strings_like_the_command_line():
    codec = build_codec("topk", {"ratio": "0.05"})

    assert codec.cfg.ratio == 0.05


@pytest.mark.parametrize(
    "layout", [[(2, -1)], [("a", 2)], [(2.5, 2)], 5, [3, 4]], ids=["negative", "str", "float", "int", "flat"]
)
def test_bad_layout_is_a_usage_error(layout):
    with pytest.raises(UsageError, match="layout"):
        build_codec("powersgd", layout=layout)


def test_layout_is_ignored_by_codecs_that_do_not_need_it():
    codec = build_codec("int8", layout=[(3, 4), (4,)])

    assert decode(codec.encode(torch.ones(16))).shape == (16,)


def test_error_feedback_from_keyword_or_option():
    for codec in (
        build_codec("topk", {"ratio": 0.1}, error_feedback=True),
        build_codec("topk", {"ratio": "0.1", "error_feedback": "true"}),
    ):
        assert isinstance(codec, ErrorFeedback) and codec.codec.cfg.ratio == 0.1
    assert not isinstance(build_codec("topk", {"error_feedback": "no"}), ErrorFeedback)
    with pytest.raises(UsageError, match="error_feedback='maybe' must be bool"):
        build_codec("topk", {"error_feedback": "maybe"})
