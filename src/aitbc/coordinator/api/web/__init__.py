"""The coordinator's browser-facing pages: the dashboard at ``/`` and the offline API
docs, with every asset they load shipped in the package (``static/``), so they work on a
machine without internet."""

from pathlib import Path
from urllib.parse import quote

STATIC_DIR = Path(__file__).parent / "static"
RUN_PAGE = "/runs/{run_id}"  # the dashboard opened on one run (the same page as /)


def dashboard_url(coordinator: str, run_id: str | None = None) -> str:
    """The dashboard's address on the coordinator at ``coordinator``: its front page (the
    newest run), or the page of ``run_id``."""
    base = coordinator.rstrip("/")
    return base + RUN_PAGE.format(run_id=quote(run_id, safe="")) if run_id else base + "/"


def metrics_url(coordinator: str) -> str:
    """Where the coordinator at ``coordinator`` serves its Prometheus metrics."""
    return coordinator.rstrip("/") + "/metrics"
