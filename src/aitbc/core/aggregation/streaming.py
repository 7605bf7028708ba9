"""Streaming aggregation: the same pipeline over updates never held as one ``(n, d)`` matrix.

A :class:`ColumnSource` hands out column blocks of the round's updates, ``(m, c)`` for
chosen rows and columns ``[lo, hi)`` (:class:`TensorSource` over a tensor;
``aitbc.storage.spill.SpillMatrix`` over a float32 file on disk). :func:`aggregate_stream`
runs an :class:`~aitbc.core.aggregation.pipeline.AggregatorPipeline` over it in bounded
memory: at most ``block_bytes`` of a block at a time (plus the ``(d,)`` result and the
``(d,)`` reference a trend reads), whatever ``n`` is.

How each stage streams (``k`` inputs of the stage, ``n`` source rows):

- Wrappers leave the data where it is: the stage's inputs are ``M @ U`` for a ``(k, n)``
  float64 mixing ``M`` (the product of the wrappers' matrices so far; a block of the inputs
  is ``M @ U_block``, a gather when ``M`` only selects rows). ``nnm`` reads one pass for the
  Gram matrix of its inputs; ``bucketing`` reads nothing (it needs only ``n`` and the
  weights); ``trend`` reads one pass for each input's dot with the reference and its norm.
- Coordinate-wise rules (``mean``, ``median``, ``trimmed-mean``) run the in-memory rule on
  each column block (one pass; the value of every coordinate is the in-memory one).
- Distance rules (``krum``, ``multi-krum``, ``geometric-median``, ``centered-clip``'s medoid
  start) accumulate the ``(k, k)`` Gram matrix over blocks (one pass), decide in
  coefficient space exactly as in memory (the iterations of Weiszfeld and of centered
  clipping touch only ``(k,)`` and ``(k, k)`` tensors: no pass per iteration), then read
  the rows with a non-zero coefficient once more and combine them (Krum reads one row).
- ``bulyan``: a Gram pass for its selection, then its second stage per column block.
- ``centered-clip:start=previous``: one pass for the Gram matrix and each input's dot
  with the reference (the run's last model step), a combining pass.
- ``centered-clip:start=median``: a pass for the median (kept as the ``(d,)`` output
  buffer), a pass for the Gram matrix of the updates minus the median, a combining pass.

Equality with memory: coordinate rules agree bit for bit on the same inputs (with no
mixing wrapper in front: a mixture is a product, rounded per block). Anything
through a Gram matrix agrees to float rounding: each block's ``X_b X_b^T`` is computed and
summed in float64 (the in-memory product is one float32 BLAS call, so the streamed Gram is
the more exact one), and an entry past the float32 range counts as overflowed as it would
in memory. Selections can then differ only between updates whose distances agree to
float32 rounding (interchangeable, see ``_distances``); there the streamed choice is the
one exact arithmetic makes.
Wrappers in front are folded into one mixing, so a mixture of mixtures is rounded once
instead of twice. ``tests/core/test_aggregation_streaming.py`` compares every rule and
wrapper with memory on random inputs.

Input checks are the in-memory ones, in the same order: shapes, NaN/Inf (a source says
which rows hold any: :meth:`ColumnSource.nonfinite_rows`), weights, the conditions on ``n``.

Shapes: ``n`` source rows (updates), ``k`` inputs of a stage, ``d`` parameters, ``c``
columns of a block.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from aitbc.core.aggregation import clipping, coordinate, geomed, krum, sparse, wrappers
from aitbc.core.aggregation._distances import distances_from_gram, mask_far
from aitbc.core.aggregation.base import AGGREGATORS, WRAPPERS, AggregationInfo, Mixing, check_weights
from aitbc.core.aggregation.pipeline import AggregatorPipeline, _through
from aitbc.errors import UsageError

BLOCK_BYTES = 32 << 20  # one (k, c) float32 block read at a time (and its float64 copy for a Gram)
F32_MAX = torch.finfo(torch.float32).max


class ColumnSource(Protocol):
    """``n`` updates of ``d`` float32 values, readable by column block."""

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, d)``."""
        ...

    def read(self, rows: Sequence[int], lo: int, hi: int) -> Tensor:
        """``(len(rows), hi - lo)`` float32: a fresh tensor (the caller may write to it)."""
        ...

    def nonfinite_rows(self) -> list[int]:
        """The rows holding a NaN or an Inf, ascending."""
        ...


