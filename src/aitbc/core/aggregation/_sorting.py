"""Coordinate-wise order statistics over ``(m, d)`` rows, one column block at a time.

The coordinate rules (median, trimmed mean, Bulyan's second stage, the start of centered
clipping) need, for every coordinate, the ``m`` values of that coordinate in sorted
order. ``torch.sort(x, dim=0)`` does that, but on a CPU it sorts each column on its own
(about 300 ns a column for ``m = 32``, ~50x a weighted mean) and returns int64 indices
twice the size of the input. Here instead:

- the columns are cut into blocks of about ``BLOCK_ELEMENTS`` values (cache sized), so
  the working set stays small and nothing ``(m, d)`` sized is allocated; the Python loop
  runs over blocks (77 blocks for ``m = 32``, ``d = 10M``), never over coordinates;
- inside a block, for ``m <= NETWORK_MAX_ROWS`` (256), a Batcher odd-even merge sorting network
  sorts all columns at once: every comparator is one ``torch.minimum`` and one
  ``torch.maximum`` over two ``(c,)`` rows, vectorised across the block's ``c``
  columns. A network is data independent, so the same ops run for every column; when
  only some sorted positions are needed (the median), comparators that cannot reach them
  are pruned. Larger ``m`` uses ``torch.sort`` per block.

Both paths return the same sorted values (sorting is exact; there is no arithmetic).
Shapes: ``m`` rows (updates), ``d`` coordinates, ``c`` columns in a block.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

BLOCK_ELEMENTS = 1 << 22  # values per block: 16 MiB of float32, about one L3 slice
NETWORK_MAX_ROWS = 256  # measured faster than torch.sort up to m=200 (4-5x); beyond, untested
NETWORK_MIN_ELEMENTS = 1 << 15  # tiny inputs: the network's per-op overhead dominates


@functools.cache
def sorting_network(m: int) -> tuple[tuple[int, int], ...]:
    """Batcher's odd-even merge sort for ``m`` inputs as comparators ``(i, j)``, ``i < j``:
    after each one, position ``i`` holds the smaller value. Built for the next power of two;
    comparators that touch a position ``>= m`` are dropped (padding with +inf: such a
    comparator would leave both positions unchanged)."""
    p = 1
    while p < m:
        p *= 2
    net: list[tuple[int, int]] = []
    size = 1
    while size < p:
        k = size
        while k >= 1:
            for j in range(k % size, p - k, 2 * k):
                for i in range(min(k, p - j - k)):
                    if (i + j) // (size * 2) == (i + j + k) // (size * 2):
                        net.append((i + j, i + j + k))
            k //= 2
        size *= 2
    return tuple((i, j) for i, j in net if j < m)


@functools.cache
def pruned_network(m: int, positions: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The comparators of :func:`sorting_network` that can influence ``positions``."""
    live = set(positions)
    keep = []
    for i, j in reversed(sorting_network(m)):
        if i in live or j in live:
            keep.append((i, j))
            live.update((i, j))
    return tuple(reversed(keep))


def column_blocks(d: int, m: int) -> Iterator[slice]:
    """Column slices of about ``BLOCK_ELEMENTS / m`` coordinates covering ``0..d``."""
    c = block_columns(d, m)
    for start in range(0, d, c):
        yield slice(start, min(start + c, d))


def block_columns(d: int, m: int) -> int:
    return min(d, max(1, BLOCK_ELEMENTS // max(m, 1)))


def block_buffer(m: int, d: int, like: Tensor) -> Tensor:
    """A flat scratch buffer for one ``(m, c)`` block, allocated once per call and reused
    by every block (allocating per block costs ~12% in page faults at d=10M)."""
    return torch.empty(m * block_columns(d, m), dtype=like.dtype, device=like.device)


def _view(buf: Tensor | None, m: int, w: int, like: Tensor) -> Tensor:
    if buf is None:
        return torch.empty(m, w, dtype=like.dtype, device=like.device)
    return buf[: m * w].view(m, w)  # contiguous (m, w)


def uses_network(m: int, d: int) -> bool:
    return 2 <= m <= NETWORK_MAX_ROWS and m * d >= NETWORK_MIN_ELEMENTS


def sort_block(x: Tensor, positions: Sequence[int] | None = None, out: Tensor | None = None) -> Tensor:
    """Sort each column of ``x`` ``(m, c)``; return the sorted rows at ``positions``
    (all ``m`` rows when None) as a ``(len(positions), c)`` tensor, written into the flat
    buffer ``out`` when given.

    ``x`` is scratch: the network path overwrites it (callers pass a block copy)."""
    m, c = x.shape
    pos = tuple(range(m)) if positions is None else tuple(positions)
    if not uses_network(m, c):
        return torch.sort(x, dim=0).values[list(pos)]  # (k, c)
    net = sorting_network(m) if positions is None else pruned_network(m, pos)
    rows = list(x.unbind(0))  # m views of (c,), sorted in place by rotating buffers
    spare = torch.empty_like(rows[0])
    for i, j in net:
        lo, hi = rows[i], rows[j]
        torch.minimum(lo, hi, out=spare)
        torch.maximum(lo, hi, out=hi)  # elementwise, so writing over an input is safe
        rows[i], spare = spare, lo
    return torch.stack([rows[p] for p in pos], out=_view(out, len(pos), c, x))  # (k, c)


def gather_block(updates: Tensor, cols: slice, rows: Tensor | None = None, out: Tensor | None = None) -> Tensor:
    """A contiguous copy of ``updates[rows][:, cols]`` ``(m, c)`` without copying whole rows,
    written into the flat buffer ``out`` when given."""
    block = updates[:, cols]  # (n, c) strided view
    if rows is None:
        return _view(out, block.shape[0], block.shape[1], updates).copy_(block)  # (n, c)
    return torch.index_select(block, 0, rows, out=_view(out, len(rows), block.shape[1], updates))  # (m, c)


def kept_shares(x: Tensor, s: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """Each row's share of the kept sorted positions ``[lo, hi)`` per column.

    ``x`` ``(m, c)`` unsorted values, ``s`` ``(m, c)`` the same columns sorted, ``lo`` and
    ``hi`` ``(c,)`` (or scalars) position bounds. A value strictly between the smallest and
    largest kept value is kept (share 1); values tied with a boundary split the kept slots
    at that value equally, so the shares of a column always sum to ``hi - lo`` and do not
    depend on the order of the rows. Returns ``(m, c)`` float shares in ``[0, 1]``."""
    m, c = s.shape
    lo = torch.as_tensor(lo, device=s.device).expand(c)
    hi = torch.as_tensor(hi, device=s.device).expand(c)
    vlo = s.gather(0, lo[None, :])  # (1, c) smallest kept value
    vhi = s.gather(0, (hi - 1)[None, :])  # (1, c) largest kept value
    pos = torch.arange(m, device=s.device)[:, None]  # (m, 1)
    in_window = (pos >= lo) & (pos < hi)  # (m, c) kept sorted positions
    share = ((x > vlo) & (x < vhi)).to(s.dtype)  # (m, c) strictly inside
    for v in (vlo, vhi):
        slots = ((s == v) & in_window).sum(0, keepdim=True)  # (1, c) kept positions holding v
        ties = x == v  # (m, c)
        if v is vhi:  # a column whose kept values are all equal was counted with vlo
            ties &= vhi != vlo
            slots = torch.where(vhi != vlo, slots, 0)
        share += ties * (slots / ties.sum(0, keepdim=True).clamp_min(1))
    return share
