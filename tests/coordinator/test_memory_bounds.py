"""The coordinator holds a bounded number of model-sized buffers per step of a round, not
one per update or per float64 copy (issue 18: checkpoints and evaluation within the bound;
``bench/live_large.py`` measures the live process). Counted, not timed: Python's tracer
sees every bytes object and NumPy buffer (what decoding allocates), torch's profiler every
tensor allocation and free; the peak is the most held at once. Each test also counts the
way it replaced, so a count that sees nothing cannot pass."""

from __future__ import annotations

import dataclasses
import tracemalloc
from collections.abc import Callable

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from aitbc.coordinator.config import Settings
from aitbc.coordinator.context import build_context
from aitbc.coordinator.round_updates import aggregate_updates, decode_rows
from aitbc.coordinator.workers import _check_update
from aitbc.core.aggregation import parse_aggregator
from aitbc.core.compression import build_codec, decode
from aitbc.core.norms import CLIP, KEEP, REJECT, NormBound, NormVerdict, apply_verdict
from aitbc.core.scoring import alignments, copies

D = 8_000_000  # values an update: 32 MB in float32, two decoded pieces (4M values each)


def traced_peak(fn: Callable[[], object]) -> int:
    """The most bytes of Python objects and NumPy buffers ``fn`` held at once."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def torch_peak(fn: Callable[[], object]) -> int:
    """The most bytes of torch tensors ``fn`` allocated and held at once (CPU)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        fn()
    events = sorted((e for e in p.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    held = peak = 0
    for e in events:  # an allocation counts on the op that made it, a free on a [memory] event
        held += e.self_cpu_memory_usage
        peak = max(peak, held)
    return peak


@pytest.fixture(scope="module")
def big_round(tmp_path_factory):
    """A context holding 3 dense (codec none) updates of D values, and the updates."""
    ctx = build_context(Settings(home=tmp_path_factory.mktemp("coord")))
    g = torch.Generator().manual_seed(0)
    ups = [torch.randn(D, generator=g) for _ in range(3)]
    codec = build_codec("none")
    return ctx, [ctx.store.put_bytes(codec.encode(u)) for u in ups], ups


def test_the_update_check_holds_the_blob_and_one_piece_not_the_decoded_update(big_round):
    ctx, cids, _ = big_round
    blob = ctx.store.get_bytes(cids[0])
    size = len(blob)
    assert _check_update(blob, D) is None
    # The whole decode it replaced held the update in float32 beside the blob (and, before
    # the payload was a view, the payload's copy too).
    assert traced_peak(lambda: decode(blob, max_numel=D)) > 0.95 * size
    assert traced_peak(lambda: _check_update(blob, D)) < 0.6 * size  # one piece of 4M values: 16 MB


@pytest.mark.parametrize(
    ("blob_of", "reason"),
    [
        (lambda d: build_codec("none").encode(torch.zeros(d)), None),
        (lambda d: build_codec("bf16").encode(torch.ones(d)), None),
        (lambda d: build_codec("none").encode(torch.tensor([0.0] * (d - 1) + [float("nan")])), "NaN or Inf"),
        (lambda d: build_codec("fp16").encode(torch.tensor([float("inf")] + [0.0] * (d - 1))), "NaN or Inf"),
        (lambda d: build_codec("none").encode(torch.zeros(d - 1)), f"shape ({9_999},)"),
        (lambda d: build_codec("none").encode(torch.zeros(d, 1)), "shape (10000, 1)"),
        (lambda d: build_codec("none").encode(torch.zeros(d + 1)), "malformed update blob"),
        (lambda d: build_codec("none").encode(torch.zeros(d))[:-4], "malformed update blob"),
        (lambda d: b"ATBC" + b"\x00" * 20, "malformed update blob"),
        (lambda d: build_codec("int8", {"chunk_size": 7}).encode(torch.randn(d)), None),
    ],
)
def test_the_update_check_judges_piece_by_piece_as_the_whole_decode_did(blob_of, reason):
    d = 10_000
    got = _check_update(blob_of(d), d)
    assert got is None if reason is None else (got is not None and reason in got), got


def test_a_round_decodes_into_one_matrix_with_one_blob_beside_it(big_round):
    ctx, cids, ups = big_round
    size = 4 * D
    U = decode_rows(ctx, cids, D)
    # The same values, bit for bit, as the whole decodes stacked (what it replaced).
    stacked = torch.stack([decode(ctx.store.get_bytes(c), max_numel=D).to(torch.float32) for c in cids])
    assert torch.equal(U, stacked) and torch.equal(U[1], ups[1])
    del U, stacked
    old = traced_peak(
        lambda: torch.stack([decode(ctx.store.get_bytes(c), max_numel=D).to(torch.float32) for c in cids])
    )
    assert old > 3 * size  # every decoded update held (NumPy-backed) until the stack, and a blob
    assert traced_peak(lambda: decode_rows(ctx, cids, D)) < 1.75 * size  # one blob and one piece


@pytest.mark.parametrize("name", ["int8", "fp16", "topk"])
def test_decode_rows_equals_the_stacked_decodes_for_every_codec(tmp_path, name):
    ctx = build_context(Settings(home=tmp_path))
    g = torch.Generator().manual_seed(3)
    codec = build_codec(name, {"ratio": 0.1} if name == "topk" else {})
    cids = [ctx.store.put_bytes(codec.encode(torch.randn(1000, generator=g))) for _ in range(4)]
    stacked = torch.stack([decode(ctx.store.get_bytes(c), max_numel=1000).to(torch.float32) for c in cids])
    assert torch.equal(decode_rows(ctx, cids, 1000), stacked)


def test_the_in_memory_round_aggregates_as_before_without_a_copy_of_the_matrix(big_round):
    ctx, cids, ups = big_round
    pipe = parse_aggregator("trend:f=0+centered-clip", default_f=0)
    ref = torch.randn(D, generator=torch.Generator().manual_seed(1))
    got = aggregate_updates(
        ctx, pipe, NormBound(), cids, [1.0, 2.0, 1.0], [1.0] * 3, [1.0, 0.5, 1.0], d=D, round_index=2, reference=ref
    )
    assert not got.streamed and got.keep == [0, 1, 2]
    U = torch.stack(ups)
    U[1] *= 0.5
    assert torch.equal(got.delta, pipe(U, torch.tensor([1.0, 2.0, 1.0]), round_index=2, reference=ref))


def test_apply_verdict_in_place_gives_the_same_rows():
    g = torch.Generator().manual_seed(2)
    U = torch.randn(4, 50, generator=g)
    kept = NormVerdict(
        norms=(1.0,) * 4,
        reference=1.0,
        actions=(KEEP, CLIP, KEEP, KEEP),
        factors=(1.0, 0.25, 1.0, 1.0),
        reasons=(None,) * 4,
    )
    dropped = dataclasses.replace(kept, actions=(KEEP, CLIP, REJECT, KEEP), factors=(1.0, 0.25, 0.0, 1.0))
    for v in (kept, dropped):
        want, keep = apply_verdict(U, v)
        mine = U.clone()
        got, keep2 = apply_verdict(mine, v, in_place=True)
        assert torch.equal(got, want) and keep == keep2
        assert (got is mine) == (v is kept)  # nothing dropped: the caller's matrix, scaled where it is
    assert torch.equal(U, torch.randn(4, 50, generator=torch.Generator().manual_seed(2)))  # not in place: untouched


def test_copies_and_alignments_of_a_large_round_hold_a_block_not_float64_copies_of_it():
    g = torch.Generator().manual_seed(4)
    base = torch.randn(2_000_000, generator=g)
    U = torch.stack([base + 0.5 * torch.randn(2_000_000, generator=g) for _ in range(3)] + [-base])  # (4, d)
    U = torch.cat([U, U[:1]])  # the fifth copies the first
    block = 1 << 20
    whole = 1 << 40  # a block larger than the round: the whole-tensor arithmetic, as before
    assert copies(U, block_bytes=block) == copies(U, block_bytes=whole) == [None, None, None, None, 0]
    assert alignments(U, block_bytes=block) == pytest.approx(alignments(U, block_bytes=whole), abs=1e-9)
    # Whole: float64 copies of the round (4x its float32 size for copies, over 3x for alignments).
    assert torch_peak(lambda: copies(U, block_bytes=whole)) > 3 * U.nbytes
    assert torch_peak(lambda: alignments(U, block_bytes=whole)) > 2 * U.nbytes
    assert torch_peak(lambda: copies(U, block_bytes=block)) < U.nbytes / 4
    assert torch_peak(lambda: alignments(U, block_bytes=block)) < U.nbytes / 4
