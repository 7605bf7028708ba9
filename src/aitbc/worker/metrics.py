"""A worker's own Prometheus metrics, served by prometheus-client's HTTP server on
``--metrics-port`` (``AITBC_WORKER_METRICS_PORT``; on ``--metrics-host``, 127.0.0.1 by default).

One registry per worker (never the process-wide default). The only labels are ``direction``
(up, down) and, on ``aitbc_worker_job_info``, the current job and run: one series at a time,
replaced when the job changes, so this worker's series stay bounded.
"""

from __future__ import annotations

import errno
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from aitbc.errors import AitbcError

PHASES = ("download", "compute", "encode", "upload")  # aitbc_worker_round_seconds' phase label


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.steps = Counter("aitbc_worker_steps", "Local optimizer steps done", registry=r)
        self.steps_per_second = Gauge(
            "aitbc_worker_steps_per_second",
            "Local steps per second of the round in progress (of the last round once it is sent)",
            registry=r,
        )
        self.bytes = Counter(
            "aitbc_worker_bytes",
            "Bytes moved: up (update blobs sent), down (models and shards fetched from the coordinator; cache "
            "hits move none), peer (fetched from other workers, peer transport), inline (models that came inside "
            "the coordinator's answer to a job poll)",
            ["direction"],
            registry=r,
        )
        self.bytes.labels("up")
        self.bytes.labels("down")
        self.bytes.labels("peer")
        self.bytes.labels("inline")
        self.seconds = Counter(
            "aitbc_worker_round_seconds",
            "Seconds spent on sent rounds, by phase: download (the global model fetched to disk and "
            "loaded), compute (local steps), encode (codec, CID, proof), upload (update blob and message)",
            ["phase"],
            registry=r,
        )
        for phase in PHASES:
            self.seconds.labels(phase)
        self.rounds = Counter("aitbc_worker_rounds", "Rounds whose update the coordinator accepted", registry=r)
        self.refusals = Counter(
            "aitbc_worker_refusals",
            "Rounds the coordinator refused this worker's work for (update rejected, round closed, job over)",
            registry=r,
        )
        self.round = Gauge("aitbc_worker_round", "The round being trained (0: no job)", registry=r)
        self.job_info = Gauge(
            "aitbc_worker_job_info",
            "1 for the job this worker holds (none: no job)",
            ["training_id", "job_id"],
            registry=r,
        )
        self._job: tuple[str, str] | None = None
        self._lock = threading.Lock()
        self.server: WSGIServer | None = None

    def set_job(self, training_id: str, job_id: str, round: int) -> None:
        with self._lock:
            if self._job != (training_id, job_id):
                self._clear()
                self._job = (training_id, job_id)
                self.job_info.labels(training_id, job_id).set(1)
        self.round.set(round)

    def clear_job(self) -> None:
        with self._lock:
            self._clear()
        self.round.set(0)

    def _clear(self) -> None:
        if self._job is not None:
            self.job_info.remove(*self._job)
            self._job = None

    def serve(self, host: str, port: int) -> None:
        """Start the HTTP server (a daemon thread); a port that cannot be bound is one clear
        error, before the worker does anything else."""
        try:
            self.server, _ = start_http_server(port, addr=host, registry=self.registry)
        except (OSError, ValueError) as e:  # ValueError: a name IDNA cannot encode (``a..b``), a NUL
            why = "already in use" if isinstance(e, OSError) and e.errno == errno.EADDRINUSE else _why(e)
            raise AitbcError(f"--metrics-port {port}: cannot listen on {host}:{port}: {why}") from None


def _why(e: OSError | ValueError) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"not a usable address ({e})" if isinstance(e, ValueError) else str(e)
