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
  (Krum-style selection keeps 0 or 1; trimming keeps a fraction). Under half is an outlier
  only if the update also earns no credit and does not point the round's way (alignment
  <= 0): a robust rule drops or trims honest updates too (multi-krum always leaves ``f``
  out, trimming cuts about ``2 beta`` of every update's coordinates), so its verdict alone
  is no evidence.

Plus a **copy** check over the round: an update equal (cosine > 0.9999) to an earlier
one of the same round is a replay.

**Noise.** Each gain is a mean over a batch of per-sample loss differences, so the
coordinator also measures its standard error from the same batch (``gain_se``,
``own_se``, ``other_se``: the spread of the paired per-sample differences over the square
root of the batch size). Near convergence a round's true gains are about 0 and what is left
is this noise; the old rules (``own <= 0 < other`` unassigned, ``gain <= 0`` unpaid) then
fired on honest workers about half the time. So:

- a *flag* counts only when the signal clears ``flag_z`` standard errors beyond its
  threshold (``unassigned``: the shortfall of own against others' gain; ``harmful``: the
  loss increase past ``harm_threshold``); at 4 standard errors an honest update is flagged
  by noise in well under 1 in 10,000 rounds (measured: bench/honest_runs.py);
- *pay* is judged on a credit, a gain up to ``credit_z`` standard errors of its own
  measurement. When every update of the round visibly helps held-out data (``gain +
  credit_z * gain_se > 0`` for all), the held-out gain pays. Otherwise -- a converged round,
  where held-out gains are noise around 0; non-IID shards, where an honest update alone
  fits its own classes and may cost held-out loss; or a cheater in the round -- each update
  is paid on its gain on the shard it was given (``own_gain``), which honest training
  reduces even at convergence. An update that raises held-out loss past
  ``harm_threshold`` beyond its noise and beyond the round's median update (by more than
  ``flag_z`` times the round's robust spread) earns nothing either way. A zero update (a free-rider) has no noise (every per-sample
  difference is 0) and no gain anywhere: it earns nothing; a tiny one earns a tiny share;
- *pay is judged at the update's share.* The close applies an update at its weight in the
  round's mean (``w_i / sum w``: its samples over the round's), not alone; so pay's gains
  are measured there too (``share_gains``, ``share_own``, with their standard errors), while
  the flags keep the update alone (what anyone can re-check, and where a reversed update is
  plainest). It matters near convergence: each honest update alone carries its own noise
  (an optimizer restarted each round moves every parameter about ``lr`` a step), which the
  mean averages out; alone it can raise every loss while its share still lowers it.
  Measured on a byte transformer, 4 workers (``bench/honest_runs.py --task transformer``):
  in the late rounds every update alone cost held-out loss (-0.4% to -2.3%) and went unpaid
  in 2-4 rounds of 20; at its share each one gained +0.2% to +0.9%, 3 to 18 standard errors
  above 0. At its share nearly every update helps held-out data, one trained on a
  neighbour's shard instead of its own as much as an honest one; so where the held-out
  gains decide, an update is paid the lesser of its held-out and its own-shard credit
  (each against its own reference). Without the share lists (None), pay judges the gains
  alone, on held-out data alone where those decide, as before;
- ``quality`` in ``[0, 1]`` is 0 for any flag and otherwise rises with credit to 1 at
  ``full_credit`` times the round's reference: the median positive gain of the signal
  paid on, or, if none is above 0, the median positive credit.

Without standard errors (the defaults, 0) every rule reduces to its plain threshold.
``harmful`` (the update alone makes held-out loss significantly worse by more than
``harm_threshold`` *and* points against the round's other updates: near convergence an
honest update alone may cost a little, but it still points the way the others do; a
reversed one points back) and ``copy`` are *provable*: anyone holding the update and the
data can re-check them, and they slash. ``unassigned`` and ``outlier`` only zero the
round's pay.

Shapes: ``n`` updates, ``d`` parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from aitbc.core.aggregation.streaming import BLOCK_BYTES, ColumnSource, TensorSource, column_blocks, gram64

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
    flag_z: float = 4.0  # a flag's signal must clear its threshold by this many standard errors
    credit_z: float = 2.0  # pay judges gain + this many standard errors of its measurement

    def __post_init__(self) -> None:
        for name in ("flag_z", "credit_z"):
            v = getattr(self, name)
            if not (0 <= v <= 10):
                raise ValueError(f"{name} must be in [0, 10], got {v}")
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
    gain_se: float = 0.0  # standard error of gain (measured from the same batch)

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


