"""A training's report: PNG plots (matplotlib, Agg, no display) and one self-contained HTML page.

:func:`write_report` takes plain data (:class:`ReportData`), so a live run (the CLI's
``distributed-training report``, its numbers read through the SDK) and a simulation
(``simulate --report``) draw the same pictures: :func:`from_run` and
:func:`from_simulation` build that data from what each one records. No HTTP here.

Written into the report folder (the same names every time, each replaced whole: written
as a new file, then renamed over the old one, so a link planted there is never followed;
other files in the folder are left alone):

- ``loss.png``: validation loss and mean training loss by round;
- ``accuracy.png``: validation and training accuracy by round (a note for a language model);
- ``scores.png``: a worker-by-round heatmap (a live run: each worker's score, quality
  0..1; blank where a worker has no score for a round);
- ``bytes.png``: bytes up (updates) and down (models) per round;
- ``report.html``: the four images embedded as ``data:`` URIs and the run's numbers in
  tables; every string from the run (worker ids, error text) HTML-escaped.

Same input, same bytes: PNGs carry no software or date metadata, and the page no time.
"""

from __future__ import annotations

import base64
import html
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aitbc.errors import UsageError

PLOTS = ("loss", "accuracy", "scores", "bytes")
HTML_NAME = "report.html"
ANNOTATE_CELLS = 240  # a heatmap of at most this many cells has its values written in
MAX_LABEL = 28  # a worker id longer than this is cut in a plot (whole in the HTML tables)
_PNG_META = {"Software": None}  # no matplotlib version in the file: same input, same bytes
_DPI = 100
_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once, at import (there is no read-only way to ask)


@dataclass(frozen=True, kw_only=True, slots=True)
class RoundPoint:
    """One closed round. Bytes are this round's own (not running totals); ``None`` where
    not recorded (a round evaluated less often, a round recorded before byte counts)."""

    round: int
    val_loss: float | None = None
    val_accuracy: float | None = None
    train_loss: float | None = None
    train_accuracy: float | None = None
    bytes_up: int | None = None
    bytes_down: int | None = None
    accepted: int | None = None
    rejected: int | None = None
    eval_pending: bool = False  # its evaluation is due and had not landed: a gap in the validation curves


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerRow:
    worker_id: str
    status: str = ""
    score: float | None = None
    paid: str = ""
    flags: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Heatmap:
    """Values by (worker id, round); a missing cell is drawn blank. ``vmin``/``vmax``
    fix the colour scale (a score's 0..1), else it spans the values."""

    title: str
    label: str
    cells: Mapping[tuple[str, int], float]
    workers: Sequence[str] = ()  # row order; default: sorted ids of the cells
    vmin: float | None = None
    vmax: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportData:
    title: str
    rounds: Sequence[RoundPoint]
    heatmap: Heatmap
    summary: Sequence[tuple[str, str]] = ()  # (name, value) rows of the summary table
    workers: Sequence[WorkerRow] = ()
    notes: Sequence[str] = field(default_factory=tuple)  # lines under the title (e.g. the run's error)


# --- the folder -------------------------------------------------------------------------


def prepare_dir(path: Path) -> Path:
    """Make ``path`` a folder we can write into, or refuse (``UsageError``, exit 2) in one
    line: called before fetching anything."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"-o {path}: is a file, not a folder")
    if path.is_symlink() and not path.exists():  # mkdir would say only "File exists"
        raise UsageError(f"-o {path}: is a link to {os.readlink(path)}, which does not exist")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".aitbc-report-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"-o {path}: cannot write there ({e.strerror or e})") from None
    return path


# --- building the data --------------------------------------------------------------------


def _language_rows(results: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A language model's perplexity and the tokens it was trained on (a coordinator that
    sends them; nothing for a classifier)."""
    rows = []
    if results.get("final_val_perplexity") is not None:
        rows.append(("final validation perplexity", f"{results['final_val_perplexity']:.2f}"))
    if results.get("tokens_seen") is not None:
        rows.append(("tokens seen", f"{int(results['tokens_seen']):,}"))
    return rows


