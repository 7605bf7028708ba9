"""Prometheus metrics of the coordinator, served at ``GET /metrics`` (outside ``/v1``, unsigned,
read-only, in the Prometheus text format).

Two kinds, each in the app's own :class:`CollectorRegistry` (never the process-wide default:
several apps can live in one process, as in the tests):

- **From the record** (:class:`RecordCollector`): counted in the database at scrape time by a
  few aggregate queries (``COUNT``/``SUM ... GROUP BY``, one per family), so they equal what the
  API reports and survive a restart: runs by status, closed rounds, updates by status and
  rejected updates by reason, flags, workers and jobs by status, ledger entries by kind, the
  training's bytes. A scrape costs those queries, whatever the size of the record.
- **Of this process** (:class:`CoordinatorMetrics`): heartbeats (never written one by one to
  the database), HTTP body bytes in and out, and the histogram of round-close time; they start
  at zero when the process starts (Prometheus's ``rate()`` handles the reset).

Every label takes values from a small fixed set: statuses are the enums of :mod:`aitbc.states`,
ledger and flag kinds are written only by this code, and a rejected update's free-text reason
is mapped to one of :data:`REASON_CODES` (:func:`reason_code`; in SQL, :func:`reason_case`).
No run, worker, job or wallet id is ever a label: their number is unbounded (per-run and
per-worker figures are in the ``/v1`` views and the dashboard).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from sqlalchemy import ColumnElement, case, distinct, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aitbc.coordinator.store.models import ChainTx, Flag, Job, Offer, RoundRecord, Run, Update
from aitbc.coordinator.store.states import LIVE
from aitbc.ledger.book import Entry
from aitbc.states import JobStatus, OfferStatus, RunStatus, UpdateStatus

log = logging.getLogger("aitbc.coordinator.observability.metrics")

# --- why an update was rejected, as a bounded label ---------------------------------------

# (code, the starts of the reasons the coordinator writes for it); the first match wins, so a
# more specific start comes before a shorter one ("update norm is not finite" before "update norm ").
REASONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("non_finite", ("update contains NaN or Inf", "update norm is not finite")),  # on receipt; core/norms.py
    ("norm_bound", ("update norm ",)),  # core/norms.py: over the reject bound x the round's median norm
    ("wrong_shape", ("update has shape",)),  # on receipt: not the model's (d,)
    ("malformed", ("malformed update blob",)),  # on receipt: the codec refused the blob
    ("bad_loss", ("reported training loss is",)),  # on receipt: a non-finite training loss
    ("verification", ("verification failed",)),  # verification/spot_checks.py: its spot check failed
    ("replay_drift", ("replay drift",)),  # spot_checks.py: a replay missed within drift (unpaid, not slashed)
    ("unanswered", ("did not reveal",)),  # spot_checks.py: its spot check was not answered in time
)
OTHER = "other"
REASON_CODES: tuple[str, ...] = (*(code for code, _ in REASONS), OTHER)
# the HTTP status codes counted by their own label (the coordinator's answers; any other is "other")
RESPONSE_CODES: tuple[str, ...] = (
    *("200", "201", "204", "206", "304"),
    *("400", "401", "403", "404", "405", "408", "409", "410", "413", "415", "422", "429"),
    *("500", "503", OTHER),
)


def reason_code(reason: str | None) -> str:
    """The code of a rejected update's recorded reason: one of :data:`REASON_CODES`."""
    for code, starts in REASONS:
        if reason is not None and reason.startswith(starts):
            return code
    return OTHER


def reason_case(column: Any) -> ColumnElement[str]:
    """:func:`reason_code` in SQL, so the database groups by code (one row per code)."""
    whens = [(column.startswith(start, autoescape=True), code) for code, starts in REASONS for start in starts]
    return case(*whens, else_=OTHER)


# --- counted by this process ---------------------------------------------------------------

ROUND_CLOSE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
SETTLEMENT_LAG_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)
CHAIN_FINAL_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
BYTE_KINDS = ("blob", "api", "web")  # a blob's bytes (PUT/GET /v1/blobs/{cid}), other /v1 JSON, pages/assets


