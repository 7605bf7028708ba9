"""Coordinate-wise order statistics over ``(m, d)`` rows, one column block at a time.

The coordinate rules (median, trimmed mean, Bulyan's second stage, the start of centered
clipping) need, for every coordinate, the ``m`` values of that coordinate in sorted
order. ``torch.sort(x, dim=0)`` does that, but on a CPU it sorts each column on its own
(about 300 ns a column for ``m = 32``, ~50x a weighted mean) and returns int64 indices
twice the size of the input. Here instead, on a CPU and for ``2 <= m <= NETWORK_MAX_ROWS``:

- the columns are cut into blocks of ``NETWORK_COLUMNS`` coordinates; the Python loop
  runs over blocks (306 blocks for ``d = 10M``), never over coordinates, and nothing
  ``(m, d)`` sized is allocated;
- inside a block a Batcher odd-even merge sorting network sorts all columns at once:
  each comparator is one ``torch.minimum`` and one ``torch.maximum`` over two ``(c,)``
  rows, vectorised across the block's columns. A network is data independent, so the
  same ops run for every column; when only some sorted positions are needed (the
  median), comparators that cannot reach them are pruned;
- every op works on one ``(c,)`` row with ``c`` below PyTorch's parallel grain size
  (32768), so it runs on the calling thread without an OpenMP region, and blocks run on
  ``torch.get_num_threads()`` Python threads (PyTorch releases the GIL inside ops).
  Hundreds of small OpenMP regions per block would stall whenever other processes
  compete for the cores (each region waits for a descheduled thread).

Larger ``m``, other devices and the ``with_info`` paths sort blocks of about
``BLOCK_ELEMENTS`` values with ``torch.sort``, one block after another. Both paths give
the same sorted values (sorting is exact).

Shapes: ``m`` rows (updates), ``d`` coordinates, ``c`` columns in a block.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

NETWORK_COLUMNS = 32767  # < at::internal::GRAIN_SIZE: a (c,) op never opens an OpenMP region
NETWORK_MAX_ROWS = 256  # measured 4-5x faster than torch.sort up to m=200; beyond, untested
NETWORK_MIN_ELEMENTS = 1 << 15  # tiny inputs: the network's per-op overhead dominates
BLOCK_ELEMENTS = 1 << 22  # values per torch.sort block: 16 MiB of float32


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


class ColumnSorter:
    """Sorted values of chosen rows of ``updates`` ``(n, d)``, one column block at a time.

    ``rows``: the ``m`` row indices to sort (all when None). ``positions``: the sorted
    positions a caller needs (all when None); the network skips what cannot reach them.
    ``exact_blocks``: use ``torch.sort`` blocks (the ``with_info`` paths, which need whole
    ``(m, c)`` tensors)."""

    def __init__(
        self,
        updates: Tensor,
        rows: Sequence[int] | None = None,
        positions: Sequence[int] | None = None,
        *,
        exact_blocks: bool = False,
    ) -> None:
        n, d = updates.shape
        self.updates = updates
        self.rows = list(range(n)) if rows is None else [int(r) for r in rows]
        m = len(self.rows)
        self.m, self.d = m, d
        self.positions = tuple(range(m)) if positions is None else tuple(positions)
        self.network = (
            not exact_blocks
            and updates.device.type == "cpu"
            and 2 <= m <= NETWORK_MAX_ROWS
            and m * d >= NETWORK_MIN_ELEMENTS
        )
        c = NETWORK_COLUMNS if self.network else max(1, BLOCK_ELEMENTS // max(m, 1))
        self.blocks = [slice(s, min(s + c, d)) for s in range(0, d, c)]
        self.comparators = (
            (sorting_network(m) if positions is None else pruned_network(m, self.positions)) if self.network else ()
        )
        self._index = torch.tensor(self.rows, device=updates.device)

    def block(self, cols: slice) -> Tensor:
        """``(m, c)``: a copy of the chosen rows' values in ``cols``, in row order."""
        return self.updates[:, cols].index_select(0, self._index)

    def sort(self, cols: slice) -> list[Tensor]:
        """The sorted values in ``cols`` at ``positions``: a list of ``(c,)`` rows."""
        if not self.network:
            s = torch.sort(self.block(cols), dim=0).values  # (m, c)
            return [s[p] for p in self.positions]
        w = cols.stop - cols.start
        # Rows start as read-only views of the updates; a comparator writes into scratch
        # rows (m + 1 suffice), reusing its inputs once they are scratch themselves.
        free = list(torch.empty(self.m + 1, w, dtype=self.updates.dtype).unbind(0))  # (c,) each
        owned = {id(t) for t in free}
        rows = [self.updates[r, cols] for r in self.rows]  # (c,) views
        for i, j in self.comparators:
            a, b = rows[i], rows[j]
            lo = torch.minimum(a, b, out=free.pop())
            # elementwise, so writing over an input (b) is safe
            hi = torch.maximum(a, b, out=b if id(b) in owned else free.pop())
            if id(a) in owned:
                free.append(a)
            rows[i], rows[j] = lo, hi
        return [rows[p] for p in self.positions]

    def run(self, fn: Callable[[slice], object]) -> None:
        """Call ``fn(cols)`` for every block: on the network path in parallel on
        ``torch.get_num_threads()`` threads (``fn`` must write only its own columns and
        use only ``(c,)`` row ops), otherwise one block after another."""
        workers = min(torch.get_num_threads(), len(self.blocks)) if self.network else 1
        if workers <= 1:
            for cols in self.blocks:
                fn(cols)
            return
        with ThreadPoolExecutor(workers, thread_name_prefix="aitbc-sort") as pool:
            for _ in pool.map(fn, self.blocks):  # re-raises a worker's exception here
                pass


def mean_of_rows(rows: Sequence[Tensor], out: Tensor) -> Tensor:
    """``out = mean(rows)`` with one ``(c,)`` op per row, summed in order; two rows as
    ``a/2 + b/2`` so that two huge values cannot overflow."""
    if len(rows) == 1:
        return out.copy_(rows[0])
    if len(rows) == 2:
        torch.mul(rows[0], 0.5, out=out)
        return out.add_(rows[1], alpha=0.5)
    out.copy_(rows[0])
    for row in rows[1:]:
        out.add_(row)
    return out.div_(len(rows))


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
