"""core/gossip: the live worker's per-round neighbour draw is the simulator's draw, and the
combine is the norm bound then the run's rule (one code path for sim, worker, coordinator)."""

from __future__ import annotations

import pytest
import torch

from aitbc.core.aggregation import parse_aggregator
from aitbc.core.gossip import RoundNeighbours, check_topology, mix_weight, neighbours, robust_combine
from aitbc.core.norms import NormBound
from aitbc.core.options import parse_spec
from aitbc.core.staleness import build_staleness
from aitbc.errors import UsageError


@pytest.mark.parametrize("topology", ["ring", "random:2"])
def test_a_worker_draws_the_simulators_neighbours(topology):
    n, seed = 5, 7
    sim = neighbours(topology, n, torch.Generator().manual_seed(seed + 3))  # as Simulation.mode_gen
    draws = [sim() for _ in range(6)]
    for i in range(n):
        live = RoundNeighbours(topology, n, seed)  # each worker keeps its own
        assert [live.of(r, i) for r in range(1, 7)] == [d[i] for d in draws]
    assert all(i not in d[i] for d in draws for i in range(n))


@pytest.mark.parametrize(
    ("topology", "n", "words"),
    [("ring", 1, "at least 2 workers"), ("random:0", 4, "1 <= K < workers"), ("star", 4, "allowed: ring, random:K")],
)
def test_bad_topologies_are_usage_errors(topology, n, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(")):
        check_topology(topology, n)


def test_combine_drops_a_huge_model_then_applies_the_rule():
    models = [torch.full((4,), 1.0), torch.full((4,), 1.2), torch.full((4,), 0.9), torch.full((4,), 1e9)]
    out = robust_combine(
        models, [1.0] * 4, aggregator=parse_aggregator("median"), norm_bound=NormBound(), round_index=1
    )
    assert out.rejected == (3,) and out.result is not None
    assert torch.allclose(out.result, torch.full((4,), 1.0))


@pytest.mark.parametrize("spec", ["constant", "polynomial", "polynomial:a=1", "hinge:a=10,b=0"])
def test_a_neighbours_stale_model_counts_the_staleness_rules_weight(spec):
    rule = build_staleness(*parse_spec(spec, what="staleness rule"))
    assert mix_weight(120.0, 0, rule, 4) == 120.0  # a neighbour of the same round (the simulator's): its samples
    for s in range(1, 5):
        assert mix_weight(120.0, s, rule, 4) == pytest.approx(120.0 * rule(s))
    assert mix_weight(120.0, 5, rule, 4) is None  # past max_staleness: left out
    if spec != "constant":
        assert mix_weight(120.0, 4, rule, 4) < mix_weight(120.0, 1, rule, 4) < 120.0