def copies(
    updates: Tensor | ColumnSource, *, cosine: float = 0.9999, block_bytes: int = BLOCK_BYTES
) -> list[int | None]:
    """For each of ``updates`` ``(n, d)``, the index of an earlier update it copies
    (cosine similarity above ``cosine``), else None. Zero updates copy nothing. A
    ``ColumnSource`` (a round streamed from disk) gives the same cosines from its float64
    Gram matrix, read one column block at a time; so does a tensor too large for one
    block (:func:`_blockwise`)."""
    n = updates.shape[0]
    out: list[int | None] = [None] * n
    if n < 2:
        return out
    updates = _blockwise(updates, block_bytes)
    if isinstance(updates, Tensor):
        x = updates.to(torch.float64)
        norms = x.norm(dim=1)  # (n,)
        unit = x / norms.clamp_min(1e-30).unsqueeze(1)  # (n, d)
        sim = unit @ unit.T  # (n, n)
    else:
        g = gram64(updates, block_bytes)  # (n, n)
        norms = g.diagonal().clamp_min(0.0).sqrt()  # (n,)
        c = norms.clamp_min(1e-30)
        sim = g / (c[:, None] * c[None, :])  # (n, n)
    for i in range(1, n):
        if norms[i] == 0:
            continue
        earlier = (sim[i, :i] > cosine) & (norms[:i] > 0)
        hit = torch.nonzero(earlier)
        if hit.numel():
            out[i] = int(hit[0, 0])
    return out


def _blockwise(updates: Tensor | ColumnSource, block_bytes: int) -> Tensor | ColumnSource:
    """A tensor whose float64 copy would pass one column block (``block_bytes``) as a
    ``ColumnSource`` over it, so :func:`copies` and :func:`alignments` hold one block's
    float64 copy, not the whole round's (three 25M-parameter updates: 600 MB a copy, and
    the whole-tensor median and cosines made several). Small rounds keep the whole-tensor
    arithmetic; the blocked one gives the same results within float64 rounding
    (``tests/core/test_scoring_streamed.py``)."""
    if (
        isinstance(updates, Tensor)
        and updates.dim() == 2
        and updates.dtype == torch.float32
        and 8 * updates.numel() > block_bytes
    ):
        return TensorSource(updates)
    return updates


