"""A run on screen: the live table, one line per change for a log, and how it ended."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from aitbc.cli.common import fit, out, shown
from aitbc.cli.training.plumbing import fmt, human_bytes, measured_line
from aitbc.errors import AitbcError

# At a narrow width, the worker table drops these first (the id, progress and status stay).
RUN_VIEW_DROPS = ("heartbeat", "epoch", "this round", "shard", "flags", "rounds", "score", "loss")


def _loss_rows(run: dict[str, Any]) -> list[tuple[str, ...]]:
    """Loss and bytes; a language model's perplexity and tokens seen, a classifier's accuracy."""
    language = run.get("tokens_seen") is not None  # a coordinator that counts them, a language model
    quality = (
        f"perplexity {fmt(run.get('val_perplexity'), '.2f')}"
        if language
        else f"val acc {fmt(run['val_accuracy'], '.3f')}"
    )
    rows: list[tuple[str, ...]] = [
        (
            loss_span(run),
            quality,
            f"bytes up {human_bytes(run['bytes_up'])}",
            f"down {human_bytes(run['bytes_down'])}",
        )
    ]
    if language:
        rows.append((f"tokens seen {run['tokens_seen']:,}",))
    return rows


def loss_span(run: dict[str, Any]) -> str:
    """The validation loss from the first evaluation (the initial model's) to the latest,
    each with its round: a round's evaluation lands a moment after it closes (and only
    every ``eval_every`` rounds), so until one has, there is one number, not ``x -> x``."""
    return "val loss " + span(run["initial_val_loss"], run["val_loss"], run.get("val_round"))


def span(first: float | None, latest: float | None, at: int | None) -> str:
    """``first -> latest (round at)``, or the one number there is before a round's evaluation."""
    if first is None and latest is None:
        return "-"
    if at is None or at == 0:
        return f"{fmt(first if first is not None else latest)} (initial model)"
    return f"{fmt(first)} -> {fmt(latest)} (round {at})"


def run_view(run: dict[str, Any]) -> Group:
    cfg = run.get("config") or {}
    head = Table.grid(padding=(0, 2))
    head.add_row(
        f"[b]{run['training_id']}[/b]",
        f"status [b]{run['status']}[/b]",
        f"round {run['round']}/{cfg.get('rounds', '-')}",
        f"completed {run['rounds_completed']}",
    )
    for row in _loss_rows(run):
        head.add_row(*row)
    if run.get("manifest_cid"):
        head.add_row(
            f"data {measured_line(run.get('measured'), run.get('data_bytes'))}", f"declared {run['dataset_size']}"
        )
    v = run.get("verification")
    if v:
        head.add_row(
            f"verified {v['passed']}",
            f"failed {v['failed']}" + (f", drift {v['drift']} (unpaid)" if v.get("drift") else ""),
            f"unanswered {v['unanswered']}",
            f"re-run {v['extra_compute']:.1%} of steps",
        )
    g = run.get("gossip")
    if g:
        head.add_row(
            f"gossip {g['topology']}",
            f"consensus spread {fmt(g['spread'])}",
            f"recorded round {g['recorded_round']} (workers at {g['newest_round']})",
            f"outliers {g['outliers']}",
        )
    a = run.get("asynchronous")
    if a:
        head.add_row(
            f"async version {a['version']}",
            f"{a['updates_per_second']:.2f} updates/s",
            f"applied {a['applied']}",
            f"refused stale {a['refused_stale']}",
        )
    t = Table()
    for col in (
        "worker",
        "shard",
        "progress %",
        "loss",
        "epoch",
        "status",
        "rounds",
        "this round",
        "score",
        "flags",
        "heartbeat",
        *(("staleness",) if a else ()),
    ):
        t.add_column(col, justify="left" if col in ("worker", "status", "this round", "flags") else "right")
    for w in run["workers"]:
        hb = w["last_heartbeat_age"]
        t.add_row(
            w["worker_id"],
            str(w["shard_index"]),
            f"{w['progress']:.1f}",
            fmt(w["loss"]),
            f"{w['epoch']:.2f}",
            w["status"],
            str(w["rounds_done"]),
            w["this_round"] or "",
            fmt(w.get("score"), ".2f"),
            ", ".join(w.get("score_flags") or []),
            "-" if hb is None else f"{hb:.1f}s ago",
            *(("-" if w.get("staleness") is None else str(w["staleness"]),) if a else ()),
        )
    fit(t, whole=("worker",), drop=RUN_VIEW_DROPS)
    parts: list[Any] = [head, t]
    if run.get("error"):  # may quote others' words: escaped, and never read as markup
        parts.append(Text(shown(run["error"]), style="red"))
    return Group(*parts)