class TensorSource:
    """A :class:`ColumnSource` over an ``(n, d)`` float32 tensor in memory (tests, and
    callers that hold the updates anyway)."""

    def __init__(self, updates: Tensor) -> None:
        if updates.dim() != 2 or updates.shape[0] == 0:
            raise UsageError(f"updates must be a non-empty (n, d) tensor, got shape {tuple(updates.shape)}")
        if updates.dtype != torch.float32:
            raise UsageError(f"a streamed source holds float32 updates, got {updates.dtype}")
        self.updates = updates

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.updates.shape[0]), int(self.updates.shape[1])

    def read(self, rows: Sequence[int], lo: int, hi: int) -> Tensor:
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.updates.device)
        return self.updates[:, lo:hi].index_select(0, index)  # (m, c) a copy

    def nonfinite_rows(self) -> list[int]:
        u = self.updates
        if bool(torch.isfinite(u.sum(dim=1)).all()):  # one reduction clears the common case
            return []
        return [int(i) for i in (~torch.isfinite(u)).any(dim=1).nonzero().flatten()]


class ScaledRows:
    """The rows ``keep`` of ``source``, row ``j`` multiplied by ``factors[j]`` where that is
    not 1: the streamed form of :func:`aitbc.core.norms.apply_verdict` (the same float32
    multiply, applied to each block as it is read)."""

    def __init__(self, source: ColumnSource, keep: Sequence[int], factors: Sequence[float]) -> None:
        n, _ = source.shape
        if len(keep) != len(factors) or any(not 0 <= i < n for i in keep):
            raise ValueError(f"keep must be rows of the source (n={n}) with one factor each")
        self.source, self.keep, self.factors = source, [int(i) for i in keep], [float(x) for x in factors]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.keep), self.source.shape[1]

    def read(self, rows: Sequence[int], lo: int, hi: int) -> Tensor:
        out = self.source.read([self.keep[r] for r in rows], lo, hi)  # (m, c)
        for j, r in enumerate(rows):
            if self.factors[r] != 1.0:
                out[j].mul_(self.factors[r])
        return out

    def nonfinite_rows(self) -> list[int]:
        bad = set(self.source.nonfinite_rows())
        return [j for j, i in enumerate(self.keep) if i in bad]


