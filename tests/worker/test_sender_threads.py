"""The worker's sender threads (``threads.Threads``): a call handed over runs on a kept
daemon thread, so the training thread pays a queue put, not a thread start; calls that
overlap each get a thread; a call's error reaches whoever waits for it."""

from __future__ import annotations

import threading

import pytest

from aitbc.worker.threads import Threads


def _names() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "test-lane"]


def test_calls_one_after_another_reuse_one_thread():
    pool = Threads("test-lane")
    before = len(_names())
    seen = set()
    for i in range(20):
        assert pool.submit(lambda i=i: (seen.add(threading.get_ident()), i * i)[1]).result(timeout=10) == i * i
    assert len(seen) == 1 and len(_names()) == before + 1
    t = next(t for t in threading.enumerate() if t.ident in seen)
    assert t.daemon and t is not threading.current_thread()


def test_overlapping_calls_each_get_a_thread_and_the_error_reaches_the_waiter():
    pool = Threads("test-lane")
    release = threading.Event()
    blocked = pool.submit(lambda: release.wait(10) and "long poll answered")
    quick = pool.submit(lambda: "sent")  # the first is busy: a second thread takes this one
    assert quick.result(timeout=10) == "sent" and not blocked.done()
    release.set()
    assert blocked.result(timeout=10) == "long poll answered"

    def fail() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        pool.submit(fail).result(timeout=10)
    assert pool.submit(lambda: "after an error").result(timeout=10) == "after an error"  # the thread lives on
