"""The API's pages for people: Swagger UI at ``/docs`` and ReDoc at ``/redoc``, every
asset loaded from the package (``/static/vendor/...``, see
``aitbc/coordinator/api/web/static/vendor/README.md``), so they render on a machine without
internet. FastAPI's own pages load them from a CDN (and a favicon from fastapi.tiangolo.com);
the app turns those off (``docs_url=None, redoc_url=None``) and mounts this router instead.

Every URL a page names is prefixed with the request's ``root_path``, as FastAPI's pages do,
so a coordinator served under a path prefix (``uvicorn --root-path /aitbc`` behind a proxy)
still loads its assets and its ``/openapi.json``.

Each page is sent with a Content-Security-Policy that lets the browser fetch from this
origin only (and ``data:``/``blob:``, which never leave it): a vendored bundle that names
another host is refused by the browser before any request is made. ReDoc's bundle does:
its "API docs by Redocly" link shows a logo from cdn.redoc.ly, which the page then leaves
out (ReDoc hides the image when it fails to load)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

from aitbc.coordinator.api.routes.dashboard import CSP as DASHBOARD_CSP

router = APIRouter(include_in_schema=False)

VENDOR = "/static/vendor"
SWAGGER_JS = f"{VENDOR}/swagger-ui/swagger-ui-bundle.js"
SWAGGER_CSS = f"{VENDOR}/swagger-ui/swagger-ui.css"
FAVICON = f"{VENDOR}/swagger-ui/favicon-32x32.png"
REDOC_JS = f"{VENDOR}/redoc/redoc.standalone.js"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"
# Swagger UI's defaults as FastAPI sets them, and no online validator (its default,
# validator.swagger.io, is a request off the machine for the badge)
SWAGGER_PARAMETERS = {
    "dom_id": "#swagger-ui",
    "layout": "BaseLayout",
    "deepLinking": True,
    "showExtensions": True,
    "showCommonExtensions": True,
    "validatorUrl": None,
}


# the pages run inline scripts (the init call) and styles (ReDoc's styled-components), and
# ReDoc's search runs in a worker made from a blob: URL
CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "worker-src 'self' blob:",
        "connect-src 'self'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)


def _same_origin(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CSP
    page.headers["X-Content-Type-Options"] = "nosniff"
    return page


class Assets(StaticFiles):
    """The package's ``static/`` files at ``/static`` (Starlette's StaticFiles: no directory
    listing, no path outside the folder, no symlink out of it), each sent with
    ``X-Content-Type-Options: nosniff`` (a file is only ever its declared type: a README or
    LICENSE is never run as a script or a page) and the dashboard's Content-Security-Policy,
    so its ``index.html`` opened at ``/static/index.html`` is held to the same policy as at
    ``/`` (no inline script, no framing)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Content-Security-Policy"] = DASHBOARD_CSP
        return response


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


@router.get("/docs")
def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    page = get_swagger_ui_html(
        openapi_url=root + str(request.app.openapi_url),
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=root + SWAGGER_JS,
        swagger_css_url=root + SWAGGER_CSS,
        swagger_favicon_url=root + FAVICON,
        oauth2_redirect_url=root + OAUTH2_REDIRECT,
        swagger_ui_parameters=SWAGGER_PARAMETERS,
    )
    return _same_origin(page)


@router.get(OAUTH2_REDIRECT)
def swagger_ui_redirect() -> HTMLResponse:
    """Swagger UI's landing page for an OAuth2 login (unused by this API's signed
    requests; kept so the page's "Authorize" flow never names a missing URL)."""
    return _same_origin(get_swagger_ui_oauth2_redirect_html())


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    root = _root(request)
    page = get_redoc_html(
        openapi_url=root + str(request.app.openapi_url),
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=root + REDOC_JS,
        redoc_favicon_url=root + FAVICON,
        with_google_fonts=False,
    )
    return _same_origin(page)
