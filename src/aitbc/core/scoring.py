"""Contribution scoring: how much each accepted update of a round was worth.

Three signals per update, each a plain number the coordinator measures (it evaluates the
model; this module only judges):

- **gain**: relative loss reduction on a held-out validation batch no worker sees,
  ``(L_before - L_after) / L_before``, where ``L_after`` is the loss of the global model
  with this update alone applied (Templar pays miners by exactly this).
- **assigned-data check**: the same gain measured on a batch of the worker's own shard and
  on an equal batch of other workers' data. An honest update fits its own data at least
  about as well as others' (``own >= other`` up to sampling noise); one that helps its own
  shard clearly less than others' data (``own < (1 - unassigned_slack) * other - 0.02``,
  or not at all while others gain) was copied from someone else or not trained on its shard.
- **aggregator verdict**: the share of coordinates the robust rule kept of the update
  (Krum-style selection keeps 0 or 1; trimming keeps a fraction). Under half is an outlier.

Plus a **copy** check over the round: an update equal (cosine > 0.9999) to an earlier
one of the same round is a replay. ``quality`` in ``[0, 1]`` is 0 for any flag and otherwise
rises with gain to 1 at ``full_credit`` times the round's median positive gain, so honest
workers of a round earn full pay and a free-rider (gain ~ 0) earns nothing. ``harmful``
(the update alone makes held-out loss worse by more than ``harm_threshold`` *and* points
against the round's other updates: near convergence an honest update alone may cost a
little, but it still points the way the others do; a reversed one points back) and ``copy`` are
*provable*: anyone holding the update and the data can re-check them, and they slash.

Shapes: ``n`` updates, ``d`` parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

HARMFUL = "harmful"
COPY = "copy"
UNASSIGNED = "unassigned"
OUTLIER = "outlier"
PROVABLE = frozenset({HARMFUL, COPY})  # flags that slash the bond


@dataclass(frozen=True, kw_only=True, slots=True)
class ScoringConfig:
    full_credit: float = 0.25  # quality 1 at this fraction of the round's median positive gain
    harm_threshold: float = 0.1  # harmful: the update alone raises held-out loss by more than this share...
    harm_alignment: float = 0.3  # ... and points against the round's other updates (cosine below -this)
    outlier_kept: float = 0.5  # kept share below this is an outlier
    copy_cosine: float = 0.9999  # closer than this to an earlier update is a copy
    unassigned_slack: float = 0.5  # own-shard gain may fall this share below others' (noise)

    def __post_init__(self) -> None:
        for name in (
            "full_credit",
            "harm_threshold",
            "harm_alignment",
            "outlier_kept",
            "copy_cosine",
            "unassigned_slack",
        ):
            v = getattr(self, name)
            if not (0 < v <= 1):
                raise ValueError(f"{name} must be in (0, 1], got {v}")


@dataclass(frozen=True, slots=True)
class UpdateScore:
    gain: float  # relative loss reduction on held-out data
    own_gain: float  # ... on the worker's own shard
    other_gain: float  # ... on other workers' data
    kept: float  # share the robust rule kept (1.0 when the rule keeps everything)
    flags: tuple[str, ...]
    quality: float  # [0, 1]

    @property
    def provable(self) -> bool:
        return any(f in PROVABLE for f in self.flags)


def relative_gain(before: float, after: float) -> float:
    """``(before - after) / before``; 0 when ``before`` is not a positive finite loss."""
    if not (before > 0 and math.isfinite(before)):
        return 0.0
    if not math.isfinite(after):
        return -math.inf
    return (before - after) / before


def copies(updates: Tensor, *, cosine: float = 0.9999) -> list[int | None]:
    """For each of ``updates`` ``(n, d)``, the index of an earlier update it copies
    (cosine similarity above ``cosine``), else None. Zero updates copy nothing."""
    n = updates.shape[0]
    out: list[int | None] = [None] * n
    if n < 2:
        return out
    x = updates.to(torch.float64)
    norms = x.norm(dim=1)  # (n,)
    unit = x / norms.clamp_min(1e-30).unsqueeze(1)  # (n, d)
    sim = unit @ unit.T  # (n, n)
    for i in range(1, n):
        if norms[i] == 0:
            continue
        earlier = (sim[i, :i] > cosine) & (norms[:i] > 0)
        hit = torch.nonzero(earlier)
        if hit.numel():
            out[i] = int(hit[0, 0])
    return out


def alignments(updates: Tensor) -> list[float]:
    """Cosine of each update ``(n, d)`` with the round's coordinate-wise median: honest
    updates point roughly the same way, a reversed one points back. The median, not the
    mean, so one large attacker cannot turn the reference around; with fewer than 3
    updates there is no majority to judge by (1.0 for all)."""
    n = updates.shape[0]
    if n < 3:
        return [1.0] * n
    x = updates.to(torch.float64)
    ref = x.median(dim=0).values.unsqueeze(0)  # (1, d)
    cos = torch.nn.functional.cosine_similarity(x, ref.expand_as(x), dim=1, eps=1e-30)  # (n,)
    return [float(c) for c in cos]


def score_round(
    gains: list[float],
    own_gains: list[float],
    other_gains: list[float],
    kept: list[float],
    copied: list[int | None],
    cfg: ScoringConfig | None = None,
    alignment: list[float] | None = None,
) -> list[UpdateScore]:
    """Judge the round's ``n`` accepted updates (all lists have length ``n``)."""
    cfg = cfg or ScoringConfig()
    n = len(gains)
    alignment = [1.0] * n if alignment is None else alignment
    if not (len(own_gains) == len(other_gains) == len(kept) == len(copied) == len(alignment) == n):
        raise ValueError("score_round needs one value per update in every list")
    positive = sorted(g for g in gains if g > 0)
    median = positive[len(positive) // 2] if positive else 0.0
    scores = []
    for i in range(n):
        flags = []
        if gains[i] < -cfg.harm_threshold and alignment[i] < -cfg.harm_alignment:
            flags.append(HARMFUL)
        if copied[i] is not None:
            flags.append(COPY)
        if unassigned(own_gains[i], other_gains[i], cfg):
            flags.append(UNASSIGNED)
        if kept[i] < cfg.outlier_kept:
            flags.append(OUTLIER)
        if flags or gains[i] <= 0:
            quality = 0.0
        else:
            quality = min(1.0, gains[i] / (cfg.full_credit * median)) if median > 0 else 1.0
        scores.append(
            UpdateScore(
                gain=gains[i],
                own_gain=own_gains[i],
                other_gain=other_gains[i],
                kept=kept[i],
                flags=tuple(flags),
                quality=quality,
            )
        )
    return scores


def unassigned(own: float, other: float, cfg: ScoringConfig) -> bool:
    """The update helps its own shard clearly less than other workers' data."""
    if other > 0 and own <= 0:
        return True
    return own < (1 - cfg.unassigned_slack) * other - 0.02


def reputation_update(reputation: float, quality: float, *, alpha: float = 0.3) -> float:
    """Exponential moving average of quality on the 0-5 reputation scale."""
    if not (0 <= quality <= 1):
        raise ValueError(f"quality must be in [0, 1], got {quality}")
    return 5.0 * (alpha * quality + (1 - alpha) * (reputation / 5.0))
