"""The coordinator's settings: one validated object, built at the edge (the CLI)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path
    db_url: str | None = None  # any SQLAlchemy URL; None: SQLite (WAL) at home/coordinator.db
    host: str = "127.0.0.1"
    port: int = Field(8700, ge=0, le=65535)
    max_blob_bytes: int = Field(256 << 20, ge=1)  # largest blob a PUT may store
    lease_seconds: float = Field(10.0, gt=0)  # a worker silent this long has failed
    max_skew_seconds: float = Field(120.0, gt=0)  # signed timestamps this far off are refused
    tick_seconds: float = Field(0.2, gt=0)  # how often the round driver looks at the clock
    heartbeat_flush_seconds: float = Field(2.0, gt=0)  # in-memory heartbeats -> database
    eval_samples: int = Field(512, ge=1)  # validation samples scored each round
    score_samples: int = Field(512, ge=1)  # samples per batch when scoring one update
    network: str = "local"  # the ledger this coordinator settles on
    settle_delay: float = Field(0.0, ge=0)  # testing: pause between two settlements
    manual_idle_seconds: float = Field(
        3600.0, gt=0
    )  # a manual run with no owner call, update or progress this long fails

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'coordinator.db'}"
