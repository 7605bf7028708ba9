"""A worker's progress reports, sent by a thread of their own.

Progress is advisory (an owner's view and the coordinator's speed measurement), so the
training loop never waits for it: :meth:`Reporter.report` hands a report over and
returns. One report is in flight at a time, so they arrive in the order they were made;
a newer report replaces one still waiting, so a slow coordinator gets fewer reports, not a
queue of stale ones. Before the round's update is sent, :meth:`Reporter.drain` drops the
report waiting and waits for the one in flight: no report of the round can land after its
update (which carries the round's last step itself) and move the job's progress back.
"""

from __future__ import annotations

import logging
import threading
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
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
        self._thread.start()

    def report(self, job_id: str, body: ProgressReport) -> None:
        """Send ``body`` as job ``job_id``'s progress soon; replaces a report still waiting."""
        with self._cond:
            self._waiting = (job_id, body)
            self._cond.notify_all()

    def drain(self) -> None:
        """Drop the report waiting, and return once none is in flight."""
        with self._cond:
            self._waiting = None
            while self._busy:
                self._cond.wait()

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
