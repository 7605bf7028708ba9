"""``aitbc distributed-training``: the training owner's workflow against a coordinator.

    init -> upload-data -> discover-workers -> distribute -> monitor -> results

Each command is a thin client of the coordinator's ``/v1`` API, signed with the owner's
wallet. ``init`` remembers which wallet and coordinator a run belongs to in
``HOME/runs/<id>.json`` so the later commands need only ``--training-id``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from aitbc.cli.common import DEFAULT_HOME, HomeOption, err, naming_wallet, out, resolve_home
from aitbc.client import CoordinatorClient, coordinator_url
from aitbc.core.options import parse_kv
from aitbc.errors import AitbcError, NotFoundError, UsageError

app = typer.Typer(
    help="Train one model on hired providers: init, upload-data, discover-workers, distribute, monitor.",
    no_args_is_help=True,
)

CoordinatorOpt = Annotated[
    str | None,
    typer.Option(
        "--coordinator", help="Coordinator URL (default: AITBC_COORDINATOR, the local stack, or http://127.0.0.1:8700)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
RunIdOpt = Annotated[
    str, typer.Option("--training-id", help="The run, as printed by init (training_...).", show_default=False)
]
WalletOpt = Annotated[str | None, typer.Option("--wallet", help="Owner's wallet (default: the one init used).")]


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


def _client(
    home: Path,
    coordinator: str | None,
    run_id: str | None = None,
    wallet: str | None = None,
    *,
    need_wallet: bool = False,
) -> CoordinatorClient:
    from aitbc.ledger.wallet import load_wallet

    known = _recall(home, run_id) if run_id else {}
    url = coordinator_url(coordinator if coordinator else coordinator or known.get("coordinator"), home)
    name = wallet or known.get("wallet")
    if need_wallet and not name:
        raise UsageError(f"run {run_id} was not started from {home}; pass --wallet NAME (the owner's wallet)")
    return CoordinatorClient(url, load_wallet(home, name) if name else None)


def _say(*lines: str) -> None:
    for line in lines:
        out.print(line, highlight=False)


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _fmt(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


def _short(addr: str) -> str:
    return addr if len(addr) <= 16 else f"{addr[:10]}…{addr[-4:]}"


# --- init ---------------------------------------------------------------------------


@app.command()
def init(
    wallet: Annotated[
        str, typer.Option("--wallet", help="The owner's wallet (created if it does not exist).", show_default=False)
    ],
    model_type: Annotated[
        str, typer.Option("--model-type", help="mlp, cnn, transformer, or package.module:callable.", show_default=False)
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
    model_opt: Annotated[
        list[str] | None, typer.Option("--model-opt", help="Model option KEY=VALUE (repeatable), e.g. context=64.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the data split and the initial model.")] = 0,
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
    from aitbc.ledger.wallet import create_wallet, load_wallet

    home = resolve_home(home)
    if target_workers < 1:
        raise UsageError(f"--target-workers must be >= 1, got {target_workers}")
    from aitbc.ledger.book import LedgerError, check_network

    try:
        check_network(network)
    except LedgerError as e:
        raise UsageError(e.detail) from None
    try:
        w = load_wallet(home, wallet)
    except NotFoundError:
        w = create_wallet(home, wallet)
        err.print(f"created wallet {wallet} ({w.address})", highlight=False)
    url = coordinator_url(coordinator, home)
    body: dict[str, Any] = {
        "model_type": model_type,
        "model_options": parse_kv(model_opt or [], what="model option"),
        "dataset_size": dataset_size,
        "target_workers": target_workers,
        "seed": seed,
        "bond": bond,
        "network": network,
    }
    if budget is not None:
        body["budget"] = budget
    with CoordinatorClient(url, w) as c, naming_wallet(wallet):
        run = c.post("/runs", body)
    _remember(home, run["training_id"], wallet, url)
    if json_out:
        _emit_json(run)
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
    max_bytes: Annotated[int, typer.Option(help="Text corpora: bytes to read at most.")] = 4 << 20,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Split the dataset into one shard per target worker and upload shards and manifest."""
    from aitbc.run_data import prepare_run_data

    home = resolve_home(home)
    if max_bytes <= 0:
        raise UsageError(f"--max-bytes must be > 0, got {max_bytes}")
    with _client(home, coordinator, training_id, wallet, need_wallet=True) as c:
        run = c.get(f"/runs/{training_id}")
        rd = prepare_run_data(run, data_path, shards=run["target_workers"], alpha=alpha, max_bytes=max_bytes)
        for cid, blob in rd.blobs():
            c.put_blob(cid, blob)
        detail = c.post(f"/runs/{training_id}/data", {"manifest_cid": rd.manifest_cid, "source": data_path})
    data, packaged, cids, val_cid, manifest_cid = rd.dataset, rd.packaged, rd.shard_cids, rd.val_cid, rd.manifest_cid
    if json_out:
        _emit_json(
            {
                "training_id": training_id,
                "manifest_cid": manifest_cid,
                "shards": cids,
                "val_cid": val_cid,
                "samples": sum(packaged.samples),
                "data_bytes": detail["data_bytes"],
                "dataset": data.name,
            }
        )
        return
    _say(
        "Data uploaded",
        f"Training ID: {training_id}",
        f"Dataset: {data.name} ({data.spec.task}, {sum(packaged.samples)} training samples, {packaged.val_samples} validation)",
        f"Shards: {len(cids)}",
        f"Size: {_human_bytes(detail['data_bytes'])} measured (declared {run['dataset_size']})",
        f"Manifest CID: {manifest_cid}",
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
    if required_workers < 1:
        raise UsageError(f"--required-workers must be >= 1, got {required_workers}")
    body: dict[str, Any] = {"required_workers": required_workers, "min_gpu": min_gpu}
    if max_price is not None:
        body["max_price"] = max_price
    with _client(home, coordinator, training_id, wallet, need_wallet=True) as c:
        res = c.post(f"/runs/{training_id}/discover", body)
    if json_out:
        _emit_json(res)
        return
    t = Table(title=f"Offers for {training_id}" + (f" (GPU >= {min_gpu})" if min_gpu else ""))
    for col in ("#", "worker", "GPU", "price/round", "reputation", "availability", "score", "hired"):
        t.add_column(col, justify="right" if col not in ("worker", "GPU") else "left")
    for i, r in enumerate(res["ranked"], 1):
        t.add_row(
            str(i),
            _short(r["worker_id"]),
            r["gpu_type"],
            f"{r['price']:.2f}",
            f"{r['reputation']:.2f}",
            f"{r['availability']:.2f}",
            f"{r['score']:.3f}",
            "yes" if r["hired"] else "",
        )
    out.print(t)
    out.print(f"Contracted {res['count']} worker{'s' if res['count'] != 1 else ''} for {training_id}", highlight=False)


# --- distribute ----------------------------------------------------------------------


@app.command()
def distribute(
    training_id: RunIdOpt,
    strategy: Annotated[str, typer.Option(help="data-parallel (the one strategy this build runs).")] = "data-parallel",
    rounds: Annotated[int, typer.Option(help="Aggregation rounds.")] = 10,
    local_steps: Annotated[int, typer.Option(help="Inner steps per worker per round (H).")] = 20,
    batch_size: Annotated[int, typer.Option(help="Samples per inner step.")] = 32,
    lr: Annotated[float, typer.Option(help="Inner learning rate.")] = 1e-3,
    outer: Annotated[str, typer.Option(help="Outer optimizer: fedavg or diloco.")] = "fedavg",
    aggregator: Annotated[
        str, typer.Option(help="Robust rule, e.g. mean, trimmed-mean:beta=0.2, krum, nnm+centered-clip.")
    ] = "mean",
    compression: Annotated[str, typer.Option(help="Update codec, e.g. none, int8, topk:ratio=0.01, sign.")] = "none",
    error_feedback: Annotated[
        bool, typer.Option("--error-feedback", help="Workers keep their compression residual.")
    ] = False,
    mode: Annotated[str, typer.Option(help="Round mode: sync (live runs).")] = "sync",
    deadline: Annotated[
        float | None, typer.Option(help="Seconds a round waits at most before closing with the quorum.")
    ] = None,
    quorum: Annotated[
        int | None,
        typer.Option(help="Accepted updates a round needs to close at its deadline (default: --min-workers)."),
    ] = None,
    min_workers: Annotated[int | None, typer.Option(help="Fewest workers the run trains with (default 1).")] = None,
    max_workers: Annotated[
        int | None, typer.Option(help="Most workers, joiners included (default: target workers).")
    ] = None,
    eval_every: Annotated[int, typer.Option(help="Evaluate every N rounds (and after the last).")] = 1,
    coordinator: CoordinatorOpt = None,
    wallet: WalletOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Assign shards to the hired workers and start the rounds."""
    home = resolve_home(home)
    if strategy != "data-parallel":
        raise UsageError(f"--strategy {strategy!r} is not available; this build runs: data-parallel")
    if mode != "sync":
        raise UsageError(
            f"--mode {mode!r}: live runs support sync (with --deadline/--quorum); async and gossip run in `aitbc simulate`"
        )
    body = {
        "strategy": strategy,
        "rounds": rounds,
        "local_steps": local_steps,
        "batch_size": batch_size,
        "lr": lr,
        "outer": outer,
        "aggregator": aggregator,
        "compression": compression,
        "error_feedback": error_feedback,
        "mode": mode,
        "deadline": deadline,
        "quorum": quorum,
        "min_workers": min_workers,
        "max_workers": max_workers,
        "eval_every": eval_every,
    }
    with (
        _client(home, coordinator, training_id, wallet, need_wallet=True) as c,
        naming_wallet(wallet or _recall(home, training_id).get("wallet")),
    ):
        detail = c.get(f"/runs/{training_id}")
        if detail.get("budget") is None:  # the escrow is the contracts' cost: sign the most it may be
            hired = sum(ct["price_micro"] for ct in detail["contracts"] if ct["status"] == "hired")
            from aitbc.units import format_price

            body["max_cost"] = format_price(hired * rounds)
        run = c.post(f"/runs/{training_id}/distribute", body)
    if json_out:
        _emit_json(run)
        return
    cfg = run["config"]
    per_round = sum(ct["price_micro"] for ct in run["contracts"] if ct["status"] == "working")
    from aitbc.units import format_price

    _say(
        "Training distributed",
        f"Training ID: {training_id}",
        f"Strategy: {strategy}",
        f"Workers: {len(run['workers'])} on {run['shards']} shards",
        f"Rounds: {cfg['rounds']} x {cfg['local_steps']} local steps",
        f"Aggregator: {cfg['aggregator']}   Compression: {cfg['compression']}   Outer: {cfg['outer']}",
        f"Estimated cost: {format_price(per_round * cfg['rounds'])} AIT",
        f"Status: {run['status']}",
    )


# --- monitor, status, list ------------------------------------------------------------


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
    ):
        t.add_column(col, justify="left" if col in ("worker", "status", "this round", "flags") else "right")
    for w in run["workers"]:
        hb = w["last_heartbeat_age"]
        t.add_row(
            _short(w["worker_id"]),
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
        )
    parts: list[Any] = [head, t]
    if run.get("error"):
        parts.append(f"[red]{run['error']}[/red]")
    return Group(*parts)


def _finished(run: dict[str, Any]) -> None:
    if run["status"] == "failed":
        raise AitbcError(f"run {run['training_id']} failed: {run.get('error') or 'no reason recorded'}")


@app.command()
def monitor(
    training_id: RunIdOpt,
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds (exit 1).")] = None,
    coordinator: CoordinatorOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="JSON snapshots (one line each).")] = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Watch a run live (one row per worker) until it completes or fails."""
    home = resolve_home(home)
    if interval <= 0:
        raise UsageError(f"--interval must be > 0, got {interval}")
    t0 = time.monotonic()
    with _client(home, coordinator, training_id) as c:
        run = c.get(f"/runs/{training_id}")
        if once or json_out:
            while True:
                if json_out:
                    _emit_json(run)
                else:
                    out.print(_run_view(run))
                if once or run["status"] in ("complete", "failed"):
                    break
                _check_timeout(t0, timeout, training_id)
                time.sleep(interval)
                run = c.get(f"/runs/{training_id}")
            if not once:
                _finished(run)
            return
        with Live(_run_view(run), console=out, refresh_per_second=4, transient=False) as live:
            while run["status"] not in ("complete", "failed"):
                _check_timeout(t0, timeout, training_id)
                time.sleep(interval)
                run = c.get(f"/runs/{training_id}")
                live.update(_run_view(run))
        if not out.is_terminal:
            out.line()  # Live leaves the cursor after the table's last border
    _finished(run)
    out.print(
        f"Run {training_id} complete: val loss {_fmt(run['initial_val_loss'])} -> {_fmt(run['val_loss'])}, "
        f"model {run['global_model_cid']}",
        highlight=False,
    )


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
    with _client(home, coordinator, training_id) as c:
        run = c.get(f"/runs/{training_id}")
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
    with _client(home, coordinator) as c:
        res = c.get("/runs", params={"status": status})
    if json_out:
        _emit_json(res)
        return
    if not res["data"]:
        err.print("no training runs", highlight=False)
        return
    t = Table()
    for col in ("training id", "status", "model", "round", "val loss", "workers", "created"):
        t.add_column(col)
    for r in res["data"]:
        t.add_row(
            r["training_id"],
            r["status"],
            r["model_type"],
            f"{r['round']}/{r['rounds'] or '-'}",
            _fmt(r["val_loss"]),
            str(r["target_workers"]),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"])),
        )
    out.print(t)


# --- control and results ----------------------------------------------------------------


def _control(
    action: str, training_id: str, coordinator: str | None, wallet: str | None, json_out: bool, home: Path
) -> None:
    home = resolve_home(home)
    with _client(home, coordinator, training_id, wallet, need_wallet=True) as c:
        run = c.post(f"/runs/{training_id}/{action}")
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
    with _client(home, coordinator, training_id) as c:
        res = c.get(f"/runs/{training_id}/results")
    if json_out:
        _emit_json(res)
        return
    t = Table(title=f"Results of {training_id}", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
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
        t.add_row(k, str(v))
    out.print(t)
    if res.get("workers"):
        w = Table(title="Contribution scores (mean quality of scored rounds, 0-1)")
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
        out.print(w)


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
    if output.is_dir():
        raise UsageError(f"{output} is a directory; give the file to write")
    if not output.parent.exists():
        raise NotFoundError(f"no such directory: {output.parent}")
    with _client(home, coordinator, training_id) as c:
        res = c.get(f"/runs/{training_id}/results")
        cid = res["model_cid"]
        if round is not None:
            match = [ck["cid"] for ck in res["checkpoints"] if ck["round"] == round]
            if not match:
                raise NotFoundError(
                    f"run {training_id} has no checkpoint for round {round} (it has 0..{len(res['checkpoints']) - 1})"
                )
            cid = match[0]
        if cid is None:
            raise AitbcError(f"run {training_id} has no model yet (status {res['status']})")
        data = c.get_blob(cid)
    tmp = output.with_name(output.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(output)
    if json_out:
        _emit_json({"training_id": training_id, "path": str(output), "cid": cid, "bytes": len(data)})
    else:
        out.print(f"Wrote {output} ({_human_bytes(len(data))}, CID {cid})", highlight=False)


@app.command()
def verify(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Download every round's checkpoint, re-hash it against its recorded CID and check
    it is a loadable checkpoint of that round. Exit 1 if any fails."""
    from aitbc.errors import IntegrityError
    from aitbc.training.checkpoint import bytes_to_tensors, read_metadata

    home = resolve_home(home)
    rows = []
    with _client(home, coordinator, training_id) as c:
        rounds = c.get(f"/runs/{training_id}/rounds")["data"]
        for r in rounds:
            ok, why = True, "hash and checkpoint OK"
            try:
                data = c.get_blob(r["checkpoint_cid"])
                meta = read_metadata(data)
                bytes_to_tensors(data)
                if meta.get("round") != str(r["round"]):
                    ok, why = False, f"checkpoint says round {meta.get('round')}"
            except (IntegrityError, AitbcError) as e:
                ok, why = False, str(e)
            rows.append({"round": r["round"], "cid": r["checkpoint_cid"], "ok": ok, "detail": why})
    bad = [row for row in rows if not row["ok"]]
    if json_out:
        _emit_json({"training_id": training_id, "checkpoints": rows, "ok": not bad})
    else:
        t = Table(title=f"Checkpoints of {training_id}")
        for col in ("round", "CID", "verified"):
            t.add_column(col)
        for row in rows:
            t.add_row(str(row["round"]), row["cid"], "OK" if row["ok"] else f"[red]FAILED: {row['detail']}[/red]")
        out.print(t)
    if not rows:
        raise AitbcError(f"run {training_id} has no checkpoints yet")
    if bad:
        raise AitbcError(
            f"{len(bad)} of {len(rows)} checkpoints failed verification (first: round {bad[0]['round']}: {bad[0]['detail']})"
        )
    if not json_out:
        out.print(f"All {len(rows)} checkpoints verified", highlight=False)


@app.command()
def payments(
    training_id: RunIdOpt,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Per worker: rounds accepted, score, paid, bond, slashed, reputation; and the escrow."""
    home = resolve_home(home)
    with _client(home, coordinator, training_id) as c:
        res = c.get(f"/runs/{training_id}/payments")
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
            _short(r["worker_id"]),
            r["price"],
            str(r["rounds_accepted"]),
            _fmt(r["score"], ".3f"),
            r["paid"],
            r["bond"],
            r["slashed"],
            _fmt(r["reputation"], ".2f"),
            ", ".join(r["flags"]),
            r["status"],
        )
    return t