def from_run(
    *,
    results: Mapping[str, Any],
    rounds: Sequence[Mapping[str, Any]],
    scores: Sequence[Mapping[str, Any]],
    payments: Mapping[str, Any] | None,
) -> ReportData:
    """A live run's report from the API's views: ``results`` (``get_results``), ``rounds``
    (``GET /runs/{id}/rounds`` rows), ``scores`` (``get_round_scores``: one row per
    contract and round) and ``payments`` (``get_payments``; ``None`` to leave money out)."""
    points = [
        RoundPoint(
            round=int(r["round"]),
            val_loss=r.get("val_loss"),
            val_accuracy=r.get("val_accuracy"),
            train_loss=r.get("train_loss"),
            train_accuracy=r.get("train_accuracy"),
            bytes_up=r.get("bytes_up"),
            bytes_down=r.get("bytes_down"),
            accepted=r.get("accepted"),
            rejected=r.get("rejected"),
            eval_pending=bool(r.get("eval_pending")),
        )
        for r in sorted(rounds, key=lambda r: r["round"])
        if r["round"] > 0  # round 0 is the initial model: no training, no bytes
    ]
    cells = {
        (str(s["worker_id"]), int(s["round"])): float(s["quality"]) for s in scores if s.get("quality") is not None
    }
    pay_rows = {p["contract_id"]: p for p in (payments or {}).get("data", [])}
    workers: list[WorkerRow] = []
    for w in results.get("workers", []):
        p = pay_rows.get(w["contract_id"], {})
        workers.append(
            WorkerRow(
                worker_id=str(w["worker_id"]),
                status=str(w.get("status") or ""),
                score=w.get("score"),
                paid=str(p.get("paid", "")),
                flags=tuple(sorted(set(w.get("score_flags") or ()) | set(p.get("flags") or ()))),
            )
        )
    order = list(dict.fromkeys(w.worker_id for w in workers))
    order += sorted({wid for wid, _ in cells} - set(order))
    summary = [
        ("training id", str(results.get("training_id", ""))),
        ("status", str(results.get("status", ""))),
        ("rounds", f"{results.get('rounds_completed', 0)}/{results.get('rounds') or '-'}"),
        ("initial validation loss", _num(results.get("initial_val_loss"))),
        ("final validation loss", _num(results.get("final_val_loss"))),
        ("final validation accuracy", _num(results.get("final_val_accuracy"))),
        *_language_rows(results),
        (
            "updates accepted / rejected",
            f"{results.get('updates_accepted', 0)} / {results.get('updates_rejected', 0)}",
        ),
        ("bytes up / down", f"{_bytes(results.get('bytes_up'))} / {_bytes(results.get('bytes_down'))}"),
    ]  # no CID: a report is made to be shared, and a CID fetches the owner's model (as on the dashboard)
    if payments:
        summary.append(("escrowed / left (AIT)", f"{payments.get('escrowed')} / {payments.get('escrow_balance')}"))
    notes = [f"error: {results['error']}"] if results.get("error") else []
    return ReportData(
        title=f"Training report: {results.get('training_id', '')}",
        rounds=points,
        heatmap=Heatmap(
            title="Score per worker and round (quality 0..1; blank: not scored)",
            label="quality",
            cells=cells,
            workers=order,
            vmin=0.0,
            vmax=1.0,
        ),
        summary=summary,
        workers=workers,
        notes=[*notes, *_pending_note(points)],
    )


def _pending_note(points: Sequence[RoundPoint]) -> list[str]:
    pending = [p.round for p in points if p.eval_pending]
    if not pending:
        return []
    return [
        f"evaluation pending for round{'s' if len(pending) > 1 else ''} {_spans(pending)} when this report was "
        "written: a gap in the validation curves (write the report again to fill it)"
    ]


