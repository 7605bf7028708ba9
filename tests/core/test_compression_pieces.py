"""decode_pieces: the same values as decode, in bounded pieces; the same refusals."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aitbc.core.compression import CODEC_NAMES, build_codec, decode, decode_pieces
from aitbc.errors import IntegrityError, UsageError


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["int8", "int4"]),
    d=st.integers(1, 5000),
    chunk=st.sampled_from([1, 3, 64, 1024]),
    piece=st.integers(1, 3000),
    seed=st.integers(0, 1000),
)
def test_chunked_codecs_decode_piece_by_piece_to_the_same_values(name, d, chunk, piece, seed):
    x = torch.randn(d, generator=torch.Generator().manual_seed(seed)) * 10
    blob = build_codec(name, {"chunk_size": chunk}).encode(x)

    pieces = list(decode_pieces(blob, piece=piece))

    assert torch.equal(torch.cat(pieces), decode(blob))
    step = -(-piece // (2 * chunk)) * 2 * chunk  # whole chunks, an even count of values
    assert all(p.numel() == step for p in pieces[:-1])


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_every_codec_decodes_in_pieces(name):
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(0))
    blob = build_codec(name, {}).encode(x)

    assert torch.equal(torch.cat(list(decode_pieces(blob, piece=256))), decode(blob).reshape(-1))


def test_a_bad_code_in_a_later_piece_is_one_line_when_that_piece_decodes():
    blob = bytearray(build_codec("int8", {"chunk_size": 4}).encode(torch.randn(64)))
    blob[-1] = 0x80  # -128: outside [-127, 127]
    pieces = decode_pieces(bytes(blob), piece=8)
    assert next(pieces).numel() == 8
    with pytest.raises(IntegrityError, match=r"^corrupt int8 payload: int8 code outside \[-127, 127\]$"):
        list(pieces)


def test_header_and_sizes_are_checked_before_the_first_piece():
    blob = build_codec("int8", {}).encode(torch.randn(100))
    with pytest.raises(IntegrityError, match="more than the allowed 10 values"):
        decode_pieces(blob, max_numel=10)  # no iteration needed
    with pytest.raises(IntegrityError, match="payload is"):
        decode_pieces(blob[:-1])
    with pytest.raises(UsageError, match="piece must be at least one value"):
        decode_pieces(blob, piece=0)


def test_pieces_keep_the_header_dtype():
    blob = build_codec("int8", {}).encode(torch.randn(10, dtype=torch.float64))
    assert {p.dtype for p in decode_pieces(blob, piece=2)} == {torch.float64}