class CoordinatorMetrics:
    """The process's own counters and the app's registry (the record's collector joins it in
    :func:`install`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()  # no auto-describe: registering queries nothing
        self.record: RecordCollector | None = None  # the record's collector, once installed
        self.heartbeats = Counter(
            "aitbc_heartbeats", "Worker heartbeats received by this process", registry=self.registry
        )
        self.http_bytes = Counter(
            "aitbc_http_bytes",
            "HTTP body bytes received (in) and sent (out) by this process, by kind: blob (PUT/GET of "
            "/v1/blobs/{cid}), api (other /v1 requests), web (pages, assets, /metrics)",
            ["direction", "kind"],
            registry=self.registry,
        )
        for direction in ("in", "out"):
            for kind in BYTE_KINDS:
                self.http_bytes.labels(direction, kind)
        self.responses = Counter(
            "aitbc_http_responses",
            "HTTP responses sent by this process, by kind (blob, api, web) and status code "
            "(refusals included: 401 signature, 409 conflict, 413 too large, 422 invalid, 429 busy; "
            "a code outside RESPONSE_CODES counts as other)",
            ["kind", "code"],
            registry=self.registry,
        )
        for kind in BYTE_KINDS:
            for code in RESPONSE_CODES:
                self.responses.labels(kind, code)
        self.round_close = Histogram(
            "aitbc_round_close_seconds",
            "Seconds to close a round: aggregate (norm bound, rule, outer step, checkpoint) and commit, "
            "by the round driver or by an owner's aggregate call (a manual run; its evaluation included)",
            buckets=ROUND_CLOSE_BUCKETS,
            registry=self.registry,
        )
        self.round_evaluation = Histogram(
            "aitbc_round_evaluation_seconds",
            "Seconds to evaluate a round's model on the validation split (eval_samples): the last "
            "round's inside its close, the others' by the books thread after the next round opens",
            buckets=ROUND_CLOSE_BUCKETS,
            registry=self.registry,
        )
        self.settlement_lag = Histogram(
            "aitbc_settlement_lag_seconds",
            "Seconds from a round's close to its settlement (every contract of it scored and paid, "
            "the run's settled round moved past it), by the books thread or the rounds thread's catch-up",
            buckets=SETTLEMENT_LAG_BUCKETS,
            registry=self.registry,
        )
        self.chain_tx_final = Histogram(
            "aitbc_chain_tx_final_seconds",
            "Seconds from a chain transaction's queueing (its round settled in the books) to its final "
            "confirmation, as the chain sender of this process saw it",
            buckets=CHAIN_FINAL_BUCKETS,
            registry=self.registry,
        )


def byte_kind(method: str, path: str) -> str:
    """Which of :data:`BYTE_KINDS` a request's bytes count under."""
    if path.startswith("/v1/blobs/") and method in ("GET", "HEAD", "PUT"):
        rest = path[len("/v1/blobs/") :]
        if rest and "/" not in rest and rest != "missing":
            return "blob"
    return "api" if path.startswith("/v1/") else "web"


def app_path(scope: Scope) -> str:
    """The request's path as the app routes it: behind a path prefix (``root_path``), without it."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root + "/") else path


def response_code(status: int) -> str:
    """A response's status as a bounded label: one of :data:`RESPONSE_CODES`."""
    code = str(status)
    return code if code in RESPONSE_CODES else OTHER


