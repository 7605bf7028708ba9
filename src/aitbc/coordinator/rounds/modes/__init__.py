"""The run modes on the coordinator, one module each (:mod:`.sync`, :mod:`.async_`,
:mod:`.gossip`) behind one interface (:class:`.base.RoundMode`), chosen by the run's config
(:func:`mode_for`, :func:`mode_of`). Nothing outside these modules asks which mode a run
is in: it calls the run's mode, or reads a fact of :class:`~aitbc.run_mode.RunMode`.
"""

from __future__ import annotations

from aitbc.coordinator.rounds.modes.async_ import AsyncMode
from aitbc.coordinator.rounds.modes.base import RoundMode
from aitbc.coordinator.rounds.modes.gossip import GossipMode
from aitbc.coordinator.rounds.modes.sync import SyncMode
from aitbc.coordinator.store.models import Run
from aitbc.coordinator.store.run_config import RunConfig
from aitbc.run_mode import RunMode

MODES: dict[RunMode, RoundMode] = {m.kind: m for m in (SyncMode(), AsyncMode(), GossipMode())}
assert set(MODES) == set(RunMode), "every run mode has its implementation"


def mode_for(cfg: RunConfig | None) -> RoundMode:
    """The mode of a run with config ``cfg``; a run not yet configured goes as sync (it has
    no round to close and takes no update)."""
    return MODES[RunMode.SYNC if cfg is None else cfg.mode]


def mode_of(run: Run) -> RoundMode:
    return mode_for(run.cfg if run.configured else None)


__all__ = ["MODES", "RoundMode", "mode_for", "mode_of"]
