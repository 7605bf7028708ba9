"""The worker's sender threads: calls handed to kept daemon threads, so the training thread
pays a queue put, not a thread start."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Threads:
    """Daemon threads that run the calls handed to them, each kept for the next call once
    done. Handing one a call costs the caller a queue put: a thread start would make the
    caller wait until the new thread holds the GIL (up to a switch interval on the training
    thread's clock, twice a round with overlap 2). A call that finds none idle starts one
    more. Daemon threads: a stopping worker does not wait for a long poll."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1  # that one takes this call (or another queued before it)
        self._calls.put((future, call))
        if start:
            threading.Thread(target=self._serve, name=self._name, daemon=True).start()
        return future

    def _serve(self) -> None:
        while True:
            future, call = self._calls.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as e:  # noqa: BLE001 - not swallowed: the caller's result() raises it
                    future.set_exception(e)
            with self._lock:
                self._idle += 1


SENDERS = Threads("sender")  # sends, and the look-ahead's long polls


class Sender:
    """One call on a sender thread (:data:`SENDERS`); :meth:`wait` returns its result or
    raises its error."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._future = SENDERS.submit(call)

    def wait(self) -> Any:
        return self._future.result()

    def done(self) -> bool:
        return self._future.done()