class _HttpCounter(ABC):
    """An ASGI middleware counting HTTP requests into ``metrics`` (:meth:`count`); other
    scopes (lifespan) pass through."""

    def __init__(self, app: ASGIApp, metrics: CoordinatorMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.count(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    @abstractmethod
    async def count(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request through ``self.app``, counting it."""


class CountResponses(_HttpCounter):
    """ASGI middleware, the outermost: every response's status code, added to
    ``aitbc_http_responses_total`` (refusals made by :class:`~aitbc.coordinator.app.Limits`, a
    413 or 429 before any route runs, and 500s included)."""

    async def count(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                kind = byte_kind(scope["method"], app_path(scope))
                self.metrics.responses.labels(kind, response_code(int(message["status"]))).inc()
            await send(message)

        await self.app(scope, receive, counted_send)


class CountBytes(_HttpCounter):
    """ASGI middleware: every request's body bytes in and response body bytes out, added to
    ``aitbc_http_bytes_total`` once the request is over (one counter update per request)."""

    async def count(self, scope: Scope, receive: Receive, send: Send) -> None:
        got = sent = 0

        async def counted_receive() -> Message:
            nonlocal got
            message = await receive()
            if message["type"] == "http.request":
                got += len(message.get("body", b""))
            return message

        async def counted_send(message: Message) -> None:
            nonlocal sent
            if message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counted_receive, counted_send)
        finally:
            kind = byte_kind(scope["method"], app_path(scope))
            if got:
                self.metrics.http_bytes.labels("in", kind).inc(got)
            if sent:
                self.metrics.http_bytes.labels("out", kind).inc(sent)


# --- counted in the record at scrape time --------------------------------------------------


def _gauge(name: str, doc: str, label: str, values: tuple[str, ...], counts: dict[str, int]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=[label])
    for v in values:
        g.add_metric([v], counts.get(v, 0))
    return g


def _counter(name: str, doc: str, label: str, values: tuple[str, ...], counts: dict[str, int]) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=[label])
    for v in values:
        c.add_metric([v], counts.get(v, 0))
    return c


def _known(values: tuple[str, ...], rows: Any) -> dict[str, int]:
    """``{value: count}`` from ``(value, count)`` rows; a value outside ``values`` (a row written
    by an older or newer release) counts under ``other``, so the label set stays fixed."""
    out: dict[str, int] = {}
    for value, n in rows:
        key = value if value in values else OTHER
        out[key] = out.get(key, 0) + int(n or 0)
    return out


RUN_STATUSES = tuple(s.value for s in RunStatus)
UPDATE_STATUSES = tuple(s.value for s in UpdateStatus)
OFFER_STATUSES = tuple(s.value for s in OfferStatus)
JOB_STATUSES = tuple(s.value for s in JobStatus)
# Written only by this code (escrow, settlement, wallets; workers, workforce, rounds, control).
LEDGER_KINDS = (
    "mint",
    "transfer",
    "escrow",
    "bond",
    "settle",
    "bond_return",
    "refund",
    "slash",
    "payment",
    "chain-deposit",  # an EVM coordinator's mirror of a deposit on chain (money.onchain)
    "chain-bond",  # and of a bond posted on chain
)
FLAG_KINDS = (
    "rejected_update",
    "lease_expired",
    "straggler",
    "stale_update",
    "bad_blob",
    "bad_peer_blob",
    "wrong_round",
    "slashed",
    "marked_failed",
    "resend_requested",
    "verification_failed",
    "replay_drift",
    "challenge_unanswered",
    "equivocation",
)
VERDICTS = (
    "unchecked",
    "challenged",
    "revealed",
    "passed",
    "drift",
    "failed",
    "unanswered",
    "error",
)  # updates.verification


MIN_SCRAPE_INTERVAL = 1.0  # seconds: scrapes closer together than this share one reading of the record


class RecordCollector(Collector):
    """The metrics the database holds, counted at each scrape (one aggregate query per family,
    all in one read transaction from ``sessions``); the number of live workers (``alive``, from
    the in-memory heartbeats, as the lease judges them) and whether this process drives the
    rounds (``driving``) are asked of their owners at each reading.

    ``/metrics`` is unsigned and a reading costs queries that grow with the tables, so
    readings are at least ``min_interval`` seconds apart and one at a time: scrapes meanwhile
    share the last reading (only the very first is waited for), and the database sees at
    most one per interval."""

    def __init__(
        self,
        sessions: Callable[[], Session],
        *,
        alive: Callable[[], int],
        driving: Callable[[], bool],
        min_interval: float = MIN_SCRAPE_INTERVAL,
    ) -> None:
        self.sessions = sessions
        self.alive = alive
        self.driving = driving
        self.min_interval = min_interval
        self._lock = threading.Lock()
        self._read_at = -math.inf
        self._last: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        # Only the first reading is waited for: while a reading is in progress, other scrapes
        # get the last one at once, so a flood never holds the thread pool's threads (those
        # of every sync /v1 route) waiting on a slow reading.
        if time.monotonic() - self._read_at >= self.min_interval and self._lock.acquire(blocking=not self._last):
            try:
                if time.monotonic() - self._read_at >= self.min_interval:
                    self._last = self._read()
                    self._read_at = time.monotonic()
            finally:
                self._lock.release()
        yield from self._last

    def _read(self) -> list[Metric]:
        t0 = time.perf_counter()
        try:
            families = list(self._families())
        except SQLAlchemyError as e:  # the database is down: say so, not a 500 with no metrics
            log.warning("metrics: the record could not be read: %s", e)
            families, ok = [], 0
        else:
            ok = 1
        up = GaugeMetricFamily("aitbc_record_up", "1 if this scrape could read the database, else 0")
        up.add_metric([], ok)
        took = GaugeMetricFamily("aitbc_record_scrape_seconds", "Seconds the last reading's database queries took")
        took.add_metric([], time.perf_counter() - t0)
        return [*families, up, took]

    def _families(self) -> Iterator[Metric]:
        with self.sessions() as s:
            yield from _run_families(s)
            yield from _update_families(s)
            yield from _worker_families(s)
            yield from _money_families(s)
            yield from _chain_families(s)
        alive = GaugeMetricFamily("aitbc_workers_alive", "Workers heard from within the lease (in-memory heartbeats)")
        alive.add_metric([], self.alive())
        yield alive
        driving = GaugeMetricFamily(
            "aitbc_driving", "1 if this coordinator process holds the driver lease (moves the rounds), else 0"
        )
        driving.add_metric([], 1 if self.driving() else 0)
        yield driving


def _run_families(s: Session) -> Iterator[Metric]:
    """Runs by status, the active ones, and closed rounds by outcome."""
    runs = _known(RUN_STATUSES, s.execute(select(Run.status, func.count()).group_by(Run.status)).all())
    yield _gauge("aitbc_runs", "Training runs on record, by status", "status", (*RUN_STATUSES, OTHER), runs)
    active = GaugeMetricFamily("aitbc_runs_active", "Runs not ended (initializing to paused)")
    active.add_metric([], sum(runs.get(st.value, 0) for st in LIVE))
    yield active

    skipped = s.execute(
        select(RoundRecord.skipped, func.count()).where(RoundRecord.round > 0).group_by(RoundRecord.skipped)
    ).all()
    rounds = {("skipped" if sk else "aggregated"): int(n) for sk, n in skipped}
    yield _counter(
        "aitbc_rounds",
        "Rounds closed and recorded, all runs (skipped: too few updates for the rule; the model kept)",
        "outcome",
        ("aggregated", "skipped"),
        rounds,
    )


def _update_families(s: Session) -> Iterator[Metric]:
    """Updates by status, rejected updates by reason, and spot-check verdicts."""
    statuses = s.execute(select(Update.status, func.count()).group_by(Update.status)).all()
    by_status = _known(UPDATE_STATUSES, statuses)
    code = reason_case(Update.reason)  # only over the rejected rows: the CASE is the costly part
    rejected = s.execute(select(code, func.count()).where(Update.status == UpdateStatus.REJECTED).group_by(code)).all()
    by_reason = _known(REASON_CODES, rejected)
    # Gauges, not counters: an update's status changes (accepted -> rejected by the norm
    # bound at the round's close, -> excluded by the owner) and a resend deletes it, and
    # a counter that falls reads as a reset to rate()/increase().
    yield _gauge(
        "aitbc_updates",
        "Updates on record, by status: accepted, rejected (provably bad), excluded (left out by the "
        "owner); an update its owner asked to be resent leaves the record",
        "status",
        (*UPDATE_STATUSES, OTHER),
        by_status,
    )
    yield _gauge(
        "aitbc_updates_rejected",
        "Rejected updates by reason: non_finite (NaN/Inf), norm_bound (norm over the reject bound), "
        "wrong_shape, malformed (undecodable), bad_loss (non-finite reported loss), verification (its "
        "spot check failed), unanswered (its spot check was not answered in time), other",
        "reason",
        REASON_CODES,
        by_reason,
    )

    verdicts = s.execute(
        select(Update.verification, func.count()).where(Update.verification.is_not(None)).group_by(Update.verification)
    ).all()
    yield _gauge(
        "aitbc_updates_verification",
        "Updates of runs that verify work, by their spot check: unchecked (none drawn), challenged, "
        "revealed (being re-run), passed, failed, unanswered",
        "verdict",
        (*VERDICTS, OTHER),
        _known(VERDICTS, verdicts),
    )


def _worker_families(s: Session) -> Iterator[Metric]:
    """Flags, workers and jobs by status, and the workers with an active job."""
    flags = _known(FLAG_KINDS, s.execute(select(Flag.kind, func.count()).group_by(Flag.kind)).all())
    yield _counter("aitbc_flags", "Flags raised against workers, by kind", "kind", (*FLAG_KINDS, OTHER), flags)

    offers = _known(OFFER_STATUSES, s.execute(select(Offer.status, func.count()).group_by(Offer.status)).all())
    yield _gauge("aitbc_workers", "Registered workers (offers), by status", "status", (*OFFER_STATUSES, OTHER), offers)
    jobs = _known(JOB_STATUSES, s.execute(select(Job.status, func.count()).group_by(Job.status)).all())
    yield _gauge("aitbc_jobs", "Jobs on record, by status", "status", (*JOB_STATUSES, OTHER), jobs)
    busy = s.scalar(select(func.count(distinct(Job.worker_id))).where(Job.status == JobStatus.ACTIVE)) or 0
    g = GaugeMetricFamily("aitbc_workers_busy", "Workers with an active job")
    g.add_metric([], busy)
    yield g


def _money_families(s: Session) -> Iterator[Metric]:
    """Ledger entries by kind, and the training's bytes up and down."""
    kinds = _known(LEDGER_KINDS, s.execute(select(Entry.kind, func.count()).group_by(Entry.kind)).all())
    yield _counter("aitbc_ledger_entries", "Ledger entries, by kind", "kind", (*LEDGER_KINDS, OTHER), kinds)

    up, down = s.execute(select(func.sum(Run.bytes_up), func.sum(Run.bytes_down))).one()
    moved = CounterMetricFamily(
        "aitbc_training_bytes",
        "Bytes of the runs' training traffic on record: up (update blobs workers sent), down (models "
        "and shards sent to workers)",
        labels=["direction"],
    )
    moved.add_metric(["up"], int(up or 0))
    moved.add_metric(["down"], int(down or 0))
    yield moved


CHAIN_TX_STATUSES = ("queued", "signed", "sent", "mined", "final", "failed")  # money.outbox.STATUSES


def _chain_families(s: Session) -> Iterator[Metric]:
    """The settlement outbox's transactions by status, and the gas they used on chain."""
    rows = s.execute(select(ChainTx.status, func.count()).group_by(ChainTx.status)).all()
    yield _gauge(
        "aitbc_chain_txs",
        "Chain transactions of the settlement outbox (EVM runs), by status: queued, signed (stored before "
        "its broadcast), sent, mined, final (confirmed), failed (reverted)",
        "status",
        (*CHAIN_TX_STATUSES, OTHER),
        _known(CHAIN_TX_STATUSES, rows),
    )
    gas = CounterMetricFamily("aitbc_chain_gas_used", "Gas the outbox's mined transactions used on chain")
    gas.add_metric([], int(s.scalar(select(func.sum(ChainTx.gas_used))) or 0))
    yield gas


# --- the route -----------------------------------------------------------------------------


def encoder(accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """The text format, or OpenMetrics when the scraper asks for it (prometheus-client's own
    choice); an ``Accept`` it cannot read (``version=1.x`` raises in prometheus-client) gets
    the text format, never a 500: the route is unsigned."""
    try:
        return choose_encoder(accept)
    except (TypeError, ValueError):
        return choose_encoder("")  # what a scraper that names no format gets


def install(app: FastAPI, metrics: CoordinatorMetrics, record: RecordCollector) -> None:
    """``GET /metrics`` (not in the OpenAPI document), the record's collector joining
    ``metrics``' registry, and the byte counter (innermost middleware: bytes of requests the
    app answers)."""
    registry = metrics.registry
    metrics.record = record
    registry.register(record)

    def serve(request: Request) -> Response:  # sync: the queries run in the thread pool, not the event loop
        encode, content_type = encoder(request.headers.get("accept", ""))
        return Response(encode(registry), headers={"content-type": content_type, "x-content-type-options": "nosniff"})

    app.add_api_route("/metrics", serve, methods=["GET"], include_in_schema=False, name="metrics")
    app.add_middleware(CountBytes, metrics=metrics)
