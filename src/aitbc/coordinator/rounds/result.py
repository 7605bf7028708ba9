"""A closed round's outcome before it is recorded (:class:`RoundResult`): what a mode's
close computes (:mod:`.aggregation`, or gossip's consensus) and :mod:`.commit` records.

Shape letters: ``d`` parameters.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True, slots=True)
class RoundResult:
    """An aggregated round, before it is recorded."""

    params: Tensor  # (d,) the new global model
    cid: str  # its checkpoint blob
    size: int  # the checkpoint's bytes
    outer_cid: str | None  # the outer optimizer's state blob, if it keeps one
    val_loss: float | None  # None: evaluated later
    val_accuracy: float | None
    skipped: bool  # too few updates for the rule (or none): the model is unchanged
    diverged: str | None = None  # why the aggregate must not be committed (the run fails)
    rejected: tuple[tuple[int, str], ...] = ()  # (update id, reason): past the norm bound, provable
    clipped: tuple[int, ...] = ()  # update ids scaled down to the norm bound (not punished)
    # the outer optimizer's state stored under outer_cid by this round (None: it wrote none),
    # so recording the round does not read back and hash what it just wrote
    outer_state: dict[str, Tensor] | None = None
    spread: float | None = None  # gossip: the round's models' mean distance to their mean
    # the writes of the checkpoint and the outer state, under way (runtime.write_behind):
    # done before the round is recorded
    stored: tuple[Future[str], ...] = ()

    def wait_stored(self) -> None:
        """Return once the round's blobs are stored (durably); a failed write's error."""
        for f in self.stored:
            f.result()
