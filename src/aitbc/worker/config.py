"""The worker's settings: every tunable of ``aitbc worker start``, with its only default.

Each can be set by the environment as ``AITBC_WORKER_<FIELD>`` (``AITBC_WORKER_PRICE=1.20``,
``AITBC_WORKER_HEARTBEAT_SECONDS=1``); flags win over the environment (see
:func:`aitbc.settings.load_settings`). Each field's description is its flag's help, and
:class:`~aitbc.settings.Flag` names a flag that is not ``--field-name``. Where to connect
and where to keep files are not settings of the worker: the CLI resolves them as for every
command (``--coordinator`` / ``AITBC_COORDINATOR`` / the local stack, ``--home`` /
``AITBC_HOME``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from aitbc.market.capacity import MAX_OFFER_PARAMS
from aitbc.settings import MIB, Flag
from aitbc.storage.peer_url import check_advertise
from aitbc.training.allow_code import check_prefixes
from aitbc.training.devices import check_device_spec
from aitbc.units import parse_price
from aitbc.worker.peers import parse_listen

LogLevel = Literal["debug", "info", "warning", "error"]


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AITBC_WORKER_", frozen=True, extra="forbid", allow_inf_nan=False)

    wallet: str = Field("worker", min_length=1, description="Wallet (identity) of this provider; created if missing.")
    gpu: str = Field("RTX3090", min_length=1, description="Advertised GPU class, e.g. RTX4090.")
    price: str = Field("1.0", description="Price per round in AIT, e.g. 1.20.")  # as typed
    max_bond: str = Field(
        "0", description="Most AIT a contract may lock from this wallet as a bond (0: only bond-free runs)."
    )
    availability: float = Field(0.98, ge=0, le=1, description="Advertised availability in [0, 1].")
    max_params: int | None = Field(
        None,
        ge=1,
        le=MAX_OFFER_PARAMS,
        description="Largest model this worker trains, in parameters: stated in its offer (hiring passes it over "
        "for larger runs), and a job of a larger model is refused. Default: derived from the training device's "
        "memory (3/4 of it over 22 bytes a parameter: weights, gradients, Adam's moments, the round's start).",
    )
    heartbeat_seconds: Annotated[float, Flag("--heartbeat")] = Field(
        2.0, gt=0, description="Seconds between heartbeats."
    )
    poll_seconds: Annotated[float, Flag("--poll")] = Field(
        10.0, gt=0, description="Seconds one long poll for a job may wait."
    )
    backoff_seconds: Annotated[float, Flag("--backoff")] = Field(
        0.2, gt=0, description="Seconds before the first retry when the coordinator is unreachable."
    )
    max_backoff_seconds: Annotated[float, Flag("--max-backoff")] = Field(
        5.0, gt=0, description="Most seconds between two retries (the wait doubles up to it)."
    )
    progress_every: int = Field(10, ge=1, description="Report progress every this many local steps.")
    progress_seconds: float = Field(
        1.0, ge=0, description="Seconds at least between two progress reports (a job's first is always sent)."
    )
    proof_memory_bytes: Annotated[int, Flag("--proof-memory-mb", per=MIB, unit="MiB", field_unit="bytes")] = Field(
        256 << 20,
        ge=0,
        description="Memory for a verifying run's committed states of one round, in MiB; past it they go to disk "
        "(HOME/worker-proofs) until the round's spot check is answered.",
    )
    cache_bytes: Annotated[int, Flag("--cache-mb", per=MIB, unit="MiB", field_unit="bytes")] = Field(
        512 << 20, ge=0, description="Disk for cached models and shards, in MiB (least recently used go first)."
    )
    log_level: LogLevel = Field("info", description="debug, info, warning or error.")
    step_delay: Annotated[float, Flag(hidden=True)] = Field(  # a slower device
        0.0, ge=0, description="Testing: seconds to sleep after each local step."
    )
    attack: Annotated[str | None, Flag(hidden=True)] = Field(  # a core.attacks spec
        None, description="Testing: act as a Byzantine worker, e.g. sign-flip."
    )
    # skip-half (worker/cheats.py); bad-blobs (worker/peers.py); equivocate (worker/gossip.py); copy,
    # copy-noise, trickle, endless: gossip cheats (worker/cheats.py)
    cheat: Annotated[
        Literal["skip-half", "bad-blobs", "equivocate", "copy", "copy-noise", "trickle", "endless"] | None,
        Flag(hidden=True),
    ] = Field(
        None,
        description="Testing: skip-half: train half the steps and claim them all; bad-blobs: serve peers corrupt "
        "blobs; equivocate: sign two gossip records a round (one served to neighbours, one published).",
    )
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Serve this worker's Prometheus metrics on this port (none: not served).",
    )
    metrics_host: str = Field(
        "127.0.0.1", min_length=1, description="Address the metrics server listens on (0.0.0.0: every interface)."
    )
    allow_code: list[str] = Field(
        [],
        description="Module prefix whose module:callable models this worker may import (repeatable; "
        "none by default: owners get the built-in mlp, cnn, transformer). Only for code you trust.",
    )
    device: str = Field(
        "auto",
        description="Where to train: auto (cuda:0 if there is a GPU, else the CPU), cpu, cuda or cuda:N.",
    )
    gpus: int = Field(
        1,
        ge=1,
        le=64,
        description="Data-parallel processes, one per GPU (rank r on cuda:r; with --device cpu, CPU processes): "
        "one update per round, averaged over them.",
    )
    listen: str | None = Field(
        None,
        description="Serve the blobs this worker holds (models, shards) to other workers on HOST:PORT "
        "(none: it only fetches; it still takes part through the coordinator).",
    )
    # default: http://HOST:PORT of listen, unless HOST is 0.0.0.0/::
    advertise: str | None = Field(
        None,
        description="URL other workers reach --listen at, http(s)://host:port (default: http:// + --listen).",
    )
    peer_timeout_seconds: Annotated[float, Flag("--peer-timeout")] = Field(
        10.0,
        gt=0,
        le=600,
        description="Seconds one read from a peer may wait (the whole fetch gets 4x); then the next peer.",
    )
    peer_connections: int = Field(
        8, ge=1, le=256, description="Blobs served to peers at a time (past it: 503, they try another)."
    )

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
