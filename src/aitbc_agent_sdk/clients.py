"""``Agent`` (blocking) and ``AsyncAgent`` (``await`` every method): one driver each for
the sans-IO operations of :mod:`aitbc_agent_sdk.operations`; their public methods are
generated from :data:`~aitbc_agent_sdk.operations.OPERATIONS`, so both have the same
names and signatures by construction.

Type checkers cannot see methods set at import, so they read them from
``_methods.pyi``, a stub generated from the same table (``python -m
aitbc_agent_sdk.stub``; a test keeps it current)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from aitbc.client import DROPPED, idempotent, tls_verify, unreachable_detail
from aitbc.errors import AitbcError
from aitbc_agent_sdk import checkpoints as _checkpoints  # noqa: F401 - registers its operations
from aitbc_agent_sdk import control as _control  # noqa: F401 - registers its operations
from aitbc_agent_sdk import data as _data  # noqa: F401 - registers its operations
from aitbc_agent_sdk import money as _money  # noqa: F401 - registers its operations
from aitbc_agent_sdk import use as _use  # noqa: F401 - registers its operations
from aitbc_agent_sdk import workers as _workers  # noqa: F401 - registers its operations
from aitbc_agent_sdk.config import AgentConfig
from aitbc_agent_sdk.errors import CoordinatorUnreachable, InvalidArgument
from aitbc_agent_sdk.operations import OPERATIONS
from aitbc_agent_sdk.protocol import (
    Close,
    Http,
    Offload,
    Sleep,
    ensure_error,
    parse_response,
    passed_on,
    raised_by_caller,
)

if TYPE_CHECKING:
    from aitbc_agent_sdk._methods import AgentMethods, AsyncAgentMethods
else:  # the methods themselves are set from OPERATIONS below
    AgentMethods = AsyncAgentMethods = object


class _Core:
    """State both clients share: the config and the wallet (loaded by ``start()``)."""

    def __init__(self, config: AgentConfig) -> None:
        if not isinstance(config, AgentConfig):
            raise TypeError(f"config must be an AgentConfig, got {type(config).__name__}")
        self.config = config
        self._wallet: Any = None
        self._http: Any = None
        self._replica = 0  # which of the configured coordinators requests go to
        self._training_id: str | None = None
        self._datasets: dict[str, Path] = {}

    @property
    def training_id(self) -> str | None:
        """The agent's current run: the one it initialized or last named, else (once a
        method needed one) the only active run its wallet owns; None until then."""
        return self._training_id

    @property
    def address(self) -> str | None:
        """The wallet's address once loaded (after ``start()``)."""
        return None if self._wallet is None else self._wallet.address

    def _signed(self, req: Http) -> tuple[str, bytes, dict[str, str]]:
        from aitbc.ledger.signing import sign_request

        target, body, headers = req.target(), req.body(), req.headers()
        if req.sign and self.config.wallet_name is None:
            if req.method != "GET":  # reads need no signature; everything else does
                raise InvalidArgument(
                    "no_wallet",
                    f"{req.method} {target} must be signed; this agent is read-only (AgentConfig(wallet_name=None))",
                )
        elif req.sign:
            if self._wallet is None:
                from aitbc.ledger.wallet import load_wallet

                self._wallet = load_wallet(self.config.resolved_home, self.config.wallet_name or "")
            headers.update(
                sign_request(self._wallet, req.method, target, body, unsigned_payload=req.content is not None)
            )
        return target, body, headers

    def _verify(self) -> Any:
        """httpx's ``verify=``: the configured CA only, or the system's CAs."""
        try:
            return tls_verify(self.config.resolved_ca_cert)
        except AitbcError as e:
            raise InvalidArgument("bad_ca_cert", str(e)) from None

    def _unreachable(self, e: Exception, url: str | None = None) -> CoordinatorUnreachable:
        return CoordinatorUnreachable("unreachable", unreachable_detail(url or self.config.resolved_coordinator_url, e))

    @property
    def _url(self) -> str:
        return self.config.resolved_coordinator_urls[self._replica]

    def _next_replica(self) -> Any:
        """Requests go to the next configured coordinator from now on; the client of the
        last one, to close."""
        old, self._http = self._http, None
        self._replica = (self._replica + 1) % len(self.config.resolved_coordinator_urls)
        return old

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.config.name!r}, coordinator={self.config.resolved_coordinator_url!r})"


