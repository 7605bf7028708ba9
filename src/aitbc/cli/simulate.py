"""``aitbc simulate``: a whole multi-worker training in one process on a virtual clock."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from aitbc import run_defaults as defaults
from aitbc.cli import checks
from aitbc.cli.common import DEFAULT_HOME, HomeOption, err, out, resolve_home
from aitbc.cli.options import (
    Aggregator,
    BatchSize,
    Buffer,
    Compression,
    Deadline,
    ErrorFeedback,
    EvalEvery,
    LocalSteps,
    Lr,
    MaxBytes,
    MaxStaleness,
    Mode,
    ModelOpt,
    Outer,
    OuterLr,
    OuterMomentum,
    Quorum,
    Rounds,
    Seed,
    Staleness,
    Topology,
)
from aitbc.core.options import parse_kv
from aitbc.errors import UsageError

if TYPE_CHECKING:
    from aitbc.sim.config import SimConfig
    from aitbc.sim.runner import SimResult, Simulation


ModelChoice = Annotated[
    str,
    typer.Option(
        help="mlp, cnn, transformer, or package.module:callable (your own code: simulate runs on your machine)."
    ),
]
Dataset = Annotated[str, typer.Option(help="digits, stdlib, text:PATH or npz:PATH.")]
Workers = Annotated[int, typer.Option(help="Number of virtual workers.")]
InnerOpt = Annotated[str, typer.Option(help="Inner optimizer: adamw, adam, sgd.")]
Alpha = Annotated[float | None, typer.Option(help="Dirichlet label skew; smaller is more non-IID. IID if unset.")]
Speeds = Annotated[str, typer.Option(help="Relative compute speed: one value or one per worker, e.g. 1,1,1,0.1.")]
Bandwidth = Annotated[str, typer.Option(help="Link bandwidth in Mbit/s: one value or one per worker.")]
Latency = Annotated[str, typer.Option(help="One-way latency in ms: one value or one per worker.")]
Attack = Annotated[
    str | None,
    typer.Option(
        help="Byzantine attack spec: sign-flip, gaussian, label-flip, alie, ipm, free-rider; "
        "absent: the attackers take no part (the reference for an attacked run)."
    ),
]
Byzantine = Annotated[int, typer.Option(help="Number of Byzantine workers (chosen by seed).")]
TargetLoss = Annotated[
    float | None, typer.Option(help="Report bytes and virtual seconds to reach this validation loss.")
]
TargetAccuracy = Annotated[
    float | None, typer.Option(help="Report bytes and virtual seconds to reach this validation accuracy.")
]
EvalSamples = Annotated[int, typer.Option(help="Validation samples evaluated each round.")]
OutDir = Annotated[Path | None, typer.Option("--out", help="Run directory (metrics.jsonl); default HOME/sims/<time>.")]
Report = Annotated[
    Path | None,
    typer.Option(
        "--report",
        help="Also write a report into this folder: PNG plots (loss, accuracy, a worker-by-round heatmap, "
        "bytes) and a self-contained report.html.",
    ),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line of stdout.")]
Threads = Annotated[
    int | None,
    typer.Option(
        help="CPU threads for torch (default: OMP_NUM_THREADS, else the physical cores this process may run on; "
        "waiting threads sleep, so a busy machine does not slow it down 10x)."
    ),
]


def simulate(
    ctx: typer.Context,
    model: ModelChoice = "mlp",
    dataset: Dataset = "digits",
    workers: Workers = 8,
    rounds: Rounds = defaults.ROUNDS,
    local_steps: LocalSteps = defaults.LOCAL_STEPS,
    batch_size: BatchSize = defaults.BATCH_SIZE,
    lr: Lr = defaults.LR,
    inner_opt: InnerOpt = defaults.INNER_OPT,
    outer: Outer = defaults.OUTER,
    outer_lr: OuterLr = None,
    outer_momentum: OuterMomentum = None,
    alpha: Alpha = None,
    seed: Seed = 0,
    speeds: Speeds = "1",
    bandwidth: Bandwidth = "100",
    latency: Latency = "20",
    model_opt: ModelOpt = None,
    compression: Compression = defaults.COMPRESSION,
    error_feedback: ErrorFeedback = defaults.ERROR_FEEDBACK,
    aggregator: Aggregator = None,
    attack: Attack = None,
    byzantine: Byzantine = 0,
    mode: Mode = defaults.MODE,
    deadline: Deadline = None,
    quorum: Quorum = None,
    max_staleness: MaxStaleness = 4,
    staleness: Staleness = "polynomial",
    buffer: Buffer = None,
    topology: Topology = "ring",
    target_loss: TargetLoss = None,
    target_accuracy: TargetAccuracy = None,
    eval_every: EvalEvery = defaults.EVAL_EVERY,
    max_bytes: MaxBytes = defaults.MAX_CORPUS_BYTES,
    eval_samples: EvalSamples = 1024,
    out_dir: OutDir = None,
    report: Report = None,
    json_out: JsonOut = False,
    threads: Threads = None,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Run a whole training with N virtual workers in one process (same seed, same numbers)."""
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be at least 1; got {threads}")
    # Before torch loads: its OpenMP threads must sleep, not spin, while they wait for work.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from aitbc.sim.runner import Simulation  # torch import is slow; keep --help fast

    _use_threads(threads if threads is not None else torch_threads())
    cfg = _sim_config(ctx.params)
    home = resolve_home(home)
    run_dir = out_dir or home / "sims" / time.strftime(f"%Y%m%d-%H%M%S-seed{seed}")

    if report is not None:
        from aitbc.reports import prepare_dir

        prepare_dir(report)  # a folder we cannot write refuses before any training
    sim = Simulation(cfg, home=home, out_dir=run_dir)  # every option is checked here, before training
    result = _run(sim, rounds, quiet=json_out)
    if report is not None:
        written = _write_report(sim, result, report)
        err.print(f"report: {written}", highlight=False)
    if json_out:
        print(result.to_json())
        return
    out.print(_result_table(cfg, result))


