"""The dashboard's page and its public JSON (``/v1/dashboard/...``) on a real coordinator:
exactly the allow-listed fields, no CID of the run anywhere (they are capabilities to
fetch the owner's data and model), no data source or model options, an unknown run is a
404 in the one error shape, and the page is served with a Content-Security-Policy that
lets no inline script run. Rendering (escaping) is checked in a real browser by
tests/e2e/test_dashboard.py."""

from __future__ import annotations

import json
import re
import time

import torch
from sqlalchemy import event, insert
from tests.conftest import wait_until

from aitbc.client import ApiError
from aitbc.coordinator.runs import dashboard
from aitbc.coordinator.store import repository
from aitbc.coordinator.store.models import RoundRecord

RUN_KEYS = {
    "training_id",
    "status",
    "owner",
    "model_type",
    "parameters",
    "dataset_size",
    "target_workers",
    "round",
    "rounds",
    "control",
    "val_loss",
    "val_accuracy",
    "created_at",
    "updated_at",
}
DETAIL_KEYS = RUN_KEYS | {
    "data_bytes",
    "data_documents",
    "data_tokens",
    "aggregator",
    "initial_val_loss",
    "rounds_completed",
    "error",
    "started_at",
    "finished_at",
    "bytes_up",
    "bytes_down",
    "curves",
    "curve_every",
    "workers",
    "payments",
    "ledger",
    "tokens_seen",
    "val_perplexity",
    "time",
}
PAY_KEYS = ("score", "rounds_accepted", "rounds_scored", "price", "paid", "paid_micro", "slashed", "slashed_micro")
ROUND_KEYS = {
    "round",
    "val_loss",
    "val_accuracy",
    "val_perplexity",
    "train_loss",
    "train_accuracy",
    "accepted",
    "rejected",
    "skipped",
    "bytes_up",
    "bytes_down",
    "closed_at",
}
WORKER_KEYS = {
    "worker_id",
    "gpu_type",
    "contract_status",
    "status",
    "progress",
    "loss",
    "speed",
    "rounds_done",
    "end_reason",
    "last_heartbeat_age",
    "score",
    "rounds_accepted",
    "rounds_scored",
    "price",
    "paid",
    "paid_micro",
    "slashed",
    "slashed_micro",
    "flags",
}
MARKUP = '<script>window.pwned=1</script><img src=x onerror="window.pwned=1">'


