"""SpillMatrix: updates decoded into a float32 file and read back by column block, real
files in a real folder."""

from __future__ import annotations

import math

import pytest
import torch

from aitbc.core.aggregation import parse_aggregator
from aitbc.core.aggregation.streaming import aggregate_stream
from aitbc.core.compression import build_codec, decode, decode_pieces
from aitbc.core.norms import update_norms
from aitbc.errors import AitbcError, UsageError
from aitbc.storage.spill import SpillMatrix


def blobs(n: int, d: int, seed: int = 0) -> list[bytes]:
    g = torch.Generator().manual_seed(seed)
    codec = build_codec("int8", {"chunk_size": 16})
    return [codec.encode(torch.randn(d, generator=g) * (1 + i)) for i in range(n)]


def test_rows_read_back_as_decoded_and_norms_match(tmp_path):
    # Prepare: 5 int8 updates, written piece by piece
    bs = blobs(5, 1000)
    U = torch.stack([decode(b).to(torch.float32) for b in bs])  # (n, d)

    # Execute
    with SpillMatrix(5, 1000, directory=tmp_path) as m:
        for i, b in enumerate(bs):
            m.fill(i, decode_pieces(b, piece=96))
        block = m.read([4, 0, 2], 17, 501)
        norms = m.norms()
        assert list(tmp_path.iterdir()) == []  # an unnamed file (O_TMPFILE): nothing to clean up after a crash

    # Assert
    assert torch.equal(block, U[[4, 0, 2], 17:501])
    assert norms == pytest.approx(update_norms(U), rel=1e-12)
    assert m.nonfinite_rows() == []


@pytest.mark.parametrize("spec", ["mean", "trimmed-mean:beta=0.2", "krum:f=1", "centered-clip", "nnm:f=1+median"])
def test_aggregating_the_spilled_matrix_equals_memory(tmp_path, spec):
    bs = blobs(7, 777, seed=1)
    U = torch.stack([decode(b).to(torch.float32) for b in bs])
    pipe = parse_aggregator(spec)
    with SpillMatrix(7, 777, directory=tmp_path) as m:
        for i, b in enumerate(bs):
            m.fill(i, decode_pieces(b))
        out, _ = aggregate_stream(pipe, m, block_bytes=4 * 7 * 100)
    torch.testing.assert_close(out, pipe(U), rtol=1e-5, atol=1e-6)


def test_non_finite_rows_are_known_and_their_norms_say_so(tmp_path):
    with SpillMatrix(3, 4, directory=tmp_path) as m:
        m.fill(0, [torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0])])
        m.fill(1, [torch.tensor([1.0, math.inf, 0.0, 0.0])])
        m.fill(2, [torch.tensor([1.0, math.nan, 0.0, 0.0])])
        norms = m.norms()
        assert m.nonfinite_rows() == [1, 2]
        with pytest.raises(UsageError, match=r"^updates \[1, 2\] contain NaN or Inf"):
            aggregate_stream(parse_aggregator("mean"), m)
    assert norms[0] == 5.0 and norms[1] == math.inf and math.isnan(norms[2])


def test_bad_rows_and_reads_are_one_line(tmp_path):
    with SpillMatrix(2, 4, directory=tmp_path) as m:
        with pytest.raises(UsageError, match=r"^update 0 has 3 values; the model has 4$"):
            m.fill(0, [torch.ones(3)])
        with pytest.raises(UsageError, match=r"^update 0 has more than the model's 4 values$"):
            m.fill(0, [torch.ones(3), torch.ones(2)])
        with pytest.raises(UsageError, match=r"^rows \[0, 1\] of the spilled matrix were never written$"):
            m.read([0], 0, 4)
        m.fill(0, [torch.ones(4)])
        m.fill(1, [torch.zeros(4)])
        with pytest.raises(IndexError, match="outside"):
            m.read([2], 0, 4)
        with pytest.raises(IndexError, match="outside"):
            m.read([0], 2, 5)
    with pytest.raises(UsageError, match="needs n >= 1"):
        SpillMatrix(0, 4, directory=tmp_path)


def test_the_file_leaves_nothing_behind(tmp_path):
    with SpillMatrix(2, 1 << 16, directory=tmp_path / "spill") as m:
        m.fill(0, [torch.ones(1 << 16)])
    assert list((tmp_path / "spill").iterdir()) == []


def test_a_folder_it_cannot_use_is_one_line(tmp_path):
    (tmp_path / "taken").write_text("a file, not a folder")
    with pytest.raises(AitbcError, match=r"^cannot spill 2 updates of 4 values \(3.2e-08 GB\) under .*taken: "):
        SpillMatrix(2, 4, directory=tmp_path / "taken")
