"""What every part of the coordinator shares: settings, database sessions, the blob store,
worker liveness and a change counter. Built once by :func:`build_context`."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from aitbc.coordinator.config import Settings
from aitbc.coordinator.observability.metrics import CoordinatorMetrics
from aitbc.coordinator.store.db import make_engine, make_sessions
from aitbc.coordinator.store.lease import DriverLease, replica_id
from aitbc.coordinator.store.models import CoordinatorIdentity, Offer
from aitbc.coordinator.store.nonces import nonce_store
from aitbc.coordinator.transfer.peers import PeerBook
from aitbc.coordinator.transfer.uploads import UploadSlots
from aitbc.ledger.book import Ledger
from aitbc.ledger.signing import NonceStore
from aitbc.ledger.wallet import ensure_wallet
from aitbc.storage.blobstore import LocalBlobStore

if TYPE_CHECKING:
    from aitbc.coordinator.chain_backend import ChainBackend


class Liveness:
    """Last heartbeat per worker, in memory: a heartbeat is a dict write, not a database
    commit (the driver flushes them every few seconds). After a restart it starts from the
    database's last heartbeats; the driver judges no lease until the coordinator has been
    up a full lease, since no worker could reach it while it was down."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._dirty: set[str] = set()
        self._lock = threading.Lock()

    def load(self, seen: dict[str, float]) -> None:
        with self._lock:
            self._seen.update(seen)

    def merge(self, seen: dict[str, float]) -> None:
        """Heartbeats other replicas flushed to the database: each worker's latest wins."""
        with self._lock:
            for w, t in seen.items():
                if t > self._seen.get(w, float("-inf")):
                    self._seen[w] = t

    def knows(self, worker_id: str) -> bool:
        return worker_id in self._seen

    def touch(self, worker_id: str, now: float) -> None:
        with self._lock:
            self._seen[worker_id] = now
            self._dirty.add(worker_id)

    def last_seen(self, worker_id: str) -> float | None:
        return self._seen.get(worker_id)

    def alive(self, worker_id: str, now: float, lease: float) -> bool:
        t = self._seen.get(worker_id)
        return t is not None and now - t <= lease

    def count_alive(self, now: float, lease: float) -> int:
        """Workers heard from within ``lease`` seconds (the metrics' ``aitbc_workers_alive``)."""
        with self._lock:
            return sum(1 for t in self._seen.values() if now - t <= lease)

    def take_dirty(self) -> dict[str, float]:
        with self._lock:
            out = {w: self._seen[w] for w in self._dirty}
            self._dirty.clear()
        return out


class Notifier:
    """A counter bumped on every change a waiting worker may care about (a round opened,
    a job assigned). Long polls wait on it (:meth:`changed`) and are woken the moment it
    moves, from whichever thread bumps it; they never query the database in a loop.
    :meth:`close` (the server is stopping) wakes them all for good: the server waits for
    every open request before it stops, and a long poll would hold it for its whole wait."""

    def __init__(self) -> None:
        self.version = 0
        self.closed = False
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self.wake_driver = threading.Event()

    def bump(self) -> None:
        with self._lock:
            self.version += 1
            waiters = list(self._waiters)
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def close(self) -> None:
        """Wake every long poll now and every later one at once (the server is stopping)."""
        with self._lock:
            self.closed = True
            waiters = list(self._waiters)
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    async def changed(self, seen: int, timeout: float) -> None:
        """Return once ``version != seen``, after ``timeout`` seconds, or once closed."""
        event = asyncio.Event()
        key = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.add(key)
        try:
            if self.version == seen and not self.closed:
                await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                self._waiters.discard(key)

    def poke_driver(self) -> None:
        self.wake_driver.set()