ENDED = ("complete", "failed", "stopped")  # a run in one of these changes no more


def finished(run: dict[str, Any]) -> None:
    """A failed run is an error (exit 1); a complete one, or one its owner stopped, is not."""
    if run["status"] == "failed":
        raise AitbcError(f"run {run['training_id']} failed: {run.get('error') or 'no reason recorded'}")


def ended_line(run: dict[str, Any]) -> str:
    loss = loss_span(run)
    if run["status"] == "stopped":
        done = f"{run['rounds_completed']}/{(run.get('config') or {}).get('rounds', '-')} rounds"
        return f"Run {run['training_id']} stopped by its owner after {done}: {loss}, model {run['global_model_cid'] or '-'}"
    return f"Run {run['training_id']} complete: {loss}, model {run['global_model_cid']}"


def _quality(run: dict[str, Any]) -> str:
    """A language model's perplexity, a classifier's accuracy."""
    if run.get("tokens_seen") is not None:
        return f"perplexity {fmt(run.get('val_perplexity'), '.2f')}, {run['tokens_seen']:,} tokens seen"
    return f"val acc {fmt(run['val_accuracy'], '.3f')}"


def _evaluation(run: dict[str, Any]) -> str:
    return f"val loss {fmt(run['val_loss'])}, {_quality(run)}"


def changes(before: dict[str, Any] | None, run: dict[str, Any]) -> list[str]:
    """What changed between two snapshots of a run, one line each: the run's status, a
    round closed (with its evaluation), a worker's state, a worker joining. For a log:
    ``monitor`` writes these when its output is not a terminal."""
    cfg = run.get("config") or {}
    rounds = cfg.get("rounds", "-")
    if before is None:
        return [
            f"{run['training_id']}: {run['status']}, round {run['round']}/{rounds}, "
            f"{len(run['workers'])} worker{'s' if len(run['workers']) != 1 else ''}, "
            f"val loss {fmt(run['val_loss'])}"
        ]
    lines = []
    evaluated = run.get("val_round") != before.get("val_round") or run["val_loss"] != before["val_loss"]
    for k in range(before["rounds_completed"] + 1, run["rounds_completed"] + 1):  # each, if several closed
        if evaluated and run.get("val_round") == k:  # its evaluation landed in the same look
            lines.append(f"round {k}/{rounds} closed: {_evaluation(run)}")
            evaluated = False
        else:
            lines.append(f"round {k}/{rounds} closed")
    if evaluated:
        at = run.get("val_round")
        lines.append(f"{'evaluation' if at is None else f'round {at}/{rounds} evaluated'}: {_evaluation(run)}")
    seen = {w["worker_id"]: w for w in before["workers"]}
    for w in run["workers"]:
        old = seen.get(w["worker_id"])
        if old is None:
            lines.append(f"worker {w['worker_id']} joined: shard {w['shard_index']}, {w['status']}")
        elif old["status"] != w["status"]:
            loss = "" if w["loss"] is None else f", loss {fmt(w['loss'])}"
            lines.append(f"worker {w['worker_id']}: {old['status']} -> {w['status']} (round {run['round']}{loss})")
    if run["status"] != before["status"]:
        lines.append(f"run {before['status']} -> {run['status']}" + (f": {run['error']}" if run.get("error") else ""))
    return lines


def log_lines(lines: list[str]) -> None:
    """Each line as it happens: written and flushed at once (a pipe or a file buffers)."""
    stamp = time.strftime("%H:%M:%S")
    for line in lines:
        out.file.write(f"{stamp} {line}\n")
    out.file.flush()
