"""Experiment trackers: a run's per-round metrics written where the owner's tools read them.

``--log-to SCHEME:TARGET`` names one (``distribute`` and ``monitor``). The owner's own CLI
writes the files, on the owner's machine, as rounds close: the coordinator never writes
to a path an owner names. The one scheme is ``tensorboard:DIR`` (TensorBoard event files
through ``torch.utils.tensorboard.SummaryWriter``; the optional extra
``aitbc[tensorboard]``).

Each value is written once, with its round as the step: a tag's values are written in
round order, and a value at or below the largest step that tag already holds in the
folder (a second ``monitor --log-to`` on the same folder, say) is skipped, so re-attaching
never writes a step twice. Values that arrive after their round closed (its evaluation,
its workers' scores) are written when they arrive.

One folder, one run, one writer: the folder records its run's id (``.aitbc-run``), and a
folder that holds another run's steps is refused (its steps would hide this run's: every
step at or below them skipped); while a writer has the folder open it holds a lock
(``.aitbc-tracker.lock``), and a second one (two ``monitor --log-to`` on one folder) is
refused instead of writing every step again in a second event file.
"""

from __future__ import annotations

import fcntl
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aitbc.errors import UsageError

SCHEMES = ("tensorboard",)
INSTALL_HINT = "pip install 'aitbc[tensorboard]'"

# tag -> the round row's field it reads (a round as GET /v1/runs/{id}/rounds returns it)
ROUND_TAGS = {
    "val/loss": "val_loss",
    "val/accuracy": "val_accuracy",
    "train/loss": "train_loss",
    "train/accuracy": "train_accuracy",
    "bytes/up": "bytes_up",
    "bytes/down": "bytes_down",
    "updates/accepted": "accepted",
    "updates/rejected": "rejected",
}
SCORE_TAG = "score/mean"  # the mean quality (0..1) of the round's scored workers
RUN_FILE = ".aitbc-run"  # the id of the run whose steps the folder holds
LOCK_FILE = ".aitbc-tracker.lock"  # held while a writer has the folder open


@dataclass(frozen=True, slots=True)
class LogTarget:
    scheme: str
    target: str

    def __str__(self) -> str:
        return f"{self.scheme}:{self.target}"


def parse_log_to(spec: str) -> LogTarget:
    """``SCHEME:TARGET`` -> a :class:`LogTarget`; an unknown scheme or an empty target is
    a ``UsageError`` (exit 2) naming the allowed schemes."""
    scheme, sep, target = spec.partition(":")
    if scheme not in SCHEMES:
        raise UsageError(
            f"--log-to {spec!r}: unknown tracker {scheme!r}; allowed: {', '.join(s + ':DIR' for s in SCHEMES)}"
        )
    if not sep or not target:
        raise UsageError(f"--log-to {spec!r}: name the folder, e.g. {scheme}:runs/my-run")
    return LogTarget(scheme, target)


def round_values(
    rounds: Sequence[Mapping[str, Any]], scores: Sequence[Mapping[str, Any]]
) -> list[tuple[str, int, float]]:
    """``(tag, round, value)`` of every value known so far, in round order: the rounds'
    own fields and each round's mean score. Round 0 (the initial model) and missing or
    non-finite values are left out."""
    by_round: dict[int, list[float]] = {}
    for s in scores:
        if s.get("quality") is not None:
            by_round.setdefault(int(s["round"]), []).append(float(s["quality"]))
    out: list[tuple[str, int, float]] = []
    for r in sorted(rounds, key=lambda r: r["round"]):
        k = int(r["round"])
        if k < 1:
            continue
        for tag, key in ROUND_TAGS.items():
            v = r.get(key)
            if v is not None and math.isfinite(float(v)):
                out.append((tag, k, float(v)))
        q = by_round.get(k)
        if q:
            out.append((SCORE_TAG, k, sum(q) / len(q)))
    return out


class TensorBoardLog:
    """TensorBoard event files in ``folder`` (made if missing) for the run ``run_id``.
    Refuses (``UsageError``) when TensorBoard is not installed, the folder cannot be
    written, holds another run's steps or is being written by another process, so a
    caller can open it before changing anything."""

    def __init__(self, folder: Path, run_id: str | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UsageError(f"--log-to tensorboard: TensorBoard is not installed; {INSTALL_HINT}") from None
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"--log-to tensorboard:{folder}: is a file, not a folder")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--log-to tensorboard:{folder}: cannot write there ({e.strerror or e})") from None
        self._lock = _lock(folder)
        try:
            _claim(folder, run_id)
            self.folder = folder
            self.last = written_steps(folder)  # tag -> largest step already in the folder
            self._writer = SummaryWriter(log_dir=str(folder))
        except BaseException:
            self._lock.close()
            raise
        self.written = 0

    def log(self, values: Sequence[tuple[str, int, float]]) -> int:
        """Write the values not written yet (see the module's note); returns how many."""
        n = 0
        for tag, step, value in values:
            if step > self.last.get(tag, 0):
                self._writer.add_scalar(tag, value, global_step=step)
                self.last[tag] = step
                n += 1
        if n:
            self._writer.flush()
        self.written += n
        return n

    def close(self) -> None:
        self._writer.close()
        self._lock.close()  # releases the folder


def _lock(folder: Path) -> Any:
    """The folder's writer lock, held until the returned file is closed."""
    where = f"--log-to tensorboard:{folder}"
    try:
        f = (folder / LOCK_FILE).open("a")
    except OSError as e:
        raise UsageError(f"{where}: cannot write there ({e.strerror or e})") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise UsageError(
            f"{where}: another aitbc process is writing to this folder; stop it or choose another folder"
        ) from None
    return f


def _claim(folder: Path, run_id: str | None) -> None:
    """Record ``run_id`` as the folder's run, or refuse a folder that holds another's."""
    if run_id is None:
        return
    marker = folder / RUN_FILE
    try:
        held = marker.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        held = ""
    except OSError as e:
        raise UsageError(f"--log-to tensorboard:{folder}: cannot read {RUN_FILE} ({e.strerror or e})") from None
    if held and held != run_id:
        raise UsageError(
            f"--log-to tensorboard:{folder}: the folder holds run {held}'s metrics; choose another folder for {run_id}"
        )
    if not held:
        marker.write_text(run_id + "\n", encoding="utf-8")


def written_steps(folder: Path) -> dict[str, int]:
    """The largest step of each scalar tag in the event files under ``folder``."""
    if not any(folder.glob("events.out.tfevents.*")):
        return {}
    from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
        SCALARS,
        EventAccumulator,
    )

    acc = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: max(e.step for e in acc.Scalars(tag)) for tag in acc.Tags()["scalars"]}


def open_log(target: LogTarget, run_id: str | None = None) -> TensorBoardLog:
    """The tracker a ``--log-to`` names (only ``tensorboard`` in this build), for the run
    ``run_id``."""
    return TensorBoardLog(Path(target.target).expanduser(), run_id)
