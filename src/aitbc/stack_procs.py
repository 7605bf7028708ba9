"""Signalling and waiting for the local stack's processes (:mod:`aitbc.stack`) through psutil."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterable

import psutil


def wait_ended(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` s for ``procs`` to end; those still running. A process that
    exited counts at once, though it stays a zombie until its parent reaps it: ``up``'s
    processes outlive the command that started them, so their parent is the system's init,
    which in a container may reap late or never (psutil's wait_procs waits for the reaping)."""
    deadline = time.monotonic() + timeout
    while True:
        procs = [proc for proc in procs if not ended(proc)]
        if not procs or time.monotonic() >= deadline:
            return procs
        time.sleep(0.02)


def ended(proc: psutil.Process) -> bool:
    try:  # is_running: false once the pid names another process (reused)
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


def with_descendants(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """``procs`` and every live descendant of theirs, each once."""
    out: list[psutil.Process] = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            out.extend(c for c in [proc, *proc.children(recursive=True)] if c not in out)
    return out


def send(procs: list[psutil.Process], sig: signal.Signals) -> list[psutil.Process]:
    """Signal each of ``procs``; returns them. psutil refuses to signal a pid that was
    reused since the Process object was made (NoSuchProcess), and one already gone."""
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(sig)
    return procs
