"""Progress bars for the commands that move many bytes (``distributed-training upload-data``
and ``download-model``, ``ipfs add`` of a large input), drawn on standard error so standard
output keeps only the command's result.

A bar is drawn only when standard error is a terminal (not ``TERM=dumb``) and ``--json`` was
not given: in a pipe, a log file or a script there is no bar and no escape code. Standard
output may still be redirected (``aitbc ipfs add big.bin > cid.txt`` shows the bar). The
commands report the SDK's stages (:data:`aitbc_agent_sdk.Progress`) as they come, one line
each: ``hashing``, ``packaging``, ``storing``, ``uploading``, ``downloading``, in bytes.

A wait for a run's settlement (``payments``) is one status line instead (:func:`settle_line`),
in rounds; in a pipe it is said once, in plain text."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from aitbc.cli.common import err

# `ipfs add` of less than this is done before a bar could say anything (hashing and storing
# run at hundreds of MB/s); upload-data and download-model cross the network: always a bar
MIN_ADD_BYTES = 8 << 20
LABELS = {
    "hash": "hashing",
    "package": "packaging",
    "store": "storing",
    "upload": "uploading",
    "download": "downloading",
}

Report = Callable[[str, int, int], None]


def at_terminal(json_out: bool) -> bool:
    """Whether a bar may be drawn: standard error is a terminal and no ``--json``."""
    if json_out or os.environ.get("TERM") == "dumb":
        return False
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, ValueError, OSError):  # replaced or closed stderr
        return False


@contextmanager
def bars(json_out: bool, *, show: bool = True) -> Iterator[Report | None]:
    """``report(stage, done, total)`` that draws one bar per stage on standard error, or
    None where no bar is wanted (``show`` false, or see :func:`at_terminal`): pass it as
    the SDK's ``progress=``. A stage whose total is 0 while nothing is done yet (packaging,
    whose size is known only at its end) is a pulsing bar; a stage with nothing to move
    shows none."""
    if not show or not at_terminal(json_out):
        yield None
        return
    columns = (
        TextColumn("{task.description:<11}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=False, refresh_per_second=8) as progress:
        tasks: list[tuple[str, TaskID]] = []  # the stages so far, in order

        def report(stage: str, done: int, total: int) -> None:
            current = tasks[-1] if tasks else None
            if current is None or current[0] != stage:
                if not total and not done and stage != "package":
                    return  # nothing to move (or the length is not known yet)
                task = progress.add_task(LABELS.get(stage, stage), total=total or None)
                tasks.append((stage, task))
                current = tasks[-1]
            progress.update(current[1], completed=done, total=total or None)

        yield report


def settle_text(done: int, total: int) -> str:
    """What a settlement wait shows: rounds settled of the rounds closed, or the end's booking."""
    if done < total:
        return f"settling: round {done} of {total} settled ..."
    return "settling: every round settled; booking the run's end (bonds, last deliveries) ..."


@contextmanager
def settle_line(json_out: bool) -> Iterator[Report]:
    """``report("settle", settled, closed)`` for the SDK's settlement waits (pass it as
    ``progress=``): on a terminal (see :func:`at_terminal`) one line on standard error,
    redrawn at each look and gone once the wait ends; elsewhere (a pipe, a log, ``--json``)
    one plain line at the first report, so a script's log says why the command waits, and
    nothing more. The SDK reports nothing when the answer is final at once."""
    if at_terminal(json_out):
        with err.status("settling ...") as status:

            def redraw(stage: str, done: int, total: int) -> None:
                status.update(settle_text(done, total))

            yield redraw
        return
    said = False

    def once(stage: str, done: int, total: int) -> None:
        nonlocal said
        if not said:
            said = True
            err.print(
                f"{settle_text(done, total)} (waiting; --no-wait answers with the payments so far)", highlight=False
            )

    yield once
