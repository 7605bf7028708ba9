"""The coordinator's settings: one validated object, built at the edge (the CLI).

Every tunable is a field here, with its only default. Each can be set by the environment
as ``AITBC_<FIELD>`` (``AITBC_LEASE_SECONDS=30``, ``AITBC_DB_URL=postgresql://...``,
``AITBC_HOME``); ``aitbc coordinator serve`` flags win over the environment (see
:func:`aitbc.settings.load_settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from aitbc.ledger.chain import LedgerError, check_network
from aitbc.training.allow_code import check_prefixes

LogLevel = Literal["debug", "info", "warning", "error"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AITBC_", frozen=True, extra="forbid", allow_inf_nan=False)

    home: Path  # state directory: database (by default), blobs, the coordinator's wallet
    db_url: str | None = None  # any SQLAlchemy URL; None: SQLite (WAL) at home/coordinator.db
    host: str = "127.0.0.1"
    port: int = Field(8700, ge=0, le=65535)  # 0: any free port
    max_blob_bytes: int = Field(256 << 20, ge=1)  # largest blob a PUT may store
    max_json_bytes: int = Field(1 << 20, ge=1)  # largest JSON request body (counted while read)
    # a round whose n x d float32 updates would pass this is aggregated from disk, in bounded memory
    aggregation_memory_mb: float = Field(1024.0, gt=0)
    max_uploads: int = Field(16, ge=1)  # blob uploads in flight at once; more are refused 429
    # Each party's share (coordinator/uploads.py): one signer holds at most this many of them, and
    # a body bringing under min_upload_rate bytes/s over any upload_rate_window seconds is cut off 408.
    max_uploads_per_signer: int = Field(4, ge=1)
    min_upload_rate: int = Field(16 << 10, ge=1)
    upload_rate_window_seconds: float = Field(10.0, gt=0)
    # Activations one evaluation or scoring forward pass may hold: batches are cut to fit. At least
    # one sample of the largest model the bounds admit (training.models.MAX_SAMPLE_BYTES, 128 MiB).
    eval_memory_mb: float = Field(256.0, ge=128)
    lease_seconds: float = Field(10.0, gt=0)  # a worker silent this long has failed
    max_skew_seconds: float = Field(120.0, gt=0)  # signed timestamps this far off are refused
    tick_seconds: float = Field(0.2, gt=0)  # how often the round driver looks at the clock
    # replicas on one database: the rounds' driver holds a lease this long, renewed every quarter of it
    driver_lease_seconds: float = Field(5.0, gt=0)
    heartbeat_flush_seconds: float = Field(2.0, gt=0)  # in-memory heartbeats -> database
    eval_samples: int = Field(512, ge=1)  # validation samples scored each round
    score_samples: int = Field(512, ge=1)  # samples per batch when scoring one update
    # The books thread (evaluation, scoring, settlement, retention: nothing a worker waits for)
    # runs this many nice levels below the rest of the coordinator (Linux; 0: as the rest).
    books_nice: int = Field(10, ge=0, le=19)
    network: str = "local"  # the ledger this coordinator settles on (aitbc.ledger.chain.NETWORKS)
    manual_idle_seconds: float = Field(
        3600.0, gt=0
    )  # a manual run with no owner call, update or progress this long fails
    owner_pay_seconds: float = Field(
        3600.0, gt=0
    )  # an ended manual run's owner has this long to pay and refund; then the coordinator pays what is owed
    stuck_seconds: float = Field(
        300.0, gt=0
    )  # an automatic run with no active worker and no offer to hire this long fails
    hire_seconds: float = Field(
        3600.0, gt=0
    )  # contracts of a run that has not distributed this long after hiring expire; their bonds go back
    pause_seconds: float = Field(
        86400.0, gt=0
    )  # a run paused this long is stopped (its delivered updates paid, bonds returned, escrow refunded)
    log_level: LogLevel = "info"
    settle_delay: float = Field(0.0, ge=0)  # testing: pause between two settlements
    # A round's aggregate is not committed if non-finite, or if its validation loss (on the first
    # guard_samples validation samples) exceeds divergence_factor x max(previous round's, initial):
    # the run fails "diverged" and nobody is slashed.
    divergence_factor: float = Field(10.0, gt=1)
    guard_samples: int = Field(128, ge=1)
    # Update norms against the round's median (aitbc.core.norms): over norm_clip x scaled down,
    # over norm_reject x rejected and slashed.
    norm_clip: float = Field(3.0, ge=1)
    norm_reject: float = Field(1000.0, ge=1)
    # A worker whose update was spot-checked reveals the states asked for within this long, or
    # its update is rejected unpaid and its job ends (coordinator/verification.py).
    verify_timeout: float = Field(120.0, gt=0)
    # The most torch threads a spot check's re-run takes (None: the CPUs this process may use).
    # A re-run uses the thread count the worker's commitment states, up to this: then bit-exact.
    verify_threads: int | None = Field(None, ge=1, le=1024)
    keep_checkpoints: int = Field(3, ge=1)  # checkpoint bytes kept per run: the last K rounds (+ current and result)
    gc_grace_seconds: float = Field(300.0, ge=0)  # an unreferenced blob younger than this is never deleted
    gc_interval_seconds: float = Field(600.0, gt=0)  # how often the round driver runs the retention policy
    # unreferenced blobs in their grace period, all together: past it the least recently touched go
    max_loose_bytes: int = Field(8 << 30, ge=0)
    max_pinned_bytes: int = Field(1 << 30, ge=0)  # blob bytes one wallet may keep pinned (POST /v1/blobs/{cid}/pin)
    # all wallets together (wallets cost nothing to make, so the per-wallet cap alone bounds no disk)
    max_pinned_bytes_total: int = Field(64 << 30, ge=0)
    tls_cert: Path | None = None  # PEM certificate (chain): serve HTTPS with it and tls_key
    tls_key: Path | None = Field(None, validate_default=True)  # its PEM private key
    # module prefixes whose module:callable models this coordinator may import (none by default)
    allow_code: list[str] = []

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
