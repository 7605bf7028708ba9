"""``aitbc demo``: the whole owner workflow on a local stack, started and stopped around it
if HOME has none running: init, upload-data, discover-workers, distribute, monitor,
download-model, then a summary, the settled payments and the ledger checked."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, TypedDict

import typer
from rich.markup import escape

from aitbc import run_defaults as defaults
from aitbc import stack as stk
from aitbc.cli import checks
from aitbc.cli.common import DEFAULT_HOME, HomeOption, agent, err, out, resolve_home
from aitbc.cli.options import LocalSteps, Rounds
from aitbc.cli.stack import emit, print_up, starting
from aitbc.coordinator.api.web import dashboard_url
from aitbc.errors import AitbcError
from aitbc.json_value import JSONObject

DEMO_OWNER_FUNDS = "1000"  # AIT minted by the local faucet for the demo's owner
DEMO_WORKER_FUNDS = "10"
DEMO_BOND = "1"
STEPS = 7
OWNER = "owner"

Workers = Annotated[int, typer.Option("--workers", "-n", help="Workers to start (and to hire).")]
Model = Annotated[str, typer.Option(help="Model type (mlp, cnn, transformer).")]
Dataset = Annotated[str, typer.Option(help="Dataset: digits, stdlib, a text file or folder, or .npz.")]
Aggregator = Annotated[
    str | None,
    typer.Option(
        help=f"Robust rule, e.g. {defaults.AGGREGATOR} (the default), mean, median, trimmed-mean:beta=0.2; "
        "with a sparse codec (topk, topk-int8, sparseloco) the default is sparse-robust.",
        show_default=False,
    ),
]
Compression = Annotated[str, typer.Option(help="Update codec, e.g. none, int8, topk:ratio=0.1.")]
VerifyRate = Annotated[
    float,
    typer.Option(min=0.0, max=1.0, help="Spot checks: the share of each update's steps the coordinator re-runs."),
]
MinGpu = Annotated[str | None, typer.Option("--min-gpu", help="Weakest GPU class to hire, e.g. RTX3080.")]
Timeout = Annotated[float, typer.Option(help="Seconds the training may take before the demo gives up.")]
KeepStack = Annotated[bool, typer.Option("--keep-stack", help="Leave a stack the demo started running.")]
DemoJson = Annotated[bool, typer.Option("--json", help="The steps on stderr; stdout is one JSON object, the summary.")]


@dataclass(frozen=True, slots=True)
class DemoRun:
    """What the demo trains, and where: the options of ``aitbc demo`` once checked."""

    home: Path
    workers: int
    rounds: int
    local_steps: int
    model: str
    dataset: str
    aggregator: str | None  # None: the codec's (run_defaults.default_aggregator)
    compression: str
    verify_rate: float
    min_gpu: str | None
    timeout: float

    def check(self) -> None:
        """Each refusal names its flag (exit 2), before any process starts."""
        checks.at_least(self.rounds, 1, "--rounds")
        checks.at_least(self.local_steps, 1, "--local-steps")
        checks.more_than(self.timeout, 0, "--timeout")
        checks.model(self.model, {}, option="--model")
        checks.dataset(self.dataset, option="--dataset")
        if self.aggregator is not None:
            checks.aggregator(self.aggregator)
        checks.codec(self.compression)
        if self.min_gpu is not None:
            checks.gpu_class(self.min_gpu)


def demo(
    workers: Workers = 3,
    rounds: Rounds = defaults.ROUNDS,
    local_steps: LocalSteps = defaults.LOCAL_STEPS,
    model: Model = "mlp",
    dataset: Dataset = "digits",
    aggregator: Aggregator = None,
    compression: Compression = "none",
    verify_rate: VerifyRate = 0.1,
    min_gpu: MinGpu = None,
    timeout: Timeout = 120.0,
    keep_stack: KeepStack = False,
    home: HomeOption = DEFAULT_HOME,
    json_out: DemoJson = False,
) -> None:
    """The whole owner workflow on a local stack (started and stopped around it if none runs).

    init, upload-data, discover-workers, distribute, monitor, download-model, then a summary."""
    run = DemoRun(
        home=resolve_home(home).absolute(),
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
    )
    run.check()
    cfg = stk.StackConfig(home=run.home, workers=workers)  # checked before anything starts
    t0 = time.monotonic()
    started: stk.Stack | None = None
    summary: JSONObject = {}
    with _interrupt_on_sigterm(), _human_output_on_stderr(json_out):
        try:
            _step(1, "local stack")
            st = stk.running(run.home)
            if st is None:
                st = started = _start_stack(cfg, t0)
            else:
                _say_using(st, run.home)
                run = replace(run, workers=len(st.workers))  # hire the workers the stack has
            _owner_workflow(st, run, t0=t0, summary=summary)
        finally:
            if started is not None:
                _leave(started, run.home, keep=keep_stack)
    if json_out:
        emit(summary)


def _start_stack(cfg: stk.StackConfig, t0: float) -> stk.Stack:
    st = stk.up(cfg, on_start=lambda url: out.print(starting(cfg, url), highlight=False))
    print_up(st, time.monotonic() - t0)
    return st


def _say_using(st: stk.Stack, home: Path) -> None:
    out.print(
        f"Using the stack already running in {home}: coordinator {st.coordinator}, {len(st.workers)} workers",
        highlight=False,
    )
    out.print(f"Dashboard: {dashboard_url(st.coordinator)}", highlight=False)


def _leave(started: stk.Stack, home: Path, *, keep: bool) -> None:
    """Stop the stack the demo started, unless ``--keep-stack``."""
    if keep:
        err.print(f"The stack keeps running; stop it with: aitbc down --home {home}", highlight=False)
        return
    with _uninterruptible():
        outcome = stk.stop(started)
    err.print(
        f"Stopped the demo's stack ({sum(v != 'not running' for v in outcome.values())} processes); "
        f"logs in {home / 'logs'}",
        highlight=False,
    )


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


def _step(n: int, text: str) -> None:
    out.print(f"\n[bold]\\[{n}/{STEPS}] {text}[/bold]", highlight=False)


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


def _owner_workflow(st: stk.Stack, run: DemoRun, *, t0: float, summary: JSONObject) -> None:
    """Steps 2 to 7 on ``st``, as an owner types them; ``summary`` gets what ``--json`` prints.
    A run that fails still gets its results and summary, then its error is raised."""
    run_id = _init(st, run)
    failure = _train(st, run, run_id)
    _step(7, "results")
    ended = _results(st, run, run_id, failed=failure is not None)
    res, detail = ended.results, ended.status
    _summary(st, res, detail, wall=time.monotonic() - t0, model_file=ended.model_file)
    summary.update(
        training_id=run_id,
        coordinator=st.coordinator,
        status=res["status"],
        rounds_completed=res["rounds_completed"],
        initial_val_loss=res["initial_val_loss"],
        final_val_loss=res["final_val_loss"],
        final_val_accuracy=res["final_val_accuracy"],
        model_cid=res["model_cid"],
        verification=detail.get("verification"),
        model_file=str(ended.model_file) if ended.model_file is not None and res["model_cid"] else None,
        wall_seconds=round(time.monotonic() - t0, 3),
    )
    if failure is not None:
        raise failure
    _settle_and_audit(st, run, run_id, summary)


def _init(st: stk.Stack, run: DemoRun) -> str:
    """Step 2: the owner's and the providers' wallets funded, and the run created; its id."""
    from aitbc.cli.training.plumbing import remember
    from aitbc.ledger.wallet import ensure_wallet

    url, home = st.coordinator, run.home
    _step(2, "init: funded wallets on the local network and a training run")
    wallet = ensure_wallet(home, OWNER)
    with agent(home, url, OWNER) as a:
        a.fund_wallet(DEMO_OWNER_FUNDS)
    for p in st.workers:  # each provider funds its bond from its own wallet (signed by it)
        wdir, name = home / "workers" / p.name.replace("worker-", "w"), p.name.replace("worker-", "provider-")
        ensure_wallet(wdir, name)
        with agent(wdir, url, name) as a:
            a.fund_wallet(DEMO_WORKER_FUNDS)
    out.print(
        f"Owner wallet: {OWNER} ({wallet.address}), funded with {DEMO_OWNER_FUNDS} AIT; "
        f"each provider funded with {DEMO_WORKER_FUNDS} AIT for its bond",
        highlight=False,
    )
    with agent(home, url, OWNER) as a:
        created = a.initialize_distributed_training(run.model, "1MB", run.workers, seed=0, bond=DEMO_BOND)
    run_id = created["training_id"]
    remember(home, run_id, OWNER, url)
    out.print(
        f"Training ID: {run_id}  (model {run.model}, {run.workers} target workers, bond {DEMO_BOND} AIT each)",
        highlight=False,
    )
    out.print(f"Watch it live: {dashboard_url(url, run_id)}", highlight=False)
    return run_id


class _Where(TypedDict):
    """The stack every owner command of the demo talks to."""

    coordinator: str
    home: Path


def _train(st: stk.Stack, run: DemoRun, run_id: str) -> AitbcError | None:
    """Steps 3 to 6, through the owner's own commands; the error the run ended with, if any."""
    from aitbc.cli.training import data, hiring, monitoring, runs

    common: _Where = {"coordinator": st.coordinator, "home": run.home}
    _step(3, f"upload-data: shard {run.dataset!r} into {run.workers} shards, content-addressed")
    data.upload_data(training_id=run_id, data_path=run.dataset, **common)

    _step(4, "discover-workers: rank the live offers and hire")
    hiring.discover_workers(training_id=run_id, required_workers=run.workers, min_gpu=run.min_gpu, **common)

    _step(5, "distribute: assign shards and start the rounds")
    runs.distribute(
        training_id=run_id,
        rounds=run.rounds,
        local_steps=run.local_steps,
        aggregator=run.aggregator,
        compression=run.compression,
        verify_rate=run.verify_rate,
        **common,
    )

    _step(6, "monitor: until the run completes")
    try:
        monitoring.monitor(training_id=run_id, interval=0.5, timeout=run.timeout, **common)
    except AitbcError as e:
        return e
    return None