def from_simulation(
    *,
    result: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    update_norms: Sequence[Mapping[int, float]],
) -> ReportData:
    """A simulation's report from its ``SimResult`` (as a dict), its ``metrics.jsonl`` rows
    (byte counts there are running totals) and each round's update norms per virtual
    worker. The simulator does not score workers, so the heatmap shows the L2 norm of
    each worker's update (an attacker's usually stands out) and says so."""
    points: list[RoundPoint] = []
    up0 = down0 = 0
    for r in rows:
        up, down = int(r["bytes_up"]), int(r["bytes_down"])
        points.append(
            RoundPoint(
                round=int(r["round"]),
                val_loss=r.get("val_loss"),
                val_accuracy=r.get("val_accuracy"),
                train_loss=r.get("train_loss"),
                train_accuracy=r.get("train_accuracy"),
                bytes_up=up - up0,
                bytes_down=down - down0,
                accepted=r.get("accepted"),
                rejected=r.get("rejected"),
            )
        )
        up0, down0 = up, down
    byz = set(result.get("byzantine_workers") or ())
    n = int(result.get("workers", 0))
    names = [f"worker {i}" + (" (byzantine)" if i in byz else "") for i in range(n)]
    cells = {
        (names[i], k + 1): float(v)
        for k, norms in enumerate(update_norms)
        for i, v in norms.items()
        if 0 <= i < n and math.isfinite(v)
    }
    cfg = result.get("config") or {}
    acc = result.get("final_val_accuracy")
    summary = [
        ("model / dataset", f"{cfg.get('model', '-')} on {cfg.get('dataset', '-')}"),
        ("workers (byzantine)", f"{n} ({len(byz)}{' x ' + str(cfg.get('attack')) if byz else ''})"),
        ("mode / aggregator / codec", f"{cfg.get('mode')} / {cfg.get('aggregator')} / {cfg.get('compression')}"),
        ("rounds", str(result.get("rounds"))),
        ("initial validation loss", _num(result.get("initial_val_loss"))),
        ("final validation loss", _num(result.get("final_val_loss"))),
        ("final validation accuracy", _num(acc) if acc is not None else "n/a (language model)"),
        ("bytes up / down", f"{_bytes(result.get('bytes_up'))} / {_bytes(result.get('bytes_down'))}"),
        ("updates rejected / dropped", f"{result.get('rejected_updates')} / {result.get('dropped_updates')}"),
        ("virtual time", f"{float(result.get('virtual_seconds') or 0):.2f} s"),
        ("final model CID", str(result.get("final_model_cid", "-"))),
    ]
    return ReportData(
        title=f"Simulation report: {cfg.get('model', '')} on {cfg.get('dataset', '')}, seed {cfg.get('seed', 0)}",
        rounds=points,
        heatmap=Heatmap(
            title="Update L2 norm per worker and round (the simulator does not score workers)",
            label="update L2 norm",
            cells=cells,
            workers=names,
        ),
        summary=summary,
        workers=[
            WorkerRow(worker_id=name, status="byzantine" if i in byz else "honest") for i, name in enumerate(names)
        ],
    )


# --- writing ------------------------------------------------------------------------------


def write_report(data: ReportData, out_dir: Path) -> dict[str, Path]:
    """Write the four PNGs and ``report.html`` into ``out_dir`` (made if missing);
    returns ``{name: path}`` (``loss``, ``accuracy``, ``scores``, ``bytes``, ``html``)."""
    prepare_dir(out_dir)
    pngs = {
        "loss": _loss_png(data.rounds),
        "accuracy": _accuracy_png(data.rounds),
        "scores": _heatmap_png(data.heatmap),
        "bytes": _bytes_png(data.rounds),
    }
    page = render_html(data, pngs).encode("utf-8")
    paths: dict[str, Path] = {}
    for name, png in pngs.items():
        paths[name] = _replace(out_dir / f"{name}.png", png)
    paths["html"] = _replace(out_dir / HTML_NAME, page)
    return paths


