"""Which coordinator process drives the rounds, when several share one database.

Any number of ``aitbc coordinator serve`` processes (replicas) may serve one database and
one blob folder; every one answers every request, but exactly one, the holder of the
``rounds`` row of table ``driver_lease``, moves runs forward (closes rounds, expires
worker leases, scores, settles, finalizes, collects blobs). The row names its holder's
replica id and an expiry; it is taken and renewed only by a conditional UPDATE (a
compare-and-set on holder and expiry), so two replicas never both hold it: the database
applies the two UPDATEs one after the other, and the second no longer matches.

Clocks: the row is judged by the database's clock alone. Its expiry is written as the
database's time plus the period, and a claim matches only a row whose expiry is past by
the database's time, both read by the database engine in the UPDATE itself
(:func:`db_now`: PostgreSQL's ``clock_timestamp()``, SQLite's ``julianday('now')``). No
replica's wall clock enters it, so a replica whose clock runs ahead cannot take the lease
from a live holder, and one whose clock runs behind cannot keep it past its expiry.

The holder renews it every quarter of ``driver_lease_seconds``; a replica believes it
holds the lease only until three quarters of the period after it *sent* the renewal that
succeeded, counted on its own monotonic clock (which measures durations, whatever its wall
clock says): the database wrote an expiry a full period after it ran that statement, later
still, so a holder that stops renewing (killed, paused, cut off from the database) stops
driving before anyone else may take over, as long as the two clocks tick at about the same
rate. Its writes are fenced as well: :meth:`DriverLease.fence` renews the row inside the
driver's own transaction, which then holds the row's lock until it commits; a paused
ex-holder's transaction finds the row taken and is rolled back. Settlement stays exactly
once by key in any case (``settle:<contract>:<round>``, unique settlement rows).

Each renewal also reads the database's time, so a replica knows how far its own wall
clock is from the database's (:attr:`DriverLease.offset`) and logs a warning
when that is more than a second: the lease no longer depends on it, but the timestamps a
replica writes (heartbeats, round openings) still do.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # not POSIX: no local lock, a restart on SQLite waits out its old lease
    fcntl = None  # type: ignore[assignment]

from sqlalchemy import Float, cast, extract, func, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.elements import ColumnElement

from aitbc.coordinator.store.models import DriverLease as LeaseRow

log = logging.getLogger("aitbc.coordinator")
ROUNDS = "rounds"
UNIX_EPOCH_JULIAN_DAY = 2440587.5  # julianday('1970-01-01')
SKEW_WARNING_SECONDS = 1.0  # a replica's wall clock this far from the database's is logged


def replica_id() -> str:
    """A new process's id among the replicas: 48 random bits (what ``/v1/health`` shows)."""
    return f"replica_{secrets.token_hex(6)}"


def db_now(dialect: str) -> ColumnElement[float]:
    """The database's current time in Unix seconds, as an expression the database itself
    evaluates in the statement that holds it. PostgreSQL: ``clock_timestamp()``, the
    server's time when it is read (``now()`` would be the transaction's start, stale in a
    long transaction); SQLite, a library in the calling process: ``julianday('now')``,
    the time of the machine every SQLite replica shares (its local lock keeps them there)."""
    if dialect == "postgresql":
        return cast(extract("epoch", func.clock_timestamp()), Float)
    return (func.julianday("now") - UNIX_EPOCH_JULIAN_DAY) * 86400.0