@dataclass(slots=True)
class _Stream:
    """The source and the current stage's inputs ``M @ U`` (``M`` None: the rows as they are)."""

    source: ColumnSource
    block_bytes: int
    mix: Tensor | None = None  # (k, n) float64
    reference: Tensor | None = None  # (d,) the run's last model step, for a rule that reads it

    @property
    def n(self) -> int:
        return self.source.shape[0]

    @property
    def d(self) -> int:
        return self.source.shape[1]

    @property
    def k(self) -> int:
        return self.n if self.mix is None else int(self.mix.shape[0])

    def blocks(self, rows: int) -> Iterator[tuple[int, int]]:
        c = max(1, self.block_bytes // (4 * max(rows, 1)))
        for lo in range(0, self.d, c):
            yield lo, min(lo + c, self.d)

    def _plan(self) -> tuple[list[int], Tensor | None]:
        """The source rows a block of the inputs needs, and the float32 ``(k, m)`` matrix
        applied to them (None: the rows are the inputs, in order)."""
        if self.mix is None:
            return list(range(self.n)), None
        m = self.mix
        nz = m != 0
        if bool((nz.sum(1) == 1).all()) and bool((m[nz] == 1).all()):  # a selection: gather, no product
            return [int(i) for i in nz.to(torch.int8).argmax(1)], None
        used = nz.any(0).nonzero().flatten()
        return [int(i) for i in used], m[:, used].to(torch.float32)

    def inputs(self) -> Iterator[tuple[int, int, Tensor]]:
        """Every column block ``(lo, hi, X)`` of the stage's inputs, ``X`` ``(k, c)`` float32."""
        rows, matrix = self._plan()
        for lo, hi in self.blocks(len(rows)):
            x = self.source.read(rows, lo, hi)  # (m, c)
            yield lo, hi, x if matrix is None else matrix @ x  # (k, m) @ (m, c) -> (k, c)

    def gram(self) -> tuple[Tensor, Tensor]:
        """The inputs' float64 Gram matrix ``(k, k)`` and overflow mask, as ``_distances.gram``."""
        g = torch.zeros(self.k, self.k, dtype=torch.float64)
        for _, _, x in self.inputs():
            g += _gram64(x)
        return mask_far(_as_f32_range(g))

    def combine(self, coef: Tensor, *, start: Tensor | None = None, start_coef: float = 0.0) -> Tensor:
        """``coef @ inputs`` ``(d,)`` for ``(k,)`` coefficients, reading only the source rows
        with a non-zero coefficient; with ``start`` ``(d,)``, ``start_coef * start`` is added
        (into ``start``, which is returned)."""
        eff = coef.to(torch.float64) if self.mix is None else coef.to(torch.float64) @ self.mix  # (n,)
        rows = [int(i) for i in eff.nonzero().flatten()]
        out = torch.zeros(self.d, dtype=torch.float32) if start is None else start
        if start is not None:
            out.mul_(start_coef)
        if not rows:
            return out
        c32 = eff[rows].to(torch.float32)  # (m,)
        for lo, hi in self.blocks(len(rows)):
            part = c32 @ self.source.read(rows, lo, hi)  # (m,) @ (m, c) -> (c,)
            if start is None:
                out[lo:hi] = part
            else:
                out[lo:hi].add_(part)
        return out


def _gram64(x: Tensor) -> Tensor:
    """``X X^T`` ``(k, k)`` of a float32 block ``(k, c)``, in float64: products of float32
    values are exact in float64, so near-duplicate updates (nnm's mixtures often are) keep
    their order instead of the float32 product's rounding picking it."""
    xd = x.to(torch.float64)  # (k, c)
    return xd @ xd.T  # (k, c) @ (c, k) -> (k, k)


def _as_f32_range(x: Tensor) -> Tensor:
    """Float64 sums of float32 products: a value past float32's range is an overflow, as
    the single float32 product in memory would have made it."""
    return torch.where(x.abs() > F32_MAX, x * math.inf, x)


# --- rules --------------------------------------------------------------------------------

RuleStream = Callable[[_Stream, Tensor, Any, bool], tuple[Tensor, AggregationInfo]]


def _columnwise(fn: Any) -> RuleStream:
    """A coordinate-wise rule: the in-memory rule on each block; info weighted by block width."""

    def run(st: _Stream, w: Tensor, cfg: Any, with_info: bool) -> tuple[Tensor, AggregationInfo]:
        out = torch.empty(st.d, dtype=torch.float32)
        kept = weight = None
        for lo, hi, x in st.inputs():
            out[lo:hi], info = fn(x, w, cfg, with_info=with_info)
            if with_info:
                share = (hi - lo) / st.d
                kept = _acc(kept, info.kept_fraction, share)
                weight = _acc(weight, info.weight, share)
        return out, AggregationInfo(kept_fraction=kept, weight=weight)

    return run


def _acc(total: Tensor | None, part: Tensor | None, share: float) -> Tensor | None:
    if part is None:
        return total
    part = part.to(torch.float64) * share
    return part if total is None else total + part


def _mean(st: _Stream, w: Tensor, cfg: Any, with_info: bool) -> tuple[Tensor, AggregationInfo]:
    coef = w / w.sum()  # (k,) float32, as in memory
    out = st.combine(coef)
    if not with_info:
        return out, AggregationInfo()
    c = coef.to(torch.float64)
    return out, AggregationInfo(kept_fraction=(c > 0).to(c.dtype), weight=c)


def _krum(st: _Stream, w: Tensor, cfg: Any, with_info: bool) -> tuple[Tensor, AggregationInfo]:
    alive = torch.ones(st.k, dtype=torch.bool)
    best = krum.krum_order(distances_from_gram(*st.gram()), alive, cfg.f)[0]
    hot = torch.zeros(st.k, dtype=torch.float64).index_fill_(0, best.view(1), 1.0)
    out = st.combine(hot)
    return out, AggregationInfo(selected=best.view(1), kept_fraction=hot, weight=hot) if with_info else _NONE


def _multi_krum(st: _Stream, w: Tensor, cfg: Any, with_info: bool) -> tuple[Tensor, AggregationInfo]:
    k = st.k
    alive = torch.ones(k, dtype=torch.bool)
    chosen = krum.krum_order(distances_from_gram(*st.gram()), alive, cfg.f)[: cfg.chosen(k)]  # (m,)
    c = torch.zeros(k, dtype=torch.float64)
    c[chosen] = w[chosen].to(torch.float64)
    if c.sum() <= 0:
        c[chosen] = 1.0
    c /= c.sum()
    out = st.combine(c)
    if not with_info:
        return out, _NONE
    hot = torch.zeros(k, dtype=torch.float64).index_fill_(0, chosen, 1.0)
    return out, AggregationInfo(selected=chosen.sort().values, kept_fraction=hot, weight=c)


def _bulyan(st: _Stream, w: Tensor, cfg: Any, with_info: bool) -> tuple[Tensor, AggregationInfo]:
    k, d = st.k, st.d
    chosen = krum.bulyan_select(distances_from_gram(*st.gram()), cfg.f)  # (theta,)
    out = torch.empty(d, dtype=torch.float32)
    kept = torch.zeros(chosen.numel(), dtype=torch.float64)
    for lo, hi, x in st.inputs():
        out[lo:hi], part = krum.bulyan_window(x, chosen, cfg.f, with_info=with_info)
        kept += part
    if not with_info:
        return out, _NONE
    beta = chosen.numel() - 2 * cfg.f
    kept_n = torch.zeros(k, dtype=torch.float64).index_put_((chosen,), kept / d)
    return out, AggregationInfo(selected=chosen.sort().values, kept_fraction=kept_n, weight=kept_n / beta)


def _geometric_median(st: _Stream, w: Tensor, cfg: Any, with_info: bool) -> tuple[Tensor, AggregationInfo]:
    a = geomed.coefficients(*st.gram(), w, cfg)  # (k,)
    out = st.combine(a)
    return out, AggregationInfo(kept_fraction=(a > 0).to(torch.float64), weight=a) if with_info else _NONE


def _centered_clip(st: _Stream, w: Tensor, cfg: Any, with_info: bool) -> tuple[Tensor, AggregationInfo]:
    if cfg.start == "median":
        return _clip_from_median(st, w, cfg), _NONE
    ref = clipping.usable_reference(st.reference) if cfg.start == "previous" else None
    if ref is not None:
        return _clip_from_previous(st, w, cfg, ref.to(torch.float32), with_info)
    k, far = st.gram()
    c = clipping.medoid_coefficients(k, far, w, cfg)  # (k,) shares of the norm-clipped inputs
    out = st.combine(c * clipping.norm_scales(k, far, cfg))
    return out, AggregationInfo(kept_fraction=(c > 0).to(torch.float64), weight=c) if with_info else _NONE


def _clip_from_previous(
    st: _Stream, w: Tensor, cfg: Any, ref: Tensor, with_info: bool
) -> tuple[Tensor, AggregationInfo]:
    """One pass for the Gram matrix and each input's dot with the reference, then the
    combining pass: ``(1 - sum b) * reference + b @ inputs``, as in memory."""
    g = torch.zeros(st.k, st.k, dtype=torch.float64)
    dots = torch.zeros(st.k, dtype=torch.float64)
    for lo, hi, x in st.inputs():
        g += _gram64(x)
        dots += (x @ ref[lo:hi]).to(torch.float64)  # (k, c) @ (c,) -> (k,)
    k, far = mask_far(_as_f32_range(g))
    ref_sq = float(ref.to(torch.float64).square().sum())
    b = clipping.previous_coefficients(k, far, _as_f32_range(dots), ref_sq, w, cfg)  # (k,)
    out = st.combine(b, start=ref.clone(), start_coef=(1.0 - b.sum()).item())
    return out, (clipping.previous_info(b) if with_info else _NONE)


def _clip_from_median(st: _Stream, w: Tensor, cfg: Any) -> Tensor:
    k = st.k
    median = AGGREGATORS.get("median")
    start = torch.empty(st.d, dtype=torch.float32)  # (d,) the median, then the result
    for lo, hi, x in st.inputs():
        start[lo:hi] = median.fn(x, w, median.config(), with_info=False)[0]
    g = torch.zeros(k, k, dtype=torch.float64)  # Gram of U - median
    for lo, hi, x in st.inputs():
        g += _gram64(x.sub_(start[lo:hi]))  # Y = X - median: (k, c)
    g, far = mask_far(_as_f32_range(g))
    b = clipping._iterate(g, far, w, cfg, start_row=None)  # (k,)
    # start + Y^T b = (1 - sum b) * start + b @ U, as in memory
    return st.combine(b, start=start, start_coef=(1.0 - b.sum()).item())


def _sparse_robust(st: _Stream, w: Tensor, cfg: Any, with_info: bool) -> tuple[Tensor, AggregationInfo]:
    """One pass for the Gram matrix, the support-overlap counts and the dots with the
    reference, then the combining pass, as in memory."""
    k = st.k
    g = torch.zeros(k, k, dtype=torch.float64)
    counts = torch.zeros(k, k, dtype=torch.float64)
    ref_norm = sparse.reference_norm(st.reference)
    ref = None if ref_norm is None or st.reference is None else st.reference.to(torch.float32)
    dots = None if ref is None else torch.zeros(k, dtype=torch.float64)
    for lo, hi, x in st.inputs():
        g += _gram64(x)
        s = (x != 0).to(torch.float64)  # (k, c)
        counts += s @ s.T
        if dots is not None and ref is not None:
            dots += (x @ ref[lo:hi]).to(torch.float64)  # (k, c) @ (c,) -> (k,)
    gram, far = mask_far(_as_f32_range(g))
    stats = sparse.RoundStats(
        gram=gram, far=far, counts=counts, dots=None if dots is None else _as_f32_range(dots), ref_norm=ref_norm
    )
    c = sparse.coefficients(stats, w, cfg)  # (k,)
    return st.combine(c), (sparse.coefficient_info(c) if with_info else _NONE)


_NONE = AggregationInfo()

RULES: dict[str, RuleStream] = {
    "mean": _mean,
    "median": _columnwise(coordinate.median),
    "trimmed-mean": _columnwise(coordinate.trimmed_mean),
    "krum": _krum,
    "multi-krum": _multi_krum,
    "bulyan": _bulyan,
    "geometric-median": _geometric_median,
    "centered-clip": _centered_clip,
    "sparse-robust": _sparse_robust,
}

# --- wrappers -----------------------------------------------------------------------------

WrapperStream = Callable[[_Stream, Tensor, Any, int, "Tensor | None"], Mixing]


def _nnm(st: _Stream, w: Tensor, cfg: Any, round_index: int, reference: Tensor | None) -> Mixing:
    return wrappers.nnm_mixing(distances_from_gram(*st.gram()), w, cfg)


def _bucketing(st: _Stream, w: Tensor, cfg: Any, round_index: int, reference: Tensor | None) -> Mixing:
    return wrappers.bucket_mixing(st.k, w, cfg, round_index=round_index)


def _trend(st: _Stream, w: Tensor, cfg: Any, round_index: int, reference: Tensor | None) -> Mixing:
    ref_norm = wrappers.trend_reference_norm(reference, cfg)
    if ref_norm is None or reference is None:
        return wrappers.trend_mixing(None, None, 0.0, w, cfg)
    ref = reference.to(torch.float32)
    dots = torch.zeros(st.k, dtype=torch.float64)
    sq = torch.zeros(st.k, dtype=torch.float64)
    for lo, hi, x in st.inputs():
        dots += (x @ ref[lo:hi]).to(torch.float64)  # (k, c) @ (c,) -> (k,)
        sq += torch.linalg.vector_norm(x, dim=1, dtype=torch.float64) ** 2  # (k,)
    return wrappers.trend_mixing(_as_f32_range(dots), _as_f32_range(sq.sqrt()), ref_norm, w, cfg)


WRAPPER_STREAMS: dict[str, WrapperStream] = {"nnm": _nnm, "bucketing": _bucketing, "trend": _trend}

_missing = sorted((set(AGGREGATORS.names()) - set(RULES)) | (set(WRAPPERS.names()) - set(WRAPPER_STREAMS)))
if _missing:  # every registered stage streams: checked when this module is imported
    raise RuntimeError(f"aggregation stages without a streaming form: {', '.join(_missing)}")


# --- for other readers of a round (scoring) -----------------------------------------------


def column_blocks(source: ColumnSource, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, int, Tensor]]:
    """Every column block ``(lo, hi, X)`` of all the source's rows, ``X`` ``(n, c)`` float32."""
    return _Stream(source, block_bytes).inputs()