def _replace(path: Path, content: bytes) -> Path:
    """Write ``content`` as a new file and rename it over ``path``: a reader never sees
    half a file, and a link planted at ``path`` (in a shared folder) is replaced, never
    followed to overwrite what it points at."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.chmod(tmp, 0o666 & ~_UMASK)  # as a plain write would make it (mkstemp's is 0600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _figure(width: float = 7.0, height: float = 4.0) -> tuple[Any, Any]:
    # The Figure API with an Agg canvas: no pyplot, no global state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _rounds_axis(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers


def _png(fig: Any) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata=_PNG_META)
    return buf.getvalue()


def _series(points: Sequence[RoundPoint], attr: str) -> tuple[list[int], list[float]]:
    """The rounds that have ``attr`` and its values; a validation value still pending is
    a NaN, which breaks the line (a round evaluated less often is joined across)."""
    xs, ys = [], []
    for p in points:
        v = getattr(p, attr)
        if v is not None and math.isfinite(v):
            xs.append(p.round)
            ys.append(float(v))
        elif p.eval_pending and attr.startswith("val_") and xs:
            xs.append(p.round)
            ys.append(math.nan)
    return xs, ys


def _spans(rounds: Sequence[int]) -> str:
    """Sorted round numbers as spans: 4-9, 12."""
    spans: list[list[int]] = []
    for r in rounds:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, parse_math=False, color="0.4")


def _curves_png(
    points: Sequence[RoundPoint],
    series: Sequence[tuple[str, str, str | None]],
    *,
    title: str,
    ylabel: str,
    empty: str,
    unit_range: bool = False,
) -> bytes:
    """One line per ``(attribute, label, colour)`` of ``series`` over the rounds that have it;
    ``empty``'s note when none has any; ``unit_range``: the y axis is 0..1."""
    fig, ax = _figure()
    ax.set(title=title, xlabel="round", ylabel=ylabel)
    _rounds_axis(ax)
    drawn = False
    for attr, label, color in series:
        xs, ys = _series(points, attr)
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3, color=color, label=label)
            drawn = True
    if drawn:
        if unit_range:
            ax.set_ylim(0, 1)
        ax.legend()
        ax.grid(alpha=0.3)
    else:
        _empty(ax, empty)
    return _png(fig)


def _loss_png(points: Sequence[RoundPoint]) -> bytes:
    series = (("val_loss", "validation loss", None), ("train_loss", "training loss (mean of workers)", None))
    return _curves_png(points, series, title="Loss by round", ylabel="loss", empty="no round closed yet")


def _accuracy_png(points: Sequence[RoundPoint]) -> bytes:
    series = (
        ("val_accuracy", "validation accuracy", "tab:green"),
        ("train_accuracy", "training accuracy (mean of workers, as reported)", "tab:orange"),
    )
    return _curves_png(
        points,
        series,
        title="Accuracy by round",
        ylabel="accuracy",
        empty="no accuracy recorded (a language model, or no evaluated round yet)",
        unit_range=True,
    )


