"""The codec byte layout (self-describing header) and the dense codecs ``none``, ``fp16``, ``bf16``.

Layout: b"ATBC" | u8 version | u32 LE header length | header JSON | payload.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from aitbc.core.compression import CODECS, MAGIC, build_codec, decode, read_header
from aitbc.errors import IntegrityError, UsageError

PREFIX = 9  # 4 magic + 1 version + 4 header length


def header_len(blob: bytes) -> int:
    return struct.unpack_from("<I", blob, 5)[0]


def make_blob(header: dict | bytes, payload: bytes = b"", *, magic: bytes = MAGIC, version: int = 1) -> bytes:
    hbytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    return magic + bytes([version]) + struct.pack("<I", len(hbytes)) + hbytes + payload


def none_header(**overrides) -> dict:
    return {"codec": "none", "shape": [2], "dtype": "float32", "params": {}, "meta": {}} | overrides


# --- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x",
    [
        torch.randn(1000, generator=torch.Generator().manual_seed(0)),
        torch.zeros(17),
        torch.empty(0),
        torch.arange(12, dtype=torch.float32).reshape(3, 4),
        torch.tensor(2.5),  # 0-d
        torch.tensor([float("inf"), -0.0, 1e-45, 3.4e38]),  # the codec itself does not judge values
    ],
    ids=["random", "zeros", "empty", "2d", "scalar", "extremes"],
)
def test_none_round_trip_is_exact(x):
    codec = build_codec("none")

    blob = codec.encode(x)

    for y in (codec.decode(blob), decode(blob)):
        assert y.shape == x.shape and y.dtype == torch.float32
        assert torch.equal(y, x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes_round_trip_exactly_and_keep_dtype(dtype):
    x = torch.randn(64, generator=torch.Generator().manual_seed(1)).to(dtype)

    y = decode(build_codec("none").encode(x))

    assert y.dtype == dtype
    assert torch.equal(y, x)


def test_float64_keeps_dtype_with_float32_values():
    x = torch.tensor([1 / 3, 1e-300], dtype=torch.float64)

    y = decode(build_codec("none").encode(x))

    assert y.dtype == torch.float64
    assert torch.equal(y, x.float().double())


def test_non_contiguous_and_grad_tensors_encode():
    x = torch.arange(6.0).reshape(2, 3).t()  # (3, 2), non-contiguous
    w = torch.ones(3, requires_grad=True)

    assert torch.equal(decode(build_codec("none").encode(x)), x)
    assert torch.equal(decode(build_codec("none").encode(w)), torch.ones(3))


# --- the header --------------------------------------------------------------------------------


def test_header_is_self_describing():
    blob = build_codec("none").encode(torch.zeros(3, 4))

    header, payload = read_header(blob)

    assert blob[:4] == b"ATBC" and blob[4] == 1
    assert header.codec == "none"
    assert header.shape == (3, 4)
    assert header.dtype == "float32"
    assert header.params == {} and header.meta == {}
    assert len(payload) == 4 * 12


@pytest.mark.parametrize("shape", [(0,), (1,), (5, 7), (1000,)])
def test_encoded_size_is_header_plus_four_bytes_per_value(shape):
    x = torch.ones(shape)

    blob = build_codec("none").encode(x)

    assert len(blob) == PREFIX + header_len(blob) + 4 * x.numel()


def test_payload_is_little_endian_float32():
    blob = build_codec("none").encode(torch.tensor([1.0, -2.0]))

    assert blob[-8:] == struct.pack("<2f", 1.0, -2.0)


def test_none_codec_is_registered_and_takes_no_options():
    assert "none" in CODECS
    with pytest.raises(UsageError, match="unknown codec 'none' option 'bits'; allowed: none"):
        build_codec("none", {"bits": 8})


def test_unknown_codec_name():
    with pytest.raises(UsageError, match="unknown codec 'zstd'"):
        build_codec("zstd")


# --- corruption --------------------------------------------------------------------------------


def good_blob() -> bytes:
    return build_codec("none").encode(torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"", "too short"),
        (b"ATBC\x01", "too short"),
        (b"XXXX" + good_blob()[4:], "not an aitbc update blob"),
        (good_blob()[:4] + b"\x02" + good_blob()[5:], "unsupported update format version 2"),
        (good_blob()[:-1], "payload"),  # truncated payload
        (good_blob() + b"\x00", "payload"),  # trailing byte
        (good_blob()[: PREFIX + 5], "out of range"),  # truncated header
        (make_blob(b"{not json"), "malformed update header"),
        (make_blob(b"\xff\xfe"), "malformed update header"),  # not UTF-8
        (make_blob(b"[1, 2]"), "malformed update header"),
        (make_blob(b"null"), "malformed update header"),
        (make_blob({"codec": "none", "shape": [2]}), "malformed update header"),  # missing keys
        (make_blob(none_header(shape=["a"]), b"\0" * 8), "malformed update header"),
        (make_blob(none_header(shape=[-2]), b"\0" * 8), "negative dimension"),
        (make_blob(none_header(codec="zstd"), b"\0" * 8), "unknown codec 'zstd'"),
        (make_blob(none_header(dtype="float99"), b"\0" * 8), "unknown dtype 'float99'"),
        (make_blob(none_header(shape=[10**12]), b"\0" * 8), "payload"),
    ],
    ids=[
        "empty",
        "prefix-only",
        "magic",
        "version",
        "truncated-payload",
        "trailing-byte",
        "truncated-header",
        "bad-json",
        "not-utf8",
        "json-list",
        "json-null",
        "missing-keys",
        "bad-dim",
        "negative-dim",
        "unknown-codec",
        "unknown-dtype",
        "huge-shape",
    ],
)
def test_corrupt_blobs_are_integrity_errors(blob, message):
    with pytest.raises(IntegrityError) as exc:
        decode(blob)

    assert message in str(exc.value)


def test_header_length_bigger_than_blob():
    blob = MAGIC + b"\x01" + struct.pack("<I", 2**32 - 1) + b"{}"

    with pytest.raises(IntegrityError, match="out of range"):
        read_header(blob)


def test_codec_decode_refuses_another_codecs_blob():
    blob = make_blob(none_header(codec="topk"), b"\0" * 8)

    with pytest.raises(IntegrityError, match="encoded with codec 'topk', not 'none'"):
        build_codec("none").decode(blob)


def test_deeply_nested_header_is_an_integrity_error():
    with pytest.raises(IntegrityError):
        decode(make_blob(b"[" * 200_000))


def test_deep_header_is_refused_where_the_recursion_limit_was_raised():
    """A library may raise the interpreter's recursion limit for the whole process (titanoboa
    sets 100000): the JSON parser then overflows the C stack on a megabyte of "[" instead of
    raising RecursionError, so the depth is checked before parsing. In a process of its own:
    before the check this one crashed."""
    code = (
        "import sys; sys.setrecursionlimit(1_000_000)\n"
        "from aitbc.core.compression.base import MAX_HEADER, _PREFIX\n"
        "from aitbc.core.compression import MAGIC, decode\n"
        "from aitbc.errors import IntegrityError\n"
        "h = b'[' * (MAX_HEADER - 1)\n"
        "try:\n"
        "    decode(_PREFIX.pack(MAGIC, 1, len(h)) + h)\n"
        "except IntegrityError as e:\n"
        "    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    assert "nested deeper than 32 levels" in r.stdout


def test_brackets_inside_strings_are_not_nesting():
    meta = {"note": "[[[[" * 20 + '\\"{{{{' * 20}
    header = {"codec": "none", "shape": [2], "dtype": "float32", "params": {}, "meta": meta}
    assert decode(make_blob(header, struct.pack("<2f", 1.0, 2.0))).tolist() == [1.0, 2.0]


def test_unknown_params_in_header_are_an_integrity_error():
    with pytest.raises(IntegrityError):
        decode(make_blob(none_header(params={"bits": 8}), b"\0" * 8))


# --- fp16 and bf16 -----------------------------------------------------------------------------


def f32_vectors(bound: float):
    bound = float(np.float32(bound))
    return arrays(np.float32, st.integers(0, 200), elements=st.floats(-bound, bound, width=32))


@settings(max_examples=80, deadline=None)
@given(f32_vectors(65504.0))
def test_fp16_relative_error_is_at_most_half_an_ulp(a):
    x = torch.from_numpy(a)

    y = decode(build_codec("fp16").encode(x)).double()

    # round to nearest with a 10-bit mantissa; below 2**-14 the step is the subnormal 2**-24
    assert (y - x.double()).abs().le(2**-11 * x.double().abs() + 2**-25).all()


@settings(max_examples=80, deadline=None)
@given(f32_vectors(1e38))
def test_bf16_relative_error_is_at_most_half_an_ulp(a):
    x = torch.from_numpy(a)

    y = decode(build_codec("bf16").encode(x)).double()

    # 7-bit mantissa, fp32's exponent range (subnormal step 2**-133)
    assert (y - x.double()).abs().le(2**-8 * x.double().abs() + 2**-134).all()


@pytest.mark.parametrize(("name", "top"), [("fp16", 65504.0), ("bf16", torch.finfo(torch.bfloat16).max)])
def test_half_codecs_saturate_finite_values_and_pass_nan_inf(name, top):
    x = torch.tensor([3.4e38, -3.4e38, float("inf"), float("-inf"), float("nan"), 1.0])

    y = decode(build_codec(name).encode(x))

    assert y[:2].tolist() == [top, -top]
    assert y[2] == float("inf") and y[3] == float("-inf") and y[4].isnan() and y[5] == 1.0


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_half_codecs_send_two_bytes_a_value(name):
    blob = build_codec(name).encode(torch.ones(1001))

    assert len(blob) == PREFIX + header_len(blob) + 2 * 1001


def test_fp16_payload_is_little_endian_half():
    blob = build_codec("fp16").encode(torch.tensor([1.0, -2.0]))

    assert blob[-4:] == struct.pack("<2e", 1.0, -2.0)
