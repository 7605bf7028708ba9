"""The dashboard in a real browser: Debian's Chromium (driven by playwright) loads the page
of a live run on a real coordinator with real workers, one of them Byzantine. The loss
curve gains points as rounds close, the worker table shows every worker, the attacker's
flag appears in its row, no CID of the run is on the page, and an owner's markup (a job's
end reason) is shown as text, never run. Screenshots go to ``$AITBC_ARTIFACTS``
(default ``test-artifacts/`` in the repository).

Without chromium on PATH (or playwright) the test is skipped with the reason, unless
``AITBC_REQUIRE_BROWSER=1`` (CI sets it) makes that a failure."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from tests.conftest import wait_until

from aitbc.coordinator.app import create_app
from aitbc.coordinator.config import Settings
from aitbc_agent_sdk import Agent, AgentConfig

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("AITBC_ARTIFACTS") or REPO / "test-artifacts")
MARKUP = '<img src=x onerror="window.pwned=1"><script>window.pwned=1</script>'
ROUNDS = 20  # more than the test waits for: the run is still training at its last step


def _browser_or_skip() -> str:
    """Chromium's path; a skip (or, with AITBC_REQUIRE_BROWSER=1, a failure) without it."""
    why = None
    chromium = shutil.which("chromium")
    if chromium is None:
        why = "no chromium on PATH (Debian: apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            why = "playwright is not installed (pip install -e '.[test]')"
    if why is None:
        return chromium
    if os.environ.get("AITBC_REQUIRE_BROWSER") == "1":
        pytest.fail(f"AITBC_REQUIRE_BROWSER=1 but {why}")
    pytest.skip(why)


def _at_least(n: int, low: int) -> int | None:
    return n if n >= low else None


def _run_cids(stack, run_id: str) -> set[str]:
    """Every CID the run's record names: the manifest, shards, checkpoints, the model, updates."""
    (manifest_cid, global_cid) = stack.rows("SELECT manifest_cid, global_cid FROM runs WHERE id = :r", r=run_id)[0]
    cids = {manifest_cid, global_cid}
    cids |= {c for (c,) in stack.rows("SELECT shard_cid FROM jobs WHERE run_id = :r", r=run_id)}
    cids |= {c for (c,) in stack.rows("SELECT checkpoint_cid FROM rounds WHERE run_id = :r", r=run_id)}
    cids |= {c for (c,) in stack.rows("SELECT cid FROM updates WHERE run_id = :r", r=run_id)}
    return {c for c in cids if c}


