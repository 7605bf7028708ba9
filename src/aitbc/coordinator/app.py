"""The coordinator's FastAPI application: routes under ``/v1``, one error shape
(``{"error": code, "detail": text}``) for every 4xx, and the round driver started and
stopped with the app."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aitbc import __version__
from aitbc.coordinator.api.deps import STREAM_SIGNER, signed, signed_stream, verify_stream
from aitbc.coordinator.api.responses import errors
from aitbc.coordinator.api.routes import blobs, chain, control, dashboard, health, ledger, runs, workers
from aitbc.coordinator.api.routes import docs as api_docs
from aitbc.coordinator.api.web import STATIC_DIR
from aitbc.coordinator.config import Settings
from aitbc.coordinator.context import Context, build_context
from aitbc.coordinator.errors import ApiError
from aitbc.coordinator.observability.metrics import CountResponses, RecordCollector
from aitbc.coordinator.observability.metrics import install as install_metrics
from aitbc.coordinator.rounds.driver import RoundDriver
from aitbc.coordinator.transfer.uploads import TOO_MANY
from aitbc.errors import AitbcError
from aitbc.ledger.signing import (
    HEADER_KEY,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    SignatureError,
    precheck_headers,
)
from aitbc.replies.base import ErrorBody
from aitbc.units import UnitError

log = logging.getLogger("aitbc.coordinator")
INTERNAL_DETAIL = "internal error; see the coordinator log"
PREFIX = "/v1"
# How long the coordinator keeps an idle connection open. It must outlast the clients'
# own keep-alive expiry (httpx's default, 5 s): with the two equal, a client can send on a
# pooled connection in the instant the server closes it, and gets "server disconnected
# without sending a response" for a request that never arrived.
KEEP_ALIVE_SECONDS = 30


def _error(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status)


class InternalErrors:
    """A bug, not a user error: answered 500 with the one JSON shape and nothing of the
    internals (an exception's text can hold paths, SQL or secrets); the traceback goes to
    the log, once. (Starlette's own handler for ``Exception`` re-raises after answering,
    so the server would log every traceback a second time.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except ClientDisconnect:  # the client hung up mid-body (killed, timed out): nobody to answer, no fault here
            log.info("%s %s: the client disconnected before its request body was in", scope["method"], scope["path"])
        except Exception:
            request_id = uuid.uuid4().hex
            log.exception("internal error on %s %s (request id %s)", scope["method"], scope["path"], request_id)
            if started:  # too late for a reply: the server drops the connection
                raise
            reply = _error(500, "internal_error", f"{INTERNAL_DETAIL} (request id {request_id})")
            reply.headers["X-Request-Id"] = request_id
            await reply(scope, receive, send)


class BodyTooLarge(StarletteHTTPException):
    """Raised from ``receive`` once a JSON body passes ``max_json_bytes``: an
    ``HTTPException``, so FastAPI's body parsing lets it through as it is (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is over this coordinator's limit of {limit} bytes for JSON")


class Limits:
    """Bounds on a request before its body is parsed (or read at all):

    - a signed route's X-Aitbc-* headers are checked for presence, form and a current
      timestamp before one body byte is read (401; the signature itself is checked by the
      route once the body is in, see ``api.deps``);
    - a JSON body is refused 413 ``body_too_large`` when its Content-Length declares more than
      ``max_json_bytes``, or, as it is read, as soon as the bytes received pass it (a chunked
      body declares nothing), so no more than the limit is ever held;
    - at most ``max_uploads`` blob uploads are in flight at once (429 ``too_many_uploads``);
      the upload route then holds each signer to its share of them and each body to a
      minimum pace (:mod:`aitbc.coordinator.transfer.uploads`); a blob's own size limit is the
      upload route's (``max_blob_bytes``)."""

    def __init__(self, app: ASGIApp, ctx: Context, routes: list[BaseRoute]) -> None:
        self.app = app
        self.ctx = ctx
        self.routes = routes
        self.uploads = ctx.uploads
        self.kinds: dict[int, tuple[bool, bool]] = {}

    def _kind(self, scope: Scope) -> tuple[bool, bool]:
        """(signed, streamed) for the route this request goes to. Behind a path prefix
        (the server's ``root_path``) the scope's path carries the prefix: it is dropped
        first, as Starlette's routing does."""
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root + "/"):
            path = path[len(root) :]
        if not path.startswith(PREFIX + "/"):
            return False, False
        inner = {**scope, "path": path[len(PREFIX) :], "root_path": ""}  # the routers' own paths
        for route in self.routes:
            if isinstance(route, APIRoute) and route.matches(inner)[0] is Match.FULL:
                kind = self.kinds.get(id(route))
                if kind is None:
                    streamed = _uses(route.dependant, signed_stream)
                    kind = self.kinds[id(route)] = (streamed or _uses(route.dependant, signed), streamed)
                return kind
        return False, False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        is_signed, streamed = self._kind(scope)
        headers = Headers(scope=scope)
        limit = self.ctx.settings.max_json_bytes
        declared = headers.get("content-length")
        if not streamed and declared is not None and declared.isdigit() and int(declared) > limit:
            await _error(413, "body_too_large", str(BodyTooLarge(limit).detail))(scope, receive, send)
            return
        if is_signed:
            settings = self.ctx.settings
            try:
                precheck_headers(
                    headers, now=time.time(), max_skew=settings.max_skew_seconds, not_before=self.ctx.started_at
                )
            except SignatureError as e:
                await _error(401, e.code, e.detail)(scope, receive, send)
                return
        if streamed:
            # An upload's signature is checked here, before it holds anything (its body is not
            # signed: the CID binds it), so its slot is counted against the signer proven, and a
            # signer at its share never takes one, not even while its signature is checked.
            try:
                signer = await verify_stream(self.ctx, Request(scope))
            except SignatureError as e:
                await _error(401, e.code, e.detail)(scope, receive, send)
                return
            over = self.uploads.over_share(signer.address)
            if over is not None:
                await _error(429, TOO_MANY, over)(scope, receive, send)
                return
            if not self.uploads.take():
                detail = (
                    f"{self.uploads.in_flight} uploads are in flight, the most this coordinator takes; try again later"
                )
                await _error(429, TOO_MANY, detail)(scope, receive, send)
                return
            scope.setdefault("state", {})[STREAM_SIGNER] = signer  # the route's signed_stream takes it
            try:
                with self.uploads.signer(signer.address):
                    await self.app(scope, receive, send)
            finally:
                self.uploads.give()
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)


