"""The dashboard: its page at ``/`` (and ``/runs/{id}``, the same page opened on one run)
and the public read-only JSON it polls, ``/v1/dashboard/...`` (an allow-list: see
:mod:`aitbc.coordinator.runs.dashboard`). The page loads only the package's own files; its
Content-Security-Policy lets no inline script, no other origin and no plugin run."""

from __future__ import annotations

import html

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from aitbc.coordinator.api.deps import CtxDep, SessionDep
from aitbc.coordinator.api.responses import errors
from aitbc.coordinator.api.web import RUN_PAGE, STATIC_DIR
from aitbc.coordinator.runs import dashboard
from aitbc.coordinator.store import repository
from aitbc.replies.dashboard import DashboardRunDetail, DashboardRuns

router = APIRouter(prefix="/dashboard", tags=["dashboard"])
pages = APIRouter(include_in_schema=False)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@router.get("/runs", response_model=DashboardRuns)
def runs(s: SessionDep) -> DashboardRuns:
    """The newest runs, public facts only (no CID, data source or model options)."""
    return dashboard.runs_list(s)


@router.get("/runs/{run_id}", response_model=DashboardRunDetail, responses=errors(404))
def run(run_id: str, ctx: CtxDep, s: SessionDep) -> DashboardRunDetail:
    """One run's public facts: curves by round, workers, bytes, payments, the ledger's head."""
    return dashboard.run_page(ctx, s, repository.get_run(s, run_id))


def _page(request: Request) -> HTMLResponse:
    """The page, every URL it names under the server's ``root_path`` (a coordinator behind a
    proxy under a path prefix; the server's setting, never a client's header), which the
    script reads from ``<html data-root>`` for the JSON it polls and the links it makes."""
    root = str(request.scope.get("root_path", "")).rstrip("/")
    text = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    text = text.replace('="/', f'="{html.escape(root)}/').replace(
        "<html ", f'<html data-root="{html.escape(root)}" ', 1
    )
    return HTMLResponse(text, headers=PAGE_HEADERS)


@pages.get("/")
def index(request: Request) -> HTMLResponse:
    return _page(request)


@pages.get(RUN_PAGE)
def run_view(run_id: str, request: Request) -> HTMLResponse:
    """The same page; its script reads the run's id from the address and asks the JSON route."""
    return _page(request)
