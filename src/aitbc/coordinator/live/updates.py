"""A closing round's accepted updates, decoded and judged, then aggregated: in memory, or
streamed from disk when their ``n x d`` float32 would pass ``aggregation_memory_mb``.

In memory (today's path for small models): every update decoded into one ``(n, d)``
float32 matrix, the norm bound (``aitbc.core.norms``) on it, then the run's pipeline.

Streamed (``aitbc.core.aggregation.streaming``): each update is decoded piece by piece
into a ``SpillMatrix`` (a float32 file under ``home/spill``, unnamed, gone when closed),
its norm measured as it goes; the norm bound judges the round from those norms; the rule
then reads column blocks of the kept rows, clipped ones scaled as they are read. What the
process holds at once: one update's blob (its codec's bytes) and a piece of it, one
column block (``BLOCK_BYTES``, and its float64 copy for a Gram matrix), the ``(d,)``
result, and the ``(d,)`` reference a ``trend`` stage reads. Same verdicts and, within
float rounding, the same aggregate (see the streaming module).

Shape letters: ``n`` accepted updates, ``k`` kept by the norm bound, ``d`` parameters.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from aitbc.coordinator.context import Context
from aitbc.core.aggregation import AggregatorPipeline
from aitbc.core.aggregation.streaming import ColumnSource, ScaledRows, TensorSource, aggregate_stream
from aitbc.core.compression import decode_pieces
from aitbc.core.norms import CLIP, REJECT, NormBound, NormVerdict, apply_verdict, judge_norms, update_norms
from aitbc.errors import AitbcError, UsageError
from aitbc.storage.spill import SpillMatrix

SPILL_DIR = "spill"  # under the coordinator's home


@dataclass(frozen=True, slots=True)
class Aggregated:
    verdict: NormVerdict  # the norm bound's verdict on each of the n updates
    keep: list[int]  # the updates the rule saw (not rejected), indices into the n
    delta: Tensor | None  # (d,) the rule's aggregate; None: too few kept for the rule (skipped)
    streamed: bool  # aggregated from disk (n x d over the memory setting)


def streams(ctx: Context, n: int, d: int, limit_bytes: int | None = None) -> bool:
    """Whether ``n`` updates of ``d`` values go through disk: their float32 matrix would
    pass ``aggregation_memory_mb`` (or ``limit_bytes``, where it is lower)."""
    cap = ctx.settings.aggregation_memory_mb * (1 << 20)
    return 4 * n * d > (cap if limit_bytes is None else min(cap, limit_bytes))


@contextmanager
def decoded(ctx: Context, cids: Sequence[str], d: int, *, limit_bytes: int | None = None) -> Iterator[ColumnSource]:
    """The updates stored under ``cids`` as a ``ColumnSource``: one ``(n, d)`` float32
    tensor in memory, or a spilled matrix on disk past ``aggregation_memory_mb`` or
    ``limit_bytes`` (what scoring reads; gone when the block ends)."""
    n = len(cids)
    if not streams(ctx, n, d, limit_bytes):
        yield TensorSource(decode_rows(ctx, cids, d))
        return
    with SpillMatrix(n, d, directory=ctx.settings.home / SPILL_DIR) as m:
        for i, cid in enumerate(cids):
            m.fill(i, decode_pieces(ctx.store.get_bytes(cid), max_numel=d))
        yield m


def decode_rows(ctx: Context, cids: Sequence[str], d: int) -> Tensor:
    """The updates stored under ``cids`` as one ``(n, d)`` float32 tensor, each decoded
    piece by piece into its row: what the process holds beside the matrix is one update's
    blob and one piece of it (``torch.stack`` of whole decoded updates held all ``n`` of
    them twice). The values are ``decode(blob).to(torch.float32)``'s."""
    out = torch.empty(len(cids), d, dtype=torch.float32)  # (n, d)
    for i, cid in enumerate(cids):
        at = 0
        for piece in decode_pieces(ctx.store.get_bytes(cid), max_numel=d):
            values = piece.reshape(-1)  # (p,)
            if at + values.numel() > d:
                raise UsageError(f"update {cid} has more than the model's {d} values")
            out[i, at : at + values.numel()] = values  # float32, as .to(torch.float32)
            at += values.numel()
            del piece, values  # not held while the next piece decodes
        if at != d:
            raise UsageError(f"update {cid} has {at} values; the model has {d}")
    return out


def aggregate_updates(
    ctx: Context,
    pipeline: AggregatorPipeline,
    bound: NormBound,
    cids: Sequence[str],
    weights: Sequence[float],
    scales: Sequence[float],
    counts: Sequence[float],
    *,
    d: int,
    round_index: int,
    reference: Tensor | None,
) -> Aggregated:
    """The norm bound's verdict on the updates stored under ``cids`` (each ``d`` values;
    ``scales``: each one's expected size, see ``judge_norms``), then ``pipeline`` over the
    kept ones with their ``weights``, each kept update multiplied by its ``counts`` entry
    after the bound (1, or less for a stale update). Call with the run's runtime lock held."""
    if streams(ctx, len(cids), d):
        with decoded(ctx, cids, d) as m:
            assert isinstance(m, SpillMatrix)
            verdict = judge_norms(m.norms(), bound, scales)
            keep = [i for i, a in enumerate(verdict.actions) if a != REJECT]
            rows: ColumnSource = ScaledRows(
                m, keep, [verdict.factors[i] if verdict.actions[i] == CLIP else 1.0 for i in keep]
            )
            late = [float(counts[i]) for i in keep]
            if any(s != 1.0 for s in late):  # after the clip, as in memory
                rows = ScaledRows(rows, range(len(keep)), late)
            w = torch.tensor([weights[i] for i in keep], dtype=torch.float32)  # (k,)
            if not _enough(pipeline, len(keep)):
                return Aggregated(verdict, keep, None, streamed=True)
            delta, _ = aggregate_stream(pipeline, rows, w, round_index=round_index, reference=reference)
            return Aggregated(verdict, keep, delta, streamed=True)
    U = decode_rows(ctx, cids, d)  # (n, d)
    verdict = judge_norms(update_norms(U), bound, scales)
    U, keep = apply_verdict(U, verdict, in_place=True)  # (n, d) -> (k, d): this matrix is ours to scale
    late = [float(counts[i]) for i in keep]
    if any(s != 1.0 for s in late):
        U.mul_(torch.tensor(late, dtype=torch.float32)[:, None])  # (k, d), in place: no second matrix
    if not _enough(pipeline, len(keep)):
        return Aggregated(verdict, keep, None, streamed=False)
    w = torch.tensor([weights[i] for i in keep], dtype=torch.float32)  # (k,)
    return Aggregated(verdict, keep, pipeline(U, w, round_index=round_index, reference=reference), streamed=False)


def _enough(pipeline: AggregatorPipeline, k: int) -> bool:
    try:
        pipeline.check(k)
    except AitbcError:
        return False
    return True
