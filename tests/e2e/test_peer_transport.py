"""End to end (issue 14, part 3): blob transport off the coordinator.

Real coordinator and worker processes on 127.0.0.1, the owner's CLI, SQLite (or PostgreSQL).
Workers started with ``--listen`` serve the models and shards they hold and fetch the round's
model from each other (the coordinator names who holds what); a worker without ``--listen``
still takes part; a worker serving bytes that do not hash to their CID is caught by the
fetcher (which falls back to the coordinator and reports it) and flagged by the coordinator,
whose own fetch confirms it; one worker's report alone cannot get an honest peer flagged.
"""

from __future__ import annotations

import time

import httpx
import pytest
from tests.e2e.conftest import free_port
from tests.e2e.test_metrics import by, scrape

from aitbc.client import ApiError, CoordinatorClient
from aitbc.ledger.wallet import ensure_wallet, load_wallet

pytestmark = pytest.mark.long

ROUNDS, STEPS = 4, 10


def _accepted(stack, run_id: str) -> dict[str, int]:
    rows = stack.rows(
        "SELECT worker_id, COUNT(*) FROM updates WHERE run_id = :r AND status = 'accepted' GROUP BY worker_id",
        r=run_id,
    )
    return dict(rows)


def _done(stack, run_id: str, timeout: float = 240) -> dict:
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=timeout, what="the end")
    assert run["status"] == "complete", run
    return run


def test_workers_fetch_the_model_from_peers_and_the_coordinator_sends_less(stack, tmp_path):
    stack.start_coordinator()
    listen = {f"p{i}": free_port() for i in range(3)}
    metrics = {name: free_port() for name in (*listen, "plain")}
    for name, port in listen.items():
        stack.start_worker(name, metrics_port=metrics[name], extra=("--listen", f"127.0.0.1:{port}"))
    stack.start_worker("plain", metrics_port=metrics["plain"])  # no --listen: reachable by nobody
    stack.wait_offers(4)
    run_id = stack.init_run(workers=4)
    stack.start_run(run_id, workers=4, rounds=ROUNDS, local_steps=STEPS)
    run = _done(stack, run_id)

    # Every worker took part in every round, the one without --listen included.
    ids = {name: stack.worker_id(name) for name in metrics}
    assert _accepted(stack, run_id) == {ids[n]: ROUNDS for n in metrics}

    # Bytes: what the workers fetched (from the coordinator, from peers) and what the coordinator sent.
    fetched = {
        n: by(scrape(f"http://127.0.0.1:{port}/metrics")["aitbc_worker_bytes_total"], "direction")
        for n, port in metrics.items()
    }
    from_peers = sum(b["peer"] for b in fetched.values())
    from_coordinator = sum(b["down"] for b in fetched.values())
    sent = scrape(f"{stack.url}/metrics")["aitbc_http_bytes_total"]
    blob_out = next(v for k, v in sent.items() if dict(k) == {"direction": "out", "kind": "blob"})
    model = int(httpx.head(f"{stack.url}/v1/blobs/{run['global_model_cid']}", timeout=10).headers["content-length"])
    assert from_peers >= model  # models went worker to worker
    # Coordinator-only, it would have sent every byte the workers fetched (and the owner's CLI
    # its few reads): it sent what they did not get from peers, well under that.
    assert from_coordinator <= blob_out < from_coordinator + model <= from_coordinator + from_peers
    print(f"model {model} B; coordinator sent {blob_out:.0f} B of blobs; workers got {from_peers:.0f} B from peers")
    assert fetched["plain"]["down"] + fetched["plain"]["peer"] > 0

    # The worker's server: read-only, by CID only, nothing it does not hold. It holds the
    # model of the last round it trained (the final model, made after it, it never fetched).
    last = stack.api(f"/runs/{run_id}/rounds")["data"]
    last = next(r["checkpoint_cid"] for r in last if r["round"] == ROUNDS - 1)
    p0 = f"http://127.0.0.1:{listen['p0']}"
    held = httpx.get(f"{p0}/v1/blobs/{last}", timeout=10)
    assert held.status_code == 200 and len(held.content) == model
    assert httpx.head(f"{p0}/v1/blobs/{last}", timeout=10).status_code == 200
    assert httpx.get(f"{p0}/v1/blobs/..%2F..%2Fwallets", timeout=10).status_code == 400
    assert httpx.get(f"{p0}/etc/passwd", timeout=10).status_code == 404
    assert httpx.put(f"{p0}/v1/blobs/{last}", content=b"x", timeout=10).status_code == 501
    assert httpx.get(f"{p0}/v1/blobs/{run['global_model_cid']}", timeout=10).status_code == 404  # not held

    # Who holds it, as anyone may ask: the listening workers that announced it, never the one left out.
    holders = httpx.get(f"{stack.url}/v1/blobs/{last}/holders", params={"exclude": ids["p1"]}, timeout=10).json()
    assert holders["count"] >= 1 and {p["worker"] for p in holders["data"]} <= {ids["p0"], ids["p2"]}
    assert {p["url"] for p in holders["data"]} <= {f"http://127.0.0.1:{listen[n]}" for n in ("p0", "p2")}
    assert httpx.get(f"{stack.url}/v1/blobs/nope/holders", timeout=10).json()["error"] == "bad_cid"

    # One report alone does not flag an honest peer: the coordinator fetches from it and checks.
    wallet = ensure_wallet(tmp_path / "accuser", "accuser")
    with CoordinatorClient(stack.url, wallet) as c:
        c.post("/workers", {"gpu": "RTX3090", "price": "1.00"})
        reply = c.post(f"/blobs/{last}/bad-peer", {"peer": ids["p0"]})
        assert reply["verdict"] == "ok"
        with pytest.raises(Exception, match="advertise URL"):
            c.post("/workers/holdings", {"advertise": "http://user:pw@127.0.0.1:1", "cids": []})
        with pytest.raises(Exception, match="advertise URL"):
            c.post("/workers/holdings", {"advertise": "file:///etc/passwd", "cids": []})
        with pytest.raises(Exception, match="not a CIDv1"):
            c.post("/workers/holdings", {"advertise": "http://127.0.0.1:1", "cids": ["../x"]})
    assert stack.rows("SELECT COUNT(*) FROM flags WHERE worker_id = :w", w=ids["p0"]) == [(0,)]


