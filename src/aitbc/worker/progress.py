"""A worker's progress reports, sent by a thread of their own.

Progress is advisory (an owner's view and the coordinator's speed measurement), so the
training loop never waits for it: :meth:`Reporter.report` hands a report over and
returns. One report is in flight at a time, so they arrive in the order they were made;
a newer report replaces one still waiting, so a slow coordinator gets fewer reports, not a
queue of stale ones. Before the round's update is sent, :meth:`Reporter.drain` drops the
report waiting and waits for the one in flight: no report of the round can land after its
update (which carries the round's last step itself) and move the job's progress back.
A job's first report is the exception: drain waits for it to be sent instead (a small
model's round can end before this thread is scheduled, every round). The reporter keeps
when it last sent each job's report (:meth:`Reporter.sent_at`), so a caller's rate limit
counts the reports that went out, not those dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import NotRequired, TypedDict

log = logging.getLogger("aitbc.worker")


class ProgressReport(TypedDict):
    """The body of ``POST /v1/jobs/{id}/progress``: this job's work in its round."""

    progress: float  # percent of the round's steps done
    loss: float | None
    epoch: float
    status: str
    round: NotRequired[int]
    step: NotRequired[int]
    seconds: NotRequired[float]  # gossip: from the round's first step, on the worker's own clock


Send = Callable[[str, ProgressReport], None]  # (job id, report body): the HTTP request


class Reporter:
    def __init__(self, send: Send) -> None:
        self._send = send
        self._cond = threading.Condition()
        self._waiting: tuple[str, ProgressReport] | None = None
        self._busy = False  # a report is being sent
        self._closed = False
        self._sent: dict[str, float] = {}  # job id -> time.perf_counter() its last report went out
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
        self._thread.start()

    def report(self, job_id: str, body: ProgressReport) -> None:
        """Send ``body`` as job ``job_id``'s progress soon; replaces a report still waiting."""
        with self._cond:
            self._waiting = (job_id, body)
            self._cond.notify_all()

    def sent_at(self, job_id: str) -> float | None:
        """When (``time.perf_counter()``) job ``job_id``'s last report was taken to be sent, or None."""
        with self._cond:
            return self._sent.get(job_id)

    def drain(self) -> None:
        """Drop the report waiting (unless it is its job's first), and return once none
        is waiting or in flight."""
        with self._cond:
            if self._waiting is not None and self._waiting[0] in self._sent:
                self._waiting = None
            self._cond.wait_for(lambda: self._waiting is None and not self._busy)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every report handed over has been sent (or failed); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._waiting is None and not self._busy, timeout)

    def close(self) -> None:
        """Stop the thread once the report in flight is done; a report waiting is dropped."""
        with self._cond:
            self._closed, self._waiting = True, None
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._waiting is not None or self._closed)
                if self._closed:
                    return
                assert self._waiting is not None
                (job_id, body), self._waiting = self._waiting, None
                self._busy = True
                self._sent[job_id] = time.perf_counter()
            try:
                self._send(job_id, body)
            except Exception:  # a bug in sending must not end reporting (or hang drain)
                log.exception("progress report of job %s failed", job_id)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


def progress_body(
    round: int | None, pct: float, loss: float | None, epoch: float, status: str, *, step: int | None = None
) -> ProgressReport:
    """A report on round ``round``: ``pct`` of its steps done (this job's work, not the run's)."""
    body: ProgressReport = {"progress": min(100.0, pct), "loss": loss, "epoch": epoch, "status": status}
    if round:
        body["round"] = round
    if step is not None:
        body["step"] = step
    return body
