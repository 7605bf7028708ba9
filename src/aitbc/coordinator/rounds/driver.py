"""The round driver: two background threads that move every live run forward.

The rounds thread, each tick (or sooner, when a request pokes it), first closes the rounds
that are due (a round's last update pokes it: nothing stands between that update and the
next round), then flushes heartbeats, fails workers whose lease ran out (reassigning their
shards), finishes distributions and fills orphaned shards. That housekeeping runs at most
once a tick: a small model's rounds poke several times a tick (each update, each close),
and on a machine the workers share, every pass was CPU taken from their training. The
books thread, woken when a round closes, does what no worker waits for: it evaluates
closed rounds' models, scores and settles them (exactly once, by key), finalizes ended
runs and collects blobs; so the next round trains while the last one is scored and paid.
It runs ``books_nice`` levels below the rest of the process (:func:`lower_priority`): on a
machine the workers share, it takes the CPU the rounds and their steps leave. On a machine
with no CPU left that is almost none: the catch-up thread, at the process's priority,
settles what the books thread leaves too long, and a run's round is not closed while its
books are past their bound (:mod:`.catch_up`). On an EVM coordinator a ``chain-sender``
thread sends the settlement transactions the books queue (:mod:`..money.sender`).
Runs under manual control are left to their owner's agent (:mod:`.control`); the driver
only scores their aggregated rounds. After a restart it simply finds runs where they
were: ``distributing`` is finished, ``aggregating`` is redone from the persisted updates,
an unscored round is scored.

Several coordinator processes (replicas) may share one database and blob folder: each
answers every request, and each runs these threads, but only the holder of the driver
lease (:mod:`.lease`) does the work above; the others' rounds thread only shares
heartbeats (flushes its own to the database, takes the others') and wakes its long polls
when the database moved, and takes the lease over when it runs out. A replica that takes
over starts as a restarted coordinator does: empty caches (runtimes, books models, rebuilt
from the database) and worker leases judged only a full lease after the takeover.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from functools import partial

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.live.books import CATCH_UP, books_lane, drop_books_model
from aitbc.coordinator.live.runtime import drop_runtime
from aitbc.coordinator.money.escrow import expire_hires, finalize
from aitbc.coordinator.money.sender import ChainSender
from aitbc.coordinator.rounds import catch_up
from aitbc.coordinator.rounds import lifecycle as rounds
from aitbc.coordinator.rounds.modes import mode_for, mode_of
from aitbc.coordinator.rounds.workers import flush_heartbeats
from aitbc.coordinator.storage import retention
from aitbc.coordinator.store.models import Job, Offer, Run
from aitbc.coordinator.store.repository import row
from aitbc.coordinator.store.states import ACTIVE, ADVANCING, ENDED
from aitbc.coordinator.verification import settlement
from aitbc.coordinator.verification import spot_checks as verification
from aitbc.coordinator.workforce import hiring as workforce
from aitbc.states import Control, JobStatus, RunStatus

log = logging.getLogger("aitbc.coordinator")
MAX_FAILURES = 3
CATCH_UP_PERIOD = 1.0  # seconds between the catch-up thread's looks when nothing wakes it


def lower_priority(nice: int) -> int | None:
    """Lower the calling thread's CPU priority by ``nice`` levels (capped at 19); its nice
    value after, or None where it was left as it was.

    Linux gives each thread a nice value of its own (``setpriority`` on its thread id), so
    this touches only the books thread. Measured on a 2-core machine shared with two
    digits-MLP workers: the books thread at the coordinator's priority took the cores the
    rounds' critical path and the workers' steps wanted; 10 levels below, the run's
    utilization went from a median of 72% to 79% (``bench/SUMMARY.md``), and the books
    still had every idle cycle (settlement ends a second or so later). Elsewhere (macOS,
    Windows) a process's priority is the unit, so the thread is left as it is.
    """
    if nice <= 0 or not sys.platform.startswith("linux"):
        return None
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(now + nice, 19))
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError as e:  # a sandbox that forbids it: the books run at the coordinator's priority
        log.warning("books thread: could not lower its priority (%s); it runs at the coordinator's", e)
        return None


class RoundDriver:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._stop = threading.Event()
        self._wake_books = threading.Event()
        self._wake_catch_up = threading.Event()
        # One round's scoring and settlement at a time, whichever thread does it (they share
        # the run's runtime; money moves once by key either way).
        self._money_lock = threading.Lock()
        self._cost: dict[str, float] = {}  # run -> CPU seconds its last round's books took
        self._held: frozenset[str] = frozenset()  # runs whose close waits for their settlement
        self._bound = catch_up.SettleBound(ctx.settings.settle_within_rounds, ctx.settings.settle_within_seconds)
        self._threads = [
            threading.Thread(
                target=self._loop, args=(ctx.notifier.wake_driver, self._poked_rounds), name="round-driver", daemon=True
            ),
            threading.Thread(target=self._books_loop, name="books", daemon=True),
            threading.Thread(target=self._catch_up_loop, name="books-catch-up", daemon=True),
            threading.Thread(target=self._keep_lease, name="driver-lease", daemon=True),
        ]
        # An EVM coordinator's settlement transactions go out from their own thread: a node's
        # round trips never hold up a round or a settlement in the books.
        self._sender = ChainSender(ctx, ctx.chain) if ctx.chain is not None else None
        self._last_flush = 0.0
        self._last_housekeeping = 0.0  # the rounds thread's leases, refills and failures last ran
        self._last_gc = 0.0  # blob retention (.retention) last ran
        self._failures: dict[str, int] = {}  # consecutive failed attempts to move a run
        self._term: float | None = None  # when this replica took the lease it drives under
        self._ever_drove = False  # a later takeover judges leases from its own time
        self._db_state: tuple[object, ...] | None = None  # the runs' and jobs' last seen change marks

    def start(self) -> None:
        for t in self._threads:
            t.start()
        if self._sender is not None:
            self._sender.start()

    def stop(self, wait: float = 30.0) -> None:
        """Stop the threads: each ends after its current pass, waited for up to ``wait``
        seconds in all. A process about to exit waits briefly: a pass cut short (a scoring,
        an evaluation of a large model) commits nothing, and the next driver redoes it."""
        self._stop.set()
        self.ctx.notifier.poke_driver()
        self._wake_books.set()
        self._wake_catch_up.set()
        deadline = time.monotonic() + wait
        if self._sender is not None:
            self._sender.stop(max(0.0, deadline - time.monotonic()))
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        busy = [t.name for t in self._threads if t.is_alive()]
        if busy:
            log.info("stopping with the %s thread(s) mid-pass; what they had not committed is redone", ", ".join(busy))
        # A clean stop hands the rounds to another replica at once. A thread still in its
        # pass has its writes fenced: its transaction finds the lease gone and rolls back.
        self.ctx.lease.release()

    def _loop(self, wake: threading.Event, tick: Callable[[], None], period: float | None = None) -> None:
        while not self._stop.is_set():
            wake.wait(self.ctx.settings.tick_seconds if period is None else period)
            wake.clear()
            if self._stop.is_set():
                break
            try:
                tick()
            except Exception:
                log.exception("round driver %s failed; retrying next tick", tick.__name__)
                time.sleep(self.ctx.settings.tick_seconds)

    def _books_loop(self) -> None:
        lower_priority(self.ctx.settings.books_nice)
        self._loop(self._wake_books, self.tick_books)

    def _catch_up_loop(self) -> None:
        # Urgency is a matter of seconds: a look a second (or when woken: a held close, a
        # round the books thread left to it) is enough, and costs the workers little.
        period = max(self.ctx.settings.tick_seconds, CATCH_UP_PERIOD)
        with books_lane(CATCH_UP):  # a model of its own: the books thread may be evaluating with its
            self._loop(self._wake_catch_up, self.tick_catch_up, period)

    def tick(self) -> None:
        """One pass of the threads, in order (what a test steps through): the books settle
        every closed round."""
        self.ctx.lease.tick(steal=not self._ever_drove and self.ctx.lease.sole_local())
        self.tick_rounds()
        self.tick_books(everything=True)
        self.tick_catch_up()
        if self._sender is not None:
            self._sender.tick()

    def _poked_rounds(self) -> None:
        """The rounds thread's pass: its housekeeping only when a tick has gone by since the
        last (a poke comes for a round that may be due; a stream of pokes still gets its
        housekeeping every ``tick_seconds``)."""
        self.tick_rounds(housekeeping=time.time() - self._last_housekeeping >= self.ctx.settings.tick_seconds)

    def tick_rounds(self, *, housekeeping: bool = True) -> None:
        """Close or open the rounds that are due; with ``housekeeping``, also expire leases,
        fill orphaned shards, expire challenges and fail runs that cannot go on."""
        ctx, now = self.ctx, time.time()
        flushed = self._share_heartbeats(now)  # every replica: its workers are live for the driver
        self._notice_changes()
        if not self._drive(now):
            return  # another replica drives: no round, lease, refill or failure is ours to move
        verification.verify_pending(ctx)  # first: a round waits for its spot checks
        advanced = self._advance_due(now)  # then the rounds whose last update just arrived
        if not housekeeping:
            if advanced:
                self._wake_books.set()
            return
        self._last_housekeeping = now
        changed = flushed
        with ctx.session() as s:
            # Leases are judged only once this coordinator has been up (or driving) a full
            # lease: no worker could heartbeat to a driver that was not there.
            if now - ctx.judging_since >= ctx.settings.lease_seconds:
                changed |= workforce.expire_leases(ctx, s, now=now)
            automatic = Run.control == Control.AUTOMATIC  # a manual run's phases are its owner's to move
            for run in s.scalars(select(Run).where(Run.status == RunStatus.TRAINING, automatic)).all():
                changed |= workforce.fill_shards(ctx, s, run, now=now)
            changed |= verification.expire_challenges(ctx, s, now=now)
            changed |= self._fail_idle_manual_runs(s, now)
            if expire_hires(ctx, s, now=now):
                log.warning(
                    "round driver: released hires older than --hire-expiry of runs that never distributed (bonds returned)"
                )
                changed = True
            if workforce.stop_long_pauses(ctx, s, now=now):
                log.warning("round driver: stopped runs paused longer than --max-pause (they settle as any stop)")
                changed = True
            if workforce.fail_stuck_runs(ctx, s, now=now):  # after fill_shards: nobody could be hired
                log.warning("round driver: failed runs that could not proceed (no workers, no offers)")
                changed = True
            if changed:
                if not ctx.lease.fence(s):  # lost the lease meanwhile: the new driver decides
                    s.rollback()
                    return
                s.commit()
                ctx.notifier.bump()
        if changed:  # a lease ran out, a shard was filled: a round may be due now
            advanced |= self._advance_due(now)
        if advanced:
            self._wake_books.set()

    def _drive(self, now: float) -> bool:
        """Whether this replica drives now (its lease thread keeps the lease). A new term
        (this replica took the lease, first or again) starts as after a restart: the
        caches are rebuilt from the database."""
        ctx = self.ctx
        if not ctx.lease.holds():
            if self._term is not None:  # lost it: the caches would go stale
                ctx.runtimes.clear()
                ctx.books_models.clear()
                self._term = None
            return False
        if self._term != ctx.lease.since:
            # a takeover (not this process's start) judges worker leases from its own time: the
            # last driver's workers are still finding this replica, their last beats unflushed
            if self._ever_drove or now - ctx.started_at > ctx.lease.period:
                ctx.judging_since = max(ctx.started_at, now)
            ctx.runtimes.clear()
            ctx.books_models.clear()
            self._failures.clear()
            self._term, self._ever_drove = ctx.lease.since, True
            self._wake_books.set()
        return True

    def _keep_lease(self) -> None:
        """The lease thread: take the driver lease when it is free, renew it while held,
        apart from the rounds thread (a long round close must not let it run out). On
        SQLite the first try takes it even from a holder not yet expired when no other
        live process holds the database's local lock: that holder is this coordinator
        before a restart (``DriverLease.sole_local``)."""
        ctx = self.ctx
        steal = ctx.lease.sole_local()
        while not self._stop.is_set():
            try:
                was = ctx.lease.holds()
                if ctx.lease.tick(steal=steal) and not was:
                    ctx.notifier.poke_driver()  # start driving now
                steal = False
            except Exception:
                log.exception("driver lease: could not reach the database; retrying")
            self._stop.wait(min(ctx.lease.period / 8, 1.0))

    def _share_heartbeats(self, now: float) -> bool:
        """Every ``heartbeat_flush_seconds``: write this replica's heartbeats to the database
        and take the others' (a worker heartbeating to another replica is live here too).
        Whether any heartbeat was written."""
        ctx = self.ctx
        if now - self._last_flush < ctx.settings.heartbeat_flush_seconds:
            return False
        self._last_flush = now
        with ctx.session() as s:
            flushed = flush_heartbeats(ctx, s)
            s.commit()
            ctx.liveness.merge(dict(s.execute(select(Offer.id, Offer.last_heartbeat)).all()))
        if flushed:
            ctx.notifier.bump()
        return flushed

    def _notice_changes(self) -> None:
        """Another replica's change that a waiting worker cares about (a round opened, a
        run resumed, a job assigned or ended) wakes this replica's long polls too: those
        marks are counted each tick and the notifier bumped when they moved. SQLite has no
        other replica: nothing to read."""
        if self.ctx.engine.dialect.name == "sqlite":
            return
        training = func.sum(case((Run.status == RunStatus.TRAINING, 1), else_=0))
        active = func.sum(case((Job.status == JobStatus.ACTIVE, 1), else_=0))
        with self.ctx.session() as s:
            runs = s.execute(select(func.count(Run.id), func.sum(Run.round), training)).one()
            jobs = s.execute(select(func.count(Job.id), active)).one()
        state = (*runs, *jobs)
        if self._db_state is not None and state != self._db_state:
            self.ctx.notifier.bump()
        self._db_state = state

    def _advance_due(self, now: float) -> bool:
        """Open or close every automatic run's round that is due; whether any was."""
        with self.ctx.session() as s:
            live = s.execute(
                select(Run.id, Run.status).where(Run.status.in_(ADVANCING), Run.control == Control.AUTOMATIC)
            ).all()
            due, held = [], set()
            for run_id, status in live:
                run = row(s, Run, run_id)
                if status != RunStatus.TRAINING or mode_of(run).round_due(self.ctx, s, run, now=now):
                    if status == RunStatus.TRAINING and self._bound.holds(catch_up.backlog(s, run), now):
                        held.add(run_id)  # its books are past their bound: settled first
                    else:
                        due.append(run_id)
        self._held = frozenset(held)
        if held:
            self._wake_catch_up.set()
        moved = False
        for run_id in due:
            if not self.ctx.lease.holds():
                break  # the lease ran out meanwhile (a long close): the next driver takes the rest
            moved |= self._advance(run_id)
        if moved:
            # Look again now, not a tick later: the next round may be due already (a gossip
            # run's records arrive ahead of their round's close; an async buffer fills
            # while the last version closes), and nothing else would poke for it.
            self.ctx.notifier.poke_driver()
        return bool(due)

    def tick_books(self, *, everything: bool = False) -> None:
        """Evaluate, score and settle closed rounds; finalize ended runs; collect blobs
        (the driver lease's holder only). A round the catch-up thread should take (urgent, or
        of a run whose books cost too much for this thread's priority) is left to it, unless
        ``everything``."""
        ctx, now = self.ctx, time.time()
        if not ctx.lease.holds():
            return
        with ctx.session() as s:
            missing = rounds.pending_evaluations(s)
            unsettled, ended = settlement.pending(ctx, s, now)
        for run_id, r in missing:
            rounds.evaluate_round(ctx, run_id, r)
        for run_id, r in unsettled:  # score and pay the oldest closed round of each run
            if everything or (self._light(run_id) and not self._urgent(run_id)):
                self._settle_round(run_id, r)
            else:  # the catch-up thread's: this one would only hold it up at its priority
                self._wake_catch_up.set()
        for run_id in ended:  # then refund the rest and return bonds
            with self._money_lock:
                self._money(run_id, partial(finalize, ctx, run_id))
                drop_runtime(ctx, run_id)
                drop_books_model(ctx, run_id)
        if now - self._last_gc >= ctx.settings.gc_interval_seconds:  # delete blobs no rule keeps
            self._last_gc = now
            try:
                retention.run(ctx)
            except Exception:  # a file system error: the next interval tries again
                log.exception("blob retention failed; retrying in %g s", ctx.settings.gc_interval_seconds)

    def tick_catch_up(self) -> None:
        """Score and settle, at the coordinator's priority, each run's rounds that are
        half-way to their bound (:meth:`.catch_up.SettleBound.urgent`), and every round of a
        run whose books are heavy; then let the runs held for it close."""
        ctx = self.ctx
        if not ctx.lease.holds():
            return
        with ctx.session() as s:
            todo = catch_up.backlogs(s)
        for first in todo:
            b: catch_up.Backlog | None = first
            while b is not None and (self._bound.urgent(b, time.time()) or not self._light(b.run_id)):
                if not self._settle_round(b.run_id, b.oldest):
                    break  # failed (logged): retried next tick
                with ctx.session() as s:
                    found = s.get(Run, b.run_id)
                    b = catch_up.backlog(s, found) if found is not None else None
            if b != first and first.run_id in self._held:
                ctx.notifier.poke_driver()  # settled some: the held round may close now

    def _urgent(self, run_id: str) -> bool:
        """Whether run ``run_id``'s oldest unsettled round is the catch-up thread's by now."""
        with self.ctx.session() as s:
            found = s.get(Run, run_id)
            b = catch_up.backlog(s, found) if found is not None else None
        return b is not None and self._bound.urgent(b, time.time())

    def _light(self, run_id: str) -> bool:
        """Whether the low-priority books thread settles run ``run_id``'s rounds: the last
        took at most :data:`.catch_up.HEAVY_SECONDS` of CPU (a run's first is taken as light:
        the books thread's, as before there was a catch-up thread)."""
        cost = self._cost.get(run_id)
        return cost is None or cost <= catch_up.HEAVY_SECONDS

    def _settle_round(self, run_id: str, r: int) -> bool:
        """Score and settle run ``run_id``'s round ``r`` (one round at a time across the
        books threads); whether it went through. Its CPU seconds are kept for :meth:`_light`."""
        ctx = self.ctx
        with self._money_lock:
            with ctx.session() as s:
                found = s.get(Run, run_id)
                mode = mode_of(found) if found is not None else mode_for(None)
            t0 = time.thread_time()
            ok = self._money(run_id, partial(mode.score, ctx, run_id, r), partial(settlement.settle, ctx, run_id, r))
            if ok:
                self._cost[run_id] = time.thread_time() - t0
            return ok

    def _fail_idle_manual_runs(self, s: Session, now: float) -> bool:
        """A manual run nobody moves (its agent crashed or gave up) would hold its
        providers and their bonds for ever: after ``manual_idle_seconds`` without an
        owner's call, an update or a progress report, it fails (bonds return; the owner
        can still refund the escrow)."""
        idle = self.ctx.settings.manual_idle_seconds
        runs = s.scalars(
            select(Run).where(Run.control == Control.MANUAL, Run.status.in_(ACTIVE), Run.updated_at < now - idle)
        ).all()
        changed = False
        for run in runs:
            last_job = s.scalar(select(func.max(Job.updated_at)).where(Job.run_id == run.id)) or 0.0
            if now - max(run.updated_at, last_job) < idle:
                continue
            workforce.end_run(
                s,
                run,
                RunStatus.FAILED,
                now=now,
                reason=f"manual run idle for {idle:g} s: no phase move, job, update or progress (is its agent running?)",
            )
            log.warning("run %s: %s", run.id, run.error)
            changed = True
        return changed

    def _money(self, run_id: str, *steps: Callable[[], None]) -> bool:
        """Run ``steps`` in order; a failure stops the rest until the next tick. Whether all ran."""
        try:
            for step in steps:
                step()
        except Exception:  # money steps are idempotent: retried next tick, logged in full
            log.exception("run %s: scoring/settlement step failed; retrying next tick", run_id)
            return False
        return True

    def _advance(self, run_id: str) -> bool:
        """Open the first round or close the current one; whether the run moved (its status
        or round changed). A run whose round fails the same way MAX_FAILURES times (a bug,
        a corrupt blob) is failed with the error, instead of retried for ever."""
        ctx = self.ctx
        try:
            with ctx.session() as s:
                found = s.get(Run, run_id)
                if found is None:
                    return False
                status, round_, mode = found.status, found.round, mode_of(found)
            if status == RunStatus.DISTRIBUTING:
                rounds.start_training(ctx, run_id)
            else:
                mode.close_round(ctx, run_id)
            self._failures.pop(run_id, None)
            with ctx.session() as s:
                after = s.execute(select(Run.status, Run.round).where(Run.id == run_id)).first()
            return after is not None and tuple(after) != (status, round_)
        except Exception as e:
            n = self._failures[run_id] = self._failures.get(run_id, 0) + 1
            log.exception("run %s: round step failed (attempt %d of %d)", run_id, n, MAX_FAILURES)
            drop_runtime(ctx, run_id)  # rebuilt from the database next time
            if n >= MAX_FAILURES:
                with ctx.session() as s:
                    run = s.get(Run, run_id)
                    if run is not None and run.status not in ENDED:
                        workforce.end_run(
                            s,
                            run,
                            RunStatus.FAILED,
                            reason=f"coordinator could not advance the run: {type(e).__name__}: {e}",
                        )
                        s.commit()
                self._failures.pop(run_id, None)
                ctx.notifier.bump()
            return False
