"""``aitbc up``, ``down``, ``status`` and ``demo``: a whole marketplace on this machine.

``up`` starts a coordinator and N workers in the background under HOME (see
:mod:`aitbc.stack`); the other commands find its coordinator through ``HOME/stack.json``.
``demo`` runs the owner's workflow (init, upload-data, discover-workers, distribute,
monitor, download-model) on that stack, bringing one up and down around itself if HOME
has none running.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from aitbc import run_defaults as defaults
from aitbc import stack as stk
from aitbc.cli import checks
from aitbc.cli.common import DEFAULT_HOME, HomeOption, agent, err, out, resolve_home
from aitbc.cli.options import LocalSteps, Rounds
from aitbc.coordinator.api.web import dashboard_url, metrics_url
from aitbc.errors import AitbcError

if TYPE_CHECKING:
    from aitbc_agent_sdk import Agent

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def _emit(obj: Any) -> None:
    sys.stdout.write(json_text(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def _processes_table(st: stk.Stack, alive: dict[str, bool] | None = None) -> Table:
    t = Table(caption=f"logs: {st.home / 'logs'}/<name>.log", caption_justify="left")
    for col in ("name", "pid", *(("alive",) if alive is not None else ()), "offer"):
        t.add_column(col, justify="right" if col == "pid" else "left")
    for p in st.processes:
        row = [p.name, str(p.pid)]
        if alive is not None:
            row.append("yes" if alive[p.name] else "[red]no[/red]")
        row.append(f"{p.gpu} at {p.price} AIT/round, avail. {p.availability:g}" if p.role == "worker" else "")
        t.add_row(*row)
    return t


# --- up / down / status ---------------------------------------------------------------


def up(
    workers: Annotated[int, typer.Option("--workers", "-n", help="Workers to start.")] = 3,
    port: Annotated[int | None, typer.Option(help="Coordinator port (default: a free one).")] = None,
    lease: Annotated[
        float | None,
        typer.Option(
            help="Seconds without a heartbeat before the coordinator fails a worker "
            "(default: AITBC_LEASE_SECONDS, else the coordinator's default)."
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the coordinator and every worker's offer.")
    ] = 60.0,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls", help="Serve HTTPS with a local CA made under HOME/tls (the CLI and SDK trust it from HOME)."
        ),
    ] = False,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOpt = False,
) -> None:
    """Start a local coordinator and N workers in the background (stop them with `aitbc down`)."""
    home = resolve_home(home).absolute()
    cfg = stk.StackConfig(home=home, workers=workers, port=port, lease=lease, ready_timeout=timeout, tls=tls)
    t0 = time.monotonic()
    st = stk.up(cfg, on_start=lambda url: err.print(_starting(cfg, url), highlight=False))
    if json_out:
        took = round(time.monotonic() - t0, 3)
        _emit(
            {
                "home": str(home),
                "running": True,
                "seconds": took,
                **st.to_json(),
                "dashboard": dashboard_url(st.coordinator),
                "metrics": metrics_url(st.coordinator),
            }
        )
        return
    _print_up(st, time.monotonic() - t0)
    if st.ca_cert:
        out.print(f"TLS: other machines' clients trust it with --ca-cert {st.ca_cert}", highlight=False)
    out.print(f"Stop it with: aitbc down --home {home}", highlight=False)


def _starting(cfg: stk.StackConfig, url: str) -> str:
    return (
        f"Starting a coordinator at {url} and {cfg.workers} worker{'s' if cfg.workers != 1 else ''} in {cfg.home} ..."
    )


def _print_up(st: stk.Stack, seconds: float) -> None:
    n = len(st.workers)
    out.print(
        f"Local stack up in {st.home} ({seconds:.1f} s): coordinator {st.coordinator}, "
        f"{n} worker{'s' if n != 1 else ''} in the marketplace",
        highlight=False,
    )
    out.print(_processes_table(st))
    out.print(f"Dashboard: {dashboard_url(st.coordinator)}", highlight=False)
    out.print(f"Metrics (Prometheus): {metrics_url(st.coordinator)}", highlight=False)


def down(home: HomeOption = DEFAULT_HOME, json_out: JsonOpt = False) -> None:
    """Stop the stack `aitbc up` started in HOME (only the processes it started)."""
    home = resolve_home(home).absolute()
    res = stk.down(home)
    if json_out:  # each process: stopped, killed, or not running
        _emit({"home": str(home), "stopped": {} if res is None else res[1]})
        return
    if res is None:
        out.print(f"no stack running in {home}", highlight=False)
        return
    st, outcome = res
    _print_down(st, outcome)


def _print_down(st: stk.Stack, outcome: dict[str, str]) -> None:
    stopped = [p for p in st.processes if outcome[p.name] != "not running"]
    if not stopped:
        out.print(f"no stack running in {st.home} (removed the record of one that had already exited)", highlight=False)
        return
    out.print(f"Stopped the local stack in {st.home}:", highlight=False)
    for p in st.processes:
        out.print(f"  {p.name:<12} pid {p.pid:<8} {outcome[p.name]}", highlight=False)


def status(home: HomeOption = DEFAULT_HOME, json_out: JsonOpt = False) -> None:
    """The local stack's processes, its coordinator's health and the live offers."""
    home = resolve_home(home).absolute()
    s = stk.status(home)
    if json_out:
        _emit(s if s is not None else {"home": str(home), "running": False, "processes": []})
        return
    if s is None:
        out.print(f"no stack running in {home}", highlight=False)
        return
    st = stk.load(home)
    assert st is not None
    alive = {p["name"]: p["alive"] for p in s["processes"]}
    n_alive = sum(alive.values())
    state = "running" if n_alive == len(alive) else ("partly running" if n_alive else "not running (stale record)")
    out.print(f"Local stack in {home}: {state}, {n_alive}/{len(alive)} processes alive", highlight=False)
    health = "ok" if s["healthy"] else f"[red]unreachable[/red] ({s['health_error']})"
    out.print(
        f"Coordinator: {s['coordinator']}  health: {health}  live offers: "
        f"{'-' if s['live_offers'] is None else s['live_offers']}",
        highlight=False,
    )
    out.print(_processes_table(st, alive))
    if n_alive < len(alive):
        out.print(f"Clean up with: aitbc down --home {home}", highlight=False)


# --- demo ---------------------------------------------------------------------------------


@contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM ends the demo like Ctrl-C does: through the finally that takes the stack down."""

    def handler(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _uninterruptible() -> Iterator[None]:
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _step(n: int, total: int, text: str) -> None:
    out.print(f"\n[bold]\\[{n}/{total}] {text}[/bold]", highlight=False)


DEMO_OWNER_FUNDS = "1000"  # AIT minted by the local faucet for the demo's owner
DEMO_WORKER_FUNDS = "10"
DEMO_BOND = "1"


def demo(
    workers: Annotated[int, typer.Option("--workers", "-n", help="Workers to start (and to hire).")] = 3,
    rounds: Rounds = defaults.ROUNDS,
    local_steps: LocalSteps = defaults.LOCAL_STEPS,
    model: Annotated[str, typer.Option(help="Model type (mlp, cnn, transformer).")] = "mlp",
    dataset: Annotated[str, typer.Option(help="Dataset: digits, stdlib, a text file or folder, or .npz.")] = "digits",
    aggregator: Annotated[
        str, typer.Option(help="Robust rule, e.g. trend+centered-clip, mean, median, trimmed-mean:beta=0.2.")
    ] = defaults.AGGREGATOR,
    compression: Annotated[str, typer.Option(help="Update codec, e.g. none, int8, topk:ratio=0.1.")] = "none",
    verify_rate: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="Spot checks: the share of each update's steps the coordinator re-runs."),
    ] = 0.1,
    min_gpu: Annotated[str | None, typer.Option("--min-gpu", help="Weakest GPU class to hire, e.g. RTX3080.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds the training may take before the demo gives up.")] = 120.0,
    keep_stack: Annotated[bool, typer.Option("--keep-stack", help="Leave a stack the demo started running.")] = False,
    home: HomeOption = DEFAULT_HOME,
    json_out: Annotated[
        bool, typer.Option("--json", help="The steps on stderr; stdout is one JSON object, the summary.")
    ] = False,
) -> None:
    """The whole owner workflow on a local stack (started and stopped around it if none runs).

    init, upload-data, discover-workers, distribute, monitor, download-model, then a summary."""
    home = resolve_home(home).absolute()
    checks.at_least(rounds, 1, "--rounds")
    checks.at_least(local_steps, 1, "--local-steps")
    checks.more_than(timeout, 0, "--timeout")
    checks.model(model, {}, option="--model")
    checks.dataset(dataset, option="--dataset")
    checks.aggregator(aggregator)
    checks.codec(compression)
    if min_gpu is not None:
        checks.gpu_class(min_gpu)
    cfg = stk.StackConfig(home=home, workers=workers)
    t0 = time.monotonic()
    started: stk.Stack | None = None
    summary: dict[str, Any] = {}
    with _interrupt_on_sigterm(), _human_output_on_stderr(json_out):
        try:
            _step(1, 7, "local stack")
            st = stk.running(home)
            if st is None:
                st = started = stk.up(cfg, on_start=lambda url: out.print(_starting(cfg, url), highlight=False))
                _print_up(st, time.monotonic() - t0)
            else:
                out.print(
                    f"Using the stack already running in {home}: coordinator {st.coordinator}, "
                    f"{len(st.workers)} workers",
                    highlight=False,
                )
                out.print(f"Dashboard: {dashboard_url(st.coordinator)}", highlight=False)
                workers = len(st.workers)
            _owner_workflow(
                st,
                home,
                workers=workers,
                rounds=rounds,
                local_steps=local_steps,
                model=model,
                dataset=dataset,
                aggregator=aggregator,
                compression=compression,
                verify_rate=verify_rate,
                min_gpu=min_gpu,
                timeout=timeout,
                t0=t0,
                summary=summary,
            )
        finally:
            if started is not None and not keep_stack:
                with _uninterruptible():
                    outcome = stk.stop(started)
                err.print(
                    f"Stopped the demo's stack ({sum(v != 'not running' for v in outcome.values())} processes); "
                    f"logs in {home / 'logs'}",
                    highlight=False,
                )
            elif started is not None:
                err.print(f"The stack keeps running; stop it with: aitbc down --home {home}", highlight=False)
    if json_out:
        _emit(summary)


