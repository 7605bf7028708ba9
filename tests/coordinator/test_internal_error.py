"""A 500 says nothing of the internals: a generic message and a request id (body and
X-Request-Id header); the coordinator's log holds the traceback under that id. The failing
route is added to a real app here (no route of ours fails on purpose), served by uvicorn."""

from __future__ import annotations

import logging
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from aitbc.coordinator.app import create_app
from aitbc.coordinator.config import Settings


def test_a_500_carries_a_request_id_and_no_internals(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(Settings(home=tmp_path), run_driver=False)

    @app.get("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("SELECT secret FROM /etc/shadow")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        while not server.started:
            time.sleep(0.05)
        with caplog.at_level(logging.ERROR, logger="aitbc.coordinator"):
            r = httpx.get(f"http://127.0.0.1:{port}/v1/boom", timeout=10)
    finally:
        server.should_exit = True
        t.join(10)
    assert r.status_code == 500
    rid = r.headers["X-Request-Id"]
    assert r.json() == {
        "error": "internal_error",
        "detail": f"internal error; see the coordinator log (request id {rid})",
    }
    assert "secret" not in r.text
    logged = [rec for rec in caplog.records if rid in rec.getMessage()]
    assert logged and logged[0].exc_info is not None
    assert "SELECT secret" in str(logged[0].exc_info[1])