def _validation_detail(exc: RequestValidationError) -> tuple[str, str]:
    errs = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errs):
        return "malformed_json", "request body is not valid JSON"
    parts = []
    for e in errs[:3]:
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
    return "invalid_request", "; ".join(parts) + more


def create_app(settings: Settings, *, run_driver: bool = True, stop_wait: float = 30.0) -> FastAPI:
    """The coordinator's app; ``stop_wait``: seconds its stop waits for the round driver's
    threads to finish their passes (a process that exits next waits little)."""
    ctx = build_context(settings)
    driver = RoundDriver(ctx)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if run_driver:
            driver.start()
        try:
            yield
        finally:
            if run_driver:
                driver.stop(stop_wait)
            ctx.engine.dispose()
            if ctx.chain is not None:
                ctx.chain.close()

    app = FastAPI(
        title="aitbc coordinator",
        version=__version__,
        lifespan=lifespan,
        description="Runs the rounds of distributed trainings across untrusted providers.",
        docs_url=None,  # FastAPI's pages load from a CDN: api_docs serves them from the package
        redoc_url=None,
    )
    app.state.ctx = ctx
    app.state.driver = driver

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError) -> JSONResponse:
        return _error(e.status, e.code, e.detail)

    @app.exception_handler(SignatureError)
    async def _sig_error(_: Request, e: SignatureError) -> JSONResponse:
        return _error(401, e.code, e.detail)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        code, detail = _validation_detail(e)
        return _error(400 if code == "malformed_json" else 422, code, detail)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(e.status_code, "http_error")
        return _error(e.status_code, code, str(e.detail))

    @app.exception_handler(AitbcError)
    async def _aitbc(_: Request, e: AitbcError) -> JSONResponse:
        return _error(422, "invalid", str(e))

    @app.exception_handler(UnitError)
    async def _unit(_: Request, e: UnitError) -> JSONResponse:
        return _error(422, e.code, e.detail)

    routers = (
        health.router,
        chain.router,
        blobs.router,
        blobs.pins_router,
        runs.router,
        control.router,
        workers.router,
        ledger.router,
        dashboard.router,
    )
    for r in routers:
        app.include_router(r, prefix=PREFIX)
    # the browser pages' assets, from the package (no CDN): read-only files, outside /v1
    app.mount("/static", api_docs.Assets(directory=STATIC_DIR), name="static")
    app.include_router(dashboard.pages)  # the dashboard page at / and /runs/{id} (outside /v1)
    app.include_router(api_docs.router)  # /docs and /redoc, offline (outside /v1, not in the schema)
    # GET /metrics (outside /v1) and the byte counter, inside Limits
    install_metrics(app, ctx.metrics, RecordCollector(ctx.session, alive=ctx.workers_alive, driving=ctx.lease.holds))
    app.add_middleware(Limits, ctx=ctx, routes=[route for r in routers for route in r.routes])
    app.add_middleware(InternalErrors)  # a bug in Limits is a 500 too
    app.add_middleware(CountResponses, metrics=ctx.metrics)  # the outermost: every answer's status, 500s included
    app.openapi = lambda: _openapi(app, routers)  # type: ignore[method-assign]
    return app


