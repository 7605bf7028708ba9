"""Watching runs: ``monitor`` (until the run ends), ``status`` (one snapshot), ``list``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.live import Live
from rich.table import Table

from aitbc.cli import checks
from aitbc.cli.common import DEFAULT_HOME, HomeOption, err, fit, out, page, resolve_home
from aitbc.cli.training.follow import CtrlC, closing, detached, drain, keys_not_echoed, open_tracker, track
from aitbc.cli.training.plumbing import CoordinatorOpt, JsonOpt, LogToOpt, RunIdOpt, api_view, emit_json, fmt, run_agent
from aitbc.cli.training.view import ENDED, changes, ended_line, finished, log_lines, run_view
from aitbc.errors import AitbcError

if TYPE_CHECKING:
    from aitbc.trackers import TensorBoardLog
    from aitbc_agent_sdk import Agent


def monitor(
    training_id: RunIdOpt,
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds (exit 1).")] = None,
    coordinator: CoordinatorOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="JSON snapshots (one line each).")] = False,
    log_to: LogToOpt = None,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Watch a run until it completes, fails (exit 1) or is stopped by its owner (exit 0).

    A live table in a terminal; elsewhere (a pipe, a log file) one line per change (round
    closed, evaluation, a worker's state, the run's status), written as it happens. With
    --log-to, also writes the closed rounds' metrics to a tracker (those already closed
    first, none twice). Ctrl-C stops watching (exit 130); the run goes on."""
    home = resolve_home(home)
    checks.more_than(interval, 0, "--interval")
    watch = _Watch(training_id=training_id, once=once, interval=interval, timeout=timeout, json_out=json_out)
    # Ctrl-C is taken between looks (see CtrlC), then ends the command with one line: the run
    # goes on, and how to come back (exit 130, as any Ctrl-C: a script's `monitor && results`
    # does not go on to an unfinished run's results). From before the tracker locks its
    # folder, so a Ctrl-C once it is locked always closes it.
    try:
        with CtrlC() as ctrl_c:
            tracker = open_tracker(log_to, training_id)
            with closing(tracker), run_agent(home, coordinator, training_id) as a:
                run = _watch(a, watch, tracker, ctrl_c)
    except KeyboardInterrupt:
        raise detached(training_id, log_to) from None
    if once:  # a snapshot, not an outcome
        return
    finished(run)
    if not json_out:
        out.print(ended_line(run), highlight=False)
        out.file.flush()


@dataclass(frozen=True, kw_only=True, slots=True)
class _Watch:
    """What ``monitor`` was asked to watch, and how."""

    training_id: str
    once: bool
    interval: float
    timeout: float | None
    json_out: bool
    t0: float = field(default_factory=time.monotonic)

    def wait(self, ctrl_c: CtrlC) -> None:
        """The pause between two looks (``--timeout`` checked first)."""
        _check_timeout(self.t0, self.timeout, self.training_id)
        time.sleep(self.interval)
        ctrl_c.check()


def _watch(a: Agent, w: _Watch, tracker: TensorBoardLog | None, ctrl_c: CtrlC) -> dict[str, Any]:
    """Follow the run as asked until it ends (or once); the last snapshot."""

    def look() -> dict[str, Any]:
        run = api_view(a.get_training_status(w.training_id))
        track(a, w.training_id, tracker)
        return run

    run = look()
    if w.once or w.json_out:
        while True:
            if w.json_out:
                emit_json(run)
            else:
                out.print(run_view(run))
            if w.once or run["status"] in ENDED:
                break
            w.wait(ctrl_c)
            run = look()
        if not w.once:
            drain(a, run, tracker, ctrl_c)
        return run
    if not out.is_terminal:  # a log: no redrawn table, one flushed line per change
        log_lines(changes(None, run))
        while run["status"] not in ENDED:
            w.wait(ctrl_c)
            before, run = run, look()
            log_lines(changes(before, run))
    else:
        with keys_not_echoed(), Live(run_view(run), console=out, refresh_per_second=4, transient=False) as live:
            while run["status"] not in ENDED:
                w.wait(ctrl_c)
                run = look()
                live.update(run_view(run))
    drain(a, run, tracker, ctrl_c)
    return run


def _check_timeout(t0: float, timeout: float | None, run_id: str) -> None:
    if timeout is not None and time.monotonic() - t0 > timeout:
        raise AitbcError(f"run {run_id} did not finish within {timeout:g} s (monitor --timeout)")


def status(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """One snapshot of a run."""
    home = resolve_home(home)
    with run_agent(home, coordinator, training_id) as a:
        run = api_view(a.get_training_status(training_id))
    if json_out:
        emit_json(run)
    else:
        out.print(run_view(run))


def list_runs(
    status: Annotated[str | None, typer.Option(help="Only runs in this state.")] = None,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Every run on the coordinator, newest first."""
    home = resolve_home(home)
    with run_agent(home, coordinator) as a:
        runs = a.list_trainings(status=status)
    if json_out:
        emit_json(page(runs))
        return
    if not runs:
        err.print("no training runs", highlight=False)
        return
    t = Table()
    for col in ("training id", "status", "model", "round", "val loss", "workers", "created"):
        t.add_column(col)
    for r in runs:
        t.add_row(
            r["training_id"],
            r["status"],
            r["model_type"],
            f"{r['round']}/{r['rounds'] or '-'}",
            fmt(r["val_loss"]),
            str(r["target_workers"]),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"])),
        )
    out.print(fit(t, whole=("training id",), drop=("created", "workers", "model")))
