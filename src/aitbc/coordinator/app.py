"""The coordinator's FastAPI application: routes under ``/v1``, one error shape
(``{"error": code, "detail": text}``) for every 4xx, and the round driver started and
stopped with the app."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from aitbc import __version__
from aitbc.coordinator.api.routes import blobs, control, health, ledger, runs, workers
from aitbc.coordinator.config import Settings
from aitbc.coordinator.context import build_context
from aitbc.coordinator.driver import RoundDriver
from aitbc.coordinator.errors import ApiError
from aitbc.errors import AitbcError
from aitbc.ledger.signing import SignatureError
from aitbc.units import UnitError


def _error(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status)


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


def create_app(settings: Settings, *, run_driver: bool = True) -> FastAPI:
    ctx = build_context(settings)
    driver = RoundDriver(ctx)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if run_driver:
            driver.start()
        try:
            yield
        finally:
            if run_driver:
                driver.stop()
            ctx.engine.dispose()

    app = FastAPI(
        title="aitbc coordinator",
        version=__version__,
        lifespan=lifespan,
        description="Runs the rounds of distributed trainings across untrusted providers.",
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
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        return _error(e.status_code, code, str(e.detail))

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:
        # A bug, not a user error: still one JSON shape (the traceback goes to the log).
        return _error(500, "internal_error", f"{type(e).__name__}: {e}")

    @app.exception_handler(AitbcError)
    async def _aitbc(_: Request, e: AitbcError) -> JSONResponse:
        return _error(422, "invalid", str(e))

    @app.exception_handler(UnitError)
    async def _unit(_: Request, e: UnitError) -> JSONResponse:
        return _error(422, e.code, e.detail)

    for r in (health.router, blobs.router, runs.router, control.router, workers.router, ledger.router):
        app.include_router(r, prefix="/v1")
    return app
