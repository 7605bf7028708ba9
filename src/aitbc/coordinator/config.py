"""The coordinator's settings: one validated object, built at the edge (the CLI).

Every tunable is a field here, with its only default. Each can be set by the environment
as ``AITBC_<FIELD>`` (``AITBC_LEASE_SECONDS=30``, ``AITBC_DB_URL=postgresql://...``,
``AITBC_HOME``); ``aitbc coordinator serve`` flags win over the environment (see
:func:`aitbc.settings.load_settings`). Each field's description is its flag's help, and
:class:`~aitbc.settings.Flag` names a flag that is not ``--field-name``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from aitbc import run_defaults
from aitbc.ledger.chain import LedgerError, check_network
from aitbc.settings import KIB, MIB, Flag
from aitbc.training.allow_code import check_prefixes

LogLevel = Literal["debug", "info", "warning", "error"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AITBC_", frozen=True, extra="forbid", allow_inf_nan=False)

    home: Path  # state directory: database (by default), blobs, the coordinator's wallet
    db_url: Annotated[str | None, Flag("--db")] = Field(
        None, description="SQLAlchemy URL (none: SQLite in WAL mode at HOME/coordinator.db)."
    )
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8700, ge=0, le=65535, description="Port to listen on (0: any free port, printed at start).")
    max_blob_bytes: Annotated[int, Flag("--max-blob-mb", per=MIB, unit="MiB", field_unit="bytes")] = Field(
        256 << 20, ge=1, description="Largest blob an upload may store, in MiB."
    )
    max_json_bytes: Annotated[int, Flag("--max-json-kb", per=KIB, unit="KiB", field_unit="bytes")] = Field(
        1 << 20, ge=1, description="Largest JSON request body, in KiB (refused 413 while it is read)."
    )
    # a round whose n x d float32 updates would pass this is aggregated from disk, in bounded memory
    aggregation_memory_mb: float = Field(
        1024.0,
        gt=0,
        description="MiB a round's updates may take as one float32 matrix; past it the round is aggregated "
        "and scored from a spill file on disk, in column blocks.",
    )
    max_uploads: int = Field(16, ge=1, description="Blob uploads in flight at once; more are refused 429.")
    # Each party's share (coordinator/uploads.py): one signer holds at most this many of them, and
    # a body bringing under min_upload_rate bytes/s over any upload_rate_window seconds is cut off 408.
    max_uploads_per_signer: int = Field(
        4, ge=1, description="Of those, the most one signer (wallet) may hold at once; more are refused 429."
    )
    min_upload_rate: Annotated[int, Flag("--min-upload-kb-s", per=KIB, unit="KiB/s", field_unit="bytes/s")] = Field(
        16 << 10,
        ge=1,
        description="KiB/s an upload's body must bring over every --upload-rate-window seconds; "
        "a slower one is cut off 408 and its slot freed.",
    )
    upload_rate_window_seconds: Annotated[float, Flag("--upload-rate-window")] = Field(
        10.0, gt=0, description="Seconds over which an upload's pace is judged (--min-upload-kb-s)."
    )
    # Activations one evaluation or scoring forward pass may hold: batches are cut to fit. At least
    # one sample of the largest model the bounds admit (training.models.MAX_SAMPLE_BYTES, 128 MiB).
    eval_memory_mb: float = Field(
        256.0,
        ge=128,
        description="MiB of activations one evaluation or scoring forward pass may hold (at least 128: one sample "
        "of the largest model the bounds admit); batches are cut to fit.",
    )
    lease_seconds: Annotated[float, Flag("--lease")] = Field(
        10.0, gt=0, description="Seconds without a heartbeat before a worker is failed."
    )
    max_skew_seconds: Annotated[float, Flag("--max-skew")] = Field(
        120.0, gt=0, description="Seconds a signed request's timestamp may be off before it is refused."
    )
    tick_seconds: Annotated[float, Flag("--tick")] = Field(
        0.2, gt=0, description="Seconds between two looks of the round driver."
    )
    driver_lease_seconds: Annotated[float, Flag("--driver-lease")] = Field(
        5.0,
        gt=0,
        description="Seconds the coordinator that drives the rounds holds its lease in the database (renewed each "
        "quarter); with several coordinators on one database, another takes over this long after it stops.",
    )
    heartbeat_flush_seconds: Annotated[float, Flag("--heartbeat-flush")] = Field(
        2.0, gt=0, description="Seconds between two writes of the in-memory heartbeats to the database."
    )
    eval_samples: int = Field(512, ge=1, description="Validation samples scored each round.")
    # A batch's noise falls with its loss terms, not its samples: a 64-token sequence carries 64
    # (its loss is their mean), a digit image one. So a budget of terms sizes a sequence model's
    # batches, within [verification.scoring.MIN_SCORE_SAMPLES, score_samples] samples.
    score_samples: int = Field(
        512, ge=1, description="Most samples per batch when scoring one update (see --score-terms)."
    )
    score_terms: int = Field(
        8192,
        ge=1,
        description="Loss terms per batch when scoring one update: a sample of T target positions (a sequence "
        "of T tokens) counts T, so a batch holds score_terms // T samples, at least 64, at most --score-samples.",
    )
    # The books thread (evaluation, scoring, settlement, retention: nothing a worker waits for)
    # runs below the rest so that it takes only the CPU the rounds leave.
    books_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="Nice levels (0-19) the books thread (evaluation, scoring, settlement) runs below the rest of "
        "the coordinator, so it takes only CPU the rounds and the workers on this machine leave (Linux).",
    )
    # How far the books may fall behind the rounds: a round is settled within this many later
    # closed rounds or seconds of its close, whichever is longer (rounds.catch_up).
    settle_within_rounds: int = Field(
        2,
        ge=1,
        description="Closed rounds settlement may fall behind (or --settle-within-seconds, whichever is longer): "
        "past half of that a thread at the coordinator's priority settles, and a run's next round waits for it.",
    )
    settle_within_seconds: float = Field(
        10.0,
        ge=0,
        description="Seconds after its close a round is settled (or --settle-within-rounds later rounds, "
        "whichever is longer).",
    )
    network: str = Field(  # aitbc.ledger.chain.NETWORKS
        "local", description="Ledger network this coordinator settles on (local)."
    )
    # Where the money is (coordinator.chain_backend): this coordinator's own ledger, or an EVM
    # chain's escrow contract, which the books then mirror (deposits, bonds) and settle on.
    chain: Literal["local", "evm"] = Field(
        "local",
        description="Where runs' money is held: local (this coordinator's ledger) or evm (the escrow contract of "
        "--chain-file, settled with --settlement-wallet's key).",
    )
    chain_file: Path | None = Field(
        None, description="With --chain evm: the deployment record (aitbc chain deploy); none: HOME/chain.json."
    )
    rpc: str | None = Field(
        None, description="With --chain evm: the node's JSON-RPC URL (none: the one in the deployment record)."
    )
    settlement_wallet: str | None = Field(
        None,
        description="With --chain evm: the wallet under HOME/wallets whose EVM account is the deployment's "
        "settlement key (passphrase from AITBC_WALLET_PASSPHRASE).",
    )
    chain_confirmations: int = Field(
        2, ge=1, le=1000, description="With --chain evm: blocks on a settlement (its own counted) before it is final."
    )
    manual_idle_seconds: Annotated[float, Flag("--manual-idle")] = Field(
        3600.0,
        gt=0,
        description="Seconds a manual-control run may go without an owner's call, "
        "an update or a progress report before it is failed.",
    )
    owner_pay_seconds: Annotated[float, Flag("--owner-pay")] = Field(
        3600.0,
        gt=0,
        description="Seconds an ended manual-control run's owner has to pay its providers and refund; "
        "then the coordinator pays each contract what its scores are owed and refunds the rest.",
    )
    stuck_seconds: Annotated[float, Flag("--stuck")] = Field(
        300.0,
        gt=0,
        description="Seconds an automatic run may go with no active worker and no offer to replace them "
        "before it is failed (escrow refunded, bonds returned).",
    )
    hire_seconds: Annotated[float, Flag("--hire-expiry")] = Field(
        3600.0,
        gt=0,
        description="Seconds a run's hires may wait for it to distribute; then the contracts expire "
        "and the providers' bonds go back.",
    )
    pause_seconds: Annotated[float, Flag("--max-pause")] = Field(
        86400.0,
        gt=0,
        description="Seconds a run may stay paused before it is stopped (delivered updates paid, "
        "bonds returned, escrow refunded).",
    )
    log_level: LogLevel = Field("info", description="debug, info, warning or error.")
    settle_delay: Annotated[float, Flag(hidden=True)] = Field(
        0.0, ge=0, description="Testing: seconds between two settlements."
    )
    # A round's aggregate is not committed if non-finite, or if its validation loss (on the first
    # guard_samples validation samples) exceeds divergence_factor x max(previous round's, initial):
    # the run fails "diverged" and nobody is slashed.
    divergence_factor: float = Field(
        10.0,
        gt=1,
        description="A round whose validation loss exceeds this x the previous round's is not committed.",
    )
    guard_samples: int = Field(
        128, ge=1, description="Validation samples the divergence check scores before a round commits."
    )
    # Update norms against the round's median (aitbc.core.norms).
    norm_clip: float = Field(
        3.0, ge=1, description="Updates over this x the round's median norm are scaled down to it."
    )
    norm_reject: float = Field(
        1000.0, ge=1, description="Updates over this x the round's median norm are rejected and slashed."
    )
    # coordinator/verification.py
    verify_timeout: float = Field(
        120.0,
        gt=0,
        description="Seconds a spot-checked worker has to reveal its states; then its update is rejected unpaid "
        "and its job ends (not slashed).",
    )
    # A re-run uses the thread count the worker's commitment states, up to this: then bit-exact.
    verify_threads: Annotated[int | None, Flag(bounded=True)] = Field(
        None,
        ge=1,
        le=1024,
        description="Most torch threads a spot check's re-run takes (default: the CPUs this process may use); it "
        "uses the worker's stated thread count up to this. Fewer than the worker's: re-runs drift (never slashed).",
    )
    keep_checkpoints: int = Field(  # (+ the current one and the result)
        3, ge=1, description="Checkpoints whose bytes are kept per run: the last K rounds."
    )
    gc_grace_seconds: Annotated[float, Flag("--gc-grace")] = Field(
        300.0,
        ge=0,
        description="Seconds an unreferenced blob is kept before blob retention deletes it (0 allowed: "
        "a blob written in the last minute, an upload its request has yet to name, is kept anyway).",
    )
    gc_interval_seconds: Annotated[float, Flag("--gc-interval")] = Field(
        600.0, gt=0, description="Seconds between two runs of blob retention."
    )
    max_loose_bytes: Annotated[int, Flag("--max-loose-mb", per=MIB, unit="MiB", field_unit="bytes")] = Field(
        8 << 30,
        ge=0,
        description="MiB of unreferenced, unpinned blobs kept in their grace period; "
        "past it blob retention deletes the least recently touched.",
    )
    max_pinned_bytes: Annotated[int, Flag("--max-pinned-mb", per=MIB, unit="MiB", field_unit="bytes")] = Field(
        1 << 30, ge=0, description="MiB of blobs one wallet may keep pinned (kept by blob retention)."
    )
    # wallets cost nothing to make, so the per-wallet cap alone bounds no disk
    max_pinned_bytes_total: Annotated[int, Flag("--max-pinned-total-mb", per=MIB, unit="MiB", field_unit="bytes")] = (
        Field(64 << 30, ge=0, description="MiB of blobs all wallets together may keep pinned.")
    )
    tls_cert: Path | None = Field(None, description="PEM certificate (chain): serve HTTPS (with --tls-key).")
    tls_key: Path | None = Field(None, validate_default=True, description="PEM private key of --tls-cert.")
    allow_code: list[str] = Field(
        [],
        description="Module prefix whose module:callable models this coordinator may import (repeatable; "
        "none by default: owners get the built-in mlp, cnn, transformer). Only for code you trust.",
    )

    max_params: int = Field(
        run_defaults.MAX_PARAMS,
        ge=1,
        description="Largest model this coordinator trains, in parameters: a run whose model counts more is "
        "refused at init, and again when its data is attached (counted exactly).",
    )

    @field_validator("home")
    @classmethod
    def _expand_home(cls, home: Path) -> Path:
        return home.expanduser()

    @field_validator("network")
    @classmethod
    def _known_network(cls, network: str) -> str:
        try:
            return check_network(network)
        except LedgerError as e:
            raise ValueError(e.detail) from None

    @field_validator("chain_file")
    @classmethod
    def _expand_chain_file(cls, path: Path | None) -> Path | None:
        return None if path is None else path.expanduser()

    @field_validator("norm_reject")
    @classmethod
    def _reject_over_clip(cls, reject: float, info: ValidationInfo) -> float:
        clip = info.data.get("norm_clip")
        if clip is not None and reject < clip:
            raise ValueError(f"must be at least norm_clip ({clip:g}), got {reject:g}")
        return reject

    @field_validator("driver_lease_seconds")
    @classmethod
    def _lease_over_ticks(cls, lease: float, info: ValidationInfo) -> float:
        tick = info.data.get("tick_seconds")
        if tick is not None and lease < 4 * tick:
            raise ValueError(f"must be at least 4 x tick_seconds ({4 * tick:g}: renewed each quarter), got {lease:g}")
        return lease

    @field_validator("allow_code")
    @classmethod
    def _code_prefixes(cls, prefixes: list[str]) -> list[str]:
        return check_prefixes(prefixes)

    @field_validator("tls_cert", "tls_key")
    @classmethod
    def _tls_file(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        if path is not None and not path.expanduser().is_file():
            raise ValueError(f"no such file: {path}")
        if info.field_name == "tls_key" and (path is None) != (info.data.get("tls_cert") is None):
            raise ValueError("give both --tls-cert and --tls-key (AITBC_TLS_CERT, AITBC_TLS_KEY) or neither")
        return None if path is None else path.expanduser()

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, level: object) -> object:
        return level.lower() if isinstance(level, str) else level

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'coordinator.db'}"