def alignments(updates: Tensor | ColumnSource, *, block_bytes: int = BLOCK_BYTES) -> list[float]:
    """Cosine of each update ``(n, d)`` with the round's coordinate-wise median: honest
    updates point roughly the same way, a reversed one points back. The median, not the
    mean, so one large attacker cannot turn the reference around; with fewer than 3
    updates there is no majority to judge by (1.0 for all). A ``ColumnSource`` is read one
    column block at a time (the median, the dots and the norms add up over blocks), and
    so is a tensor too large for one block (:func:`_blockwise`)."""
    n = updates.shape[0]
    if n < 3:
        return [1.0] * n
    updates = _blockwise(updates, block_bytes)
    if not isinstance(updates, Tensor):
        dots = torch.zeros(n, dtype=torch.float64)
        sq = torch.zeros(n, dtype=torch.float64)
        sq_med = 0.0
        for _, _, block in column_blocks(updates, block_bytes):
            xb = block.to(torch.float64)  # (n, c)
            med = xb.median(dim=0).values  # (c,) the lower median, as below
            dots += xb @ med
            sq += (xb * xb).sum(1)
            sq_med += float(med @ med)
        cos = dots / (sq.sqrt() * math.sqrt(sq_med)).clamp_min(1e-30)  # (n,)
        return [float(c) for c in cos]
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
    *,
    gain_se: list[float] | None = None,
    own_se: list[float] | None = None,
    other_se: list[float] | None = None,
    share_gains: list[float] | None = None,
    share_gain_se: list[float] | None = None,
    share_own: list[float] | None = None,
    share_own_se: list[float] | None = None,
) -> list[UpdateScore]:
    """Judge the round's ``n`` accepted updates (all lists have length ``n``); the
    ``*_se`` lists are the standard errors of the gains (None: not measured, 0). The
    ``share_*`` lists are the held-out and own-shard gains of each update applied at its
    weight in the round's mean, and pay is judged on them; None: on the gains alone."""
    cfg = cfg or ScoringConfig()
    n = len(gains)
    alignment = [1.0] * n if alignment is None else alignment
    gain_se, own_se, other_se = ([0.0] * n if x is None else x for x in (gain_se, own_se, other_se))
    lists = (own_gains, other_gains, kept, copied, alignment, gain_se, own_se, other_se)
    if any(len(x) != n for x in lists):
        raise ValueError("score_round needs one value per update in every list")
    shared = (share_gains, share_gain_se, share_own, share_own_se)
    if any(x is not None for x in shared):
        if any(x is None or len(x) != n for x in shared):
            raise ValueError("score_round needs every share_* list, one value per update, or none")
        credits, ratios = _pay(cfg, *(list(x or ()) for x in shared), own_also=True)
    else:
        credits, ratios = _pay(cfg, gains, gain_se, own_gains, own_se, own_also=False)
    typical = sorted(gains)[n // 2] if n else 0.0  # the round's median held-out gain
    # ... and its spread (1.4826 x the median absolute deviation: a standard deviation that
    # one outlier cannot move): small shards of few classes spread widely, honestly
    spread = 1.4826 * sorted(abs(g - typical) for g in gains)[n // 2] if n else 0.0
    scores = []
    for i in range(n):
        flags = []
        se = _finite_se(gain_se[i])
        if gains[i] + cfg.flag_z * se < -cfg.harm_threshold and alignment[i] < -cfg.harm_alignment:
            flags.append(HARMFUL)
        if copied[i] is not None:
            flags.append(COPY)
        noise = math.hypot(_finite_se(own_se[i]), _finite_se(other_se[i]))
        if unassigned(own_gains[i], other_gains[i], cfg, noise=noise):
            flags.append(UNASSIGNED)
        # Costs held-out loss beyond doubt, and far more than the round's typical update (on
        # non-IID shards every honest update alone may cost some; a poisoned one costs more).
        harms = gains[i] + cfg.flag_z * se < min(0.0, typical) - cfg.harm_threshold - cfg.flag_z * spread
        credit = 0.0 if harms else credits[i]
        if kept[i] < cfg.outlier_kept and credit <= 0 and alignment[i] <= 0:
            flags.append(OUTLIER)
        quality = 0.0 if flags or not credit > 0 else ratios[i]
        scores.append(
            UpdateScore(
                gain=gains[i],
                own_gain=own_gains[i],
                other_gain=other_gains[i],
                kept=kept[i],
                flags=tuple(flags),
                quality=quality,
                gain_se=se,
            )
        )
    return scores


def _pay(
    cfg: ScoringConfig,
    paid: list[float],
    paid_se: list[float],
    paid_own: list[float],
    paid_own_se: list[float],
    *,
    own_also: bool,
) -> tuple[list[float], list[float]]:
    """Each update's credit and its ratio to the round's reference (quality before flags),
    from the gains pay judges: held out and on its own shard, with their standard errors
    (at each update's share of the mean, or alone). ``own_also``: where held-out gains
    decide, also judge the own shard and take the lesser (the share's rule)."""
    held_out = [g + cfg.credit_z * _finite_se(e) for g, e in zip(paid, paid_se)]  # gain up to its noise
    own_credits = [o + cfg.credit_z * _finite_se(e) for o, e in zip(paid_own, paid_own_se)]
    if all(g > 0 for g in paid):
        # Every update visibly helps data no worker saw: pay on that, the stronger evidence.
        # (Measured gains, not credits: in a converged round every gain can be negative and
        # yet within its noise of 0, and an update whose noise happened to be small would be
        # paid a sliver of a reference set by the noisier ones.)
        if not own_also:
            return held_out, _ratios(held_out, paid, cfg)
        # At its share nearly every update helps held-out data, the copy of a neighbour's
        # training as much as honest work; it must help the shard it was given as well.
        ratios = [min(a, b) for a, b in zip(_ratios(held_out, paid, cfg), _ratios(own_credits, paid_own, cfg))]
        return [min(h, o) for h, o in zip(held_out, own_credits)], ratios
    # A converged round (held-out gains are noise around 0), non-IID shards (an update
    # alone fits its own classes and may cost held-out loss) or a cheater in the round:
    # each is paid on the gain on the shard it was given, which honest training reduces.
    return own_credits, _ratios(own_credits, paid_own, cfg)


def _ratios(credits: list[float], measured: list[float], cfg: ScoringConfig) -> list[float]:
    """Each credit against the round's reference, capped at 1: the reference is the median
    positive measured gain, else the median positive credit, so a tiny update still earns
    only a tiny share (0 for a credit not above 0)."""
    positive = sorted(g for g in measured if g > 0) or sorted(c for c in credits if c > 0)
    reference = positive[len(positive) // 2] if positive else 0.0
    return [min(1.0, c / (cfg.full_credit * reference)) if c > 0 and reference > 0 else 0.0 for c in credits]


def _finite_se(x: float) -> float:
    return x if x >= 0 and math.isfinite(x) else 0.0


def unassigned(own: float, other: float, cfg: ScoringConfig, *, noise: float = 0.0) -> bool:
    """The update helps its own shard clearly less than other workers' data: by more than
    the slack and ``cfg.flag_z`` times ``noise`` (the standard error of ``own - other``)."""
    margin = cfg.flag_z * noise
    if other > 0 and own <= 0 and other - own > margin:
        return True
    return own < (1 - cfg.unassigned_slack) * other - 0.02 - margin


def reputation_update(reputation: float, quality: float, *, alpha: float = 0.3) -> float:
    """Exponential moving average of quality on the 0-5 reputation scale."""
    if not (0 <= quality <= 1):
        raise ValueError(f"quality must be in [0, 1], got {quality}")
    return 5.0 * (alpha * quality + (1 - alpha) * (reputation / 5.0))