def _sim_config(options: Mapping[str, Any]) -> SimConfig:
    """The simulation the command's options ask for: each option named as a field of
    :class:`SimConfig` is that field; the model's and the outer optimizer's options are
    parsed and the choices checked first, each refusal naming its flag."""
    from aitbc.sim.config import SimConfig

    outer_options = checks.outer_options(options["outer_lr"], options["outer_momentum"])
    model_options = parse_kv(options["model_opt"] or [], what="model")
    checks.model(options["model"], model_options, option="--model")
    checks.dataset_name(options["dataset"])
    if options["aggregator"] is not None:
        checks.aggregator(options["aggregator"])
    checks.codec(options["compression"])
    checks.outer(options["outer"], outer_options)
    same = {f.name for f in fields(SimConfig)} & set(options)
    return SimConfig(
        **{name: options[name] for name in same if name != "quorum"},
        model_options=model_options,
        outer_options=outer_options,
        # the simulator's default: 1, as --min-workers
        quorum=SimConfig.quorum if options["quorum"] is None else options["quorum"],
    )


def _run(sim: Simulation, rounds: int, *, quiet: bool) -> SimResult:
    """``sim`` run to its end, with a progress bar on stderr (cleared after if ``quiet``)."""
    with Progress(
        TextColumn("[bold]simulate"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=err,
        transient=quiet,
    ) as bar:
        task = bar.add_task("rounds", total=rounds, status="")

        def on_round(row: dict) -> None:
            acc = row["val_accuracy"]
            status = f"val_loss {row['val_loss']:.4f}" + (f"  acc {acc:.3f}" if acc is not None else "")
            bar.update(task, advance=1, status=status)

        return sim.run(on_round)


def _result_table(cfg: SimConfig, result: SimResult) -> Table:
    title = (
        f"simulation: {cfg.model} on {cfg.dataset}, {cfg.workers} workers, {cfg.mode}, {cfg.outer},\n"
        f"{cfg.aggregator_spec}, {cfg.compression}"  # two lines: an aggregation spec alone can be long
    )
    if cfg.byzantine:
        title += f", {cfg.byzantine} absent (taking no part)" if cfg.absent else f", {cfg.byzantine} x {cfg.attack}"
    table = Table(title=title, show_header=False)
    table.add_column(overflow="fold")
    table.add_column(overflow="fold")
    acc = result.final_val_accuracy
    rows = [
        ("rounds x local steps", f"{result.rounds} x {cfg.local_steps}"),
        ("parameters", f"{result.params:,}"),
        ("validation loss", f"{result.initial_val_loss:.4f} -> {result.final_val_loss:.4f}"),
        ("validation accuracy", "n/a (language model)" if acc is None else f"{acc:.4f}"),
        ("bytes up / down", f"{_mib(result.bytes_up)} / {_mib(result.bytes_down)}"),
        ("compression ratio", f"{result.compression_ratio:.1f}x"),
        ("updates rejected / dropped", f"{result.rejected_updates} / {result.dropped_updates}"),
        ("rounds skipped (too few updates)", str(result.skipped_rounds)),
        ("virtual time", f"{result.virtual_seconds:.2f} s"),
        ("wall time", f"{result.wall_seconds:.2f} s"),
        ("final model CID", result.final_model_cid),
        ("metrics", result.metrics_path),
    ]
    if acc is None:
        rows.insert(3, ("uniform-byte baseline", f"{math.log(256):.4f}"))
    if cfg.target_loss is not None or cfg.target_accuracy is not None:
        reached = (
            "not reached"
            if result.rounds_to_target is None
            else f"round {result.rounds_to_target}, {_mib(result.bytes_to_target or 0)} up, "
            f"{result.virtual_seconds_to_target:.2f} virtual s"
        )
        rows.append(("target", reached))
    if result.spread is not None:
        rows.append(("model spread (gossip)", f"{result.spread:.4g}"))
    for k, v in rows:
        table.add_row(k, v)
    # At a narrow width the names wrap at words and a path folds; the CID (copied) stays whole.
    keys = max(len(w) for k, _ in rows for w in k.split())
    room = out.width - 7  # borders and padding of two columns
    if max(len(k) for k, _ in rows) + max(len(v) for _, v in rows) > room:
        table.columns[1].width = max(len(result.final_model_cid), room - max(keys, room // 3))
        table.columns[0].width = max(keys, room - table.columns[1].width)
    return table


def _write_report(sim: Simulation, result: SimResult, folder: Path) -> Path:
    """The simulation's report (``aitbc.reports``) from its metrics rows and update norms."""
    import json
    from dataclasses import asdict

    from aitbc.reports import from_simulation, write_report

    rows = [json.loads(line) for line in Path(result.metrics_path).read_text().splitlines() if line.strip()]
    data = from_simulation(result=asdict(result), rows=rows, update_norms=sim.update_norms)
    return write_report(data, folder)["html"]


def torch_threads() -> int:
    """Threads for one torch process: ``OMP_NUM_THREADS`` if set, else the physical cores
    of this machine that this process may run on (affinity, a container's CPU set), at least 1. Not the logical CPUs
    (hyper-threads share a core's arithmetic units) and not the load of the moment (the
    same command on the same machine keeps the same numbers).

    torch's own default spins its OpenMP threads while they wait for work; when another
    process holds a core, every parallel op then waits for a descheduled spinner
    (``bench/simulate_contention.py`` measures it). ``simulate`` sets
    ``OMP_WAIT_POLICY=PASSIVE`` (unless set) so waiting threads sleep instead."""
    import psutil

    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:  # the user's (or a launcher's) own choice
        return int(given)
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        allowed = os.cpu_count() or 1
    return max(1, min(psutil.cpu_count(logical=False) or allowed, allowed))


def _use_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # set once per process, before any inter-op work
        torch.set_num_interop_threads(1)  # the simulator runs one op at a time


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
