"""A round's updates spilled to disk: an ``(n, d)`` float32 matrix in an anonymous
temporary file, written one update at a time and read back by column block.

This is what lets the coordinator aggregate updates whose ``n x d`` float32 would not fit
in its memory (``aitbc.core.aggregation.streaming``): each update is decoded piece by
piece (``aitbc.core.compression.decode_pieces``) straight into its row, its L2 norm and
finiteness measured on the way (the norm bound needs every norm before any rule runs),
then the rules read ``(m, c)`` blocks with one positioned read per row. The process never
maps the file, so none of it counts in its resident memory; the kernel's page cache
keeps what fits, so a second pass over a matrix that fits in RAM reads no disk.

The file is created unnamed where the platform allows (``O_TMPFILE``: nothing to clean up
after a crash), in a folder the caller names (the blob store's, on the same disk).
Little-endian float32, row-major: row ``i`` at byte ``4 * i * d``. Nothing else is stored.

Shapes: ``n`` rows (updates), ``d`` values a row, ``m`` rows and ``c`` columns of a block.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType

import torch
from torch import Tensor

from aitbc.errors import AitbcError, UsageError


class SpillMatrix:
    """``n`` rows of ``d`` float32 values on disk; a ``ColumnSource`` for
    :func:`aitbc.core.aggregation.streaming.aggregate_stream`. Use as a context manager
    (or call :meth:`close`): the file goes when it closes."""

    def __init__(self, n: int, d: int, *, directory: Path) -> None:
        if n < 1 or d < 1:
            raise UsageError(f"a spilled matrix needs n >= 1 rows and d >= 1 values, got ({n}, {d})")
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._file = tempfile.TemporaryFile(dir=self.directory, prefix="spill-")  # noqa: SIM115 - closed by close()
            self._fd = self._file.fileno()
            os.ftruncate(self._fd, 4 * n * d)  # sparse until written
        except OSError as e:
            raise self._no_room(e, n, d) from None
        self.n, self.d = n, d
        self._sq = [0.0] * n  # each row's sum of squares, float64
        self._finite = [True] * n
        self._filled = [False] * n

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.d

    def fill(self, row: int, pieces: Iterable[Tensor]) -> None:
        """Write row ``row`` from consecutive flat pieces (any float dtype; stored as
        float32, as ``decode(...).to(torch.float32)`` would give), measuring its norm."""
        if not 0 <= row < self.n:
            raise IndexError(f"row {row} is outside the matrix's {self.n} rows")
        at, sq = 0, 0.0
        for piece in pieces:
            values = piece.reshape(-1).to(torch.float32).contiguous()  # (p,)
            if at + values.numel() > self.d:
                raise UsageError(f"update {row} has more than the model's {self.d} values")
            try:
                _write_all(self._fd, values.numpy().data, 4 * (row * self.d + at))
            except OSError as e:  # ENOSPC, EIO: one line, not a traceback from the driver's thread
                raise self._no_room(e, self.n, self.d) from None
            # float32 squares summed in float64 cannot overflow: the sum is finite iff every value is
            sq += float(torch.linalg.vector_norm(values, dtype=torch.float64)) ** 2
            at += values.numel()
            del piece, values  # not held while the next piece decodes
        if at != self.d:
            raise UsageError(f"update {row} has {at} values; the model has {self.d}")
        self._sq[row], self._finite[row], self._filled[row] = sq, math.isfinite(sq), True

    def norms(self) -> list[float]:
        """Each row's L2 norm (float64 sums, as ``aitbc.core.norms.update_norms``; nan for a
        row holding NaN, inf for one holding inf)."""
        self._check_filled()
        return [math.sqrt(s) for s in self._sq]  # inf and nan stay what they are

    def nonfinite_rows(self) -> list[int]:
        return [i for i, f in enumerate(self._finite) if not f]

    def read(self, rows: Sequence[int], lo: int, hi: int) -> Tensor:
        """``(len(rows), hi - lo)`` float32, a fresh tensor: one positioned read a row."""
        self._check_filled()
        if not 0 <= lo <= hi <= self.d:
            raise IndexError(f"columns [{lo}, {hi}) are outside [0, {self.d})")
        out = torch.empty(len(rows), hi - lo, dtype=torch.float32)  # (m, c)
        for j, r in enumerate(rows):
            if not 0 <= r < self.n:
                raise IndexError(f"row {r} is outside the matrix's {self.n} rows")
            _read_all(self._fd, out[j].numpy().data, 4 * (r * self.d + lo))
        return out

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SpillMatrix:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _no_room(self, e: OSError, n: int, d: int) -> AitbcError:
        return AitbcError(
            f"cannot spill {n} updates of {d} values ({4 * n * d / 1e9:.3g} GB) under {self.directory}: "
            f"{e.strerror or e}"
        )

    def _check_filled(self) -> None:
        missing = [i for i, f in enumerate(self._filled) if not f]
        if missing:
            raise UsageError(f"rows {missing[:10]} of the spilled matrix were never written")


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    view = data.cast("B")
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _read_all(fd: int, into: memoryview, offset: int) -> None:
    view = into.cast("B")
    while view:
        got = os.preadv(fd, [view], offset)
        if got == 0:
            raise OSError(f"spill file ended at byte {offset}")
        view, offset = view[got:], offset + got


__all__ = ["SpillMatrix"]
