"""``aitbc distributed-training``: the training owner's workflow against a coordinator.

    init -> upload-data -> discover-workers -> distribute -> monitor -> results

Each command drives the SDK's :class:`~aitbc_agent_sdk.Agent` (the one client of the
coordinator's ``/v1`` API: every request body and client-side rule is built there), signed
with the owner's wallet, and prints what it returns. ``init`` remembers which wallet and
coordinator a run belongs to in ``HOME/runs/<id>.json`` so the later commands need only
``--training-id``.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from aitbc import run_defaults as defaults
from aitbc.cli import checks
from aitbc.cli.common import (
    DEFAULT_HOME,
    CoordinatorOption,
    HomeOption,
    agent,
    err,
    fit,
    naming_wallet,
    others,
    out,
    page,
    resolve_home,
    shown,
)
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
    Quorum,
    Rounds,
    Seed,
    Staleness,
    Topology,
)
from aitbc.cli.progress import bars
from aitbc.core.options import parse_kv
from aitbc.errors import AitbcError, NotFoundError, UsageError
from aitbc.units import format_price

if TYPE_CHECKING:
    from aitbc.trackers import TensorBoardLog
    from aitbc_agent_sdk import Agent

app = typer.Typer(
    help="Train one model on hired providers: init, upload-data, discover-workers, distribute, monitor.",
    no_args_is_help=True,
)

CoordinatorOpt = CoordinatorOption
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
RunIdOpt = Annotated[
    str, typer.Option("--training-id", help="The run, as printed by init (training_...).", show_default=False)
]
WalletOpt = Annotated[str | None, typer.Option("--wallet", help="Owner's wallet (default: the one init used).")]
LogToOpt = Annotated[
    str | None,
    typer.Option(
        "--log-to",
        help="Also write each closed round's metrics to an experiment tracker, from this machine as rounds "
        "close: tensorboard:DIR (TensorBoard event files; needs the extra: pip install 'aitbc[tensorboard]').",
        show_default=False,
    ),
]


# --- plumbing -----------------------------------------------------------------------


def _runs_dir(home: Path) -> Path:
    return home / "runs"


def _remember(home: Path, run_id: str, wallet: str, url: str) -> None:
    d = _runs_dir(home)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{run_id}.json").write_text(json.dumps({"training_id": run_id, "wallet": wallet, "coordinator": url}))


def _recall(home: Path, run_id: str) -> dict[str, Any]:
    try:
        return json.loads((_runs_dir(home) / f"{run_id}.json").read_text())
    except (OSError, ValueError):
        return {}


def _agent(
    home: Path,
    coordinator: str | None,
    run_id: str | None = None,
    wallet: str | None = None,
    *,
    need_wallet: bool = False,
) -> Agent:
    """The agent for a run: at the coordinator ``init`` used (unless ``--coordinator``),
    signed by the owner's wallet when the command changes the run (``need_wallet``);
    read-only otherwise."""
    known = _recall(home, run_id) if run_id else {}
    name = wallet or known.get("wallet")
    if need_wallet and not name:
        raise UsageError(f"run {run_id} was not started from {home}; pass --wallet NAME (the owner's wallet)")
    return agent(home, coordinator or known.get("coordinator"), name if need_wallet else None)


def _api_view(run: dict[str, Any]) -> dict[str, Any]:
    """A run as the API sends it: without the ``phase`` the SDK adds (it repeats ``status``)."""
    return {k: v for k, v in run.items() if k != "phase"}


def _say(*lines: str) -> None:
    for line in lines:
        out.print(line, highlight=False)


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    x = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(x) < 1000 or unit == "TB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1000
    return str(x)


def _fmt(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


# --- init ---------------------------------------------------------------------------


@app.command()
def init(
    wallet: Annotated[
        str, typer.Option("--wallet", help="The owner's wallet (created if it does not exist).", show_default=False)
    ],
    model_type: Annotated[
        str,
        typer.Option(
            "--model-type",
            help="mlp, cnn, transformer (options bounded: see the README's trust model); a package.module:callable "
            "only where the coordinator's and the workers' operators allowed it (--allow-code).",
            show_default=False,
        ),
    ],
    dataset_size: Annotated[
        str,
        typer.Option(
            "--dataset-size",
            help="Declared size, e.g. 100GB (the real size is measured at upload).",
            show_default=False,
        ),
    ],
    target_workers: Annotated[
        int, typer.Option("--target-workers", help="Workers (and data shards) to plan for.", show_default=False)
    ],
    model_opt: ModelOpt = None,
    seed: Seed = 0,
    budget: Annotated[
        str | None,
        typer.Option(help="AIT to escrow now from the wallet (default: distribute escrows the contracts' cost)."),
    ] = None,
    bond: Annotated[
        str, typer.Option(help="AIT each hired provider locks for the run (slashed for provable misbehaviour).")
    ] = "0",
    network: Annotated[
        str, typer.Option(help="Ledger network: local (this build settles on the local ledger only).")
    ] = "local",
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Create a training run."""
    from aitbc.ledger.chain import LedgerError, check_network  # not .book: no SQLAlchemy for a CLI command
    from aitbc.ledger.wallet import create_wallet, load_wallet

    home = resolve_home(home)
    checks.at_least(target_workers, 1, "--target-workers")
    try:
        check_network(network)
    except LedgerError as e:
        raise UsageError(f"--network: {e.detail}") from None
    model_options = parse_kv(model_opt or [], what="--model-opt")
    checks.size(dataset_size)
    checks.model(model_type, model_options)
    if budget is not None:
        checks.amount(budget, option="--budget")
    checks.price(bond, option="--bond")
    try:
        load_wallet(home, wallet)
    except NotFoundError:
        w = create_wallet(home, wallet)
        err.print(f"created wallet {wallet} ({w.address})", highlight=False)
    with (
        agent(home, coordinator, wallet, network) as a,
        naming_wallet(wallet),
        checks.naming_flags(
            "model_type", "dataset_size", "target_workers", "seed", "budget", "bond", model_options="--model-opt"
        ),
    ):
        run = a.initialize_distributed_training(
            model_type, dataset_size, target_workers, model_options=model_options, seed=seed, budget=budget, bond=bond
        )
        url = a.config.resolved_coordinator_url
    _remember(home, run["training_id"], wallet, url)
    if json_out:
        _emit_json(_api_view(run))
        return
    _say(
        "Distributed training initialized",
        f"Training ID: {run['training_id']}",
        f"Model Type: {run['model_type']}",
        f"Dataset Size: {run['dataset_size']}",
        f"Target Workers: {run['target_workers']}",
        f"Status: {run['status']}",
    )


