"""The API's pages work without internet: ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) of a
real coordinator process load every asset from the coordinator itself, and a real Chromium,
with every request to another host aborted, renders the API's operations from them.

The browser test needs Debian's chromium (``/usr/bin/chromium``, driven by playwright): where
it is missing the test is skipped, unless ``AITBC_REQUIRE_BROWSER=1`` (CI), where it fails."""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn

from aitbc.coordinator.app import create_app
from aitbc.coordinator.config import Settings

pytestmark = pytest.mark.slow

PAGES = ("/docs", "/redoc")
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
TYPES = {  # what each asset must be served as
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
    ".json": "application/json",
}


class _Refs(HTMLParser):
    """Every URL an HTML page names: src/href attributes, ReDoc's spec-url, and the quoted
    ``url:`` Swagger UI's inline script loads the document from."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._script = tag == "script"
        self.urls += [v for k, v in attrs if k in ("src", "href", "spec-url") and v]

    def handle_endtag(self, tag: str) -> None:
        self._script = False

    def handle_data(self, data: str) -> None:
        if self._script:
            self.urls += re.findall(r"""\burl:\s*['"]([^'"]+)['"]""", data)
            self.urls += re.findall(r"""['"]([^'"\s]*/docs/oauth2-redirect)['"]""", data)


def referenced(html: str) -> list[str]:
    parser = _Refs()
    parser.feed(html)
    return parser.urls


def _expected_type(url: str) -> str:
    path = urlsplit(url).path
    if path.endswith("/oauth2-redirect"):
        return "text/html"
    return TYPES[Path(path).suffix]


@pytest.fixture
def coordinator(stack) -> str:
    stack.start_coordinator()
    return stack.url


def test_pages_name_only_their_own_assets(coordinator: str) -> None:
    """Every URL /docs and /redoc name is on the coordinator itself (relative, no host) and
    answers 200 with the right type; no page names a CDN or Google's fonts."""
    with httpx.Client(base_url=coordinator, timeout=30) as http:
        for page in PAGES:
            r = http.get(page)
            assert r.status_code == 200, (page, r.status_code)
            assert r.headers["content-type"].startswith("text/html")
            csp = r.headers["content-security-policy"]  # the browser may fetch from this origin only
            assert "default-src 'self'" in csp and "connect-src 'self'" in csp and "img-src 'self' data:" in csp
            assert "cdn." not in r.text and "fonts.googleapis" not in r.text and "tiangolo" not in r.text
            urls = referenced(r.text)
            assert any(u.endswith(".js") for u in urls) and any(u.endswith("/openapi.json") for u in urls), urls
            for url in urls:
                parts = urlsplit(url)
                assert not parts.scheme and not parts.netloc and url.startswith("/"), (page, url)
                asset = http.get(url)
                assert asset.status_code == 200, (page, url, asset.status_code)
                assert asset.headers["content-type"].startswith(_expected_type(url)), (url, asset.headers)
                assert asset.content, url
        # the prefix is the server's setting, never a client's header
        forged = http.get("/docs", headers={"X-Forwarded-Prefix": "https://evil.example", "X-Script-Name": "/x"})
        assert referenced(forged.text) == referenced(http.get("/docs").text)
        # the pages are for people, not part of the API's document
        paths = http.get("/openapi.json").json()["paths"]
        assert not [p for p in paths if not p.startswith("/v1/")], paths


# --- behind a path prefix -----------------------------------------------------------------


