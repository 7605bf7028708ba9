"""What each run mode asks of a ``distribute`` request, checked before the run's config is
built (:func:`.runtime.build_run_config`): a 422 naming what the mode cannot combine with,
else the shape of one aggregation under it (:class:`ModeShape`).

One check per mode, in :data:`MODE_CHECKS` keyed by :class:`~aitbc.run_mode.RunMode`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aitbc.coordinator.errors import unprocessable
from aitbc.coordinator.schemas import Distribute
from aitbc.core.gossip import GOSSIP_CODECS, check_topology
from aitbc.core.options import parse_spec
from aitbc.core.staleness import buffer_size, build_staleness
from aitbc.errors import AitbcError
from aitbc.run_mode import RunMode


@dataclass(frozen=True, slots=True)
class ModeShape:
    """What a mode's check resolved: async's buffer (updates per version), gossip's
    neighbours per worker and topology; None where the mode has none."""

    buffer: int | None = None
    neighbours: int | None = None
    topology: str | None = None

    def group(self, *, workers: int, quorum: int, deadline: float | None) -> int:
        """The fewest updates (or models) one aggregation must take with everyone in: what
        the run's robust rule is checked against."""
        if self.buffer is not None:  # async: a version is one buffer of updates
            return min(workers, self.buffer)
        if self.neighbours is not None:  # gossip: a worker mixes its own model and its neighbours'
            return 1 + self.neighbours
        return min(workers, quorum) if deadline else workers


def _no_topology(body: Distribute) -> None:
    if body.topology is not None:
        raise unprocessable("bad_config", f"topology is for mode gossip; mode {body.mode} has no topology")


def check_sync(body: Distribute, *, workers: int, max_workers: int) -> ModeShape:
    _no_topology(body)
    return ModeShape()


def check_async(body: Distribute, *, workers: int, max_workers: int) -> ModeShape:
    """An async run's buffer size, or a 422 naming what async cannot combine with."""
    if body.overlap:
        raise unprocessable(
            "bad_config",
            "overlap is for sync runs; async already lets workers train from any recent version: give overlap 0",
        )
    if body.verify_rate > 0:
        # a spot check replays an update from the model it names; an async update's base may be
        # any of the last max_staleness versions, which this build's verification does not handle
        raise unprocessable(
            "bad_config",
            "spot checks (verify_rate > 0) are not available with mode async: give verify_rate 0 or mode sync",
        )
    try:
        build_staleness(*parse_spec(body.staleness, what="staleness rule"))
    except (AitbcError, ValueError) as e:
        raise unprocessable("bad_config", f"staleness: {e}") from None
    buffer = buffer_size(body.buffer, workers)
    if buffer > max_workers:
        raise unprocessable(
            "bad_config", f"buffer {buffer} exceeds max_workers ({max_workers}): a worker sends one update per version"
        )
    _no_topology(body)
    return ModeShape(buffer=buffer)


def check_gossip(body: Distribute, *, workers: int, max_workers: int) -> ModeShape:
    """A gossip run's neighbours per worker, or a 422 naming what gossip cannot combine with."""

    def refuse(why: str) -> None:
        raise unprocessable("bad_config", f"mode gossip: {why}")

    if body.overlap:
        refuse("overlap is for sync runs; gossip workers never wait for a global model: give overlap 0")
    if body.verify_rate > 0:
        refuse("spot checks (verify_rate > 0) replay an update from a global model, which gossip has not: give 0")
    if body.buffer is not None:
        refuse("buffer is for mode async")
    if body.error_feedback:
        refuse("gossip sends whole models, not updates: error feedback has nothing to carry; give error_feedback false")
    if body.outer != "fedavg":
        refuse(f"outer {body.outer!r}: gossip mixes models with the run's rule and takes no outer step; give fedavg")
    try:
        name, _ = parse_spec(body.compression, what="codec")
    except AitbcError as e:
        raise unprocessable("bad_config", str(e)) from None
    if name not in GOSSIP_CODECS:
        refuse(
            f"compression {body.compression!r} would destroy whole models; use one of: {', '.join(sorted(GOSSIP_CODECS))}"
        )
    topology = body.topology or "ring"
    try:
        return ModeShape(neighbours=check_topology(topology, workers), topology=topology)
    except AitbcError as e:
        raise unprocessable("bad_config", f"mode gossip: {e}") from None


MODE_CHECKS: dict[RunMode, Callable[..., ModeShape]] = {
    RunMode.SYNC: check_sync,
    RunMode.ASYNC: check_async,
    RunMode.GOSSIP: check_gossip,
}
assert set(MODE_CHECKS) == set(RunMode), "every run mode has its distribute check"