# --- upload-data ---------------------------------------------------------------------


@app.command("upload-data")
def upload_data(
    training_id: RunIdOpt,
    data_path: Annotated[
        str,
        typer.Option("--data-path", help="digits, stdlib, a text file or folder, or an .npz file.", show_default=False),
    ],
    alpha: Annotated[float | None, typer.Option(help="Dirichlet label skew of the shards (IID if unset).")] = None,
    max_bytes: MaxBytes = defaults.MAX_CORPUS_BYTES,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Split the dataset into one shard per target worker and upload shards and manifest."""
    home = resolve_home(home)
    checks.at_least(max_bytes, 1, "--max-bytes")
    checks.more_than(alpha, 0, "--alpha")
    checks.dataset(data_path)
    with (
        _agent(home, coordinator, training_id, wallet, need_wallet=True) as a,
        checks.naming_flags("alpha", "max_bytes", data_path="--data-path"),
        bars(json_out) as progress,  # packaging, uploading: on stderr, at a terminal only
    ):
        up = a.upload_data(training_id, data_path, alpha=alpha, max_bytes=max_bytes, progress=progress)
    if json_out:
        keys = ("training_id", "manifest_cid", "shards", "val_cid", "samples", "data_bytes", "dataset")
        _emit_json({k: up[k] for k in keys})
        return
    _say(
        "Data uploaded",
        f"Training ID: {training_id}",
        f"Dataset: {up['dataset']} ({up['task']}, {up['samples']} training samples, {up['val_samples']} validation)",
        f"Shards: {len(up['shards'])}",
        f"Size: {_human_bytes(up['data_bytes'])} measured (declared {up['dataset_size']})",
        f"Manifest CID: {up['manifest_cid']}",
    )


# --- discover-workers ------------------------------------------------------------------


@app.command("discover-workers")
def discover_workers(
    training_id: RunIdOpt,
    required_workers: Annotated[int, typer.Option("--required-workers", help="Workers to hire.", show_default=False)],
    min_gpu: Annotated[str | None, typer.Option("--min-gpu", help="Weakest GPU class accepted, e.g. RTX3090.")] = None,
    max_price: Annotated[
        str | None, typer.Option("--max-price", help="Highest price per round accepted, in AIT.")
    ] = None,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Rank live offers (GPU, price, reputation, availability) and hire the best."""
    home = resolve_home(home)
    checks.at_least(required_workers, 1, "--required-workers")
    if min_gpu is not None:
        checks.gpu_class(min_gpu)
    if max_price is not None:
        checks.price(max_price, option="--max-price")
    with (
        _agent(home, coordinator, training_id, wallet, need_wallet=True) as a,
        checks.naming_flags("required_workers", "min_gpu", "max_price"),
    ):
        res = a.hire_workers(training_id, required_workers, min_gpu=min_gpu, max_price=max_price)
    if json_out:
        _emit_json(res)
        return
    t = Table(title=f"Offers for {training_id}" + (f" (GPU >= {min_gpu})" if min_gpu else ""))
    for col in ("#", "worker", "GPU", "price/round", "reputation", "availability", "score", "hired"):
        t.add_column(col, justify="right" if col not in ("worker", "GPU") else "left")
    for i, r in enumerate(res["ranked"], 1):
        t.add_row(
            str(i),
            r["worker_id"],
            others(r["gpu_type"]),  # the provider's words
            f"{r['price']:.2f}",
            f"{r['reputation']:.2f}",
            f"{r['availability']:.2f}",
            f"{r['score']:.3f}",
            "yes" if r["hired"] else "",
        )
    out.print(fit(t, whole=("worker",), drop=("availability", "reputation", "#", "score")))
    out.print(f"Contracted {res['count']} worker{'s' if res['count'] != 1 else ''} for {training_id}", highlight=False)


# --- distribute ----------------------------------------------------------------------


DISTRIBUTE_FIELDS = (
    "rounds",
    "local_steps",
    "batch_size",
    "lr",
    "outer",
    "aggregator",
    "compression",
    "error_feedback",
    "deadline",
    "quorum",
    "min_workers",
    "max_workers",
    "eval_every",
    "verify_rate",
    "overlap",
    "precision",
    "mode",
    "buffer",
    "max_staleness",
    "staleness",
    "topology",
)


@app.command()
def distribute(
    training_id: RunIdOpt,
    strategy: Annotated[str, typer.Option(help="data-parallel (the one strategy this build runs).")] = "data-parallel",
    rounds: Rounds = defaults.ROUNDS,
    local_steps: LocalSteps = defaults.LOCAL_STEPS,
    batch_size: BatchSize = defaults.BATCH_SIZE,
    lr: Lr = defaults.LR,
    outer: Outer = defaults.OUTER,
    aggregator: Aggregator = defaults.AGGREGATOR,
    compression: Compression = defaults.COMPRESSION,
    error_feedback: ErrorFeedback = defaults.ERROR_FEEDBACK,
    mode: Mode = defaults.MODE,
    deadline: Deadline = None,
    quorum: Quorum = None,
    min_workers: Annotated[int | None, typer.Option(help="Fewest workers the run trains with (default 1).")] = None,
    max_workers: Annotated[
        int | None, typer.Option(help="Most workers, joiners included (default: target workers).")
    ] = None,
    eval_every: EvalEvery = defaults.EVAL_EVERY,
    verify_rate: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Spot checks: the expected share of each update's local steps the coordinator re-runs "
            "(0: none). Verified updates are paid in full; one that fails is rejected and its worker slashed.",
        ),
    ] = defaults.VERIFY_RATE,
    overlap: Annotated[
        int,
        typer.Option(
            min=0,
            max=2,
            help="Overlapping rounds: 1 lets a worker start round r+1 from the newest published model as soon "
            "as it has sent round r, its update applied to the newer model (one-step delay: less idle time). "
            "2 lets it train two rounds ahead and send the next round's update before that round opens "
            "(two-step delay: for rounds whose close and model download take longer than their compute). "
            "0: synchronous rounds.",
        ),
    ] = defaults.OVERLAP,
    precision: Annotated[
        str,
        typer.Option(
            help="The workers' inner steps: fp32, or bf16 (bfloat16 autocast on CPU and CUDA; weights, "
            "gradients and optimizer state stay float32).",
        ),
    ] = defaults.PRECISION,
    buffer: Buffer = None,
    max_staleness: MaxStaleness = 4,
    staleness: Staleness = "polynomial",
    topology: Topology = "ring",
    log_to: LogToOpt = None,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Assign shards to the hired workers and start the rounds. With ``--log-to``, stay
    attached like ``monitor``: write each closed round's metrics to the tracker until the
    run ends (exit 1 if it fails; Ctrl-C detaches, the run goes on)."""
    home = resolve_home(home)
    if strategy != "data-parallel":
        raise UsageError(f"--strategy {strategy!r} is not available; this build runs: data-parallel")
    if mode not in ("sync", "async", "gossip"):
        raise UsageError(f"--mode {mode!r} is not a mode; choose one of: sync, async, gossip")
    if mode == "gossip":
        checks.topology(topology)
    checks.outer(outer)
    checks.aggregator(aggregator)
    checks.codec(compression)
    if precision not in defaults.PRECISIONS:
        raise UsageError(f"--precision {precision!r} is not available; choose one of: {', '.join(defaults.PRECISIONS)}")
    tracker = _open_tracker(log_to, training_id)  # refused (exit 2) before anything is distributed
    with (
        _closing(tracker),
        _agent(home, coordinator, training_id, wallet, need_wallet=True) as a,
        naming_wallet(wallet or _recall(home, training_id).get("wallet")),
        checks.naming_flags(*DISTRIBUTE_FIELDS),
    ):
        # A run without a budget escrows its contracts' cost now; the SDK signs the most
        # it may be (price x rounds) as max_cost.
        run = a.start_training(
            training_id,
            rounds,
            local_steps,
            batch_size=batch_size,
            lr=lr,
            outer=outer,
            aggregator=aggregator,
            compression=compression,
            error_feedback=error_feedback,
            deadline=deadline,
            quorum=quorum,
            min_workers=min_workers,
            max_workers=max_workers,
            eval_every=eval_every,
            verify_rate=verify_rate,
            overlap=overlap,
            precision=precision,
            mode=mode,
            buffer=buffer,
            max_staleness=max_staleness,
            staleness=staleness,
            topology=topology,
        )
        if json_out:
            _emit_json(_api_view(run))
        else:
            _say_distributed(run, strategy)
        if tracker is not None:
            _follow(a, training_id, tracker, log_to, quiet=json_out)


def _say_distributed(run: dict[str, Any], strategy: str) -> None:
    cfg = run["config"]
    per_round = sum(ct["price_micro"] for ct in run["contracts"] if ct["status"] == "working")
    _say(
        "Training distributed",
        f"Training ID: {run['training_id']}",
        f"Strategy: {strategy}",
        f"Workers: {len(run['workers'])} on {run['shards']} shards",
        f"Rounds: {cfg['rounds']} x {cfg['local_steps']} local steps",
        f"Aggregator: {cfg['aggregator']}   Compression: {cfg['compression']}   Outer: {cfg['outer']}",
        f"Verification: {_verification_line(cfg)}",
        f"Rounds overlap: {_overlap_line(cfg.get('overlap') or 0)}",
        f"Estimated cost: {format_price(per_round * cfg['rounds'])} AIT",
        f"Status: {run['status']}",
    )


def _overlap_line(overlap: int) -> str:
    if not overlap:
        return "no (synchronous)"
    return "yes (one-step delay)" if overlap == 1 else f"yes ({overlap} rounds ahead, {overlap}-step delay)"


def _verification_line(cfg: dict[str, Any]) -> str:
    rate = float(cfg.get("verify_rate") or 0.0)
    if not rate:
        return "none (updates are scored, not re-run; --verify-rate to spot-check them)"
    return f"spot checks re-run {rate:.0%} of each update's steps (about {rate:.0%} extra compute on the coordinator)"


# --- monitor, status, list ------------------------------------------------------------


# At a narrow width, the worker table drops these first (the id, progress and status stay).
RUN_VIEW_DROPS = ("heartbeat", "epoch", "this round", "shard", "flags", "rounds", "score", "loss")


def _run_view(run: dict[str, Any]) -> Group:
    cfg = run.get("config") or {}
    head = Table.grid(padding=(0, 2))
    head.add_row(
        f"[b]{run['training_id']}[/b]",
        f"status [b]{run['status']}[/b]",
        f"round {run['round']}/{cfg.get('rounds', '-')}",
        f"completed {run['rounds_completed']}",
    )
    head.add_row(
        f"val loss {_fmt(run['initial_val_loss'])} -> {_fmt(run['val_loss'])}",
        f"val acc {_fmt(run['val_accuracy'], '.3f')}",
        f"bytes up {_human_bytes(run['bytes_up'])}",
        f"down {_human_bytes(run['bytes_down'])}",
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
            f"consensus spread {_fmt(g['spread'])}",
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
            _fmt(w["loss"]),
            f"{w['epoch']:.2f}",
            w["status"],
            str(w["rounds_done"]),
            w["this_round"] or "",
            _fmt(w.get("score"), ".2f"),
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


def _finished(run: dict[str, Any]) -> None:
    """A failed run is an error (exit 1); a complete one, or one its owner stopped, is not."""
    if run["status"] == "failed":
        raise AitbcError(f"run {run['training_id']} failed: {run.get('error') or 'no reason recorded'}")


def _ended_line(run: dict[str, Any]) -> str:
    loss = f"val loss {_fmt(run['initial_val_loss'])} -> {_fmt(run['val_loss'])}"
    if run["status"] == "stopped":
        done = f"{run['rounds_completed']}/{(run.get('config') or {}).get('rounds', '-')} rounds"
        return f"Run {run['training_id']} stopped by its owner after {done}: {loss}, model {run['global_model_cid'] or '-'}"
    return f"Run {run['training_id']} complete: {loss}, model {run['global_model_cid']}"


def _changes(before: dict[str, Any] | None, run: dict[str, Any]) -> list[str]:
    """What changed between two snapshots of a run, one line each: the run's status, a
    round closed (with its evaluation), a worker's state, a worker joining. For a log:
    ``monitor`` writes these when its output is not a terminal."""
    cfg = run.get("config") or {}
    rounds = cfg.get("rounds", "-")
    if before is None:
        return [
            f"{run['training_id']}: {run['status']}, round {run['round']}/{rounds}, "
            f"{len(run['workers'])} worker{'s' if len(run['workers']) != 1 else ''}, "
            f"val loss {_fmt(run['val_loss'])}"
        ]
    lines = []
    if run["rounds_completed"] > before["rounds_completed"]:  # each round, if several closed between two looks
        evaluated = run["val_loss"] != before["val_loss"] or run["val_accuracy"] != before["val_accuracy"]
        lines += [f"round {k}/{rounds} closed" for k in range(before["rounds_completed"] + 1, run["rounds_completed"])]
        lines.append(
            f"round {run['rounds_completed']}/{rounds} closed"
            + (f": val loss {_fmt(run['val_loss'])}, val acc {_fmt(run['val_accuracy'], '.3f')}" if evaluated else "")
        )
    elif run["val_loss"] != before["val_loss"]:
        lines.append(f"evaluation: val loss {_fmt(run['val_loss'])}, val acc {_fmt(run['val_accuracy'], '.3f')}")
    seen = {w["worker_id"]: w for w in before["workers"]}
    for w in run["workers"]:
        old = seen.get(w["worker_id"])
        if old is None:
            lines.append(f"worker {w['worker_id']} joined: shard {w['shard_index']}, {w['status']}")
        elif old["status"] != w["status"]:
            loss = "" if w["loss"] is None else f", loss {_fmt(w['loss'])}"
            lines.append(f"worker {w['worker_id']}: {old['status']} -> {w['status']} (round {run['round']}{loss})")
    if run["status"] != before["status"]:
        lines.append(f"run {before['status']} -> {run['status']}" + (f": {run['error']}" if run.get("error") else ""))
    return lines


def _log(lines: list[str]) -> None:
    """Each line as it happens: written and flushed at once (a pipe or a file buffers)."""
    stamp = time.strftime("%H:%M:%S")
    for line in lines:
        out.file.write(f"{stamp} {line}\n")
    out.file.flush()


def _open_tracker(log_to: str | None, training_id: str) -> TensorBoardLog | None:
    """The ``--log-to`` tracker, opened (or refused, exit 2) before anything else happens."""
    if log_to is None:
        return None
    from aitbc.trackers import open_log, parse_log_to

    return open_log(parse_log_to(log_to), training_id)


@contextlib.contextmanager
def _closing(tracker: TensorBoardLog | None) -> Iterator[None]:
    try:
        yield
    finally:
        if tracker is not None:
            tracker.close()


def _track(a: Agent, training_id: str, tracker: TensorBoardLog | None) -> None:
    """Write what the tracker does not hold yet: the closed rounds and their scores."""
    if tracker is not None:
        from aitbc.trackers import round_values

        tracker.log(round_values(a.get_rounds(training_id), a.get_round_scores(training_id)))


class Detached(AitbcError):
    """Ctrl-C while ``distribute --log-to`` follows its run: the run goes on; exit 130."""

    exit_code = 130
    code = "interrupted"


class _CtrlC:
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

    def __enter__(self) -> _CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


DRAIN_SECONDS = 20.0  # after the run ends, how long to wait for its last evaluation and scores


def _drain(a: Agent, run: dict[str, Any], tracker: TensorBoardLog | None, ctrl_c: _CtrlC | None = None) -> None:
    """After the run ended: the last round's evaluation and its workers' scores land a
    moment later (the coordinator scores closed rounds in the background); write them
    too, waiting at most ``DRAIN_SECONDS``."""
    if tracker is None:
        return
    from aitbc.trackers import round_values

    training_id = run["training_id"]
    until = time.monotonic() + DRAIN_SECONDS
    while True:
        rounds = a.get_rounds(training_id)
        scores = a.get_round_scores(training_id)
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


def _follow(a: Agent, training_id: str, tracker: TensorBoardLog, log_to: str | None, *, quiet: bool) -> None:
    """``distribute --log-to``: follow the run as ``monitor`` does for a log (one line per
    change unless ``quiet``), writing the tracker, until the run ends; then as monitor:
    exit 1 if it failed."""
    if not quiet:
        _say(f"Logging to {log_to}; following the run until it ends (Ctrl-C detaches, the run goes on)")
    try:
        with _CtrlC() as ctrl_c:
            run = _api_view(a.get_training_status(training_id))
            _track(a, training_id, tracker)
            if not quiet:
                _log(_changes(None, run))
            while run["status"] not in ENDED:
                time.sleep(1.0)
                ctrl_c.check()
                before, run = run, _api_view(a.get_training_status(training_id))
                _track(a, training_id, tracker)
                if not quiet:
                    _log(_changes(before, run))
                ctrl_c.check()
            _drain(a, run, tracker, ctrl_c)
    except KeyboardInterrupt:
        raise Detached(
            f"interrupted: run {training_id} goes on training; re-attach with: aitbc distributed-training "
            f"monitor --training-id {shlex.quote(training_id)} --log-to {shlex.quote(log_to or '')}"
        ) from None
    _finished(run)
    if not quiet:
        _say(_ended_line(run))


@app.command()
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
    """Watch a run until it completes, fails (exit 1) or is stopped by its owner (exit 0):
    a live table in a terminal; elsewhere (a pipe, a log file) one line per change
    (round closed, evaluation, a worker's state, the run's status), written as it happens.
    With ``--log-to``, also writes the closed rounds' metrics to a tracker (those already
    closed first, none twice)."""
    home = resolve_home(home)
    checks.more_than(interval, 0, "--interval")
    t0 = time.monotonic()
    # Ctrl-C is taken between looks (see _CtrlC), then ends the command as any Ctrl-C does (exit 130);
    # from before the tracker locks its folder, so a Ctrl-C once it is locked always closes it.
    with _CtrlC() as ctrl_c:
        tracker = _open_tracker(log_to, training_id)
        with _closing(tracker), _agent(home, coordinator, training_id) as a:

            def look() -> dict[str, Any]:
                run = _api_view(a.get_training_status(training_id))
                _track(a, training_id, tracker)
                return run

            run = look()
            if once or json_out:
                while True:
                    if json_out:
                        _emit_json(run)
                    else:
                        out.print(_run_view(run))
                    if once or run["status"] in ENDED:
                        break
                    _check_timeout(t0, timeout, training_id)
                    time.sleep(interval)
                    ctrl_c.check()
                    run = look()
                if not once:
                    _drain(a, run, tracker, ctrl_c)
                    _finished(run)
                return
            if not out.is_terminal:  # a log: no redrawn table, one flushed line per change
                _log(_changes(None, run))
                while run["status"] not in ENDED:
                    _check_timeout(t0, timeout, training_id)
                    time.sleep(interval)
                    ctrl_c.check()
                    before, run = run, look()
                    _log(_changes(before, run))
            else:
                with Live(_run_view(run), console=out, refresh_per_second=4, transient=False) as live:
                    while run["status"] not in ENDED:
                        _check_timeout(t0, timeout, training_id)
                        time.sleep(interval)
                        ctrl_c.check()
                        run = look()
                        live.update(_run_view(run))
            _drain(a, run, tracker, ctrl_c)
    _finished(run)
    out.print(_ended_line(run), highlight=False)
    out.file.flush()


def _check_timeout(t0: float, timeout: float | None, run_id: str) -> None:
    if timeout is not None and time.monotonic() - t0 > timeout:
        raise AitbcError(f"run {run_id} did not finish within {timeout:g} s (monitor --timeout)")


@app.command()
def status(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """One snapshot of a run."""
    home = resolve_home(home)
    with _agent(home, coordinator, training_id) as a:
        run = _api_view(a.get_training_status(training_id))
    if json_out:
        _emit_json(run)
    else:
        out.print(_run_view(run))


@app.command("list")
def list_runs(
    status: Annotated[str | None, typer.Option(help="Only runs in this state.")] = None,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Every run on the coordinator, newest first."""
    home = resolve_home(home)
    with _agent(home, coordinator) as a:
        runs = a.list_trainings(status=status)
    if json_out:
        _emit_json(page(runs))
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
            _fmt(r["val_loss"]),
            str(r["target_workers"]),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"])),
        )
    out.print(fit(t, whole=("training id",), drop=("created", "workers", "model")))