def _keys(value) -> set[str]:
    """Every key in a JSON value, at any depth."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def _run_cids(t) -> set[str]:
    """Every CID the run's record names: manifest, shards, validation data, checkpoints,
    the global model and outer state, updates."""
    coord, run_id = t.coord, t.run_id
    (run,) = coord.rows("SELECT manifest_cid, manifest, global_cid, outer_state_cid FROM runs WHERE id = :r", r=run_id)
    manifest = run["manifest"] if isinstance(run["manifest"], dict) else json.loads(run["manifest"])
    cids = {run["manifest_cid"], run["global_cid"], run["outer_state_cid"], manifest["val"]["cid"]}
    cids |= {s["cid"] for s in manifest["shards"]}
    for r in coord.rows("SELECT checkpoint_cid, outer_state_cid FROM rounds WHERE run_id = :r", r=run_id):
        cids |= {r["checkpoint_cid"], r["outer_state_cid"]}
    cids |= {u["cid"] for u in coord.rows("SELECT cid FROM updates WHERE run_id = :r", r=run_id)}
    cids |= {j["shard_cid"] for j in coord.rows("SELECT shard_cid FROM jobs WHERE run_id = :r", r=run_id)}
    cids.discard(None)
    return cids


def test_dashboard_json_is_the_allow_list_and_names_no_cid(api, new_coordinator):
    t = api.start_training_run(new_coordinator(), 3)
    g = torch.Generator().manual_seed(0)
    (a, ja), (b, jb), (c, jc) = ((w, t.jobs[w.wallet.address]) for w in t.workers)
    for (w, job), acc in (((a, ja), 0.25), ((b, jb), 0.75)):
        cid = api.put_update(w, 1e-3 * torch.randn(t.d, generator=g))
        for wrong in (1.5, -0.1):  # a reported accuracy outside [0, 1]: refused, nothing stored
            try:
                w.post(f"/jobs/{job}/updates", api.update_body(1, cid, train_accuracy=wrong))
                raise AssertionError(f"train_accuracy {wrong} was accepted")
            except ApiError as e:
                assert e.status == 422 and "train_accuracy" in e.detail, e.detail
        assert not t.coord.rows("SELECT id FROM updates WHERE job_id = :j", j=job)
        w.post(f"/jobs/{job}/updates", api.update_body(1, cid, train_accuracy=acc))
    bad = torch.zeros(t.d)
    bad[0] = float("nan")
    try:
        c.post(f"/jobs/{jc}/updates", api.update_body(1, api.put_update(c, bad)))
        raise AssertionError("a NaN update was accepted")
    except ApiError as e:
        assert e.status == 422 and e.code == "update_rejected"
    settled = "SELECT settled_round FROM runs WHERE id = :r"
    wait_until(lambda: t.coord.rows(settled, r=t.run_id)[0]["settled_round"] >= 1, what="round 1 settled")
    # A round's evaluation lands a moment after its close (off the close's path): wait for it too.
    evaluated = "SELECT val_loss FROM rounds WHERE run_id = :r AND round = 1"
    wait_until(
        lambda: (t.coord.rows(evaluated, r=t.run_id) or [{}])[0].get("val_loss") is not None, what="round 1 evaluated"
    )
    # The owner ends a job with a reason of its own words: text the page must show as text.
    t.owner.post(f"/jobs/{ja}/end", {"status": "released", "reason": MARKUP})

    with t.coord.http() as http:  # unsigned, like a browser
        listed = http.get("/v1/dashboard/runs")
        assert listed.status_code == 200, listed.text
        page = listed.json()
        assert page["count"] == len(page["data"]) >= 1
        assert all(set(r) == RUN_KEYS for r in page["data"])
        assert t.run_id in {r["training_id"] for r in page["data"]}

        reply = http.get(f"/v1/dashboard/runs/{t.run_id}")
        assert reply.status_code == 200, reply.text
        run = reply.json()
        assert set(run) == DETAIL_KEYS
        with t.coord.ctx.session() as s:  # the reply keeps the view's keys in its order
            view = dashboard.run_page(t.coord.ctx, s, repository.get_run(s, t.run_id)).model_dump(mode="json")
        assert list(run) == list(view) and list(run["workers"][0]) == list(view["workers"][0])
        assert list(run["curves"][0]) == list(view["curves"][0]) and list(run["payments"]) == list(view["payments"])
        assert run["parameters"] == t.d and run["rounds"] == 3 and run["rounds_completed"] >= 1
        assert run["tokens_seen"] is None and run["val_perplexity"] is None  # a classifier has neither
        assert [r["round"] for r in run["curves"]][:2] == [0, 1] and run["curve_every"] == 1
        assert all(set(r) == ROUND_KEYS for r in run["curves"])
        closed = run["curves"][1]
        assert closed["accepted"] == 2 and closed["rejected"] == 1 and closed["val_loss"] is not None
        assert closed["bytes_up"] and closed["bytes_down"]  # per-round bytes, from the rounds record
        assert closed["train_accuracy"] == 0.5  # the accepted updates' reported accuracies, averaged
        assert run["bytes_up"] >= closed["bytes_up"]
        workers = {w["worker_id"]: w for w in run["workers"]}
        assert set(workers) == {w.wallet.address for w in t.workers}
        assert all(set(w) == WORKER_KEYS for w in workers.values())
        cheat = workers[c.wallet.address]
        assert cheat["contract_status"] == "slashed" and "rejected_update" in cheat["flags"], cheat
        assert cheat["paid_micro"] == 0 and cheat["score"] == 0  # (no bond in this run: nothing to burn)
        assert workers[a.wallet.address]["end_reason"] == MARKUP  # JSON carries it as data
        assert set(run["payments"]) == {
            "network",
            "escrowed",
            "escrow_balance",
            "paid",
            "paid_micro",
            "slashed",
            "slashed_micro",
            "settled_round",
            "finalized",
            "chain_txs",
        }
        assert run["payments"]["chain_txs"] == []  # the coordinator's own ledger: no chain transactions
        assert run["payments"]["paid_micro"] == sum(w["paid_micro"] for w in workers.values()) > 0
        ledger = http.get("/v1/ledger").json()
        assert run["ledger"]["network"] == ledger["network"]
        assert run["ledger"]["entries"] >= 1 and re.fullmatch(r"[0-9a-f]{64}", run["ledger"]["head"])

        # No CID of the run, nor where its data came from, nor its model's options.
        cids = _run_cids(t)
        assert len(cids) >= 3 + 1 + 1 + 2 + 2  # shards, val, manifest, checkpoints, updates at least
        html = http.get("/").text + http.get(f"/runs/{t.run_id}").text
        for text in (listed.text, reply.text, html):
            assert not [cid for cid in cids if cid in text]
        for text in (listed.text, reply.text):
            assert "digits" not in text and "hidden" not in text  # the data source, the model's options
        assert not [k for k in _keys(run) | _keys(page) if "cid" in k or k in ("source", "data_source", "config")]

        # Each worker's standing and pay are the payments view's numbers...
        pay = {p["worker_id"]: p for p in http.get(f"/v1/runs/{t.run_id}/payments").json()["data"]}
        for w in http.get(f"/v1/dashboard/runs/{t.run_id}").json()["workers"]:
            p = pay[w["worker_id"]]
            assert [w[k] for k in PAY_KEYS] == [p[k] for k in PAY_KEYS] and set(p["flags"]) <= set(w["flags"])
    # ... read in a fixed number of queries through the run's indexes: one of the scores
    # table (it read each contract's scores by contract_id, which no index covers: a scan
    # of every run's scores per worker, per poll, per open page).
    statements: list[str] = []

    def seen(conn, cursor, statement, *args):
        statements.append(statement)

    event.listen(t.coord.ctx.engine, "before_cursor_execute", seen)
    try:
        with t.coord.ctx.session() as s:
            dashboard.run_page(t.coord.ctx, s, repository.get_run(s, t.run_id))
    finally:
        event.remove(t.coord.ctx.engine, "before_cursor_execute", seen)
    from_scores = [q for q in statements if re.search(r"\bFROM scores\b", q)]
    assert len(from_scores) == 1 and "scores.run_id" in from_scores[0], from_scores


def test_a_long_runs_curves_are_thinned_to_a_bound(server, api):
    """A run of thousands of rounds (up to 100,000 may be asked for): one poll holds at most
    MAX_CURVE_POINTS rounds of curves (every n-th and the newest; it held them all, a
    reply of megabytes every 1.5 s per open page) and says which."""
    run_id = api.create_run(server.client("owner"))
    closed = 2 * dashboard.MAX_CURVE_POINTS + 500
    now = time.time()
    with server.ctx.session() as s:
        s.execute(
            insert(RoundRecord),
            [
                dict(run_id=run_id, round=k, checkpoint_cid="x", val_loss=1 / (k + 1), started_at=now, closed_at=now)
                for k in range(closed + 1)
            ],
        )
        s.commit()
    with server.http() as http:
        reply = http.get(f"/v1/dashboard/runs/{run_id}")
    assert reply.status_code == 200, reply.text
    run = reply.json()
    rounds = [r["round"] for r in run["curves"]]
    every = run["curve_every"]
    assert every == 3 and run["rounds_completed"] == closed
    assert len(rounds) <= dashboard.MAX_CURVE_POINTS and rounds == sorted(rounds)
    assert rounds[0] == 0 and rounds[-1] == closed and all(k % every == 0 for k in rounds[:-1])
    assert len(rounds) == closed // every + 2  # 0, every n-th round up to the newest, the newest
    assert len(reply.content) < 250_000


def test_unknown_run_is_a_json_404_and_the_routes_are_read_only(server):
    with server.http() as http:
        r = http.get("/v1/dashboard/runs/training_000000000000")
        assert r.status_code == 404
        assert r.json() == {"error": "unknown_run", "detail": r.json()["detail"]}
        assert "training_000000000000" in r.json()["detail"]
        for path in ("/v1/dashboard/runs", "/v1/dashboard/runs/training_000000000000"):
            r = http.post(path, json={})
            assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
        # The page for an unknown run is the same page: its script shows the 404's detail.
        assert http.get("/runs/training_000000000000").status_code == 200


def test_the_page_is_served_with_a_content_security_policy_and_no_inline_script(server):
    with server.http() as http:
        for path in ("/", "/runs/training_abc"):
            r = http.get(path)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
            assert r.headers["x-content-type-options"] == "nosniff"
            scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", r.text, flags=re.S)
            assert scripts and all('src="/static/' in attrs and not body.strip() for attrs, body in scripts)
            assert not re.search(r"<[^>]*\son[a-z]+\s*=", r.text)  # no inline event handlers
            assert "http://" not in r.text and "https://" not in r.text  # nothing from another origin
        for asset in ("/static/dashboard.js", "/static/dashboard.css", "/static/vendor/uplot/uPlot.iife.min.js"):
            assert http.get(asset).status_code == 200
        assert "/" not in http.get("/openapi.json").json()["paths"]  # the page is not part of the API
        assert "/v1/dashboard/runs/{run_id}" in http.get("/openapi.json").json()["paths"]


def test_only_the_dashboard_routes_import_its_view():
    """The allow-list is the dashboard's alone: no other view or use-case builds on it (a
    field added for another page would become public there)."""
    import ast
    from pathlib import Path

    import aitbc

    root = Path(aitbc.__file__).parent
    users = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = {f"{node.module}.{a.name}" for a in node.names} | {node.module or ""}
            elif isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            else:
                continue
            if "aitbc.coordinator.runs.dashboard" in names:
                users.add(path.relative_to(root).as_posix())
    assert users == {"coordinator/api/routes/dashboard.py"}