def test_a_peer_serving_corrupt_blobs_is_caught_reported_and_flagged(stack):
    stack.start_coordinator()
    # the only worker that serves: every model the others fetch is handed out from it first
    stack.start_worker("bad", cheat="bad-blobs", extra=("--listen", f"127.0.0.1:{free_port()}"))
    stack.start_worker("h1")
    stack.start_worker("h2")
    stack.wait_offers(3)
    run_id = stack.init_run(workers=3)
    stack.start_run(run_id, workers=3, rounds=2, local_steps=STEPS)
    _done(stack, run_id)

    bad, h1, h2 = (stack.worker_id(n) for n in ("bad", "h1", "h2"))
    # The honest fetchers verified, fell back to the coordinator and trained every round.
    assert _accepted(stack, run_id) == {bad: 2, h1: 2, h2: 2}
    logs = stack.log("h1") + stack.log("h2")
    assert "does not hash to its CID" in logs
    assert "coordinator's check bad" in logs
    # The coordinator's own fetch confirmed it: one flag against the peer, none against the others.
    flags = stack.rows("SELECT worker_id, kind FROM flags")
    assert (bad, "bad_peer_blob") in flags
    assert {w for w, _ in flags} == {bad}
    offers = {o["worker_id"]: o for o in stack.api("/market/offers?all=true")["data"]}
    assert offers[bad]["flags"] >= 1

    # Caught once is remembered: the book is in memory, the flag is not. After a coordinator
    # restart the worker is refused as a peer, whether it registers again or announces.
    stack.kill("bad")
    stack.kill("coordinator")
    stack.start_coordinator()
    model = stack.api(f"/runs/{run_id}")["global_model_cid"]
    with CoordinatorClient(stack.url, load_wallet(stack.root / "bad", "bad")) as c:
        deadline = time.monotonic() + 60
        while True:  # its old process's lease runs out first (registering over a live one is refused)
            try:
                c.post("/workers", {"gpu": "RTX3090", "price": "1.00", "advertise": "http://127.0.0.1:1"})
                break
            except ApiError as e:
                assert e.code == "duplicate_registration" and time.monotonic() < deadline, e
                time.sleep(0.5)
        with pytest.raises(ApiError, match="serves no peers") as refused:
            c.post("/workers/holdings", {"advertise": "http://127.0.0.1:1", "cids": [model]})
    assert refused.value.status == 403
    holders = httpx.get(f"{stack.url}/v1/blobs/{model}/holders", timeout=10).json()["data"]
    assert bad not in {p["worker"] for p in holders}