# --- control and results ----------------------------------------------------------------


def _control(
    action: str, training_id: str, coordinator: str | None, wallet: str | None, json_out: bool, home: Path
) -> None:
    """``action``: stop, pause or resume (the agent's ``<action>_training``)."""
    home = resolve_home(home)
    with _agent(home, coordinator, training_id, wallet, need_wallet=True) as a:
        run = getattr(a, f"{action}_training")(training_id)
    if json_out:
        _emit_json(run)
    else:
        out.print(f"Run {training_id}: {run['status']}", highlight=False)


@app.command()
def stop(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """End a run now (its workers are released)."""
    _control("stop", training_id, coordinator, wallet, json_out, home)


@app.command()
def pause(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Hold a run after its current round's updates (resume continues it)."""
    _control("pause", training_id, coordinator, wallet, json_out, home)


@app.command()
def resume(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Continue a paused run."""
    _control("resume", training_id, coordinator, wallet, json_out, home)


@app.command()
def results(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Final metrics and the trained model's CID."""
    home = resolve_home(home)
    with _agent(home, coordinator, training_id) as a:
        res = a.get_results(training_id)
    if json_out:
        _emit_json(res)
        return
    t = Table(title=f"Results of {training_id}", show_header=False)
    t.add_column("key", style="bold")
    t.add_column("value")
    rows = [
        ("status", res["status"]),
        ("rounds", f"{res['rounds_completed']}/{res['rounds'] or '-'}"),
        ("validation loss", f"{_fmt(res['initial_val_loss'])} -> {_fmt(res['final_val_loss'])}"),
        ("validation accuracy", _fmt(res["final_val_accuracy"], ".4f")),
        ("updates accepted / rejected", f"{res['updates_accepted']} / {res['updates_rejected']}"),
        ("bytes up / down", f"{_human_bytes(res['bytes_up'])} / {_human_bytes(res['bytes_down'])}"),
        ("wall time", "-" if res["wall_seconds"] is None else f"{res['wall_seconds']:.1f} s"),
        ("model CID", res["model_cid"] or "-"),
    ]
    if res.get("error"):
        rows.append(("error", res["error"]))
    for k, v in rows:
        t.add_row(k, others(v))
    out.print(fit(t, whole=("value",) if not res.get("error") else ()))  # the CID whole; an error wraps
    if res.get("workers"):
        settled = res.get("settled_round")  # None: a coordinator that does not say
        behind = ""
        if settled is not None and settled < res["rounds_completed"]:  # settlement runs behind the rounds
            behind = f"; {settled} of {res['rounds_completed']} rounds settled so far"
        w = Table(title=f"Contribution scores (mean quality of scored rounds, 0-1{behind})")
        for col in ("worker", "contract", "score", "last round", "flags"):
            w.add_column(col)
        for r in res["workers"]:
            w.add_row(
                r["worker_id"],
                r["status"],
                _fmt(r["score"], ".3f"),
                _fmt(r["last_quality"], ".3f"),
                ", ".join(r["score_flags"]),
            )
        out.print(fit(w, whole=("worker",), drop=("last round", "flags", "contract")))


@app.command("download-model")
def download_model(
    training_id: RunIdOpt,
    output: Annotated[Path, typer.Option("-o", "--output", help="File to write (safetensors).", show_default=False)],
    round: Annotated[
        int | None, typer.Option("--round", help="A given round's checkpoint (default: the latest).")
    ] = None,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Download the model (a safetensors checkpoint), verified against its CID."""
    home = resolve_home(home)
    with _agent(home, coordinator, training_id) as a, bars(json_out) as progress:
        res = a.download_model(training_id, output, round=round, progress=progress)
    if json_out:
        _emit_json(res)
    else:
        out.print(f"Wrote {res['path']} ({_human_bytes(res['bytes'])}, CID {res['cid']})", highlight=False)


@app.command()
def verify(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Download every round's checkpoint, re-hash it against its recorded CID and check
    it is a loadable checkpoint of that round. A checkpoint whose bytes the coordinator's
    blob retention deleted is reported as pruned; the latest must be there. Exit 1 if any
    fails."""
    home = resolve_home(home)
    rows = []
    with _agent(home, coordinator, training_id) as a:
        for ck in a.get_round_checkpoints(training_id):
            v = a.verify_checkpoint(ck)
            rows.append(
                {
                    "round": ck["round"],
                    "cid": ck["checkpoint_cid"],
                    "ok": v["valid"],
                    "pruned": bool(v.get("pruned")),
                    "detail": v["detail"],
                }
            )
    if rows and rows[-1]["pruned"]:  # retention always keeps the latest: its absence is a failure
        rows[-1]["pruned"] = False
        rows[-1]["detail"] = "the latest checkpoint is missing"
    bad = [row for row in rows if not row["ok"] and not row["pruned"]]
    pruned = sum(row["pruned"] for row in rows)
    if json_out:
        _emit_json({"training_id": training_id, "checkpoints": rows, "ok": not bad, "pruned": pruned})
    else:
        t = Table(title=f"Checkpoints of {training_id}")
        for col in ("round", "CID", "verified"):
            t.add_column(col)
        for row in rows:
            shown = "OK" if row["ok"] else "pruned" if row["pruned"] else f"[red]FAILED: {row['detail']}[/red]"
            t.add_row(str(row["round"]), row["cid"], shown)
        out.print(fit(t, whole=("CID",)))
    if not rows:
        raise AitbcError(f"run {training_id} has no checkpoints yet")
    if bad:
        raise AitbcError(
            f"{len(bad)} of {len(rows)} checkpoints failed verification (first: round {bad[0]['round']}: {bad[0]['detail']})"
        )
    if not json_out:
        kept = len(rows) - pruned
        tail = f"; {pruned} older ones pruned by blob retention (CIDs recorded, bytes deleted)" if pruned else ""
        out.print(f"All {kept} {'kept ' if pruned else ''}checkpoints verified{tail}", highlight=False)


@app.command()
def payments(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Per worker: rounds accepted, score, paid, bond, slashed, reputation; and the escrow."""
    home = resolve_home(home)
    with _agent(home, coordinator, training_id) as a:
        res = a.get_payments(training_id)
    if json_out:
        _emit_json(res)
        return
    out.print(_payments_table(res))
    out.print(
        f"Escrowed {res['escrowed']} AIT; left in escrow {res['escrow_balance']} AIT; "
        f"settled through round {res['settled_round']}" + ("; finalized" if res["finalized"] else ""),
        highlight=False,
    )


def _payments_table(res: dict[str, Any]) -> Table:
    t = Table(title=f"Payments of {res['training_id']} ({res['network']} network, AIT)")
    for col in (
        "worker",
        "price/round",
        "rounds accepted",
        "score",
        "paid",
        "bond",
        "slashed",
        "reputation",
        "flags",
        "contract",
    ):
        t.add_column(col, justify="left" if col in ("worker", "flags", "contract") else "right")
    for r in res["data"]:
        t.add_row(
            r["worker_id"],
            format_price(r["price_micro"]),
            str(r["rounds_accepted"]),
            _fmt(r["score"], ".3f"),
            r["paid"],
            r["bond"],
            r["slashed"],
            _fmt(r["reputation"], ".2f"),
            ", ".join(r["flags"]),
            r["status"],
        )
    return fit(
        t,
        whole=("worker",),
        drop=("reputation", "flags", "contract", "rounds accepted", "bond", "score", "price/round"),
    )


# --- report ----------------------------------------------------------------------------------


@app.command()
def report(
    training_id: RunIdOpt,
    output: Annotated[
        Path,
        typer.Option("-o", "--output", help="Folder to write the report into (made if missing).", show_default=False),
    ],
    coordinator: CoordinatorOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the written paths as JSON.")] = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Write a report of the run into a folder: PNG plots (loss and accuracy by round, a
    worker-by-round heatmap of scores, bytes per round) and a self-contained report.html
    with the run's numbers. Of a running run: the report so far."""
    from aitbc.reports import from_run, prepare_dir, write_report

    home = resolve_home(home)
    prepare_dir(output)  # a folder we cannot write refuses (exit 2) before anything is fetched
    with _agent(home, coordinator, training_id) as a:
        res = a.get_results(training_id)
        data = from_run(
            results=res,
            rounds=a.get_rounds(training_id),
            scores=a.get_round_scores(training_id),
            payments=a.get_payments(training_id),
        )
    paths = write_report(data, output)
    if json_out:
        _emit_json({"training_id": training_id, **{k: str(v) for k, v in paths.items()}})
        return
    _say(f"Report of {training_id} ({res['status']}, {res['rounds_completed']} rounds) in {output}:")
    _say(*(f"  {p}" for p in paths.values()))
