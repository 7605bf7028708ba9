"""Gossip: who mixes with whom, and how a model is mixed with its neighbours'.

One code path for ``aitbc simulate --mode gossip`` (:func:`aitbc.sim.modes.run_gossip`), the
live worker (:mod:`aitbc.worker.gossip`) and the coordinator's consensus over published
models (:mod:`aitbc.coordinator.rounds.gossip`):

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

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from aitbc.core.aggregation.pipeline import AggregatorPipeline
from aitbc.core.compression import build_codec
from aitbc.core.norms import NormBound, apply_verdict, judge_norms, update_norms
from aitbc.core.options import parse_spec
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


# --- copies: a published model that is another's, with or without noise -------------------

# A model this close to another worker's published model (a fraction of the round's median
# distance between its published models) is a copy, not local training. Calibrated on honest
# simulated gossip runs (tests/core/test_gossip_copies.py; digits MLP, 8-10 rounds, ring and
# random:K, 4-8 workers, codecs none/int8/int4, mixing rules median/mean/trimmed-mean, adamw
# lr 0.001-0.3, 5-20 local steps, seeds 0-1; 20 configurations): an honest worker's nearest
# other model (another's of its round or the one before, or the last consensus) was 0.59 x
# the round's median distance or more at the default lr 0.001 and on rings; on random:2 with
# median mixing at lr 0.1-0.3 it came down to 0.009 (two workers that mixed the same three
# models start a round from one point, and an unstable step leaves them close while the
# others fly apart). 0.002 leaves a 4.5x margin under that worst. A copier that adds more
# noise than that is not caught by distance; its model is then judged as any other.
COPY_FRACTION = 0.002


@dataclass(frozen=True)
class Near:
    """Model ``i`` of the round is ``ratio`` x the round's median distance from ``other``:
    ``("now", j)`` (model ``j`` of the same round), ``("before", k)`` (model ``k`` of the
    previous round), or ``("reference", 0)`` (the previous round's consensus)."""

    i: int
    other: tuple[str, int]
    ratio: float


def _distances(
    now: list[Tensor], owners: list[str], before: list[Tensor], before_owners: list[str], reference: Tensor | None
) -> tuple[float, list[list[tuple[tuple[str, int], float]]]]:
    """The round's median distance between its models, and each model's distance to every
    model it is compared with (see :func:`near_copies`)."""
    n = len(now)
    stack = torch.stack([m.to(torch.float64) for m in now])  # (n, d)
    dist = torch.cdist(stack, stack)  # (n, n)
    scale = float(dist[tuple(torch.triu_indices(n, n, offset=1))].median())
    out: list[list[tuple[tuple[str, int], float]]] = []
    for i in range(n):
        row = [(("now", j), float(dist[i, j])) for j in range(n) if owners[j] != owners[i]]
        row += [
            (("before", k), float((stack[i] - m.to(torch.float64)).norm()))
            for k, (m, who) in enumerate(zip(before, before_owners, strict=True))
            if who != owners[i]
        ]
        if reference is not None:
            row.append((("reference", 0), float((stack[i] - reference.to(torch.float64)).norm())))
        out.append(row)
    return scale, out


def near_copies(
    now: list[Tensor],
    owners: list[str],
    *,
    before: list[Tensor] | None = None,
    before_owners: list[str] | None = None,
    reference: Tensor | None = None,
    fraction: float = COPY_FRACTION,
) -> list[Near]:
    """Pairs of published models too close to be two workers' own training (see
    :data:`COPY_FRACTION`): each model of the round (``now``, each ``(d,)``, published by
    ``owners[i]``) against the round's other owners' models, the previous round's models of
    other owners (``before``, published by ``before_owners``), and the previous round's
    consensus (``reference``). A pair of the same round is given once (``i < j``): which of
    the two copied is for the caller to tell (who signed first). The scale is the median
    distance between the round's models, so it needs at least 3 of them (with 2 there is no
    typical distance to judge by): fewer, nothing is near. Pure: no I/O."""
    if len(now) < 3:
        return []
    scale, rows = _distances(now, owners, before or [], before_owners or [], reference)
    if not scale > 0:
        return []
    return [
        Near(i, other, d / scale)
        for i, row in enumerate(rows)
        for other, d in row
        if d < fraction * scale and not (other[0] == "now" and other[1] < i)
    ]


def nearest_ratio(
    now: list[Tensor],
    owners: list[str],
    *,
    before: list[Tensor] | None = None,
    before_owners: list[str] | None = None,
    reference: Tensor | None = None,
) -> list[float]:
    """Each model's nearest other (as :func:`near_copies` compares) over the round's median
    distance: what :data:`COPY_FRACTION` is calibrated on (``inf``: nothing to compare)."""
    if len(now) < 3:
        return [math.inf] * len(now)
    scale, rows = _distances(now, owners, before or [], before_owners or [], reference)
    return [min(d for _, d in row) / scale if row and scale > 0 else math.inf for row in rows]


@lru_cache(maxsize=64)
def model_bytes(compression: str, d: int) -> int:
    """The exact size of a gossip model's blob: ``d`` values encoded with the run's value
    codec (header included; the values do not change it). A peer that sends more for a
    model's CID is refused at the byte past it."""
    name, opts = parse_spec(compression, what="codec")
    return len(build_codec(name, opts).encode(torch.zeros(d)))


def distinct(models: list[Tensor], owners: list[str], *, fraction: float = COPY_FRACTION) -> list[int]:
    """The indices of ``models`` to mix, a copy counted once: of two owners' models that
    are the same (equal, or :func:`near_copies` of each other), the later in the list is
    left out (a mixer lists its own model first: a neighbour's copy of it is left out).
    Honest models are never that near (:data:`COPY_FRACTION`), so an honest mix is
    unchanged; a copier's model would otherwise count twice in its victim's mix (a median
    of the victim, the copy and one other is the victim's own model: it stops mixing)."""
    dropped: set[int] = set()
    for j in range(len(models)):
        for i in range(j):
            if i not in dropped and owners[i] != owners[j] and torch.equal(models[i], models[j]):
                dropped.add(j)
                break
    for near in near_copies(models, owners, fraction=fraction):
        j = near.other[1]
        if near.i not in dropped:
            dropped.add(j)
    return [k for k in range(len(models)) if k not in dropped]