@contextmanager
def _human_output_on_stderr(on: bool) -> Iterator[None]:
    """``demo --json``: every step's lines go to stderr, so stdout holds only the JSON."""
    if not on:
        yield
        return
    saved = out.file
    out.file = sys.stderr
    try:
        yield
    finally:
        out.file = saved


def _owner_workflow(
    st: stk.Stack,
    home: Path,
    *,
    workers: int,
    rounds: int,
    local_steps: int,
    model: str,
    dataset: str,
    aggregator: str,
    compression: str,
    verify_rate: float,
    min_gpu: str | None,
    timeout: float,
    t0: float,
    summary: dict[str, Any],
) -> None:
    from aitbc.cli.ledger import audit_coordinator
    from aitbc.cli.training import data, hiring, monitoring, plumbing, results, runs, view
    from aitbc.ledger.wallet import ensure_wallet

    url, owner = st.coordinator, "owner"
    common: dict[str, Any] = {"coordinator": url, "home": home}

    _step(2, 7, "init: funded wallets on the local network and a training run")
    wallet = ensure_wallet(home, owner)
    with agent(home, url, owner) as a:
        a.fund_wallet(DEMO_OWNER_FUNDS)
    for p in st.workers:  # each provider funds its bond from its own wallet (signed by it)
        wdir, name = home / "workers" / p.name.replace("worker-", "w"), p.name.replace("worker-", "provider-")
        ensure_wallet(wdir, name)
        with agent(wdir, url, name) as a:
            a.fund_wallet(DEMO_WORKER_FUNDS)
    out.print(
        f"Owner wallet: {owner} ({wallet.address}), funded with {DEMO_OWNER_FUNDS} AIT; "
        f"each provider funded with {DEMO_WORKER_FUNDS} AIT for its bond",
        highlight=False,
    )
    with agent(home, url, owner) as a:
        run = a.initialize_distributed_training(model, "1MB", workers, seed=0, bond=DEMO_BOND)
    run_id = run["training_id"]
    plumbing.remember(home, run_id, owner, url)
    out.print(
        f"Training ID: {run_id}  (model {model}, {workers} target workers, bond {DEMO_BOND} AIT each)", highlight=False
    )
    out.print(f"Watch it live: {dashboard_url(url, run_id)}", highlight=False)

    _step(3, 7, f"upload-data: shard {dataset!r} into {workers} shards, content-addressed")
    data.upload_data(training_id=run_id, data_path=dataset, **common)

    _step(4, 7, "discover-workers: rank the live offers and hire")
    hiring.discover_workers(training_id=run_id, required_workers=workers, min_gpu=min_gpu, **common)

    _step(5, 7, "distribute: assign shards and start the rounds")
    runs.distribute(
        training_id=run_id,
        rounds=rounds,
        local_steps=local_steps,
        aggregator=aggregator,
        compression=compression,
        verify_rate=verify_rate,
        **common,
    )

    _step(6, 7, "monitor: until the run completes")
    failure: AitbcError | None = None
    try:
        monitoring.monitor(training_id=run_id, interval=0.5, timeout=timeout, **common)
    except AitbcError as e:
        failure = e

    _step(7, 7, "results")
    with agent(home, url, owner) as a:
        if failure is not None and a.get_training_status(run_id)["status"] not in view.ENDED:
            a.stop_training(run_id)  # release the workers of a stack that outlives the demo
        res = a.get_results(run_id)
        detail = a.get_training_status(run_id)
    model_file = home / "demo-model.safetensors"
    if failure is None and res["model_cid"]:
        results.download_model(training_id=run_id, output=model_file, **common)
    _summary(st, res, detail, wall=time.monotonic() - t0, model_file=model_file if failure is None else None)
    summary.update(
        training_id=run_id,
        coordinator=url,
        status=res["status"],
        rounds_completed=res["rounds_completed"],
        initial_val_loss=res["initial_val_loss"],
        final_val_loss=res["final_val_loss"],
        final_val_accuracy=res["final_val_accuracy"],
        model_cid=res["model_cid"],
        verification=detail.get("verification"),
        model_file=str(model_file) if failure is None and res["model_cid"] else None,
        wall_seconds=round(time.monotonic() - t0, 3),
    )
    if failure is not None:
        raise failure
    with agent(home, url, owner) as a:
        pay = _wait_settled(a, run_id, timeout=60)
        out.print(results.payments_table(pay))
        out.print(
            f"Escrowed {pay['escrowed']} AIT; {pay['escrow_balance']} AIT left in escrow (unspent budget refunded to the owner)",
            highlight=False,
        )
    result = audit_coordinator(url)  # the whole ledger, fetched and re-checked: what `aitbc ledger verify` does
    out.print(f"aitbc ledger verify: {result.describe()}", highlight=False)
    summary.update(escrowed=pay["escrowed"], escrow_balance=pay["escrow_balance"], ledger_ok=result.ok)
    if not result.ok:
        raise AitbcError(f"ledger verification failed: {result.describe()}")