@dataclass
class Context:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    store: LocalBlobStore
    liveness: Liveness
    notifier: Notifier
    nonces: NonceStore
    started_at: float
    ledger: Ledger
    # Which replica drives the rounds (store.lease); this process's part in it.
    lease: DriverLease
    # The blob uploads in flight, and each signer's (transfer.uploads; the app's Limits holds them).
    uploads: UploadSlots
    # Which coordinator this is: its database's id (store.models.CoordinatorIdentity), the
    # same for every replica serving it; "" until build_context reads it.
    coordinator_id: str = ""
    # Worker leases and spot checks are judged from here at the earliest: this process's
    # start, or when it took the rounds over (nobody could reach a driver that was not one).
    judging_since: float = 0.0
    # Per live run, the driver's in-memory model, validation data and optimizer state
    # (live.runtime.RunRuntime); rebuilt from the database after a restart.
    runtimes: dict[str, Any] = field(default_factory=dict)
    # Per live run, the round driver's books thread's own copy of that model (it evaluates
    # and scores with it, so a round's close never waits for a scoring; verification.scoring).
    books_models: dict[str, Any] = field(default_factory=dict)
    # Decoded shards by content id, for scoring (live.books.ShardCache).
    books_shards: Any = None
    # The process's own Prometheus counters and the app's registry (observability.metrics).
    metrics: CoordinatorMetrics = field(default_factory=CoordinatorMetrics)
    # Which workers serve which blobs (peer transport), in memory (transfer.peers).
    peers: PeerBook = field(default_factory=PeerBook)
    # The EVM chain this coordinator settles on (--chain evm); None: its own ledger holds the money.
    chain: ChainBackend | None = None

    def session(self) -> Session:
        return self.sessions()

    def workers_alive(self) -> int:
        """Workers heard from within a lease, now (the metrics' ``aitbc_workers_alive``)."""
        return self.liveness.count_alive(time.time(), self.settings.lease_seconds)


def _sqlite_lock(engine: Engine) -> Path | None:
    """The driver lease's local lock file of a SQLite database: beside it (None: not SQLite,
    or in memory)."""
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return None
    return Path(f"{engine.url.database}.driver-lock")


def _connect_chain(settings: Settings) -> ChainBackend | None:
    if settings.chain == "local":
        return None
    # eth-account and the contracts' ABI cost a second to import: only an EVM coordinator pays it
    from aitbc.coordinator.chain_backend import connect

    return connect(settings)


def _bind_chain(engine: Engine, sessions: sessionmaker[Session], chain: ChainBackend | None) -> None:
    """The database's money stays on the chain it was first started with (chain_binding)."""
    from aitbc.coordinator.store.chain_binding import bind

    try:
        bind(sessions, chain, rpc=chain.rpc if chain is not None else "")
    except BaseException:
        engine.dispose()
        if chain is not None:
            chain.close()
        raise


def build_context(settings: Settings) -> Context:
    settings.home.mkdir(parents=True, exist_ok=True)
    chain = _connect_chain(settings)  # first: a chain that does not match stops the start before anything is written
    engine = make_engine(settings.database_url)
    sessions = make_sessions(engine)
    _bind_chain(engine, sessions, chain)
    ctx = Context(
        settings=settings,
        engine=engine,
        sessions=sessions,
        store=LocalBlobStore(settings.home, max_size=settings.max_blob_bytes),
        liveness=Liveness(),
        notifier=Notifier(),
        nonces=nonce_store(engine, window=2 * settings.max_skew_seconds),
        started_at=time.time(),
        ledger=Ledger(ensure_wallet(settings.home, "coordinator"), settings.network),
        lease=DriverLease(sessions, replica_id(), settings.driver_lease_seconds, local_lock=_sqlite_lock(engine)),
        uploads=UploadSlots(settings.max_uploads, settings.max_uploads_per_signer),
        chain=chain,
    )
    ctx.judging_since = ctx.started_at
    with ctx.session() as s:
        seen = s.execute(select(Offer.id, Offer.last_heartbeat)).all()
        ctx.coordinator_id = s.execute(select(CoordinatorIdentity.id)).scalar_one()
    ctx.liveness.load(dict(seen))
    return ctx
