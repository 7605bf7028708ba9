"""Blob uploads' share of the coordinator: slots per signer, and a floor on a body's pace.

A blob upload holds one of ``max_uploads`` slots from its first byte to its last (a small
one buffered whole in memory, a large one an open file). Two bounds keep one party from
holding them:

- **per signer**: one signer (a wallet; the app's ``Limits`` verifies an upload's signature
  before the upload takes a slot or a body byte is read) holds at most
  ``max_uploads_per_signer`` of them at once (429 ``too_many_uploads``), counted from the
  check to the upload's end, so no burst of its requests ever holds more; there are no
  unsigned uploads (``PUT /v1/blobs/{cid}`` is signed);
- **pace**: a body must bring at least ``min_upload_rate`` bytes/s, judged over every
  ``upload_rate_window`` seconds the coordinator spends waiting for it: the wait is timed
  by the clock, not by the arrival of the next chunk, so a client that sends nothing at
  all is cut off as surely as one that trickles. Cut off: 408 ``upload_too_slow``, nothing
  stored, the slot free again. The time the coordinator spends on its own side (a write to
  disk, a thread hop) is not counted against the client.

Many wallets (they are free) can still hold all the slots, each at the floor's pace: the
bandwidth that takes is what the floor prices (``max_uploads`` x ``min_upload_rate``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

from aitbc.coordinator.errors import ApiError

TOO_MANY = "too_many_uploads"
TOO_SLOW = "upload_too_slow"


class UploadSlots:
    """The ``total`` upload slots and each signer's share of them. One event loop takes and
    gives them: plain counters, no lock."""

    def __init__(self, total: int, per_signer: int) -> None:
        self.total = total
        self.per_signer = per_signer
        self.in_flight = 0
        self.by_signer: dict[str, int] = {}

    def take(self) -> bool:
        """One of the ``total`` slots (False: all are held)."""
        if self.in_flight >= self.total:
            return False
        self.in_flight += 1
        return True

    def give(self) -> None:
        self.in_flight -= 1

    def over_share(self, address: str) -> str | None:
        """Why an upload by ``address`` (its signature verified) is refused now (its share is
        held), else None. Asked before a slot is taken."""
        held = self.by_signer.get(address, 0)
        if held < self.per_signer:
            return None
        return (
            f"this signer has {held} uploads in flight, the most one signer may hold "
            f"(max_uploads_per_signer {self.per_signer}); send the next when one is done"
        )

    @contextmanager
    def signer(self, address: str) -> Iterator[None]:
        """Count an upload by ``address`` (its signature verified) against its share for as
        long as the block runs; past the share, 429 ``too_many_uploads``."""
        why = self.over_share(address)
        if why is not None:
            raise ApiError(429, TOO_MANY, why)
        held = self.by_signer.get(address, 0)
        self.by_signer[address] = held + 1
        try:
            yield
        finally:
            left = self.by_signer[address] - 1
            if left:
                self.by_signer[address] = left
            else:
                del self.by_signer[address]


async def paced(
    chunks: AsyncIterator[bytes],
    *,
    rate: int,
    window: float,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[bytes]:
    """``chunks`` (a request's body) as they come, cut off with 408 ``upload_too_slow`` when
    fewer than ``rate x window`` bytes arrive within ``window`` seconds of waiting for them
    (each window starts when the previous one's bytes were in). The wait is bounded by a
    timer, so a body that stops arriving is cut off at the window's end, not whenever (or
    never) its next byte comes."""
    need = rate * window
    waited = 0.0  # seconds spent waiting on the client in this window
    got = 0  # bytes it brought in this window
    it = aiter(chunks)
    while True:
        start = clock()
        try:
            async with asyncio.timeout(window - waited):
                chunk = await anext(it)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise ApiError(
                408,
                TOO_SLOW,
                f"the upload's body brought {got} bytes in {window:g} s; this coordinator needs at least "
                f"{rate} bytes/s (min_upload_rate) over every {window:g} s (upload_rate_window)",
            ) from None
        waited += clock() - start
        got += len(chunk)
        if got >= need:  # this window's share is in: the next starts now
            waited, got = 0.0, 0
        yield chunk
