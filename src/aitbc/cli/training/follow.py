"""Following a run until it ends: the ``--log-to`` tracker, Ctrl-C taken between looks (and
the run left to go on), and the last round's evaluation and scores drained after the end."""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import termios
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aitbc.cli.training.plumbing import api_view, say
from aitbc.cli.training.view import ENDED, changes, ended_line, finished, log_lines
from aitbc.errors import AitbcError

if TYPE_CHECKING:
    from aitbc.trackers import TensorBoardLog
    from aitbc_agent_sdk import Agent


def open_tracker(log_to: str | None, training_id: str) -> TensorBoardLog | None:
    """The ``--log-to`` tracker, opened (or refused, exit 2) before anything else happens."""
    if log_to is None:
        return None
    from aitbc.trackers import open_log, parse_log_to

    return open_log(parse_log_to(log_to), training_id)


@contextlib.contextmanager
def closing(tracker: TensorBoardLog | None) -> Iterator[None]:
    try:
        yield
    finally:
        if tracker is not None:
            tracker.close()


def _rounds_and_scores(a: Agent, training_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's closed rounds and their scores, as the JSON the coordinator sent (what the
    tracker reads)."""
    rounds = [r.model_dump(mode="json") for r in a.get_rounds(training_id)]
    return rounds, [s.model_dump(mode="json") for s in a.get_round_scores(training_id)]


def track(a: Agent, training_id: str, tracker: TensorBoardLog | None) -> None:
    """Write what the tracker does not hold yet: the closed rounds and their scores."""
    if tracker is not None:
        from aitbc.trackers import round_values

        tracker.log(round_values(*_rounds_and_scores(a, training_id)))


class Detached(AitbcError):
    """Ctrl-C while ``distribute --log-to`` follows its run: the run goes on; exit 130."""

    exit_code = 130
    code = "interrupted"


def detached(training_id: str, log_to: str | None) -> Detached:
    """Ctrl-C while following a run: one line saying the run goes on, and how to come back."""
    again = f"aitbc distributed-training monitor --training-id {shlex.quote(training_id)}"
    if log_to:
        again += f" --log-to {shlex.quote(log_to)}"
    return Detached(f"interrupted: run {training_id} goes on training; re-attach with: {again}")


@contextlib.contextmanager
def keys_not_echoed() -> Iterator[None]:
    """Typed keys not echoed while a live view redraws (as ``top`` and ``watch`` do): the
    terminal's echo of Ctrl-C, ``^C``, at the end of the view's last line (a table as wide
    as the terminal) wraps it, and the redraws after it, moving up one line too few, leave
    the view's first lines printed twice. Nothing where standard input is no terminal."""
    before = None
    with contextlib.suppress(OSError, ValueError, termios.error):
        before = termios.tcgetattr(sys.stdin.fileno())
    if before is None:
        yield
        return
    fd = sys.stdin.fileno()
    quiet = list(before)
    quiet[3] = before[3] & ~termios.ECHO  # lflag
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, before)


class CtrlC:
    """Ctrl-C noted, not raised where it lands: a loop following a run calls :meth:`check`
    between its looks, so the interrupt never lands inside an HTTP request or a tracker
    write (where a KeyboardInterrupt can leave a connection pool or an event file half done,
    and the CLI hang on closing them instead of detaching). A second Ctrl-C interrupts at
    once. Only in the main thread (the only one a handler can be set from)."""

    def __init__(self) -> None:
        self.pressed = False
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True

    def check(self) -> None:
        if self.pressed:
            raise KeyboardInterrupt

    def __enter__(self) -> CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


DRAIN_SECONDS = 20.0  # after the run ends, how long to wait for its last evaluation and scores


def drain(a: Agent, run: dict[str, Any], tracker: TensorBoardLog | None, ctrl_c: CtrlC | None = None) -> None:
    """After the run ended: the last round's evaluation and its workers' scores land a
    moment later (the coordinator scores closed rounds in the background); write them
    too, waiting at most ``DRAIN_SECONDS``."""
    if tracker is None:
        return
    from aitbc.trackers import round_values

    training_id = run["training_id"]
    until = time.monotonic() + DRAIN_SECONDS
    while True:
        rounds, scores = _rounds_and_scores(a, training_id)
        tracker.log(round_values(rounds, scores))
        last = max(rounds, key=lambda r: r["round"], default=None)
        if last is None or last["round"] == 0:
            return
        scored = any(s["round"] == last["round"] for s in scores) or not last.get("accepted")
        if (scored and last.get("val_loss") is not None) or time.monotonic() > until:
            return
        time.sleep(0.5)
        if ctrl_c is not None:
            ctrl_c.check()


def follow(a: Agent, training_id: str, tracker: TensorBoardLog, log_to: str | None, *, quiet: bool) -> None:
    """``distribute --log-to``: follow the run as ``monitor`` does for a log (one line per
    change unless ``quiet``), writing the tracker, until the run ends; then as monitor:
    exit 1 if it failed."""
    if not quiet:
        say(f"Logging to {log_to}; following the run until it ends (Ctrl-C detaches, the run goes on)")
    try:
        with CtrlC() as ctrl_c:
            run = api_view(a.get_training_status(training_id))
            track(a, training_id, tracker)
            if not quiet:
                log_lines(changes(None, run))
            while run["status"] not in ENDED:
                time.sleep(1.0)
                ctrl_c.check()
                before, run = run, api_view(a.get_training_status(training_id))
                track(a, training_id, tracker)
                if not quiet:
                    log_lines(changes(before, run))
                ctrl_c.check()
            drain(a, run, tracker, ctrl_c)
    except KeyboardInterrupt:
        raise detached(training_id, log_to) from None
    finished(run)
    if not quiet:
        say(ended_line(run))
