"""``aitbc coordinator serve`` and ``aitbc worker start``: the two long-running services."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Annotated

import typer

from aitbc.cli.common import DEFAULT_HOME, HomeOption, resolve_home
from aitbc.errors import UsageError

coordinator_app = typer.Typer(help="The coordinator service (HTTP API, database, round driver).", no_args_is_help=True)
worker_app = typer.Typer(help="A provider's worker daemon.", no_args_is_help=True)


def _logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@coordinator_app.command("serve")
def serve(
    home: HomeOption = DEFAULT_HOME,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port, printed at start).")] = 8700,
    db: Annotated[
        str | None, typer.Option("--db", help="SQLAlchemy URL (default: SQLite in WAL mode at HOME/coordinator.db).")
    ] = None,
    max_blob_mb: Annotated[float, typer.Option(help="Largest blob an upload may store, in MiB.")] = 256.0,
    lease: Annotated[float, typer.Option(help="Seconds without a heartbeat before a worker is failed.")] = 10.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    network: Annotated[str, typer.Option(help="Ledger network this coordinator settles on (local).")] = "local",
    manual_idle: Annotated[
        float,
        typer.Option(
            help="Seconds a manual-control run may go without an owner's call, "
            "an update or a progress report before it is failed."
        ),
    ] = 3600.0,
    settle_delay: Annotated[float, typer.Option(hidden=True, help="Testing: seconds between two settlements.")] = 0.0,
) -> None:
    """Serve the coordinator's API under /v1 (OpenAPI docs at /docs)."""
    import uvicorn

    from aitbc.coordinator.app import create_app
    from aitbc.coordinator.config import Settings

    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {port}")
    if max_blob_mb <= 0 or lease <= 0 or manual_idle <= 0:
        raise UsageError("--max-blob-mb, --lease and --manual-idle must be > 0")
    _logging(log_level)
    from aitbc.ledger.book import LedgerError, check_network

    try:
        check_network(network)
    except LedgerError as e:
        raise UsageError(e.detail) from None
    settings = Settings(
        home=resolve_home(home),
        db_url=db,
        host=host,
        port=port,
        network=network,
        max_blob_bytes=int(max_blob_mb * (1 << 20)),
        lease_seconds=lease,
        settle_delay=settle_delay,
        manual_idle_seconds=manual_idle,
    )
    app = create_app(settings)
    import gc

    gc.freeze()  # torch, SQLAlchemy and FastAPI's long-lived objects: out of every full collection
    # Long polls hold requests up to their wait; a stop should not wait that long for them.
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        access_log=False,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    server.run()


@worker_app.command("start")
def start(
    coordinator: Annotated[
        str | None, typer.Option(help="Coordinator URL (default: AITBC_COORDINATOR or the local stack).")
    ] = None,
    wallet: Annotated[str, typer.Option(help="Wallet (identity) of this provider; created if missing.")] = "worker",
    gpu: Annotated[str, typer.Option(help="Advertised GPU class, e.g. RTX4090.")] = "RTX3090",
    price: Annotated[str, typer.Option(help="Price per round in AIT, e.g. 1.20.")] = "1.0",
    availability: Annotated[float, typer.Option(help="Advertised availability in [0, 1].")] = 0.98,
    home: HomeOption = DEFAULT_HOME,
    heartbeat: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 2.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    max_bond: Annotated[
        str, typer.Option(help="Most AIT a contract may lock from this wallet as a bond (0: only bond-free runs).")
    ] = "0",
    step_delay: Annotated[
        float, typer.Option(hidden=True, help="Testing: seconds to sleep after each local step.")
    ] = 0.0,
    attack: Annotated[
        str | None, typer.Option(hidden=True, help="Testing: act as a Byzantine worker, e.g. sign-flip.")
    ] = None,
) -> None:
    """Offer this machine to the marketplace and train the jobs it is given, until stopped."""
    from aitbc.client import coordinator_url
    from aitbc.units import parse_price
    from aitbc.worker.daemon import Worker, WorkerConfig

    for flag, value in (("--price", price), ("--max-bond", max_bond)):
        parse_price(value, field=flag)  # a UnitError is a UsageError: one line, exit 2
    _logging(log_level)
    home_dir: Path = resolve_home(home)
    cfg = WorkerConfig(
        coordinator=coordinator_url(coordinator, home_dir),
        home=home_dir,
        wallet=wallet,
        gpu=gpu,
        price=price,
        availability=availability,
        heartbeat_seconds=heartbeat,
        step_delay=step_delay,
        max_bond=max_bond,
        attack=attack,
    )
    worker = Worker(cfg)

    def _terminate(*_: object) -> None:  # out of a long poll or a training step at once
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        worker.run()
    except KeyboardInterrupt:
        worker.stop.set()