class Agent(_Core, AgentMethods):
    """The blocking client (``httpx.Client``). Use as a context manager to close it."""

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(base_url=self._url, timeout=self.config.timeout, verify=self._verify())
        return self._http

    def _do(self, req: Any) -> Any:
        if isinstance(req, Http):
            target, body, headers = self._signed(req)
            error: Exception | None = None
            for _ in self.config.resolved_coordinator_urls:  # the next replica while none can be connected to
                url = self._url
                try:
                    try:
                        return self._send(req, target, body, headers)
                    except DROPPED:  # a pooled connection closed as it was sent: once more, signed afresh
                        if not idempotent(req.method, target):
                            raise
                        target, body, headers = self._signed(req)
                        return self._send(req, target, body, headers)
                except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # never sent
                    error = e
                    _close(self._next_replica())
                except httpx.TransportError as e:  # sent, answer lost: not sent again
                    _close(self._next_replica())
                    raise self._unreachable(e, url) from None
            assert error is not None
            raise self._unreachable(error, ", ".join(self.config.resolved_coordinator_urls)) from None
        if isinstance(req, Sleep):
            time.sleep(req.seconds)
            return None
        if isinstance(req, Offload):
            return req.fn(*req.args)
        if isinstance(req, Close):
            if self._http is not None:
                self._http.close()
                self._http = None
            return None
        raise TypeError(f"unknown request {req!r}")

    def _send(self, req: Http, target: str, body: bytes, headers: dict[str, str]) -> Any:
        if req.streams_reply:
            return self._receive(req, target, body, headers)
        if req.streams_upload:  # sent in pieces, each reported; the length declared
            headers["content-length"] = str(len(body))
            r = self._client().request(req.method, target, content=req.pieces(), headers=headers)
        else:
            r = self._client().request(req.method, target, content=body, headers=headers)
        return parse_response(r, req)

    def _receive(self, req: Http, target: str, body: bytes, headers: dict[str, str]) -> Any:
        """A raw reply read in pieces, each reported (``req.progress``)."""
        with self._client().stream(req.method, target, content=body, headers=headers) as r:
            if r.status_code >= 400:
                r.read()
                return parse_response(r, req)
            length, data = _length(r), bytearray()
            for piece in r.iter_bytes():
                data += piece
                req.progress(r.num_bytes_downloaded, length)  # type: ignore[misc]
            if not data:
                req.progress(0, length)  # type: ignore[misc]
            return bytes(data)

    def _run(self, gen: Generator) -> Any:
        try:
            req = next(gen)
            while True:
                try:
                    result = self._do(req)
                except BaseException as e:  # noqa: BLE001 - handed to the operation to handle or re-raise
                    req = gen.throw(passed_on(e))
                else:
                    req = gen.send(result)
        except StopIteration as stop:
            return stop.value
        except AitbcError as e:  # a local error of the aitbc package (bad dataset, ...) in the SDK's hierarchy
            if raised_by_caller(e):
                raise
            raise ensure_error(e) from None

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self._do(Close())


