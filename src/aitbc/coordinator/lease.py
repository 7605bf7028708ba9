"""Which coordinator process drives the rounds, when several share one database.

Any number of ``aitbc coordinator serve`` processes (replicas) may serve one database and
one blob folder; every one answers every request, but exactly one, the holder of the
``rounds`` row of table ``driver_lease``, moves runs forward (closes rounds, expires
worker leases, scores, settles, finalizes, collects blobs). The row names its holder's
replica id and an expiry; it is taken and renewed only by a conditional UPDATE (a
compare-and-set on holder and expiry), so two replicas never both hold it: the database
applies the two UPDATEs one after the other, and the second no longer matches.

The holder renews it every quarter of ``driver_lease_seconds``; a replica believes it
holds the lease only until three quarters of the period after it last wrote it, so a holder that stops renewing (killed,
paused, cut off from the database) stops driving before anyone else may take over. Its
writes are fenced as well: :meth:`DriverLease.fence` renews the row inside the driver's own
transaction, which then holds the row's lock until it commits; a paused ex-holder's
transaction finds the row taken and is rolled back. Settlement stays exactly once by key
in any case (``settle:<contract>:<round>``, unique settlement rows).

Clocks: expiries are the writer's wall clock; replicas on several machines need clocks in
step (NTP) to well under a lease, as signed requests already need theirs within
``max_skew_seconds``.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # not POSIX: no local lock, a restart on SQLite waits out its old lease
    fcntl = None  # type: ignore[assignment]

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from aitbc.coordinator.models import DriverLease as LeaseRow

log = logging.getLogger("aitbc.coordinator")
ROUNDS = "rounds"


def replica_id() -> str:
    """A new process's id among the replicas: 48 random bits (what ``/v1/health`` shows)."""
    return f"replica_{secrets.token_hex(6)}"


class DriverLease:
    """One replica's view of the ``rounds`` lease.

    ``held_until`` is the expiry this replica last wrote while holding it (0: not held);
    :meth:`holds` trusts it without a query. :meth:`tick` takes or renews the lease as due
    and returns whether this replica holds it now."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        me: str,
        period: float,
        *,
        name: str = ROUNDS,
        local_lock: Path | None = None,
    ) -> None:
        self.sessions, self.me, self.period, self.name = sessions, me, period, name
        self.held_until = 0.0
        self.since = 0.0  # when this replica last took it
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

    def holds(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) < self.held_until

    def tick(self, now: float | None = None, *, steal: bool = False) -> bool:
        """Take the lease if it is free (or expired, or ``steal``), renew it if ours and a
        quarter of the period has passed; whether this replica holds it now."""
        now = time.time() if now is None else now
        if self.holds(now) and now - self._renewed < self.period / 4:
            return True
        with self._session() as s:
            held = self._claim(s, now, steal=steal)
            s.commit()
        self._record(held, now)
        return held

    def fence(self, s: Session, now: float | None = None) -> bool:
        """Renew the lease inside ``s``'s transaction (whose commit then waits on no other
        replica's claim: the row stays locked until it ends); False: it is no longer ours
        and the caller must roll back."""
        now = time.time() if now is None else now
        if not self.holds(now):
            return False
        held = self._renew(s, now)
        self._record(held, now)
        return held

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
        """The current holder and its expiry (None: never taken)."""
        with self._session() as s:
            row = s.execute(select(LeaseRow.holder, LeaseRow.expires_at).where(LeaseRow.name == self.name)).first()
        return None if row is None else (row[0], row[1])

    # --- the compare-and-set ------------------------------------------------------------

    def _renew(self, s: Session, now: float) -> bool:
        done = s.execute(
            update(LeaseRow)
            .where(LeaseRow.name == self.name, LeaseRow.holder == self.me, LeaseRow.expires_at > now)
            .values(expires_at=now + self.period)
        )
        return bool(done.rowcount)  # type: ignore[attr-defined]

    def _claim(self, s: Session, now: float, *, steal: bool) -> bool:
        if self._renew(s, now):
            return True
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

    def _record(self, held: bool, now: float) -> None:
        was = self.held_until > 0
        if held:
            if not was:
                self.since = now
                log.info("replica %s now drives the rounds (lease %g s)", self.me, self.period)
            # believed a quarter period less than written: ours stops before anyone else's may start
            self.held_until, self._renewed = now + self.period * 0.75, now
        else:
            if was:
                log.warning("replica %s lost the driver lease; standing by", self.me)
            self.held_until = 0.0
