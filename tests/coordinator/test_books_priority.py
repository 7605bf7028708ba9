"""The books thread (evaluation, scoring, settlement: nothing a worker waits for) runs
``books_nice`` levels below the rest of the coordinator, so on a machine the workers share
it takes only the CPU they and the rounds' critical path leave. Linux gives each thread a
nice value of its own: only that thread moves."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from aitbc.coordinator.config import Settings
from aitbc.coordinator.context import build_context
from aitbc.coordinator.rounds.driver import RoundDriver, lower_priority

from .conftest import wait_for

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def _nice(thread: threading.Thread) -> int:
    return os.getpriority(os.PRIO_PROCESS, thread.native_id)


def _in_thread(fn):
    """``fn()``'s result and the thread's nice after it, from a fresh thread (whose priority
    this test process does not keep)."""
    out: dict = {}

    def body():
        out["result"] = fn()
        out["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out["result"], out["nice"]


@linux
@pytest.mark.parametrize("nice", [0, 7])
def test_only_the_books_thread_runs_lower(tmp_path, nice):
    base = os.getpriority(os.PRIO_PROCESS, 0)
    ctx = build_context(Settings(home=tmp_path, books_nice=nice))
    driver = RoundDriver(ctx)
    driver.start()
    try:
        threads = {t.name: t for t in driver._threads}
        # the thread lowers itself as it starts
        wait_for("the books thread's nice", lambda: _nice(threads["books"]), lambda v: v == min(base + nice, 19))
        assert _nice(threads["round-driver"]) == base  # the rounds' critical path keeps its priority
        assert _nice(threads["driver-lease"]) == base
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # and so does the caller
    finally:
        driver.stop()
        ctx.engine.dispose()


@linux
def test_lower_priority_is_relative_and_capped():
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert _in_thread(lambda: lower_priority(3)) == (min(base + 3, 19), min(base + 3, 19))
    assert _in_thread(lambda: lower_priority(19)) == (19, 19)  # never past the lowest
    assert _in_thread(lambda: lower_priority(0)) == (None, base)  # 0: left as it is


def test_lower_priority_leaves_other_systems_alone(monkeypatch):
    """Where a process's priority is the unit (macOS, Windows), lowering it would slow the
    whole coordinator: the thread is left as it is."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert _in_thread(lambda: lower_priority(10)) == (None, base)


@linux
def test_a_refused_change_leaves_the_books_running(monkeypatch, caplog):
    def refuse(*a):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    assert _in_thread(lambda: lower_priority(10))[0] is None
    assert "could not lower its priority" in caplog.text


def test_books_nice_is_bounded(tmp_path):
    with pytest.raises(ValueError, match="less than or equal to 19"):
        Settings(home=tmp_path, books_nice=20)
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        Settings(home=tmp_path, books_nice=-1)  # raising a priority would need privileges
