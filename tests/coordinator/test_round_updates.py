"""round_updates.aggregate_updates: the streamed path gives the in-memory verdict and
aggregate, with the norm bound and stale updates' counts, on a real blob store and spill."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from aitbc.coordinator.config import Settings
from aitbc.coordinator.context import build_context
from aitbc.coordinator.live.updates import SPILL_DIR, aggregate_updates, decoded, streams
from aitbc.core.aggregation import parse_aggregator
from aitbc.core.aggregation.streaming import TensorSource
from aitbc.core.compression import build_codec
from aitbc.core.norms import NormBound


@pytest.fixture(scope="module")
def round_blobs(tmp_path_factory):
    """A context and 7 int8 updates: one 5x (clipped), one 5000x (rejected)."""
    ctx = build_context(Settings(home=tmp_path_factory.mktemp("coord")))
    g = torch.Generator().manual_seed(0)
    base = torch.randn(300, generator=g)
    ups = [base + 0.3 * torch.randn(300, generator=g) for _ in range(7)]
    ups[2] = 5 * ups[2]
    ups[5] = 5000 * ups[5]
    codec = build_codec("int8", {"chunk_size": 32})
    return ctx, [ctx.store.put_bytes(codec.encode(u)) for u in ups]


@pytest.mark.parametrize("spec", ["mean", "trimmed-mean:beta=0.2", "krum:f=1", "centered-clip", "trend:f=1+median"])
def test_streamed_round_equals_the_in_memory_round(round_blobs, spec):
    ctx, cids = round_blobs
    pipe = parse_aggregator(spec, default_f=1)
    weights = [1.0, 2.0, 1.0, 3.0, 1.0, 1.0, 2.0]
    counts = [1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.5]  # two stale updates count a half
    ref = torch.randn(300, generator=torch.Generator().manual_seed(1))

    def run(mb: float):
        c = dataclasses.replace(ctx, settings=ctx.settings.model_copy(update={"aggregation_memory_mb": mb}))
        return aggregate_updates(
            c, pipe, NormBound(), cids, weights, [1.0] * 7, counts, d=300, round_index=2, reference=ref
        )

    mem, disk = run(1e9), run(1e-6)
    assert (mem.streamed, disk.streamed) == (False, True)
    assert disk.verdict == mem.verdict and disk.keep == mem.keep == [0, 1, 2, 3, 4, 6]
    assert mem.verdict.clipped == [2] and mem.verdict.rejected == [5]
    torch.testing.assert_close(disk.delta, mem.delta, rtol=1e-5, atol=1e-6)
    assert list((ctx.settings.home / SPILL_DIR).iterdir()) == []


def test_decoded_gives_scoring_the_same_rows(round_blobs):
    ctx, cids = round_blobs
    small = dataclasses.replace(ctx, settings=ctx.settings.model_copy(update={"aggregation_memory_mb": 1e-6}))
    assert streams(small, 7, 300) and not streams(ctx, 7, 300)
    with decoded(ctx, cids, 300) as mem, decoded(small, cids, 300) as disk:
        assert isinstance(mem, TensorSource) and not isinstance(disk, TensorSource)
        assert torch.equal(disk.read(range(7), 0, 300), mem.updates)
