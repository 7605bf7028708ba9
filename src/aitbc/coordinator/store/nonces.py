"""Replay protection shared by the coordinator replicas on one PostgreSQL database.

Every signed request carries a random nonce, and a nonce is accepted once within the
replay window (``ledger.signing.verify_request``). One process remembers them in memory
(``NonceCache``); replicas (``coordinator.lease``) must remember them together, or a
captured request could be replayed once to each other replica. ``SharedNonces`` keeps
them in table ``seen_nonces``: one conditional INSERT per signed request, which the
database applies atomically, so of two replicas given the same nonce exactly one accepts.

It is used on PostgreSQL, the database replicas share. Its commits are asynchronous
(``synchronous_commit = off``): a replay check needs the row visible to the other
replicas, not on disk, and a database crash loses at most the last fraction of a second of
nonces; a restarted coordinator refuses every request signed before its start anyway.
SQLite keeps the in-memory cache (a write per request there would be a file lock and an
fsync): several processes on one SQLite file do not share nonces.
"""

from __future__ import annotations

import math
import threading

from sqlalchemy import Engine, delete, text
from sqlalchemy.dialects.postgresql import insert

from aitbc.coordinator.store.models import SeenNonce
from aitbc.ledger.signing import NonceCache


class SharedNonces:
    """``NonceCache``'s contract (``window``, ``check_and_add``) on the database."""

    shared = True  # each check is a database round trip: callers keep it off the event loop

    def __init__(self, engine: Engine, window: float) -> None:
        if not window > 0 or math.isinf(window):
            raise ValueError(f"nonce window must be a positive number of seconds, not {window!r}")
        self.window = float(window)
        self._engine = engine
        self._lock = threading.Lock()
        self._next_purge = 0.0

    def check_and_add(self, nonce: str, timestamp: float, now: float) -> bool:
        """Record ``nonce`` until ``timestamp + window``; False if a replica holds it
        unexpired already (a replay). An expired row is taken over, as the in-memory
        cache forgets it."""
        row = insert(SeenNonce).values(nonce=nonce, expires_at=timestamp + self.window)
        stmt = row.on_conflict_do_update(
            index_elements=[SeenNonce.nonce],
            set_={"expires_at": row.excluded.expires_at},
            where=SeenNonce.expires_at < now,
        ).returning(SeenNonce.nonce)  # a row back: inserted, or an expired one taken over
        with self._engine.begin() as conn:
            conn.execute(text("SET LOCAL synchronous_commit TO OFF"))
            added = conn.execute(stmt).first() is not None
            if self._purge_due(now):
                conn.execute(delete(SeenNonce).where(SeenNonce.expires_at < now))
        return added

    def _purge_due(self, now: float) -> bool:
        """Whether this replica deletes the expired rows now: about twice a window."""
        with self._lock:
            if now < self._next_purge:
                return False
            self._next_purge = now + self.window / 2
            return True

    def __len__(self) -> int:
        with self._engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM seen_nonces")).scalar_one())


def nonce_store(engine: Engine, window: float) -> NonceCache | SharedNonces:
    """Shared nonces on PostgreSQL (where replicas run), the in-memory cache elsewhere."""
    if engine.dialect.name == "postgresql":
        return SharedNonces(engine, window)
    return NonceCache(window)