def test_dashboard_follows_a_live_run_in_chromium(stack):
    chromium = _browser_or_skip()
    from playwright.sync_api import sync_playwright

    out = ARTIFACTS / "dashboard"
    out.mkdir(parents=True, exist_ok=True)
    stack.start_coordinator()
    for i in range(3):  # no bonds: funding four provider wallets would double the test's time
        stack.start_worker(f"honest{i}", price=f"1.{i}0", step_delay=0.04)
    stack.start_worker("byz", price="0.50", attack="sign-flip", step_delay=0.04)
    stack.wait_offers(4)
    run_id = stack.init_run(workers=4)
    workers = {stack.worker_id(n) for n in ("honest0", "honest1", "honest2", "byz")}
    byz = stack.worker_id("byz")

    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(f"{stack.url}/runs/{run_id}")  # open before training starts: it follows the run
            assert page.title() == "aitbc dashboard"
            page.locator("#run-status", has_text="initializing").wait_for(timeout=30_000)
            assert page.locator("#chart-loss").get_attribute("data-points") == "0"
            assert page.locator(f'#runs li.current a[data-run-id="{run_id}"]').count() == 1  # the runs list
            stack.start_run(run_id, workers=4, rounds=ROUNDS, local_steps=20, aggregator="trimmed-mean:beta=0.25")

            # The curve gains points as rounds close (0 before, then two later looks). Polled from
            # Python: the page's policy forbids the string evaluation wait_for_function uses.
            chart = page.locator("#chart-loss")
            first = wait_until(lambda: _at_least(int(chart.get_attribute("data-points")), 2), "round 1 on the curve")
            read = "['#chart-loss', '#points'].map(s => document.querySelector(s))"
            chart_points, visible = page.evaluate(f"{read}.map((e, i) => i ? e.textContent : e.dataset.points)")
            assert chart_points == visible  # the visible "rounds: N" says the same (read at one instant)
            page.screenshot(path=str(out / "1-first-rounds.png"))
            second = wait_until(lambda: _at_least(int(chart.get_attribute("data-points")), first + 1), "another round")
            assert second > first and page.locator("#chart-loss canvas").count() == 1  # uPlot drew it

            # Every worker has its row; the attacker's flag appears in its own.
            rows = page.locator("#workers tbody tr")
            wait_until(lambda: rows.count() == 4, "four rows in the worker table")
            shown = {rows.nth(i).get_attribute("data-worker-id") for i in range(rows.count())}
            assert shown == workers
            flag = page.locator(f'#workers tr[data-worker-id="{byz}"] .flag', has_text="harmful")
            flag.wait_for(timeout=60_000)
            honest_flags = page.locator("#workers tr:not([data-worker-id='" + byz + "']) .flag", has_text="harmful")
            assert honest_flags.count() == 0
            head = page.locator("#ledger dd").nth(2)  # network, entries, head
            assert len(head.inner_text()) == 64 and int(page.locator("#ledger dd").nth(1).inner_text()) > 0
            page.screenshot(path=str(out / "2-live-run.png"))  # the README's picture (docs/dashboard.png)

            # No CID of the run anywhere on the rendered page.
            html = page.content()
            cids = _run_cids(stack, run_id)
            assert len(cids) >= 4 + 2 and not [c for c in cids if c in html]

            # An owner's words are data: a job's end reason with markup shows as text and runs nothing.
            honest = stack.worker_id("honest2")
            owner = Agent(
                AgentConfig(
                    name="owner", wallet_name="my-agent-wallet", coordinator_url=stack.url, home=stack.root / "owner"
                )
            )
            with owner:
                owner.mark_worker_failed(honest, reason=MARKUP, training_id=run_id)
            reason = page.locator(f'#workers tr[data-worker-id="{honest}"] .reason')
            reason.wait_for(timeout=30_000)
            assert reason.inner_text() == MARKUP
            time.sleep(2)  # two more polls: anything the markup could run has had its chance
            assert page.evaluate("window.pwned") is None
            assert page.locator("#workers img, #workers script").count() == 0
            page.screenshot(path=str(out / "3-markup-as-text.png"), full_page=True)

            # The front page opens on the newest run.
            page.goto(f"{stack.url}/")
            page.locator("#run-title", has_text=run_id).wait_for(timeout=30_000)
        finally:
            browser.close()
    assert problems == []  # no script error, no Content-Security-Policy refusal


