"""The sans-IO layer: operations are generators that yield these requests and receive
their results; :class:`~aitbc_agent_sdk.Agent` and :class:`~aitbc_agent_sdk.AsyncAgent`
only differ in how they carry a request out (blocking vs ``await``)."""

from __future__ import annotations

import json as _json
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx

from aitbc.client import NotACoordinator, error_fields, not_a_coordinator
from aitbc.errors import IntegrityError, NotFoundError, UsageError
from aitbc_agent_sdk.config import AgentConfig
from aitbc_agent_sdk.errors import AgentError, IntegrityFailure, InvalidArgument, NotFound, error_for

T = TypeVar("T")


class AgentState(Protocol):
    """What an operation may read of the agent it runs for (its ``self``): the config and
    the wallet, loaded on first use (``None`` until then), and the current run."""

    config: AgentConfig
    _wallet: Any
    _training_id: str | None  # the agent's current run (see operations.resolve_run)
    _datasets: dict[str, Path]  # dataset folder CID -> the local folder this agent uploaded

    @property
    def address(self) -> str | None: ...


@dataclass(frozen=True)
class Http:
    """One call of the coordinator's ``/v1`` API; ``path`` is relative to ``/v1``.
    Result: the parsed JSON (``raw``: the body's bytes)."""

    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None
    content: bytes | None = None  # a raw body (blob upload: the payload is not signed)
    sign: bool = True
    raw: bool = False

    def target(self) -> str:
        t = "/v1" + self.path
        params = {k: v for k, v in (self.params or {}).items() if v is not None}
        if params:
            t += "?" + str(httpx.QueryParams(params))
        return t

    def body(self) -> bytes:
        if self.content is not None:
            return self.content
        return b"" if self.json is None else _json.dumps(self.json).encode()

    def headers(self) -> dict[str, str]:
        if self.content is not None:
            return {"content-type": "application/octet-stream"}
        return {"content-type": "application/json"} if self.json is not None else {}


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Offload:
    """Local work that may take a while (packaging a dataset, hashing a file): run in a
    thread by the async client so the event loop keeps going. Result: ``fn(*args)``."""

    fn: Callable[..., Any]
    args: tuple = field(default_factory=tuple)


@dataclass(frozen=True)
class Close:
    """Release the HTTP connection pool (``stop()``)."""


Request = Http | Sleep | Offload | Close
Op = Generator[Request, Any, T]


def parse_response(r: httpx.Response, req: Http) -> Any:
    if r.status_code < 400:
        if req.raw:
            return r.content
        other = not_a_coordinator(r)
        if other is not None:
            raise AgentError(NotACoordinator.code, other, r.status_code)
        return r.json() if r.content else None
    raise error_for(r.status_code, *error_fields(r))


def ensure_error(e: BaseException) -> AgentError:
    """Local errors of the ``aitbc`` package as :class:`AgentError` (one hierarchy)."""
    if isinstance(e, AgentError):
        return e
    if isinstance(e, IntegrityError):
        return IntegrityFailure("integrity", str(e))
    if isinstance(e, NotFoundError):
        return NotFound("not_found", str(e))
    if isinstance(e, UsageError):
        return InvalidArgument(getattr(e, "code", "bad_argument"), str(e))
    return AgentError("error", str(e))
