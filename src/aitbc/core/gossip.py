"""Gossip: who mixes with whom, and how a model is mixed with its neighbours'.

One code path for ``aitbc simulate --mode gossip`` (:func:`aitbc.sim.modes.run_gossip`), the
live worker (:mod:`aitbc.worker.gossip`) and the coordinator's consensus over published
models (:mod:`aitbc.coordinator.gossip`):

- :func:`neighbours`: a topology spec (``ring`` or ``random:K``) as a function that returns,
  each time it is called (once per round), every worker's neighbour indices. ``random:K``
  draws from a generator seeded by the run's seed, so every live worker draws the same
  neighbours for a round as the simulator would (:class:`RoundNeighbours`).
- :func:`robust_combine`: the run's norm bound then its robust rule over a list of vectors
  (updates in sync and async, whole models in gossip); ``None`` when too few are left for
  the rule's conditions.
- :func:`mix_weight`: what a neighbour's model counts for in a mix: its samples, scaled by
  the run's staleness rule when it is of an older round than the mixer's (a live worker
  beside a slower one; the simulator's neighbours are never stale).

Shape letters: ``k`` vectors combined, ``d`` parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from aitbc.core.aggregation.pipeline import AggregatorPipeline
from aitbc.core.norms import NormBound, apply_verdict, judge_norms, update_norms
from aitbc.core.staleness import async_weight
from aitbc.errors import UsageError

TOPOLOGIES = "ring, random:K"
GOSSIP_CODECS = {"none", "fp16", "bf16", "int8", "int4"}  # value codecs: fit for whole models
GOSSIP_SEED_OFFSET = 3  # the simulator's mode generator: seed + 3
PACE_MIN_STEPS = 4  # a worker's pace is judged from this many steps into its round (the first is slower)


def check_topology(topology: str, n: int) -> int:
    """How many neighbours each worker has on ``topology`` with ``n`` workers, or a
    ``UsageError`` naming what is allowed."""
    kind, _, arg = topology.partition(":")
    if kind == "ring" and not arg:
        if n < 2:
            raise UsageError(f"gossip on a ring needs at least 2 workers, got {n}")
        return min(2, n - 1)
    if kind == "random":
        try:
            k = int(arg)
        except ValueError:
            raise UsageError(f"--topology random:K needs an integer K, got {topology!r}") from None
        if not 1 <= k < n:
            raise UsageError(f"--topology random:K needs 1 <= K < workers ({n}), got K={k}")
        return k
    raise UsageError(f"unknown --topology {topology!r}; allowed: {TOPOLOGIES}")


def neighbours(topology: str, n: int, gen: torch.Generator) -> Callable[[], list[list[int]]]:
    """Each call: every worker's neighbours for the next round (see the module's docstring)."""
    k = check_topology(topology, n)
    if topology == "ring":
        ring = [sorted({(i - 1) % n, (i + 1) % n} - {i}) for i in range(n)]
        return lambda: ring

    def draw() -> list[list[int]]:
        peers = []
        for i in range(n):
            others = torch.randperm(n - 1, generator=gen)[:k]  # (k,) indices among the n-1 others
            peers.append(sorted(int(j) + (int(j) >= i) for j in others))
        return peers

    return draw


class RoundNeighbours:
    """A live worker's view of :func:`neighbours`: round ``r``'s draw (1-based), the same as
    the simulator's ``r``-th call with the generator seeded ``seed + 3``."""

    def __init__(self, topology: str, n: int, seed: int) -> None:
        self._next = neighbours(topology, n, torch.Generator().manual_seed(seed + GOSSIP_SEED_OFFSET))
        self._draws: list[list[list[int]]] = []

    def of(self, r: int, i: int) -> list[int]:
        while len(self._draws) < r:  # a ring returns one list each time: cheap to keep
            self._draws.append(self._next())
        return self._draws[r - 1][i]


def mix_weight(samples: float, staleness: int, rule: Callable[[int], float], max_staleness: int) -> float | None:
    """A neighbour's model ``staleness`` rounds older than the mixer's round: its weight in
    the mix, ``samples`` times the run's staleness rule's weight (as an async update that
    many versions old: :func:`aitbc.core.staleness.async_weight`), or None (left out) past
    ``max_staleness``. A stale model is a point training has moved on from, not a step: at
    full weight it pulls its neighbours back (measured: bench/live_stragglers.py)."""
    w = async_weight(rule, staleness, max_staleness)
    return None if w is None else samples * w


@dataclass(frozen=True, slots=True)
class Combined:
    result: Tensor | None  # (d,); None: too few left for the rule
    rejected: tuple[int, ...]  # indices past the norm bound's reject level
    clipped: tuple[int, ...]


def robust_combine(
    vectors: list[Tensor],
    weights: list[float],
    *,
    aggregator: AggregatorPipeline,
    norm_bound: NormBound,
    round_index: int,
    reference: Tensor | None = None,
) -> Combined:
    """The norm bound (grossly large dropped, large clipped), then the robust rule over the
    rest: ``(k, d) -> (d,)``."""
    U = torch.stack(vectors)  # (k, d)
    verdict = judge_norms(update_norms(U), norm_bound)
    U, keep = apply_verdict(U, verdict)  # (k, d) -> (k', d)
    try:
        aggregator.check(len(keep))
    except UsageError:
        return Combined(None, tuple(verdict.rejected), tuple(verdict.clipped))
    w = torch.tensor([weights[i] for i in keep])  # (k',)
    out = aggregator(U, w, round_index=round_index, reference=reference)
    return Combined(out, tuple(verdict.rejected), tuple(verdict.clipped))