def _bytes_png(points: Sequence[RoundPoint]) -> bytes:
    from matplotlib.ticker import EngFormatter

    fig, ax = _figure()
    ax.set(title="Bytes per round", xlabel="round", ylabel="bytes")
    _rounds_axis(ax)
    ax.yaxis.set_major_formatter(EngFormatter(unit="B"))
    up_x, up = _series(points, "bytes_up")
    down_x, down = _series(points, "bytes_down")
    if up_x or down_x:
        w = 0.4
        ax.bar([x - w / 2 for x in up_x], up, width=w, label="up (updates)")
        ax.bar([x + w / 2 for x in down_x], down, width=w, label="down (models)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never over them
        ax.grid(alpha=0.3, axis="y")
    else:
        _empty(ax, "no byte counts recorded")
    return _png(fig)


def _heatmap_png(h: Heatmap) -> bytes:
    import numpy as np
    from matplotlib import colormaps

    workers = list(h.workers) or sorted({w for w, _ in h.cells})
    rounds = sorted({r for _, r in h.cells})
    fig, ax = _figure(7.0, min(12.0, 2.0 + 0.3 * max(1, len(workers))))
    ax.set_title(h.title, fontsize=9, wrap=True).set_parse_math(False)
    if not workers or not rounds:
        _empty(ax, "no values yet")
        ax.set_xticks([])
        ax.set_yticks([])
        return _png(fig)
    grid = np.full((len(workers), len(rounds)), np.nan)  # (workers, rounds); NaN: blank
    row, col = {w: i for i, w in enumerate(workers)}, {r: j for j, r in enumerate(rounds)}
    for (w, r), v in h.cells.items():
        if w in row:
            grid[row[w], col[r]] = v
    cmap = colormaps["viridis"].with_extremes(bad="white")
    im = ax.imshow(
        np.ma.masked_invalid(grid), aspect="auto", cmap=cmap, vmin=h.vmin, vmax=h.vmax, interpolation="nearest"
    )
    step = max(1, len(rounds) // 20)
    ax.set_xticks(range(0, len(rounds), step), [str(r) for r in rounds[::step]])
    ax.set_yticks(range(len(workers)), [_cut(w) for w in workers])
    for label in ax.get_yticklabels():
        label.set_parse_math(False)  # a worker id is text, never TeX ("$" in it must not parse)
    ax.set_xlabel("round")
    if grid.size <= ANNOTATE_CELLS:  # small enough to read: each value written in its cell
        for i, j in zip(*np.nonzero(np.isfinite(grid)), strict=True):
            v = grid[i, j]
            shade = im.norm(v)
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="black" if shade > 0.5 else "white")
    fig.colorbar(im, ax=ax, label=h.label)
    return _png(fig)


def _cut(s: str) -> str:
    return s if len(s) <= MAX_LABEL else s[: MAX_LABEL - 1] + "…"


# --- the page -------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}code{word-break:break-all}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:1em}
.plots img{width:100%;border:1px solid #eee}.note{color:#a00}
"""


def render_html(data: ReportData, pngs: Mapping[str, bytes]) -> str:
    """One page that needs nothing else: the PNGs as ``data:`` URIs, CSS inline, every
    string from the run escaped."""
    e = html.escape
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(data.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(data.title)}</h1>",
    ]
    parts += [f'<p class="note">{e(n)}</p>' for n in data.notes]
    parts.append('<h2>Summary</h2><table id="summary">')
    parts += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in data.summary]
    parts.append('</table><h2>Plots</h2><div class="plots">')
    alts = {"loss": "loss by round", "accuracy": "accuracy by round", "scores": data.heatmap.title, "bytes": "bytes"}
    for name in PLOTS:
        if name in pngs:
            b64 = base64.b64encode(pngs[name]).decode("ascii")
            parts.append(f'<img id="{name}" alt="{e(alts[name])}" src="data:image/png;base64,{b64}">')
    parts.append("</div>")
    if data.workers:
        parts.append('<h2>Workers</h2><table id="workers"><tr><th>worker</th><th>status</th>')
        parts.append("<th>score</th><th>paid (AIT)</th><th>flags</th></tr>")
        for w in data.workers:
            parts.append(
                f"<tr><td><code>{e(w.worker_id)}</code></td><td>{e(w.status)}</td>"
                f'<td class="n">{e(_num(w.score, ".3f"))}</td><td class="n">{e(w.paid or "-")}</td>'
                f"<td>{e(', '.join(w.flags))}</td></tr>"
            )
        parts.append("</table>")
    parts.append('<h2>Rounds</h2><table id="rounds"><tr><th>round</th><th>val loss</th><th>val accuracy</th>')
    parts.append("<th>train loss</th><th>train accuracy</th><th>bytes up</th><th>bytes down</th>")
    parts.append("<th>accepted</th><th>rejected</th></tr>")
    for p in data.rounds:
        cells = (
            str(p.round),
            _num(p.val_loss),
            _num(p.val_accuracy),
            _num(p.train_loss),
            _num(p.train_accuracy),
            _bytes(p.bytes_up),
            _bytes(p.bytes_down),
            "-" if p.accepted is None else str(p.accepted),
            "-" if p.rejected is None else str(p.rejected),
        )
        parts.append("<tr>" + "".join(f'<td class="n">{e(c)}</td>' for c in cells) + "</tr>")
    parts.append("</table></body></html>\n")
    return "\n".join(parts)


def _num(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(float(v), spec)


def _bytes(n: Any) -> str:
    if n is None:
        return "-"
    x = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(x) < 1000:
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1000
    return f"{x:.1f} TB"
