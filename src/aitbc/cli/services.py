"""``aitbc coordinator serve`` and ``aitbc worker start``: the two long-running services.

Every tunable of each service is a flag whose default is None (not given): a given flag
wins over the service's ``AITBC_...`` environment variable, which wins over the default
written in its settings class (``coordinator.config.Settings``,
``worker.config.WorkerSettings``), the only place a default lives. ``--help`` reads the
defaults and variable names from those classes when it is asked for, so no other command
pays for importing them.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from aitbc.cli.common import DEFAULT_HOME, HomeOption, resolve_home

coordinator_app = typer.Typer(help="The coordinator service (HTTP API, database, round driver).", no_args_is_help=True)
worker_app = typer.Typer(help="A provider's worker daemon.", no_args_is_help=True)

MIB = 1 << 20

# Settings field -> its flag, for each service (the help and the error lines name them).
SERVE_FLAGS = {
    "host": "--host",
    "port": "--port",
    "db_url": "--db",
    "max_blob_bytes": "--max-blob-mb",
    "max_json_bytes": "--max-json-kb",
    "max_uploads": "--max-uploads",
    "max_uploads_per_signer": "--max-uploads-per-signer",
    "min_upload_rate": "--min-upload-kb-s",
    "upload_rate_window_seconds": "--upload-rate-window",
    "eval_memory_mb": "--eval-memory-mb",
    "lease_seconds": "--lease",
    "max_skew_seconds": "--max-skew",
    "tick_seconds": "--tick",
    "driver_lease_seconds": "--driver-lease",
    "heartbeat_flush_seconds": "--heartbeat-flush",
    "eval_samples": "--eval-samples",
    "score_samples": "--score-samples",
    "books_nice": "--books-nice",
    "network": "--network",
    "manual_idle_seconds": "--manual-idle",
    "owner_pay_seconds": "--owner-pay",
    "stuck_seconds": "--stuck",
    "hire_seconds": "--hire-expiry",
    "pause_seconds": "--max-pause",
    "log_level": "--log-level",
    "settle_delay": "--settle-delay",
    "keep_checkpoints": "--keep-checkpoints",
    "gc_grace_seconds": "--gc-grace",
    "gc_interval_seconds": "--gc-interval",
    "max_pinned_bytes": "--max-pinned-mb",
    "max_pinned_bytes_total": "--max-pinned-total-mb",
    "max_loose_bytes": "--max-loose-mb",
    "tls_cert": "--tls-cert",
    "tls_key": "--tls-key",
    "divergence_factor": "--divergence-factor",
    "guard_samples": "--guard-samples",
    "norm_clip": "--norm-clip",
    "norm_reject": "--norm-reject",
    "aggregation_memory_mb": "--aggregation-memory-mb",
    "verify_timeout": "--verify-timeout",
    "verify_threads": "--verify-threads",
    "allow_code": "--allow-code",
}
WORKER_FLAGS = {
    "wallet": "--wallet",
    "gpu": "--gpu",
    "price": "--price",
    "max_bond": "--max-bond",
    "availability": "--availability",
    "heartbeat_seconds": "--heartbeat",
    "poll_seconds": "--poll",
    "backoff_seconds": "--backoff",
    "max_backoff_seconds": "--max-backoff",
    "progress_every": "--progress-every",
    "progress_seconds": "--progress-seconds",
    "log_level": "--log-level",
    "step_delay": "--step-delay",
    "attack": "--attack",
    "cheat": "--cheat",
    "cache_bytes": "--cache-mb",
    "proof_memory_bytes": "--proof-memory-mb",
    "allow_code": "--allow-code",
    "metrics_port": "--metrics-port",
    "metrics_host": "--metrics-host",
    "device": "--device",
    "gpus": "--gpus",
    "listen": "--listen",
    "advertise": "--advertise",
    "peer_timeout_seconds": "--peer-timeout",
    "peer_connections": "--peer-connections",
}
_SHOWN: dict[str, Callable[[Any], str]] = {
    "max_blob_bytes": lambda b: f"{b / MIB:g} MiB",
    "max_json_bytes": lambda b: f"{b / 1024:g} KiB",
    "cache_bytes": lambda b: f"{b / MIB:g} MiB",
    "proof_memory_bytes": lambda b: f"{b / MIB:g} MiB",
}


def _settings_help(load: Callable[[], Any], flags: dict[str, str]) -> type[TyperCommand]:
    """A command class whose ``--help`` shows, for each settings flag, its default and its
    environment variable, read from the settings class ``load()`` returns."""

    class SettingsCommand(TyperCommand):
        def format_help(self, ctx: Any, formatter: Any) -> None:
            from aitbc.settings import env_name

            cls = load()
            by_flag = {flag: field for field, flag in flags.items()}
            for param in self.params:
                opt: Any = param  # an option (arguments have no help of their own)
                field = next((by_flag[o] for o in opt.opts if o in by_flag), None)
                if field is None or "(env " in (opt.help or ""):
                    continue
                default = cls.model_fields[field].default
                shown = "none" if default is None else _SHOWN.get(field, str)(default)
                opt.help = f"{opt.help or ''} (default {shown}; env {env_name(cls, field)})".strip()
            super().format_help(ctx, formatter)

    return SettingsCommand


def _coordinator_settings() -> Any:
    from aitbc.coordinator.config import Settings

    return Settings


def _worker_settings() -> Any:
    from aitbc.worker.config import WorkerSettings

    return WorkerSettings


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # alembic's set-up chatter (plugins, dialect) at every start; aitbc.coordinator.db logs what changed
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger().level))


@coordinator_app.command("serve", cls=_settings_help(_coordinator_settings, SERVE_FLAGS))
def serve(
    home: HomeOption = DEFAULT_HOME,
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (0: any free port, printed at start).")] = None,
    db: Annotated[
        str | None, typer.Option("--db", help="SQLAlchemy URL (none: SQLite in WAL mode at HOME/coordinator.db).")
    ] = None,
    max_blob_mb: Annotated[float | None, typer.Option(help="Largest blob an upload may store, in MiB.")] = None,
    max_json_kb: Annotated[
        float | None, typer.Option(help="Largest JSON request body, in KiB (refused 413 while it is read).")
    ] = None,
    max_uploads: Annotated[
        int | None, typer.Option(help="Blob uploads in flight at once; more are refused 429.")
    ] = None,
    max_uploads_per_signer: Annotated[
        int | None, typer.Option(help="Of those, the most one signer (wallet) may hold at once; more are refused 429.")
    ] = None,
    min_upload_kb_s: Annotated[
        float | None,
        typer.Option(
            help="KiB/s an upload's body must bring over every --upload-rate-window seconds; "
            "a slower one is cut off 408 and its slot freed."
        ),
    ] = None,
    upload_rate_window: Annotated[
        float | None, typer.Option(help="Seconds over which an upload's pace is judged (--min-upload-kb-s).")
    ] = None,
    eval_memory_mb: Annotated[
        float | None,
        typer.Option(
            help="MiB of activations one evaluation or scoring forward pass may hold (at least 128: one sample "
            "of the largest model the bounds admit); batches are cut to fit."
        ),
    ] = None,
    lease: Annotated[float | None, typer.Option(help="Seconds without a heartbeat before a worker is failed.")] = None,
    max_skew: Annotated[
        float | None, typer.Option(help="Seconds a signed request's timestamp may be off before it is refused.")
    ] = None,
    tick: Annotated[float | None, typer.Option(help="Seconds between two looks of the round driver.")] = None,
    driver_lease: Annotated[
        float | None,
        typer.Option(
            help="Seconds the coordinator that drives the rounds holds its lease in the database (renewed each "
            "quarter); with several coordinators on one database, another takes over this long after it stops."
        ),
    ] = None,
    heartbeat_flush: Annotated[
        float | None, typer.Option(help="Seconds between two writes of the in-memory heartbeats to the database.")
    ] = None,
    eval_samples: Annotated[int | None, typer.Option(help="Validation samples scored each round.")] = None,
    score_samples: Annotated[int | None, typer.Option(help="Samples per batch when scoring one update.")] = None,
    books_nice: Annotated[
        int | None,
        typer.Option(
            help="Nice levels (0-19) the books thread (evaluation, scoring, settlement) runs below the rest of "
            "the coordinator, so it takes only CPU the rounds and the workers on this machine leave (Linux)."
        ),
    ] = None,
    network: Annotated[str | None, typer.Option(help="Ledger network this coordinator settles on (local).")] = None,
    manual_idle: Annotated[
        float | None,
        typer.Option(
            help="Seconds a manual-control run may go without an owner's call, "
            "an update or a progress report before it is failed."
        ),
    ] = None,
    owner_pay: Annotated[
        float | None,
        typer.Option(
            help="Seconds an ended manual-control run's owner has to pay its providers and refund; "
            "then the coordinator pays each contract what its scores are owed and refunds the rest."
        ),
    ] = None,
    stuck: Annotated[
        float | None,
        typer.Option(
            help="Seconds an automatic run may go with no active worker and no offer to replace them "
            "before it is failed (escrow refunded, bonds returned)."
        ),
    ] = None,
    hire_expiry: Annotated[
        float | None,
        typer.Option(
            help="Seconds a run's hires may wait for it to distribute; then the contracts expire "
            "and the providers' bonds go back."
        ),
    ] = None,
    max_pause: Annotated[
        float | None,
        typer.Option(
            help="Seconds a run may stay paused before it is stopped (delivered updates paid, "
            "bonds returned, escrow refunded)."
        ),
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
    settle_delay: Annotated[
        float | None, typer.Option(hidden=True, help="Testing: seconds between two settlements.")
    ] = None,
    keep_checkpoints: Annotated[
        int | None, typer.Option(help="Checkpoints whose bytes are kept per run: the last K rounds.")
    ] = None,
    gc_grace: Annotated[
        float | None,
        typer.Option(
            help="Seconds an unreferenced blob is kept before blob retention deletes it (0 allowed: "
            "a blob written in the last minute, an upload its request has yet to name, is kept anyway)."
        ),
    ] = None,
    gc_interval: Annotated[float | None, typer.Option(help="Seconds between two runs of blob retention.")] = None,
    max_pinned_mb: Annotated[
        float | None, typer.Option(help="MiB of blobs one wallet may keep pinned (kept by blob retention).")
    ] = None,
    max_pinned_total_mb: Annotated[
        float | None, typer.Option(help="MiB of blobs all wallets together may keep pinned.")
    ] = None,
    max_loose_mb: Annotated[
        float | None,
        typer.Option(
            help="MiB of unreferenced, unpinned blobs kept in their grace period; "
            "past it blob retention deletes the least recently touched."
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="PEM certificate (chain): serve HTTPS (with --tls-key).")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert.")] = None,
    divergence_factor: Annotated[
        float | None,
        typer.Option(help="A round whose validation loss exceeds this x the previous round's is not committed."),
    ] = None,
    guard_samples: Annotated[
        int | None, typer.Option(help="Validation samples the divergence check scores before a round commits.")
    ] = None,
    norm_clip: Annotated[
        float | None, typer.Option(help="Updates over this x the round's median norm are scaled down to it.")
    ] = None,
    norm_reject: Annotated[
        float | None, typer.Option(help="Updates over this x the round's median norm are rejected and slashed.")
    ] = None,
    aggregation_memory_mb: Annotated[
        float | None,
        typer.Option(
            help="MiB a round's updates may take as one float32 matrix; past it the round is aggregated "
            "and scored from a spill file on disk, in column blocks."
        ),
    ] = None,
    verify_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds a spot-checked worker has to reveal its states; then its update is rejected unpaid "
            "and its job ends (not slashed)."
        ),
    ] = None,
    verify_threads: Annotated[
        int | None,
        typer.Option(
            help="Most torch threads a spot check's re-run takes (default: the CPUs this process may use); it uses "
            "the worker's stated thread count up to this. Fewer than the worker's: re-runs drift (never slashed).",
            min=1,
            max=1024,
        ),
    ] = None,
    allow_code: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-code",
            help="Module prefix whose module:callable models this coordinator may import (repeatable; "
            "none by default: owners get the built-in mlp, cnn, transformer). Only for code you trust.",
        ),
    ] = None,
) -> None:
    """Serve the coordinator's API under /v1 (OpenAPI docs at /docs).

    Every option can also be set in the environment as AITBC_<SETTING> (e.g.
    AITBC_LEASE_SECONDS=30, AITBC_DB_URL=...); a flag wins over the environment."""
    from aitbc.coordinator.config import Settings
    from aitbc.settings import load_settings

    flags = {
        "host": host,
        "port": port,
        "db_url": db,
        "max_blob_bytes": None if max_blob_mb is None else round(max_blob_mb * MIB),
        "max_json_bytes": None if max_json_kb is None else round(max_json_kb * 1024),
        "max_uploads": max_uploads,
        "max_uploads_per_signer": max_uploads_per_signer,
        "min_upload_rate": None if min_upload_kb_s is None else round(min_upload_kb_s * 1024),
        "upload_rate_window_seconds": upload_rate_window,
        "eval_memory_mb": eval_memory_mb,
        "lease_seconds": lease,
        "max_skew_seconds": max_skew,
        "tick_seconds": tick,
        "driver_lease_seconds": driver_lease,
        "heartbeat_flush_seconds": heartbeat_flush,
        "eval_samples": eval_samples,
        "score_samples": score_samples,
        "books_nice": books_nice,
        "network": network,
        "manual_idle_seconds": manual_idle,
        "owner_pay_seconds": owner_pay,
        "stuck_seconds": stuck,
        "hire_seconds": hire_expiry,
        "pause_seconds": max_pause,
        "log_level": log_level,
        "settle_delay": settle_delay,
        "keep_checkpoints": keep_checkpoints,
        "gc_grace_seconds": gc_grace,
        "gc_interval_seconds": gc_interval,
        "max_pinned_bytes": None if max_pinned_mb is None else round(max_pinned_mb * MIB),
        "max_pinned_bytes_total": None if max_pinned_total_mb is None else round(max_pinned_total_mb * MIB),
        "max_loose_bytes": None if max_loose_mb is None else round(max_loose_mb * MIB),
        "tls_cert": tls_cert,
        "tls_key": tls_key,
        "divergence_factor": divergence_factor,
        "guard_samples": guard_samples,
        "norm_clip": norm_clip,
        "norm_reject": norm_reject,
        "aggregation_memory_mb": aggregation_memory_mb,
        "verify_timeout": verify_timeout,
        "verify_threads": verify_threads,
        "allow_code": allow_code or None,
    }
    names = {
        **SERVE_FLAGS,
        "max_blob_bytes": "--max-blob-mb (in bytes)",
        "max_json_bytes": "--max-json-kb (in bytes)",
        "max_pinned_bytes": "--max-pinned-mb (in bytes)",
        "max_pinned_bytes_total": "--max-pinned-total-mb (in bytes)",
        "max_loose_bytes": "--max-loose-mb (in bytes)",
    }
    settings = load_settings(Settings, {"home": resolve_home(home), **flags}, flag_names=names)
    _logging(settings.log_level)

    import gc

    import uvicorn

    from aitbc.coordinator.app import KEEP_ALIVE_SECONDS, create_app
    from aitbc.coordinator.heap import return_large_frees

    return_large_frees()  # a large model's freed tensors go back to the system (aitbc.coordinator.heap)
    app = create_app(settings)
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
    server = uvicorn.Server(config)
    server.run()


@worker_app.command("start", cls=_settings_help(_worker_settings, WORKER_FLAGS))
def start(
    coordinator: Annotated[
        str | None, typer.Option(help="Coordinator URL (default: AITBC_COORDINATOR or the local stack).")
    ] = None,
    home: HomeOption = DEFAULT_HOME,
    wallet: Annotated[str | None, typer.Option(help="Wallet (identity) of this provider; created if missing.")] = None,
    gpu: Annotated[str | None, typer.Option(help="Advertised GPU class, e.g. RTX4090.")] = None,
    price: Annotated[str | None, typer.Option(help="Price per round in AIT, e.g. 1.20.")] = None,
    max_bond: Annotated[
        str | None,
        typer.Option(help="Most AIT a contract may lock from this wallet as a bond (0: only bond-free runs)."),
    ] = None,
    availability: Annotated[float | None, typer.Option(help="Advertised availability in [0, 1].")] = None,
    heartbeat: Annotated[float | None, typer.Option(help="Seconds between heartbeats.")] = None,
    poll: Annotated[float | None, typer.Option(help="Seconds one long poll for a job may wait.")] = None,
    backoff: Annotated[
        float | None, typer.Option(help="Seconds before the first retry when the coordinator is unreachable.")
    ] = None,
    max_backoff: Annotated[
        float | None, typer.Option(help="Most seconds between two retries (the wait doubles up to it).")
    ] = None,
    progress_every: Annotated[int | None, typer.Option(help="Report progress every this many local steps.")] = None,
    progress_seconds: Annotated[
        float | None, typer.Option(help="Seconds at least between two progress reports (a job's first is always sent).")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
    step_delay: Annotated[
        float | None, typer.Option(hidden=True, help="Testing: seconds to sleep after each local step.")
    ] = None,
    attack: Annotated[
        str | None, typer.Option(hidden=True, help="Testing: act as a Byzantine worker, e.g. sign-flip.")
    ] = None,
    cheat: Annotated[
        str | None,
        typer.Option(
            hidden=True,
            help="Testing: skip-half: train half the steps and claim them all; bad-blobs: serve peers corrupt blobs; "
            "equivocate: sign two gossip records a round (one served to neighbours, one published).",
        ),
    ] = None,
    proof_memory_mb: Annotated[
        float | None,
        typer.Option(
            help="Memory for a verifying run's committed states of one round, in MiB; past it they go to disk "
            "(HOME/worker-proofs) until the round's spot check is answered."
        ),
    ] = None,
    cache_mb: Annotated[
        float | None, typer.Option(help="Disk for cached models and shards, in MiB (least recently used go first).")
    ] = None,
    ca_cert: Annotated[
        Path | None,
        typer.Option(help="CA certificate an https:// coordinator's certificate must chain to (or AITBC_CA_CERT)."),
    ] = None,
    allow_code: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-code",
            help="Module prefix whose module:callable models this worker may import (repeatable; "
            "none by default: owners get the built-in mlp, cnn, transformer). Only for code you trust.",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve this worker's Prometheus metrics on this port (none: not served).")
    ] = None,
    metrics_host: Annotated[
        str | None, typer.Option(help="Address the metrics server listens on (0.0.0.0: every interface).")
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(help="Where to train: auto (cuda:0 if there is a GPU, else the CPU), cpu, cuda or cuda:N."),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(
            help="Data-parallel processes, one per GPU (rank r on cuda:r; with --device cpu, CPU processes): "
            "one update per round, averaged over them."
        ),
    ] = None,
    listen: Annotated[
        str | None,
        typer.Option(
            help="Serve the blobs this worker holds (models, shards) to other workers on HOST:PORT "
            "(none: it only fetches; it still takes part through the coordinator)."
        ),
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(help="URL other workers reach --listen at, http(s)://host:port (default: http:// + --listen)."),
    ] = None,
    peer_timeout: Annotated[
        float | None,
        typer.Option(help="Seconds one read from a peer may wait (the whole fetch gets 4x); then the next peer."),
    ] = None,
    peer_connections: Annotated[
        int | None, typer.Option(help="Blobs served to peers at a time (past it: 503, they try another).")
    ] = None,
) -> None:
    """Offer this machine to the marketplace and train the jobs it is given, until stopped.

    Every option but --coordinator and --home can also be set in the environment as
    AITBC_WORKER_<SETTING> (e.g. AITBC_WORKER_PRICE=1.20); a flag wins over the environment."""
    from aitbc.client import coordinator_url
    from aitbc.settings import load_settings
    from aitbc.worker.config import WorkerSettings

    flags = {
        "wallet": wallet,
        "gpu": gpu,
        "price": price,
        "max_bond": max_bond,
        "availability": availability,
        "heartbeat_seconds": heartbeat,
        "poll_seconds": poll,
        "backoff_seconds": backoff,
        "max_backoff_seconds": max_backoff,
        "progress_every": progress_every,
        "progress_seconds": progress_seconds,
        "log_level": log_level,
        "step_delay": step_delay,
        "attack": attack,
        "cheat": cheat,
        "cache_bytes": None if cache_mb is None else round(cache_mb * MIB),
        "proof_memory_bytes": None if proof_memory_mb is None else round(proof_memory_mb * MIB),
        "allow_code": allow_code or None,
        "metrics_port": metrics_port,
        "metrics_host": metrics_host,
        "device": device,
        "gpus": gpus,
        "listen": listen,
        "advertise": advertise,
        "peer_timeout_seconds": peer_timeout,
        "peer_connections": peer_connections,
    }
    settings = load_settings(WorkerSettings, flags, flag_names={**WORKER_FLAGS, "cache_bytes": "--cache-mb (in bytes)"})
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

    def _terminate(*_: object) -> None:  # out of a long poll or a training step at once
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        worker.run()
    except KeyboardInterrupt:
        worker.stop.set()


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
    """Run blob retention now: delete the coordinator's blobs no run needs any more (old
    checkpoints, settled updates, data of finalized runs). Safe while the coordinator runs."""
    import json
    import sys

    from aitbc.cli.common import out
    from aitbc.coordinator.config import Settings
    from aitbc.coordinator.db import make_engine, make_sessions
    from aitbc.coordinator.retention import IN_FLIGHT_SECONDS, collect
    from aitbc.settings import load_settings
    from aitbc.storage.blobstore import LocalBlobStore

    flags = {"db_url": db, "keep_checkpoints": keep_checkpoints, "gc_grace_seconds": gc_grace}
    settings = load_settings(Settings, {"home": resolve_home(home), **flags}, flag_names=SERVE_FLAGS)
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
