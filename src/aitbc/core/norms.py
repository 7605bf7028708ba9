"""Norm bounds: no single update may be larger than the round says updates are.

One huge but finite update (say ``3e38`` in every coordinate) moves a plain ``mean`` as
far as its sender likes; robust rules resist it but pay for it elsewhere. So before any
rule runs, each update's L2 norm is compared with the round's *reference*: the lower
median of the round's norms (each divided by the update's expected scale, see below).
With an honest majority the lower median is an honest norm, whatever order updates
arrived in and whatever the attackers sent.

- ``norm <= clip x reference`` (clip 3: honest updates measured within 1.6x of the
  median on digits, IID and Dirichlet(0.1), 8 and 24 workers, 30 rounds): kept as sent.
- ``clip x reference < norm <= reject x reference``: scaled down to ``clip x reference``
  (an honest worker with an unusual shard may land here; it is not punished).
- ``norm > reject x reference``, or a non-finite norm: rejected. No honest worker training
  the run's config from the model it was given sends that (measured honest spread: well
  under 2x the median), so it is provable misbehaviour and slashes the bond.

The whole round is judged at once (at aggregation, when every norm is known), not update
by update as they arrive: a first arrival could otherwise set the reference. A round of
one update has only itself to compare with and is always kept; a reference of zero (most
updates empty) judges nothing.

``scales`` (default all 1) is each update's expected size relative to the run's config,
e.g. ``lr_job / lr_run x steps_job / steps_run`` when its owner gave one job its own
learning rate or steps. Rejection (which punishes) needs the update to be gross both as
sent and divided by its scale, each against its round's lower median: an owner can neither
frame a provider (other jobs given a tiny lr make the raw median tiny, not the scaled one)
nor shield one. Clipping (which does not punish) looks at the norms as sent.

Shapes: ``n`` updates, ``d`` parameters; ``updates`` ``(n, d)``, norms ``(n,)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

KEEP, CLIP, REJECT = "keep", "clip", "reject"


@dataclass(frozen=True, kw_only=True, slots=True)
class NormBound:
    """``clip`` and ``reject``: multiples of the round's reference norm (``1 <= clip <= reject``;
    ``clip == reject`` means no clipping zone: everything over it is rejected)."""

    clip: float = 3.0
    reject: float = 1000.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip) and math.isfinite(self.reject) and 1 <= self.clip <= self.reject):
            raise ValueError(
                f"norm bounds need 1 <= clip <= reject, both finite; got clip={self.clip}, reject={self.reject}"
            )


@dataclass(frozen=True, slots=True)
class NormVerdict:
    """What the bound does to each update of a round."""

    norms: tuple[float, ...]  # (n,) L2 norm of each update as sent (float64; inf if it overflows)
    reference: float | None  # the round's reference norm (scale 1); None: nothing judged
    actions: tuple[str, ...]  # (n,) keep | clip | reject
    factors: tuple[float, ...]  # (n,) multiply the update by this (1 unless clipped; 0 if rejected)
    reasons: tuple[str | None, ...]  # (n,) why an update was rejected or clipped

    @property
    def rejected(self) -> list[int]:
        return [i for i, a in enumerate(self.actions) if a == REJECT]

    @property
    def clipped(self) -> list[int]:
        return [i for i, a in enumerate(self.actions) if a == CLIP]


def update_norms(updates: Sequence[Tensor] | Tensor) -> list[float]:
    """L2 norm of each ``(d,)`` update, accumulated in float64 (a float32 sum of 3e38s
    overflows; the float64 one does not), one row at a time (no ``(n, d)`` float64 copy)."""
    return [float(torch.linalg.vector_norm(u.reshape(-1), dtype=torch.float64)) for u in updates]


def judge_norms(norms: Sequence[float], bound: NormBound, scales: Sequence[float] | None = None) -> NormVerdict:
    """The bound's verdict on a round whose updates have L2 ``norms``."""
    n = len(norms)
    sc = [1.0] * n if scales is None else [float(x) for x in scales]
    if len(sc) != n or not all(x > 0 and math.isfinite(x) for x in sc):
        raise ValueError(f"scales must be {n} positive finite numbers, got {list(sc)}")
    rel = [norm / s for norm, s in zip(norms, sc)]  # each norm as if trained with the run's config
    ref, rel_ref = _lower_median(list(norms)), _lower_median(rel)
    actions: list[str] = []
    factors: list[float] = []
    reasons: list[str | None] = []
    for x, y in zip(norms, rel):
        if not (math.isfinite(x) and math.isfinite(y)):
            actions.append(REJECT)
            factors.append(0.0)
            reasons.append("update norm is not finite")
        elif ref is None or ref <= 0:
            actions.append(KEEP)
            factors.append(1.0)
            reasons.append(None)
        elif x > bound.reject * ref and rel_ref is not None and rel_ref > 0 and y > bound.reject * rel_ref:
            actions.append(REJECT)
            factors.append(0.0)
            reasons.append(
                f"update norm {x:.3g} is {x / ref:.3g} x the round's median {ref:.3g} "
                f"(more than {bound.reject:g} x is refused)"
            )
        elif x > bound.clip * ref:
            actions.append(CLIP)
            factors.append(bound.clip * ref / x)
            reasons.append(
                f"update norm {x:.3g} is {x / ref:.3g} x the round's median {ref:.3g}; scaled down to {bound.clip:g} x"
            )
        else:
            actions.append(KEEP)
            factors.append(1.0)
            reasons.append(None)
    return NormVerdict(
        norms=tuple(float(x) for x in norms),
        reference=ref if ref is not None and ref > 0 else None,
        actions=tuple(actions),
        factors=tuple(factors),
        reasons=tuple(reasons),
    )


def _lower_median(values: list[float]) -> float | None:
    """With an honest majority, an honest value (non-finite ones count as large)."""
    n = len(values)
    if n == 0:
        return None
    ordered = sorted(v if math.isfinite(v) else math.inf for v in values)
    m = ordered[(n - 1) // 2]
    return m if math.isfinite(m) else None


def apply_verdict(updates: Tensor, verdict: NormVerdict, *, in_place: bool = False) -> tuple[Tensor, list[int]]:
    """The updates the rule should see: rejected rows dropped, clipped rows scaled down.
    Returns ``(k, d)`` and the kept rows' indices into ``updates`` ``(n, d)``.
    ``in_place``: the caller's ``updates`` may be changed (clipped rows scaled where they
    are) and, when none is rejected, are returned themselves: no ``(k, d)`` copy."""
    keep = [i for i, a in enumerate(verdict.actions) if a != REJECT]
    out = updates if in_place and len(keep) == updates.shape[0] else updates[keep]  # (k, d), a copy unless in place
    for row, i in enumerate(keep):
        if verdict.actions[i] == CLIP:
            out[row].mul_(verdict.factors[i])
    return out, keep


__all__ = ["CLIP", "KEEP", "REJECT", "NormBound", "NormVerdict", "apply_verdict", "judge_norms", "update_norms"]