@dataclass(frozen=True, slots=True)
class Ended:
    """The demo's run once it ended: its results and status (the API's views) and the
    model file (None: the run failed; downloaded where the run has a model)."""

    results: dict[str, Any]
    status: dict[str, Any]
    model_file: Path | None


def _results(st: stk.Stack, run: DemoRun, run_id: str, *, failed: bool) -> Ended:
    """Step 7: the run stopped if it failed and still runs, its results, its model downloaded."""
    from aitbc.cli.training import results, view

    with agent(run.home, st.coordinator, OWNER) as a:
        if failed and a.get_training_status(run_id)["status"] not in view.ENDED:
            a.stop_training(run_id)  # release the workers of a stack that outlives the demo
        res = a.get_results(run_id).model_dump(mode="json")  # the JSON the summary and tables read
        detail = a.get_training_status(run_id).model_dump(mode="json", exclude={"phase"})
    if failed:
        return Ended(res, detail, None)
    model_file = run.home / "demo-model.safetensors"
    if res["model_cid"]:
        results.download_model(training_id=run_id, output=model_file, coordinator=st.coordinator, home=run.home)
    return Ended(res, detail, model_file)


def _settle_and_audit(st: stk.Stack, run: DemoRun, run_id: str, summary: JSONObject) -> None:
    """The run's payments once settled, and the whole ledger fetched and re-checked (what
    ``aitbc ledger verify`` does); a ledger that does not verify is an error."""
    from aitbc.cli.ledger import audit_coordinator
    from aitbc.cli.progress import settle_line
    from aitbc.cli.training.results import payments_table

    with agent(run.home, st.coordinator, OWNER) as a, settle_line(False) as progress:
        pay = a.get_payments(run_id, progress=progress).model_dump(mode="json")  # waits for the last settlements
        out.print(payments_table(pay))
        out.print(
            f"Escrowed {pay['escrowed']} AIT; {pay['escrow_balance']} AIT left in escrow (unspent budget refunded to the owner)",
            highlight=False,
        )
    result = audit_coordinator(st.coordinator)
    out.print(f"aitbc ledger verify: {result.describe()}", highlight=False)
    summary.update(escrowed=pay["escrowed"], escrow_balance=pay["escrow_balance"], ledger_ok=result.ok)
    if not result.ok:
        raise AitbcError(f"ledger verification failed: {result.describe()}")


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