def test_the_page_says_when_it_is_not_updating_and_recovers(stack):
    """An unknown run's page says so; a coordinator that stops answering without closing
    the connection (a hung process: SIGSTOP) turns the page's 'live' into 'not updating'
    within the poll's reply timeout (it said 'live' forever); a restarted coordinator is
    followed again without reloading the page."""
    chromium = _browser_or_skip()
    from playwright.sync_api import sync_playwright

    stack.start_coordinator()
    coordinator = stack.procs["coordinator"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(f"{stack.url}/runs/training_nope")
            page.locator("#notice", has_text="no training run 'training_nope'").wait_for(timeout=30_000)
            assert page.locator("#run").is_hidden()
            live = page.locator("#live")
            page.locator("#live.ok").wait_for(timeout=10_000)

            os.kill(coordinator.pid, signal.SIGSTOP)
            try:
                page.locator("#live.down", has_text="not updating: no reply in 10 s").wait_for(timeout=25_000)
            finally:
                os.kill(coordinator.pid, signal.SIGCONT)
            page.locator("#live.ok").wait_for(timeout=15_000)

            coordinator.terminate()
            coordinator.wait(timeout=30)
            page.locator("#live.down").wait_for(timeout=15_000)
            stack.start_coordinator()
            page.locator("#live.ok").wait_for(timeout=30_000)
            assert live.inner_text().startswith("live · updated")
            assert page.locator("#notice", has_text="training_nope").is_visible()
        finally:
            browser.close()


def test_the_page_works_behind_a_path_prefix(tmp_path, databases):
    """A coordinator a proxy serves under ``/aitbc`` (uvicorn's ``root_path``): the page
    names its assets under the prefix and its script polls and links under it (it asked
    ``/v1/...`` and ``/static/...`` at the proxy's root, a blank page there). The proxy here
    is the browser's own request routing: it strips the prefix, as a proxy would."""
    chromium = _browser_or_skip()
    from playwright.sync_api import sync_playwright

    db_url = databases.new(tmp_path)
    app = create_app(Settings(home=tmp_path, db_url=db_url), run_driver=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(app, root_path="/aitbc", log_level="warning", access_log=False, lifespan="on", ws="none")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    real = f"http://127.0.0.1:{sock.getsockname()[1]}"
    wait_until(lambda: server.started, "the coordinator up", timeout=30)
    proxy = "http://aitbc.test"
    outside: list[str] = []
    problems: list[str] = []

    def forward(route):
        url = route.request.url
        if not url.startswith(f"{proxy}/aitbc/"):
            outside.append(url)  # a request the proxy does not serve: outside the prefix
            return route.fulfill(status=404, body="not under /aitbc")
        return route.fulfill(response=route.fetch(url=real + url[len(f"{proxy}/aitbc") :]))

    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                page = browser.new_page()
                page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
                page.route(f"{proxy}/**", forward)
                page.goto(f"{proxy}/aitbc/")
                page.locator("#live.ok").wait_for(timeout=30_000)
                assert page.locator("#notice").inner_text() == "No runs yet."
                assert page.locator("header h1 a").get_attribute("href") == "/aitbc/"
                assert page.evaluate("typeof window.uPlot") == "function"  # the vendored library loaded
                assert problems == []  # (the unknown run's page below logs its 404)
                page.goto(f"{proxy}/aitbc/runs/training_nope")
                page.locator("#notice", has_text="no training run 'training_nope'").wait_for(timeout=30_000)
            finally:
                browser.close()
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        databases.drop(db_url)
    assert outside == []


def test_a_language_runs_second_chart_is_perplexity_and_byte_labels_differ(stack, tmp_path):
    """A language model has no accuracy: its second chart is validation perplexity (it was
    an empty accuracy chart, with no word why). Its dataset reads as measured, the owner's
    declaration beside it. The bytes axis labels each tick apart: at one decimal, ticks
    10 KiB apart on a 5.4 MiB axis all read "5.4 MiB"."""
    chromium = _browser_or_skip()
    from playwright.sync_api import sync_playwright

    stack.start_coordinator()
    run_id = stack.init_run("--model-opt", "context=16,d_model=16,n_layers=1,n_heads=2", model="transformer", workers=1)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    up = stack.cli("distributed-training", "upload-data", "--training-id", run_id, "--data-path", str(corpus))
    assert up.returncode == 0, up.stderr
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(f"{stack.url}/runs/{run_id}")
            page.locator("#quality-caption", has_text="Validation perplexity by round").wait_for(timeout=30_000)
            # The dataset is the size measured as the corpus was read, the owner's "100GB" beside it.
            dataset = page.locator("#run-facts div", has=page.locator("dt", has_text="dataset")).locator("dd")
            assert dataset.inner_text() == "17.6 KiB · 1 document · 18,000 tokens (declared 100GB)", (
                dataset.inner_text()
            )
            mib = 2**20
            ticks = [5.40 * mib, 5.41 * mib, 5.42 * mib, 5.43 * mib]
            labels = page.evaluate(f"window.aitbcFormats.byteTicks({ticks})")
            assert labels == ["5.40 MiB", "5.41 MiB", "5.42 MiB", "5.43 MiB"]
            assert page.evaluate(f"{ticks}.map(window.aitbcFormats.bytes)") == ["5.4 MiB"] * 4  # a value: one decimal
            assert page.evaluate("window.aitbcFormats.byteTicks([0, 512, 1024, 1536])") == [
                "0.0 KiB",
                "0.5 KiB",
                "1.0 KiB",
                "1.5 KiB",
            ]
        finally:
            browser.close()
    assert problems == []
