"""``aitbc coordinator serve`` and ``aitbc worker start``: the two long-running services.

Every tunable of each service is a field of its settings class
(``coordinator.config.Settings``, ``worker.config.WorkerSettings``) and, through
:mod:`aitbc.cli.settings_flags`, a flag whose default is None (not given): a given flag
wins over the service's ``AITBC_...`` environment variable, which wins over the default
written in the class, the only place a default lives. The two commands are built when
named, so no other command pays for importing the settings classes.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from aitbc.cli.common import DEFAULT_HOME, HomeOption, resolve_home
from aitbc.cli.lazy_group import lazy_group

MIB = 1 << 20
# s a stopping coordinator waits for its round driver's passes: the process exits next, and
# a pass cut short commits nothing (`aitbc down` gives the whole stop a few seconds)
DRIVER_STOP_WAIT = 1.0


def _serve_command() -> Any:
    from aitbc.cli.settings_flags import with_setting_flags
    from aitbc.coordinator.config import Settings

    return with_setting_flags(serve, Settings)


def _start_command() -> Any:
    from aitbc.cli.settings_flags import with_setting_flags
    from aitbc.worker.config import WorkerSettings

    return with_setting_flags(start, WorkerSettings)


coordinator_app = typer.Typer(
    help="The coordinator service (HTTP API, database, round driver).",
    no_args_is_help=True,
    cls=lazy_group(serve=_serve_command),
)
worker_app = typer.Typer(help="A provider's worker daemon.", no_args_is_help=True, cls=lazy_group(start=_start_command))


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # alembic's set-up chatter (plugins, dialect) at every start; aitbc.coordinator.db logs what changed
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger().level))


def serve(home: HomeOption = DEFAULT_HOME, *, flags: dict[str, Any]) -> None:
    """Serve the coordinator's API under /v1 (OpenAPI docs at /docs).

    Every option can also be set in the environment as AITBC_<SETTING> (e.g.
    AITBC_LEASE_SECONDS=30, AITBC_DB_URL=...); a flag wins over the environment."""
    from aitbc.cli.settings_flags import flag_names
    from aitbc.coordinator.config import Settings
    from aitbc.settings import load_settings

    given = {"home": resolve_home(home), **flags}
    settings = load_settings(Settings, given, flag_names=flag_names(Settings))
    _logging(settings.log_level)
    _run_coordinator(settings)


def _run_coordinator(settings: Any) -> None:
    """Serve ``settings``' app with uvicorn until stopped."""
    import gc

    import uvicorn

    from aitbc.coordinator.app import KEEP_ALIVE_SECONDS, create_app
    from aitbc.coordinator.heap import return_large_frees
    from aitbc.coordinator.server import Server

    return_large_frees()  # a large model's freed tensors go back to the system (aitbc.coordinator.heap)
    app = create_app(settings, stop_wait=DRIVER_STOP_WAIT)
    gc.freeze()  # torch, SQLAlchemy and FastAPI's long-lived objects: out of every full collection
    # Long polls hold requests up to their wait; a stop should not wait that long for them.
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=2,
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
    )
    Server(config, on_stop=app.state.ctx.notifier.close).run()