def _wait_settled(a: Agent, run_id: str, *, timeout: float) -> dict[str, Any]:
    """Payments settle after the run completes; wait until the run is finalized."""
    deadline = time.monotonic() + timeout
    while True:
        pay = a.get_payments(run_id)
        if pay["finalized"] or time.monotonic() > deadline:
            return pay
        time.sleep(0.2)


def _verified(v: dict[str, Any] | None) -> str:
    if not v:
        return "off (--verify-rate to spot-check updates)"
    return (
        f"{v['passed']} passed, {v['failed']} failed, {v.get('drift', 0)} drift (unpaid, not slashed), "
        f"{v['unanswered']} unanswered of {v['updates']} updates; "
        f"{v['steps_replayed']} of {v['steps_trained']} steps re-run ({v['extra_compute']:.1%})"
    )


def _summary(
    st: stk.Stack, res: dict[str, Any], detail: dict[str, Any], *, wall: float, model_file: Path | None
) -> None:
    from aitbc.cli.training.plumbing import fmt, human_bytes

    names = {p.address: p for p in st.workers}
    up_b, down_b = res["bytes_up"] or 0, res["bytes_down"] or 0
    rows = [
        ("training id", res["training_id"]),
        ("status", res["status"]),
        ("rounds", f"{res['rounds_completed']}/{res['rounds'] or '-'}"),
        ("validation loss", f"{fmt(res['initial_val_loss'])} -> {fmt(res['final_val_loss'])}"),
        ("validation accuracy", fmt(res["final_val_accuracy"], ".4f")),
        ("updates accepted/rejected", f"{res['updates_accepted']} / {res['updates_rejected']}"),
        ("verification", _verified(detail.get("verification"))),
        ("bytes moved", f"{human_bytes(up_b + down_b)} ({human_bytes(up_b)} up, {human_bytes(down_b)} down)"),
        ("training time", "-" if res["wall_seconds"] is None else f"{res['wall_seconds']:.1f} s"),
        ("demo wall time", f"{wall:.1f} s"),
        ("model CID", res["model_cid"] or "-"),
    ]
    if model_file is not None:
        rows.append(("model file", str(model_file)))
    for w in detail["workers"]:
        p = names.get(w["worker_id"])
        who = f"{p.name} ({p.gpu}, {p.price} AIT)" if p else w["worker_id"]
        rows.append((f"rounds done by {who}", f"{w['rounds_done']} (shard {w['shard_index']}, {w['status']})"))
    if res.get("error"):
        rows.append(("error", res["error"]))
    width = max(len(k) for k, _ in rows)
    # Plain lines, not a table: a CID must never be cut to fit the terminal.
    out.print("\n[bold]Demo summary[/bold]", highlight=False)
    for k, v in rows:
        out.print(f"  {k:<{width}}  {escape(str(v))}", highlight=False)
