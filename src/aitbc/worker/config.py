"""The worker's settings: every tunable of ``aitbc worker start``, with its only default.

Each can be set by the environment as ``AITBC_WORKER_<FIELD>`` (``AITBC_WORKER_PRICE=1.20``,
``AITBC_WORKER_HEARTBEAT_SECONDS=1``); flags win over the environment (see
:func:`aitbc.settings.load_settings`). Where to connect and where to keep files are not
settings of the worker: the CLI resolves them as for every command (``--coordinator`` /
``AITBC_COORDINATOR`` / the local stack, ``--home`` / ``AITBC_HOME``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from aitbc.storage.peer_url import check_advertise
from aitbc.training.allow_code import check_prefixes
from aitbc.training.devices import check_device_spec
from aitbc.units import parse_price
from aitbc.worker.peers import parse_listen

LogLevel = Literal["debug", "info", "warning", "error"]


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AITBC_WORKER_", frozen=True, extra="forbid", allow_inf_nan=False)

    wallet: str = Field("worker", min_length=1)  # this provider's identity; created if missing
    gpu: str = Field("RTX3090", min_length=1)  # advertised GPU class
    price: str = "1.0"  # AIT per round, as typed ("1.20")
    max_bond: str = "0"  # AIT: the most a contract may lock from this wallet as a bond (0: bond-free runs only)
    availability: float = Field(0.98, ge=0, le=1)  # advertised availability
    heartbeat_seconds: float = Field(2.0, gt=0)  # between two heartbeats
    poll_seconds: float = Field(10.0, gt=0)  # long-poll length when there is nothing to train
    backoff_seconds: float = Field(0.2, gt=0)  # first wait before retrying an unreachable coordinator
    max_backoff_seconds: float = Field(5.0, gt=0)  # the wait doubles up to this
    progress_every: int = Field(10, ge=1)  # report progress every this many local steps
    progress_seconds: float = Field(1.0, ge=0)  # and at most once in this many seconds (a job's first report always)
    # a verifying run's committed states stay in memory up to this size a round, else go to disk
    proof_memory_bytes: int = Field(256 << 20, ge=0)
    cache_bytes: int = Field(512 << 20, ge=0)  # models and shards kept on disk, least recently used evicted first
    log_level: LogLevel = "info"
    step_delay: float = Field(0.0, ge=0)  # testing: sleep this long after each local step (a slower device)
    attack: str | None = None  # testing: behave as a Byzantine worker (a core.attacks spec)
    # testing: skip-half: do half the local steps and claim all (worker/cheats.py); bad-blobs: serve peers
    # every blob with its first byte flipped (worker/peers.py); equivocate: a gossip worker signs two
    # records a round, one served to its neighbours and one published (worker/gossip.py); copy,
    # copy-noise, trickle, endless: gossip cheats (worker/cheats.py)
    cheat: Literal["skip-half", "bad-blobs", "equivocate", "copy", "copy-noise", "trickle", "endless"] | None = None
    metrics_port: int | None = Field(None, ge=1, le=65535)  # serve Prometheus metrics here (none: not served)
    metrics_host: str = Field("127.0.0.1", min_length=1)  # the metrics server's address (0.0.0.0: every interface)
    # module prefixes whose module:callable models this worker may import (none by default)
    allow_code: list[str] = []
    # where it trains: auto (cuda:0 if torch sees a GPU, else the CPU), cpu, cuda or cuda:N
    device: str = "auto"
    # data-parallel processes inside this worker, one per GPU (rank r on cuda:r; with --device cpu, CPU processes)
    gpus: int = Field(1, ge=1, le=64)
    # peer transport: serve the blobs this worker holds to other workers on HOST:PORT (none: not served)
    listen: str | None = None
    # the URL other workers reach that server at (default: http://HOST:PORT of listen, unless HOST is 0.0.0.0/::)
    advertise: str | None = None
    peer_timeout_seconds: float = Field(10.0, gt=0, le=600)  # one read from a peer; the whole fetch gets 4x
    peer_connections: int = Field(8, ge=1, le=256)  # blobs served to peers at a time (503 past it)

    @field_validator("listen")
    @classmethod
    def _listen(cls, listen: str | None) -> str | None:
        if listen is not None:
            parse_listen(listen)
        return listen

    @field_validator("advertise")
    @classmethod
    def _advertise(cls, url: str | None, info: ValidationInfo) -> str | None:
        if url is None:
            return None
        if info.data.get("listen") is None:
            raise ValueError("advertise needs listen (the server it names)")
        return check_advertise(url)

    @model_validator(mode="after")
    def _reachable(self) -> WorkerSettings:
        if self.listen is not None and self.advertise is None and parse_listen(self.listen)[0] in ("0.0.0.0", "::"):
            raise ValueError(f"listen {self.listen} is every interface: give advertise, the URL peers reach it at")
        return self

    def advertise_url(self) -> str | None:
        """Where peers fetch from: ``advertise``, else ``http://`` + ``listen``; None: not served."""
        if self.listen is None or self.advertise is not None:
            return self.advertise
        host, port = parse_listen(self.listen)
        return check_advertise(f"http://{f'[{host}]' if ':' in host else host}:{port}")

    @field_validator("price", "max_bond")
    @classmethod
    def _ait(cls, value: str) -> str:
        parse_price(value, field="amount")  # a UnitError is a ValueError: one line naming the source
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, device: str) -> str:
        return check_device_spec(device)  # the hardware itself is checked when the worker starts

    @field_validator("gpus")
    @classmethod
    def _one_process_cheat(cls, gpus: int, info: ValidationInfo) -> int:
        if gpus > 1 and info.data.get("cheat") is not None:  # cheat is declared (and checked) before gpus
            raise ValueError("the testing cheat trains in one process; give 1 with cheat")
        return gpus

    @field_validator("allow_code")
    @classmethod
    def _code_prefixes(cls, prefixes: list[str]) -> list[str]:
        return check_prefixes(prefixes)

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, level: object) -> object:
        return level.lower() if isinstance(level, str) else level