@pytest.fixture
def prefixed(tmp_path: Path, databases) -> str:
    """A coordinator served as a proxy would mount it under ``/aitbc`` (uvicorn's
    ``root_path``); the URL returned is the server's own (the proxy strips the prefix)."""
    db_url = databases.new(tmp_path)
    app = create_app(Settings(home=tmp_path, db_url=db_url), run_driver=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, root_path="/aitbc", log_level="warning", access_log=False, lifespan="on", ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "coordinator did not come up"
    yield url
    server.should_exit = True
    thread.join(30)
    sock.close()
    databases.drop(db_url)


def test_pages_behind_a_path_prefix(prefixed: str) -> None:
    """Under a prefix every URL a page names carries it, so the browser's requests reach the
    coordinator through the proxy: each answers once the proxy has stripped the prefix."""
    with httpx.Client(base_url=prefixed, timeout=30) as http:
        for page in PAGES:
            r = http.get(page)
            assert r.status_code == 200, (page, r.status_code)
            urls = referenced(r.text)
            assert urls
            for url in urls:
                assert url.startswith("/aitbc/"), (page, url)
                asset = http.get(url.removeprefix("/aitbc"))
                assert asset.status_code == 200, (url, asset.status_code)
                assert asset.headers["content-type"].startswith(_expected_type(url)), (url, asset.headers)


def test_request_limits_hold_behind_a_path_prefix(prefixed: str) -> None:
    """The request bounds apply under a prefix too: a signed route's missing signature is
    refused before one byte of its (chunked, over-limit) body is read, not after."""
    limit = Settings.model_fields["max_json_bytes"].default
    body = iter([b"x" * (limit + 1024)])  # a generator: sent chunked, nothing declared
    with httpx.Client(base_url=prefixed, timeout=30) as http:
        r = http.post("/v1/runs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 401 and r.json()["error"].startswith("missing"), r.text


# --- a real browser, offline --------------------------------------------------------------


def _browser_or_skip() -> str:
    chromium = shutil.which("chromium")
    required = os.environ.get("AITBC_REQUIRE_BROWSER") == "1"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        if required:
            pytest.fail("AITBC_REQUIRE_BROWSER=1 but playwright is not installed (pip install -e '.[test]')")
        pytest.skip("playwright is not installed")
    if chromium is None:
        if required:
            pytest.fail("AITBC_REQUIRE_BROWSER=1 but there is no chromium on PATH (apt-get install chromium)")
        pytest.skip("no chromium on PATH (apt-get install chromium; AITBC_REQUIRE_BROWSER=1 makes this a failure)")
    return chromium


def test_a_browser_offline_renders_every_operation(coordinator: str, tmp_path: Path) -> None:
    """Chromium loads /docs and /redoc with every request off the machine aborted: Swagger UI
    shows one block per operation of the API's document, ReDoc one heading per operation
    summary, and no request ever left for another host (the pages' Content-Security-Policy
    stops ReDoc's attribution logo, on cdn.redoc.ly, before it is requested)."""
    chromium = _browser_or_skip()
    from playwright.sync_api import Route, sync_playwright

    doc = httpx.get(coordinator + "/openapi.json", timeout=30).json()
    ops = [(path, m, op) for path, item in doc["paths"].items() for m, op in item.items()]
    summaries = {op["summary"] for _, _, op in ops}
    assert "Health" in summaries and len(ops) > 20
    off_machine: list[str] = []
    seen: list[str] = []

    def guard(route: Route) -> None:
        url = route.request.url
        seen.append(url)
        if urlsplit(url).scheme in ("http", "https") and urlsplit(url).hostname not in LOOPBACK:
            off_machine.append(url)
            route.abort("internetdisconnected")
        else:
            route.continue_()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"], headless=True)
        try:
            context = browser.new_context()
            context.route("**/*", guard)
            page = context.new_page()
            errors: list[str] = []
            refused: list[str] = []  # what the pages' Content-Security-Policy kept the browser from fetching
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on(
                "console",
                lambda m: (
                    (refused if "Content Security Policy" in m.text else errors).append(m.text)
                    if m.type == "error"
                    else None
                ),
            )

            page.goto(coordinator + "/docs", wait_until="load")
            page.wait_for_selector(".opblock", timeout=30_000)
            page.wait_for_function(f"document.querySelectorAll('.opblock').length >= {len(ops)}", timeout=30_000)
            assert page.locator(".opblock").count() == len(ops)
            shown = page.locator(".opblock-summary-path").all_inner_texts()
            assert {s.replace("\u200b", "") for s in shown} == {path for path, _, _ in ops}
            page.screenshot(path=str(tmp_path / "docs.png"), full_page=False)

            page.goto(coordinator + "/redoc", wait_until="load")
            page.wait_for_selector("h2", timeout=30_000)
            page.wait_for_function(f"document.querySelectorAll('h2').length >= {len(summaries)}", timeout=30_000)
            headings = set(page.locator("h2").all_inner_texts())
            assert summaries <= headings, sorted(summaries - headings)[:5]
            page.screenshot(path=str(tmp_path / "redoc.png"), full_page=False)
            assert not errors, errors
        finally:
            browser.close()
    assert not off_machine, off_machine
    # the policy refused only what named another host (ReDoc's attribution logo on
    # cdn.redoc.ly), never one of the pages' own assets
    assert all("https://cdn.redoc.ly/" in r for r in refused), refused
    assert any(u.endswith("/static/vendor/swagger-ui/swagger-ui-bundle.js") for u in seen), seen
    assert any(u.endswith("/static/vendor/redoc/redoc.standalone.js") for u in seen), seen