# --- the OpenAPI document -----------------------------------------------------------------


_SIGNED = (
    "The four X-Aitbc-* headers sign the request with the sender's Ed25519 wallet key: the signature "
    "covers AITBC-REQUEST-1, the method, the raw path and query, the body's sha256 (UNSIGNED-PAYLOAD for "
    "a blob upload), the timestamp and the nonce, one per line (see aitbc.ledger.signing)."
)
SIGNATURE_HEADERS = {
    "AitbcKey": (HEADER_KEY, "the sender's Ed25519 public key, hex; its address is the signer. " + _SIGNED),
    "AitbcTimestamp": (HEADER_TIMESTAMP, "unix seconds; refused when far from the coordinator's clock"),
    "AitbcNonce": (HEADER_NONCE, "32 hex digits, new for every request (a replay is refused)"),
    "AitbcSignature": (HEADER_SIGNATURE, "the Ed25519 signature of the canonical request, hex"),
}


def _uses(dependant: Dependant, *calls: Any) -> bool:
    return any(d.call in calls or _uses(d, *calls) for d in dependant.dependencies)


def _openapi(app: FastAPI, routers: tuple[APIRouter, ...]) -> dict[str, Any]:
    """FastAPI's document, made to say what the app really sends: every error is an
    ``ErrorBody``; a signed route declares its signature headers (security schemes) and
    401, and a route with a JSON body 400
    (malformed JSON) and 422 (invalid fields), from the route itself, so no route can
    forget them; FastAPI's own 422 shape (``HTTPValidationError``), which this app never
    sends, is dropped (routes whose parameters can be invalid declare our 422)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes, tags=app.openapi_tags
    )
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    for route in (r for router in routers for r in router.routes):
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        implied: list[int] = []
        is_signed = _uses(route.dependant, signed, signed_stream)
        if is_signed:
            implied.append(401)
        if route.body_field is not None:
            implied += [400, 422]
        if route.body_field is not None or is_signed:  # the body is read: bounded (Limits)
            implied.append(413)
        if _uses(route.dependant, signed_stream):
            implied.append(429)  # the upload slots (Limits, then the signer's share)
        for method in route.methods or ():
            op = doc["paths"][PREFIX + route.path_format].get(method.lower())
            if op is None:
                continue
            responses = op["responses"]
            default_422 = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if default_422.get("$ref", "").endswith("/HTTPValidationError"):
                del responses["422"]
            for status, spec in errors(*implied).items():
                responses.setdefault(
                    str(status),
                    {"description": spec["description"], "content": {"application/json": {"schema": error_ref}}},
                )
            op["responses"] = dict(sorted(responses.items()))
            if is_signed:
                op["security"] = [{name: [] for name in SIGNATURE_HEADERS}]
    components = doc.setdefault("components", {})
    components["securitySchemes"] = {
        name: {"type": "apiKey", "in": "header", "name": header, "description": why}
        for name, (header, why) in SIGNATURE_HEADERS.items()
    }
    schemas = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas.setdefault("ErrorBody", ErrorBody.model_json_schema())
    app.openapi_schema = doc
    return doc