class DriverLease:
    """One replica's view of the ``rounds`` lease.

    ``held_until`` is when, on ``clock`` (monotonic seconds), this replica stops believing
    it holds the lease (0: not held); :meth:`holds` trusts it without a query. :meth:`tick`
    takes or renews the lease as due and returns whether this replica holds it now."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        me: str,
        period: float,
        *,
        name: str = ROUNDS,
        local_lock: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sessions, self.me, self.period, self.name = sessions, me, period, name
        self.clock = clock  # durations only: never compared with the row's (database) times
        self.held_until = 0.0
        self.since = 0.0  # on ``clock``: when this replica last took it (a term's mark)
        self.offset: float | None = None  # the database's time less this replica's wall clock
        self._renewed = 0.0
        self.local_lock = local_lock  # SQLite: a file beside the database (see sole_local)
        self._lock_file: IO[bytes] | None = None

    def sole_local(self) -> bool:
        """Whether this process holds ``local_lock`` (an exclusive ``flock``, kept until
        :meth:`release`; the kernel drops it when a process dies, even by SIGKILL). On
        SQLite every coordinator of the database is on this machine: the one holding it
        may take the lease from an unexpired holder, which can only be a dead process
        (a restart drives at once); a second live one stands by as on PostgreSQL."""
        if self._lock_file is not None:
            return True
        if self.local_lock is None or fcntl is None:
            return False
        try:
            f = self.local_lock.open("ab")
        except OSError as e:
            log.warning("driver lease: cannot open %s (%s); a restart waits out the old lease", self.local_lock, e)
            self.local_lock = None
            return False
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return False
        self._lock_file = f
        return True

    def _session(self) -> Session:
        return self.sessions()

    def _now(self, s: Session) -> ColumnElement[float]:
        return db_now(s.get_bind().dialect.name)

    def holds(self) -> bool:
        return self.clock() < self.held_until

    def tick(self, *, steal: bool = False) -> bool:
        """Take the lease if it is free (expired by the database's clock, or ``steal``),
        renew it if ours and a quarter of the period has passed; whether this replica holds
        it now."""
        sent = self.clock()
        if sent < self.held_until and sent - self._renewed < self.period / 4:
            return True
        wall = time.time()
        with self._session() as s:
            held = self._claim(s, steal=steal)
            self._measure(s, wall)
            s.commit()
        self._record(held, sent)
        return held

    def fence(self, s: Session) -> bool:
        """Renew the lease inside ``s``'s transaction (whose commit then waits on no other
        replica's claim: the row stays locked until it ends); False: it is no longer ours
        and the caller must roll back. It extends nothing this replica believes (the
        transaction may still roll back): the lease thread's committed renewals do."""
        if not self.holds():
            return False
        if self._renew(s):
            return True
        self._record(False, self.clock())
        return False

    def release(self) -> None:
        """Give the lease up at a clean stop, so another replica takes over at once."""
        if self._lock_file is not None:
            self._lock_file.close()  # and the local lock (closing drops the flock)
            self._lock_file = None
        if not self.held_until:
            return
        self.held_until = 0.0
        try:
            with self._session() as s:
                s.execute(
                    update(LeaseRow)
                    .where(LeaseRow.name == self.name, LeaseRow.holder == self.me)
                    .values(expires_at=0.0)
                )
                s.commit()
        except SQLAlchemyError:  # the database is gone: the lease simply runs out
            log.warning("could not release the driver lease; it expires in %g s", self.period)

    def holder(self) -> tuple[str, float] | None:
        """The current holder and how long its lease has left by the database's clock, in
        seconds (negative: expired; None: never taken)."""
        with self._session() as s:
            row = s.execute(
                select(LeaseRow.holder, LeaseRow.expires_at - self._now(s)).where(LeaseRow.name == self.name)
            ).first()
        return None if row is None else (row[0], float(row[1]))

    # --- the compare-and-set, on the database's clock --------------------------------------

    def _renew(self, s: Session) -> bool:
        now = self._now(s)
        done = s.execute(
            update(LeaseRow)
            .where(LeaseRow.name == self.name, LeaseRow.holder == self.me, LeaseRow.expires_at > now)
            .values(expires_at=now + self.period)
        )
        return bool(done.rowcount)  # type: ignore[attr-defined]

    def _claim(self, s: Session, *, steal: bool) -> bool:
        if self._renew(s):
            return True
        now = self._now(s)
        free = LeaseRow.expires_at <= now
        taken = s.execute(
            update(LeaseRow)
            .where(LeaseRow.name == self.name, free if not steal else LeaseRow.name == self.name)
            .values(holder=self.me, expires_at=now + self.period, since=now)
        )
        if taken.rowcount:  # type: ignore[attr-defined]
            return True
        if s.scalar(select(LeaseRow.name).where(LeaseRow.name == self.name)) is not None:
            return False  # another replica holds it
        try:  # the first claim ever: the primary key lets one replica in
            with s.begin_nested():
                s.execute(
                    insert(LeaseRow).values(name=self.name, holder=self.me, expires_at=now + self.period, since=now)
                )
        except IntegrityError:
            return False
        return True

    def _measure(self, s: Session, wall: float) -> None:
        """How far this replica's wall clock is from the database's (read just after it)."""
        offset = float(s.scalar(select(self._now(s))) or 0.0) - wall
        if abs(offset) > SKEW_WARNING_SECONDS and (self.offset is None or abs(self.offset) <= SKEW_WARNING_SECONDS):
            log.warning(
                "replica %s: this machine's clock is %+.1f s from the database's; the driver lease is judged "
                "by the database's, but heartbeats and round times this replica writes are not (run NTP)",
                self.me,
                -offset,
            )
        self.offset = offset

    def _record(self, held: bool, sent: float) -> None:
        was = self.held_until > 0
        if held:
            if not was:
                self.since = sent
                log.info("replica %s now drives the rounds (lease %g s)", self.me, self.period)
            # believed a quarter period less than the database wrote, counted from before the
            # statement was sent: ours stops before anyone else's may start
            self.held_until, self._renewed = sent + self.period * 0.75, sent
        else:
            if was:
                log.warning("replica %s lost the driver lease; standing by", self.me)
            self.held_until = 0.0
