"""Streaming aggregation against the in-memory pipeline: every rule and wrapper, random
inputs, tiny blocks (many passes over few columns), and the edge cases."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aitbc.core.aggregation import AGGREGATORS, WRAPPERS, AggregationInfo, parse_aggregator
from aitbc.core.aggregation.streaming import RULES, WRAPPER_STREAMS, ScaledRows, TensorSource, aggregate_stream
from aitbc.core.norms import NormBound, apply_verdict, judge_norms, update_norms
from aitbc.errors import UsageError

RULE_SPECS = [
    "mean",
    "median",
    "trimmed-mean:beta=0.2",
    "krum:f={f}",
    "multi-krum:f={f}",
    "multi-krum:f={f},m=2",
    "bulyan:f={f}",
    "geometric-median",
    "centered-clip",
    "centered-clip:tau=0.5,iters=4",
    "centered-clip:start=median",
    "centered-clip:start=previous",
    "centered-clip:iters=1,norm=1.5",
    "sparse-robust:f={f}",
]
WRAPPER_SPECS = [
    "",
    "nnm:f={f}+",
    "bucketing:s=2+",
    "trend:f={f}+",
    "trend:f={f}+nnm:f={f}+",
    "bucketing:s=3+nnm:f={f}+",
]


def both(spec, u, w, *, reference=None, round_index=0, block_bytes=4 * 7):
    """(in-memory float32, in-memory float64, streamed) results with info, or the UsageError lines."""
    pipe = parse_aggregator(spec)
    try:
        mem = pipe.with_info(u, w, round_index=round_index, reference=reference)
    except UsageError as e:
        with pytest.raises(UsageError) as got:
            aggregate_stream(pipe, TensorSource(u), w, round_index=round_index, reference=reference)
        assert str(got.value) == str(e)
        return None
    mem64 = pipe.with_info(
        u.double(),
        None if w is None else w.double(),
        round_index=round_index,
        reference=None if reference is None else reference.double(),
    )
    out = aggregate_stream(
        pipe, TensorSource(u), w, round_index=round_index, reference=reference, with_info=True, block_bytes=block_bytes
    )
    return mem, mem64, out


def close(a: torch.Tensor, b: torch.Tensor, scale: float) -> bool:
    a, b = a.double(), b.double()
    if not torch.equal(torch.isfinite(a), torch.isfinite(b)):
        return False
    fin = torch.isfinite(a)
    if not torch.equal(a[~fin], b[~fin]):
        return False
    return bool(((a[fin] - b[fin]).abs() <= 1e-4 * scale + 1e-4 * a[fin].abs()).all())


def same_info(a: AggregationInfo, b: AggregationInfo) -> None:
    for name in ("selected", "kept_fraction", "weight"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            if name == "selected":
                assert x.tolist() == y.tolist()
            else:
                torch.testing.assert_close(x.double(), y.double(), atol=1e-5, rtol=1e-4, msg=name)


def agree(res, scale: float) -> None:
    """The streamed result is the in-memory one; where float32 rounding decides a selection
    in memory (near-ties, nnm's near-identical mixtures) it may be the float64 one instead."""
    if res is None:
        return
    (m, mi), (m64, mi64), (s, si) = res
    assert s.dtype == torch.float32 and s.shape == m.shape
    if close(m, s, scale):
        same_info(mi, si)
    else:
        assert close(m64, s, scale), f"streamed {s} is neither the float32 {m} nor the float64 {m64} result"
        same_info(mi64, si)


@settings(max_examples=150, deadline=None)
@given(
    rule=st.sampled_from(RULE_SPECS),
    wrapper=st.sampled_from(WRAPPER_SPECS),
    n=st.integers(1, 11),
    d=st.integers(1, 40),
    f=st.integers(0, 2),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([1e-3, 1.0, 1e4]),
    weighted=st.booleans(),
    with_reference=st.booleans(),
    block=st.sampled_from([4, 4 * 7, 4 * 64, 1 << 20]),
)
def test_streaming_equals_in_memory_on_random_inputs(
    rule, wrapper, n, d, f, seed, scale, weighted, with_reference, block
):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n, d, generator=g) * scale  # (n, d)
    u += torch.randn(1, d, generator=g) * scale * 2  # a shared component, as real updates have
    w = torch.rand(n, generator=g) + 0.1 if weighted else None
    ref = torch.randn(d, generator=g) if with_reference else None
    spec = (wrapper + rule).format(f=f)
    agree(both(spec, u, w, reference=ref, round_index=seed % 5, block_bytes=block), scale)


@pytest.mark.parametrize("rule", [r.format(f=0) for r in RULE_SPECS])
def test_one_update_streams_to_itself_where_the_rule_allows_one(rule):
    u = torch.tensor([[1.5, -2.0, 3.25]])
    res = both(rule, u, None)
    agree(res, 1.0)
    if res is not None:
        assert torch.equal(res[2][0], u[0])


@pytest.mark.parametrize("rule", [r.format(f=1) for r in RULE_SPECS])
def test_overflowing_updates_stream_as_in_memory(rule):
    # row 2's squared norm overflows float32 (its Gram entry is inf in memory), row 5 is at the float32 edge
    g = torch.Generator().manual_seed(3)
    u = torch.randn(9, 6, generator=g)
    u[2] = 1e20
    u[5] = 3e38
    agree(both(rule, u, None, block_bytes=8), 1.0)