def gram64(source: ColumnSource, block_bytes: int = BLOCK_BYTES) -> Tensor:
    """The source's ``(n, n)`` Gram matrix, float64 throughout (no overflow masking)."""
    n = source.shape[0]
    g = torch.zeros(n, n, dtype=torch.float64)
    for _, _, x in column_blocks(source, block_bytes):
        g += _gram64(x)
    return g


def read_row(source: ColumnSource, i: int) -> Tensor:
    """Row ``i`` ``(d,)`` float32, a fresh tensor."""
    return source.read([i], 0, source.shape[1])[0]


# --- the entry point ----------------------------------------------------------------------


def aggregate_stream(
    pipeline: AggregatorPipeline,
    source: ColumnSource,
    weights: Tensor | None = None,
    *,
    round_index: int = 0,
    reference: Tensor | None = None,
    with_info: bool = False,
    block_bytes: int = BLOCK_BYTES,
) -> tuple[Tensor, AggregationInfo]:
    """``pipeline`` over ``source`` ``(n, d)`` -> ``((d,) float32, info)``, reading at most
    ``block_bytes`` of it at a time; same arguments and checks as calling the pipeline."""
    n, d = source.shape
    if n == 0:
        raise UsageError(f"updates must be a non-empty (n, d) tensor, got shape {(n, d)}")
    if block_bytes < 4:
        raise ValueError(f"block_bytes must hold at least one float32 value, got {block_bytes}")
    bad = source.nonfinite_rows()
    if bad:
        raise UsageError(f"updates {bad} contain NaN or Inf; reject them before aggregation")
    w = check_weights(n, weights, dtype=torch.float32, device=torch.device("cpu"))
    if reference is not None and tuple(reference.shape) != (d,):
        raise UsageError(f"reference must have shape ({d},) like one update, got {tuple(reference.shape)}")
    pipeline.check(n)
    st = _Stream(source, block_bytes, reference=reference)
    mixes: list[Mixing] = []
    for stage in pipeline.wrappers:
        mix = WRAPPER_STREAMS[stage.entry.name](st, w, stage.config, round_index, reference)
        m = mix.matrix.to(torch.float64)  # (k', k)
        st.mix = m if st.mix is None else m @ st.mix  # (k', n)
        w = mix.weights
        mixes.append(mix)
    out, info = RULES[pipeline.rule.entry.name](st, w, pipeline.rule.config, with_info)
    for mix in reversed(mixes):
        info = _through(info, mix)
    return out, info


__all__ = [
    "BLOCK_BYTES",
    "ColumnSource",
    "ScaledRows",
    "TensorSource",
    "aggregate_stream",
    "column_blocks",
    "gram64",
    "read_row",
]
