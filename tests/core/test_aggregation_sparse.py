"""``sparse-robust``: robust aggregation of sparse updates (each nonzero on a few percent of
the coordinates, mostly different ones), and the default that picks it for sparse codecs."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from aitbc import run_defaults
from aitbc.core.aggregation import aggregate, parse_aggregator
from aitbc.core.aggregation.sparse import COPY_JACCARD, copy_groups
from aitbc.core.aggregation.streaming import TensorSource, aggregate_stream
from aitbc.sim.config import SimConfig

D = 4000
K = 80  # 2% of D


def _sparse(direction: torch.Tensor, gen: torch.Generator, *, noise: float = 0.5) -> torch.Tensor:
    """A top-k update of a noisy copy of ``direction``: its K largest coordinates kept."""
    full = direction + noise * torch.randn(D, generator=gen)
    out = torch.zeros(D)
    top = full.abs().topk(K).indices
    out[top] = full[top]
    return out


def _round(seed: int, honest: int = 6, noise: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``honest`` sparse updates along one dense direction ``g`` (a gradient spread over
    every coordinate, so each worker's top-k lands on mostly different ones), and ``g``."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(D, generator=gen)
    return torch.stack([_sparse(g, gen, noise=noise) for _ in range(honest)]), g


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize("with_reference", [False, True])
def test_a_sign_flipped_minority_is_bounded(with_reference):
    honest, g = _round(0)
    flipped = -4.0 * honest[:2]  # 2 of 8 reverse and amplify their own updates (sign-flip)
    updates = torch.cat([honest, 1e3 * flipped])  # and scale them past any norm
    reference = honest.mean(0) if with_reference else None
    out, info = parse_aggregator("sparse-robust", default_f=2).with_info(updates, reference=reference)
    mean = honest.mean(0)
    assert _cos(out, g) > 0.5 * _cos(mean, g)
    # Each update counts at most at the round's median norm: the attackers cannot make the
    # result larger than the honest updates are.
    assert float(out.norm()) <= float(honest.norm(dim=1).max())
    if with_reference:  # they point against the trend: dropped
        assert info.weight is not None and float(info.weight[6:].sum()) == 0.0
    assert float(aggregate("mean", updates) @ g) < 0  # where the plain mean goes


@pytest.mark.parametrize("with_reference", [False, True])
def test_honest_updates_on_disjoint_supports_give_the_mean(with_reference):
    gen = torch.Generator().manual_seed(1)
    updates = torch.zeros(8, D)
    for i in range(8):  # disjoint supports, equal norms, positive along a shared trend
        block = slice(i * K, (i + 1) * K)
        updates[i, block] = torch.rand(K, generator=gen) + 0.5
        updates[i] *= 2.0 / updates[i].norm()
    reference = updates.mean(0) if with_reference else None
    out = parse_aggregator("sparse-robust", default_f=2)(updates, reference=reference)
    assert_close(out, updates.mean(0))


def test_an_attacker_that_repeats_the_last_step_is_dropped():
    # Late in a run the honest updates barely correlate with the last step, while an
    # attacker that got into it once sends nearly the same coordinates again.
    honest, g = _round(2)
    gen = torch.Generator().manual_seed(3)
    attacker = -_sparse(g, gen, noise=3.0)
    reference = (honest.sum(0) + attacker) / 7 + 0.01 * torch.randn(D, generator=gen)
    honest_now, _ = _round(4)  # this round's honest updates: other coordinates
    updates = torch.cat([honest_now, attacker[None]])
    _, info = parse_aggregator("sparse-robust", default_f=1).with_info(updates, reference=reference)
    assert info.weight is not None and float(info.weight[-1]) == 0.0
    _, trend = parse_aggregator("trend+centered-clip", default_f=1).with_info(updates, reference=reference)
    assert trend.weight is not None and float(trend.weight[-1]) > 0  # the trend check alone keeps it


def test_the_copy_detector_flags_an_index_overlap_copy_and_not_honest_overlap():
    honest, _ = _round(5, noise=0.3)  # an early round: every worker's largest coordinates are much the same
    support = (honest != 0).to(torch.float64)
    counts = support @ support.T
    shared = counts.fill_diagonal_(0).max() / K
    assert shared > 0.5  # honest supports do overlap: more than half of one in another
    assert not copy_groups(support @ support.T, COPY_JACCARD).fill_diagonal_(False).any()

    copy = torch.zeros(D)
    idx = honest[0].nonzero().flatten()
    gen = torch.Generator().manual_seed(6)
    copy[idx] = honest[0, idx] * (1 + 0.3 * torch.randn(idx.numel(), generator=gen))  # new values, same indices
    copy[idx[:4]] = 0.0
    copy[torch.arange(D - 4, D)] = 1.0  # a few indices moved
    updates = torch.cat([honest, copy[None]])
    s = (updates != 0).to(torch.float64)
    groups = copy_groups(s @ s.T, COPY_JACCARD)
    assert groups[0, 6] and groups[6, 0]
    assert int(groups.sum()) == 7 + 2  # each with itself, and the one pair

    _, info = parse_aggregator("sparse-robust", default_f=0).with_info(updates)
    assert info.weight is not None
    assert_close(float(info.weight[0] + info.weight[6]), float(info.weight[1]), rtol=0.3, atol=0.0)


def test_deterministic_and_streams_as_in_memory():
    honest, g = _round(7)
    updates = torch.cat([honest, -4.0 * honest[:2]])
    pipe = parse_aggregator("sparse-robust", default_f=2)
    for reference in (None, g):
        a = pipe(updates, reference=reference)
        assert torch.equal(a, pipe(updates.clone(), reference=reference))
        streamed, _ = aggregate_stream(pipe, TensorSource(updates), reference=reference, block_bytes=4 * 8 * 500)
        assert_close(streamed, a, rtol=1e-5, atol=1e-7)


def test_a_sparse_codec_gets_sparse_robust_by_default_and_a_named_rule_stays():
    assert run_defaults.default_aggregator("sparseloco:density=0.02,bits=2") == "sparse-robust"
    assert run_defaults.default_aggregator("topk:ratio=0.01") == "sparse-robust"
    assert run_defaults.default_aggregator("int8") == run_defaults.AGGREGATOR
    assert SimConfig(compression="sparseloco").aggregator == "sparse-robust"
    assert SimConfig().aggregator == run_defaults.AGGREGATOR
    assert SimConfig(compression="sparseloco", aggregator="mean").aggregator == "mean"


def test_bad_options_name_the_option():
    with pytest.raises(ValueError, match="clip >= 1"):
        parse_aggregator("sparse-robust:f=1,clip=0.5")
    with pytest.raises(ValueError, match="copy"):
        parse_aggregator("sparse-robust:f=1,copy=0")