@pytest.mark.parametrize("spec", ["krum:f=1", "multi-krum:f=1,m=2", "bulyan:f=1", "nnm:f=1+krum:f=1", "median"])
def test_exact_ties_go_to_the_same_update(spec):
    # two pairs of identical updates: Krum's tie rule (then the lower index) decides alike
    u = torch.tensor([[0.0, 1.0], [0.0, 1.0], [5.0, 5.0], [0.2, 1.1], [0.2, 1.1], [9.0, -9.0], [0.1, 0.9]])
    (m, mi), _, (s, si) = both(spec, u, None, block_bytes=4)
    assert torch.equal(m, s)
    same_info(mi, si)


@pytest.mark.parametrize("spec", ["mean", "multi-krum:f=1", "geometric-median", "centered-clip", "bucketing:s=2+mean"])
def test_weights_including_zeros_stream_as_in_memory(spec):
    g = torch.Generator().manual_seed(5)
    u = torch.randn(7, 33, generator=g)
    w = torch.tensor([0.0, 3.0, 1.0, 0.0, 2.0, 5.0, 1.0])
    agree(both(spec, u, w, block_bytes=4 * 7 * 5), 1.0)


@pytest.mark.parametrize(
    ("wrapper", "overflow"), [("", True), ("nnm:f=1+", True), ("trend:f=1+", False)]
)  # trend with an overflowing row: memory (float32 norm: inf, cos 0, dropped) and stream (float64 norm) differ
def test_centered_clip_from_the_previous_step_streams_as_in_memory(wrapper, overflow):
    # the reference is near the updates (as a last step is); row 3's norm and dot overflow float32
    g = torch.Generator().manual_seed(11)
    u = torch.randn(8, 21, generator=g) + 4.0
    ref = u.mean(0) + 0.1 * torch.randn(21, generator=g)
    if overflow:
        u[3] = 1e30
    else:
        u[3] = -u[3]  # against the reference: the trend drops it
    agree(both(wrapper + "centered-clip:start=previous", u, None, reference=ref, block_bytes=4 * 8 * 3), 1.0)


def test_the_norm_bound_streams_as_apply_verdict():
    # Prepare: one update clipped (5x the median), one rejected (5000x)
    g = torch.Generator().manual_seed(1)
    u = torch.randn(6, 50, generator=g)
    u[1] *= 5.0
    u[4] *= 5000.0
    verdict = judge_norms(update_norms(u), NormBound())
    kept, keep = apply_verdict(u, verdict)
    assert verdict.clipped == [1] and verdict.rejected == [4]
    rows = ScaledRows(TensorSource(u), keep, [verdict.factors[i] for i in keep])
    pipe = parse_aggregator("trimmed-mean:beta=0.2")

    # Execute
    out, _ = aggregate_stream(pipe, rows, block_bytes=4 * 5 * 3)

    # Assert: the same rows, scaled by the same float32 multiply, so bit for bit
    assert rows.shape == (5, 50)
    assert torch.equal(rows.read(range(5), 0, 50), kept)
    assert torch.equal(out, pipe(kept))


def test_every_rule_and_wrapper_has_a_streaming_form():
    assert sorted(RULES) == AGGREGATORS.names()
    assert sorted(WRAPPER_STREAMS) == WRAPPERS.names()


def test_a_bad_source_or_argument_is_one_clear_line():
    pipe = parse_aggregator("mean")
    u = torch.ones(3, 4)
    u[1, 2] = math.nan
    u[2, 0] = math.inf
    with pytest.raises(UsageError, match=r"^updates \[1, 2\] contain NaN or Inf; reject them before aggregation$"):
        aggregate_stream(pipe, TensorSource(u))
    with pytest.raises(UsageError, match=r"^weights must have shape \(3,\), got \(2,\)$"):
        aggregate_stream(pipe, TensorSource(torch.ones(3, 4)), torch.ones(2))
    with pytest.raises(UsageError, match="weights must be finite"):
        aggregate_stream(pipe, TensorSource(torch.ones(3, 4)), torch.tensor([-1.0, 1.0, 1.0]))
    with pytest.raises(UsageError, match=r"^reference must have shape \(4,\)"):
        aggregate_stream(parse_aggregator("trend:f=1+mean"), TensorSource(torch.ones(3, 4)), reference=torch.ones(5))
    with pytest.raises(UsageError, match=r"^updates must be a non-empty \(n, d\) tensor"):
        TensorSource(torch.ones(0, 4))
    with pytest.raises(UsageError, match="float32"):
        TensorSource(torch.ones(2, 4, dtype=torch.float64))
    with pytest.raises(UsageError, match=r"^krum needs n >= f\+3"):
        aggregate_stream(parse_aggregator("krum:f=1"), TensorSource(torch.ones(3, 4)))
    with pytest.raises(ValueError, match="block_bytes"):
        aggregate_stream(pipe, TensorSource(torch.ones(3, 4)), block_bytes=2)
