"""How a run's rounds go: the three modes, by the name a config, a request and a CLI flag
give them, each with the facts about it that code outside the coordinator's rounds asks.

- ``sync``: every worker trains from the round's global model; the round waits for them
  all (or its deadline), and the coordinator aggregates their updates.
- ``async``: a round is one applied buffer (a version) of updates, each trained from any
  recent version and down-weighted by its staleness; nobody waits at a barrier.
- ``gossip``: workers train from their own models and mix them with their topology
  neighbours' peer to peer; the coordinator keeps the record and judges it.

What each mode does on the coordinator is :mod:`aitbc.coordinator.rounds.modes`.
"""

from __future__ import annotations

from enum import StrEnum


class RunMode(StrEnum):
    SYNC = "sync"
    ASYNC = "async"
    GOSSIP = "gossip"

    @classmethod
    def parse(cls, name: str) -> RunMode | None:
        """The mode called ``name``, or None when no mode is."""
        try:
            return cls(name)
        except ValueError:
            return None

    @classmethod
    def named(cls, name: str) -> RunMode:
        """The mode called ``name``; a name this build does not know goes as sync (a worker
        told of a newer mode trains its rounds as a sync worker would)."""
        return cls.parse(name) or cls.SYNC

    @property
    def has_barrier(self) -> bool:
        """A round waits for every active worker (or its deadline): those missing at its
        close are stragglers, and a worker may train ahead of it (overlap)."""
        return self is RunMode.SYNC

    @property
    def buffered(self) -> bool:
        """A round is one buffer of updates applied as a version; an update may be trained
        from any of the last ``max_staleness`` versions."""
        return self is RunMode.ASYNC

    @property
    def peer_to_peer(self) -> bool:
        """Workers mix their own models with their topology neighbours' (no global model
        is sent to them); a run of it has a topology."""
        return self is RunMode.GOSSIP

    @property
    def has_global_model(self) -> bool:
        """Workers train from a global model the coordinator aggregates and sends."""
        return not self.peer_to_peer

    @property
    def pays_delivered(self) -> bool:
        """An update delivered for a round that never closed is paid when the run ends
        (a gossip round's models are judged only at its close)."""
        return not self.peer_to_peer

    @property
    def needs_driver(self) -> bool:
        """Only the round driver can move its rounds (no owner-driven control): it fills
        and applies the buffers, or keeps the gossip record."""
        return not self.has_barrier