class AsyncAgent(_Core, AsyncAgentMethods):
    """The asyncio client (``httpx.AsyncClient``); every public method is ``async``. Use
    as ``async with`` to close it."""

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(base_url=self._url, timeout=self.config.timeout, verify=self._verify())
        return self._http

    async def _do(self, req: Any) -> Any:
        if isinstance(req, Http):
            target, body, headers = self._signed(req)
            error: Exception | None = None
            for _ in self.config.resolved_coordinator_urls:  # the next replica while none can be connected to
                url = self._url
                try:
                    try:
                        return await self._send(req, target, body, headers)
                    except DROPPED:  # a pooled connection closed as it was sent: once more, signed afresh
                        if not idempotent(req.method, target):
                            raise
                        target, body, headers = self._signed(req)
                        return await self._send(req, target, body, headers)
                except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # never sent
                    error = e
                    await _aclose(self._next_replica())
                except httpx.TransportError as e:  # sent, answer lost: not sent again
                    await _aclose(self._next_replica())
                    raise self._unreachable(e, url) from None
            assert error is not None
            raise self._unreachable(error, ", ".join(self.config.resolved_coordinator_urls)) from None
        if isinstance(req, Sleep):
            await asyncio.sleep(req.seconds)
            return None
        if isinstance(req, Offload):
            return await asyncio.to_thread(req.fn, *req.args)
        if isinstance(req, Close):
            if self._http is not None:
                await self._http.aclose()
                self._http = None
            return None
        raise TypeError(f"unknown request {req!r}")

    async def _send(self, req: Http, target: str, body: bytes, headers: dict[str, str]) -> Any:
        if req.streams_reply:
            return await self._receive(req, target, body, headers)
        if req.streams_upload:  # sent in pieces, each reported; the length declared
            headers["content-length"] = str(len(body))
            r = await self._client().request(req.method, target, content=_pieces(req), headers=headers)
        else:
            r = await self._client().request(req.method, target, content=body, headers=headers)
        return parse_response(r, req)

    async def _receive(self, req: Http, target: str, body: bytes, headers: dict[str, str]) -> Any:
        """A raw reply read in pieces, each reported (``req.progress``)."""
        async with self._client().stream(req.method, target, content=body, headers=headers) as r:
            if r.status_code >= 400:
                await r.aread()
                return parse_response(r, req)
            length, data = _length(r), bytearray()
            async for piece in r.aiter_bytes():
                data += piece
                req.progress(r.num_bytes_downloaded, length)  # type: ignore[misc]
            if not data:
                req.progress(0, length)  # type: ignore[misc]
            return bytes(data)

    async def _run(self, gen: Generator) -> Any:
        try:
            req = next(gen)
            while True:
                try:
                    result = await self._do(req)
                except BaseException as e:  # noqa: BLE001 - cancellation is thrown in too
                    req = gen.throw(passed_on(e))
                else:
                    req = gen.send(result)
        except StopIteration as stop:
            return stop.value
        except AitbcError as e:  # a local error of the aitbc package (bad dataset, ...) in the SDK's hierarchy
            if raised_by_caller(e):
                raise
            raise ensure_error(e) from None

    async def __aenter__(self) -> AsyncAgent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._do(Close())


def _close(http: httpx.Client | None) -> None:
    if http is not None:
        http.close()


async def _aclose(http: httpx.AsyncClient | None) -> None:
    if http is not None:
        await http.aclose()


def _length(r: httpx.Response) -> int | None:
    """The reply body's declared length, in bytes on the wire (None: not declared)."""
    declared = r.headers.get("content-length", "")
    return int(declared) if declared.isdigit() else None


async def _pieces(req: Http) -> AsyncIterator[bytes]:
    for piece in req.pieces():
        yield piece


def _sync_method(op: Callable[..., Generator]) -> Callable[..., Any]:
    @functools.wraps(op)
    def method(self: Agent, *args: Any, **kwargs: Any) -> Any:
        return self._run(op(self, *args, **kwargs))

    method.__signature__ = inspect.signature(op)  # type: ignore[attr-defined]
    return method


def _async_method(op: Callable[..., Generator]) -> Callable[..., Any]:
    @functools.wraps(op)
    async def method(self: AsyncAgent, *args: Any, **kwargs: Any) -> Any:
        return await self._run(op(self, *args, **kwargs))

    method.__signature__ = inspect.signature(op)  # type: ignore[attr-defined]
    return method


for _name, _op in OPERATIONS.items():
    setattr(Agent, _name, _sync_method(_op))
    setattr(AsyncAgent, _name, _async_method(_op))
del _name, _op
