"""The sans-IO layer: operations are generators that yield these requests and receive
their results; :class:`~aitbc_agent_sdk.Agent` and :class:`~aitbc_agent_sdk.AsyncAgent`
only differ in how they carry a request out (blocking vs ``await``)."""

from __future__ import annotations

import json as _json
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from aitbc.client import NotACoordinator, error_fields, not_a_coordinator
from aitbc.errors import IntegrityError, NotFoundError, UsageError
from aitbc.replies.base import parse
from aitbc_agent_sdk.config import AgentConfig
from aitbc_agent_sdk.errors import AgentError, IntegrityFailure, InvalidArgument, NotFound, error_for

T = TypeVar("T")

Progress = Callable[[str, int, int], None]
# what Progress means (docs/SDK.md prints it: an alias has no docstring of its own)
PROGRESS_DOC = """``progress(stage, done, total)``: how far an operation that moves bytes has come, in
bytes. Stages follow one another (``hash``: files read and hashed into CIDs; ``package``: a
dataset cut into shards, ``total`` 0 until it is done; ``upload``; ``download``); a call
naming another stage than the last starts that stage, whose ``done`` rises from 0 to its
``total``, the last call of each having ``done == total``. ``total`` is known from the
stage's first call, except a download's (0 until the reply's length is in) and
``package``'s. Called from the thread doing the work (``AsyncAgent``: a worker thread while
hashing or packaging); it should return quickly. An exception it raises ends the
operation and reaches the caller as itself (not as an ``AgentError``); what was sent so far
stays stored, but a run's dataset is attached only once all its pieces are. One stage counts
rounds, not bytes: ``settle`` (``get_payments`` and ``refund_payments`` waiting for an ended
run's settlement), the rounds settled of the rounds closed, reported at each look while they
wait (nothing when the payments are final at the first look). Another counts micro-AIT:
``deposit`` (``start_training`` on an EVM coordinator), the run's escrow on chain before
its transactions and once they are mined (nothing when it holds enough already)."""

CHUNK = 256 << 10  # bytes per piece of an upload whose progress is reported


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
    # called as the body moves (the upload's bytes sent, or a raw reply's received) with
    # (bytes so far, the body's length: None for a reply that does not declare it)
    progress: Callable[[int, int | None], None] | None = field(default=None, compare=False)

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

    def pieces(self) -> Iterator[bytes]:
        """The raw body in :data:`CHUNK` pieces, reporting each once it is taken (sent)."""
        data = self.content or b""
        total = len(data)
        for start in range(0, total, CHUNK):
            piece = data[start : start + CHUNK]
            yield piece
            if self.progress is not None:
                self.progress(start + len(piece), total)
        if not total and self.progress is not None:
            self.progress(0, 0)

    @property
    def streams_upload(self) -> bool:
        return self.progress is not None and self.content is not None

    @property
    def streams_reply(self) -> bool:
        return self.progress is not None and self.raw


CALLER_MARK = "_aitbc_raised_by_progress"


def raised_by_caller(e: BaseException) -> bool:
    """Whether ``e`` came from the caller's ``progress`` callback (ended the operation as itself)."""
    return getattr(e, CALLER_MARK, False) is True


class Meter:
    """One stage of a :data:`Progress`: bytes done of ``total`` over one or more requests or
    local steps; reports ``(stage, 0, total)`` when made (``total`` None: at its first
    update instead). Reports nothing when ``progress`` is None."""

    def __init__(self, progress: Progress | None, stage: str, total: int | None = 0) -> None:
        self.user, self.stage, self.total, self.done = progress, stage, total or 0, 0
        self.progress = None if progress is None else self._call
        if progress is not None and total is not None:  # None: the first update starts it
            self._call(stage, 0, total)

    def _call(self, stage: str, done: int, total: int) -> None:
        """The caller's callback; what it raises is marked (:func:`raised_by_caller`) so it
        reaches the caller as itself, not as an :class:`AgentError`."""
        try:
            self.user(stage, done, total)  # type: ignore[misc]
        except Exception as e:
            setattr(e, CALLER_MARK, True)
            raise

    def add(self, n: int) -> None:
        """``n`` more bytes done (a local step's)."""
        self.update(self.done + n)

    def update(self, done: int, total: int | None = None) -> None:
        if self.progress is None:
            return
        if total is not None:
            self.total = total
        self.done = max(self.done, done)
        self.total = max(self.total, self.done)
        self.progress(self.stage, self.done, self.total)

    def local(self) -> Callable[[int, int], None] | None:
        """For a local step that reports ``(done, total)`` of its own: the stage's."""
        return None if self.progress is None else self.update

    def request(self) -> Callable[[int, int | None], None] | None:
        """For one :class:`Http` whose body moves: its bytes add to the stage's from where it
        stands (a download's declared length becomes the stage's total)."""
        if self.progress is None:
            return None
        base = self.done

        def moved(n: int, length: int | None) -> None:
            self.update(base + n, None if length is None else max(self.total, base + length))

        return moved

    def end(self) -> None:
        """The stage is over: ``done`` is its total (a reply that declared no length)."""
        if self.progress is not None and self.done != self.total:
            self.total = self.done
            self.progress(self.stage, self.done, self.total)


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

M = TypeVar("M", bound=BaseModel)


def ask(reply: type[M], req: Http) -> Op[M]:
    """Carry out ``req`` and parse its JSON reply as ``reply``, the model the coordinator
    answers that call with (:mod:`aitbc.replies`): a field it renamed is a type error in
    the caller, and a reply of another shape an :class:`AgentError` (``bad_reply``) here,
    not a ``KeyError`` later."""
    answer = yield req
    try:
        return parse(reply, answer)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the reply"
        raise AgentError(
            "bad_reply",
            f"{req.method} /v1{req.path} answered with no {reply.__name__} "
            f"({e.error_count()} field(s) wrong; {where}: {first['msg']})",
        ) from None


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
    """Local errors of the ``aitbc`` package as :class:`AgentError` (one hierarchy); an
    exception of the caller's ``progress`` callback is not one (see :func:`passed_on`)."""
    if isinstance(e, AgentError):
        return e
    if isinstance(e, IntegrityError):
        return IntegrityFailure("integrity", str(e))
    if isinstance(e, NotFoundError):
        return NotFound("not_found", str(e))
    if isinstance(e, UsageError):
        return InvalidArgument(getattr(e, "code", "bad_argument"), str(e))
    return AgentError("error", str(e))


def passed_on(e: BaseException) -> BaseException:
    """What an operation sees of ``e``, raised while carrying out its request: the caller's
    own exception (from its ``progress`` callback) or a cancellation as they are, anything
    else as an :class:`AgentError`."""
    return e if raised_by_caller(e) or not isinstance(e, Exception) else ensure_error(e)