def start(
    coordinator: Annotated[
        str | None, typer.Option(help="Coordinator URL (default: AITBC_COORDINATOR or the local stack).")
    ] = None,
    home: HomeOption = DEFAULT_HOME,
    ca_cert: Annotated[
        Path | None,
        typer.Option(help="CA certificate an https:// coordinator's certificate must chain to (or AITBC_CA_CERT)."),
    ] = None,
    *,
    flags: dict[str, Any],
) -> None:
    """Offer this machine to the marketplace and train the jobs it is given, until stopped.

    Every option but --coordinator and --home can also be set in the environment as
    AITBC_WORKER_<SETTING> (e.g. AITBC_WORKER_PRICE=1.20); a flag wins over the environment."""
    from aitbc.cli.settings_flags import flag_names
    from aitbc.client import coordinator_url
    from aitbc.settings import load_settings
    from aitbc.worker.config import WorkerSettings

    settings = load_settings(WorkerSettings, flags, flag_names=flag_names(WorkerSettings))
    _logging(settings.log_level)
    home_dir = resolve_home(home)

    from aitbc.worker.daemon import Worker
    from aitbc.worker.metrics import WorkerMetrics

    metrics = WorkerMetrics()
    if settings.metrics_port is not None:  # first: a port in use is an error before anything else
        metrics.serve(settings.metrics_host, settings.metrics_port)
    worker = Worker(
        settings, coordinator=coordinator_url(coordinator, home_dir), home=home_dir, ca_cert=ca_cert, metrics=metrics
    )

    terminated: list[int] = []

    def _terminate(sig: int, _frame: object) -> None:  # out of a long poll or a training step at once
        terminated.append(sig)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        worker.run()
    except KeyboardInterrupt:
        worker.stop.set()
        if terminated:
            _end_by(signal.SIGTERM)


def _end_by(sig: signal.Signals) -> None:
    """End this process as ``sig`` would have, once it has stopped cleanly: the interpreter's
    teardown of torch's modules and objects takes a second or more of CPU and has nothing
    left to do (uvicorn ends the coordinator the same way after its own shutdown)."""
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(sig, signal.SIG_DFL)
    signal.raise_signal(sig)


@coordinator_app.command("gc")
def gc_blobs(
    home: HomeOption = DEFAULT_HOME,
    db: Annotated[str | None, typer.Option("--db", help="SQLAlchemy URL (none: HOME/coordinator.db).")] = None,
    keep_checkpoints: Annotated[
        int | None, typer.Option(help="Checkpoints whose bytes are kept per run: the last K rounds.")
    ] = None,
    gc_grace: Annotated[
        float | None, typer.Option(help="Seconds an unreferenced blob is kept before it is deleted.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only report what would be deleted.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Run blob retention now: delete the coordinator's blobs no run needs any more.

    Those are old checkpoints, settled updates and the data of finalized runs. Safe while
    the coordinator runs."""
    import json
    import sys

    from aitbc.cli.common import out
    from aitbc.cli.settings_flags import flag_names
    from aitbc.coordinator.config import Settings
    from aitbc.coordinator.storage.retention import IN_FLIGHT_SECONDS, collect
    from aitbc.coordinator.store.db import make_engine, make_sessions
    from aitbc.settings import load_settings
    from aitbc.storage.blobstore import LocalBlobStore

    flags = {"db_url": db, "keep_checkpoints": keep_checkpoints, "gc_grace_seconds": gc_grace}
    settings = load_settings(Settings, {"home": resolve_home(home), **flags}, flag_names=flag_names(Settings))
    engine = make_engine(settings.database_url)
    try:
        report = collect(
            make_sessions(engine),
            LocalBlobStore(settings.home),
            keep_checkpoints=settings.keep_checkpoints,
            grace_seconds=settings.gc_grace_seconds,
            max_loose_bytes=settings.max_loose_bytes,  # AITBC_MAX_LOOSE_BYTES, as the coordinator's
            dry_run=dry_run,
        )
    finally:
        engine.dispose()
    if json_out:
        sys.stdout.write(json.dumps(report.as_dict(), sort_keys=True) + "\n")
        return
    verb = "Would delete" if dry_run else "Deleted"
    out.print(
        f"{verb} {len(report.deleted)} blobs ({report.freed / MIB:.1f} MiB); kept {report.kept} "
        f"({report.kept_bytes / MIB:.1f} MiB); {report.young} unreferenced younger than "
        f"{max(settings.gc_grace_seconds, IN_FLIGHT_SECONDS):g} s left ({report.young_bytes / MIB:.1f} MiB)"
        + (f"; {report.over_cap} of the deleted were younger, over the loose-blob cap" if report.over_cap else ""),
        highlight=False,
    )
