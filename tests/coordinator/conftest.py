"""Fixtures for the coordinator's API tests: a real coordinator (uvicorn, the round driver, a
database of the backend under test: SQLite, or PostgreSQL where ``AITBC_TEST_DB=postgresql``)
on a free loopback port in a background thread, signed clients, and helpers to
drive a run to ``training`` through the API and to check that a refusal changed nothing.

``server`` is one coordinator per test module (fast); ``fresh_server`` is one per test, for
tests whose outcome depends on the whole marketplace (who else is registered);
``new_coordinator(**settings)`` starts more, living until the module ends (a training run
gets its own). ``api`` is this module, for its helpers (``api.assert_error(...)``).
Every worker here is a signed client, not a daemon: it trains nothing and sends no
heartbeats (the lease is long), so each test decides exactly what the coordinator receives.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn
from sqlalchemy import text

from aitbc.client import ApiError, CoordinatorClient
from aitbc.coordinator.app import KEEP_ALIVE_SECONDS, create_app
from aitbc.coordinator.config import Settings
from aitbc.coordinator.context import Context
from aitbc.coordinator.rounds.lifecycle import pending_evaluations
from aitbc.core.compression import build_codec
from aitbc.ledger.signing import sign_request
from aitbc.ledger.wallet import Wallet
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.checkpoint import flat_params, load_checkpoint, load_shard
from aitbc.training.data_spec import DataSpec
from aitbc.training.local import LocalConfig, LocalTrainer
from aitbc.training.models import build_model

MAX_BLOB = 256 << 10  # small, so an oversized upload is cheap; the digits shards fit
LEASE = 600.0  # no lease expires during a test: the workers here send no heartbeats
MODEL_OPTIONS = {"hidden": [8]}  # a tiny mlp: d = 64*8 + 8 + 8*10 + 10 = 610
TABLES = ("runs", "offers", "contracts", "jobs", "updates", "rounds", "flags", "gossip_witnesses")


# --- the coordinator -------------------------------------------------------------------


@dataclass
class Coordinator:
    url: str
    ctx: Context
    home: Path
    clients: list[CoordinatorClient] = field(default_factory=list)  # closed with the coordinator

    def client(self, name: str = "user", wallet: Wallet | None = None) -> CoordinatorClient:
        """A signed client with a new wallet (``name`` is only the wallet's label)."""
        c = CoordinatorClient(self.url, wallet or Wallet.generate(name))
        self.clients.append(c)
        return c

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    # What the database and the blob directory hold, for "nothing changed" checks. Offers'
    # last_heartbeat is left out: the driver copies in-memory heartbeats there on its own.
    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with self.ctx.engine.connect() as conn:
            for t in TABLES:
                rows = [dict(r._mapping) for r in conn.execute(text(f"SELECT * FROM {t}"))]
                if t == "offers":
                    for r in rows:
                        r.pop("last_heartbeat")
                out[t] = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
        d = self.ctx.store.dir
        out["blobs"] = sorted(os.listdir(d)) if d.is_dir() else []
        return out

    def rows(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        with self.ctx.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(text(sql), params)]

    def settled(self, timeout: float = 20) -> None:
        """Wait until the driver has done what it does in the background after a round
        closes: scored and settled every aggregated round, evaluated every round due an
        evaluation, and returned the bonds of ended runs. A snapshot taken now stays still."""
        deadline = time.monotonic() + timeout
        while True:
            busy = self.rows(
                "SELECT r.id FROM runs r WHERE r.config IS NOT NULL AND (r.settled_round < "
                "(SELECT COALESCE(MAX(x.round), 0) FROM rounds x WHERE x.run_id = r.id) "
                "OR (r.status IN ('complete', 'failed', 'stopped') AND NOT r.bonds_returned))"
            )
            with self.ctx.session() as s:
                unevaluated = pending_evaluations(s)
            if not busy and not unevaluated:
                return
            assert time.monotonic() < deadline, f"the driver never settled {busy} nor evaluated {unevaluated}"
            time.sleep(0.02)


def serve(app: Any) -> tuple[str, Callable[[], None]]:
    """Serve ``app`` from a thread on a free loopback port, as `aitbc coordinator serve` does;
    returns once it answers /v1/health: its URL and the call that stops it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            ws="none",
            timeout_keep_alive=KEEP_ALIVE_SECONDS,  # as `aitbc coordinator serve`
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="coordinator", daemon=True)
    thread.start()

    def stop() -> None:
        server.should_exit = True
        thread.join(30)
        sock.close()

    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/v1/health", timeout=2).status_code == 200:
                return url, stop
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            stop()
            raise RuntimeError("coordinator did not come up")
        time.sleep(0.02)


def start_coordinator(home: Path, **settings: Any) -> tuple[Coordinator, Callable[[], None]]:
    cfg = dict(home=home, lease_seconds=LEASE, max_blob_bytes=MAX_BLOB, tick_seconds=0.05)
    cfg.update(settings)
    app = create_app(Settings(**cfg))
    url, stop_server = serve(app)
    coord = Coordinator(url, app.state.ctx, home)

    def stop() -> None:
        for c in coord.clients:
            c.close()
        stop_server()

    return coord, stop


def start_on(databases: Any, home: Path, **settings: Any) -> tuple[Coordinator, Callable[[], None]]:
    """``start_coordinator`` on a new database of the backend under test (``databases``: the
    session fixture of tests/conftest.py), dropped when the coordinator stops."""
    url = databases.new(home)
    try:
        coord, stop = start_coordinator(home, db_url=url, **settings)
    except BaseException:
        databases.drop(url)
        raise

    def stop_and_drop() -> None:
        try:
            stop()
        finally:
            databases.drop(url)

    return coord, stop_and_drop


@pytest.fixture(scope="module")
def server(tmp_path_factory, databases) -> Iterator[Coordinator]:
    coord, stop = start_on(databases, tmp_path_factory.mktemp("coord"))
    yield coord
    stop()


@pytest.fixture
def fresh_server(tmp_path, databases) -> Iterator[Coordinator]:
    coord, stop = start_on(databases, tmp_path / "coord")
    yield coord
    stop()


@pytest.fixture(scope="module")
def new_coordinator(tmp_path_factory, databases) -> Iterator[Callable[..., Coordinator]]:
    """Start more coordinators (settings as keywords) that live until the module ends:
    a training run gets its own, so nobody else's offers are in its marketplace."""
    stops = []

    def make(**settings: Any) -> Coordinator:
        coord, stop = start_on(databases, tmp_path_factory.mktemp("coord"), **settings)
        stops.append(stop)
        return coord

    yield make
    for stop in stops:
        stop()


# --- requests and assertions -----------------------------------------------------------


def signed_post(
    http: httpx.Client, wallet: Wallet, path: str, body: Any = None, *, raw: bytes | None = None, **sign_kw: Any
) -> httpx.Response:
    """POST ``path`` (full, from ``/v1``) signed by ``wallet``; ``raw`` sends those bytes."""
    data = raw if raw is not None else json.dumps({} if body is None else body).encode()
    headers = {"content-type": "application/json", **sign_request(wallet, "POST", path, data, **sign_kw)}
    return http.post(path, content=data, headers=headers)


def assert_error(r: httpx.Response, status: int, code: str, *detail_parts: str) -> str:
    """The reply is ``status`` with exactly ``{"error": code, "detail": str}``; returns the detail."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error", "detail"}, body
    assert body["error"] == code, body
    assert isinstance(body["detail"], str) and body["detail"], body
    assert "\n" not in body["detail"], body
    for part in detail_parts:
        assert part in body["detail"], (part, body["detail"])
    return body["detail"]


def assert_api_error(e: pytest.ExceptionInfo[ApiError], status: int, code: str, *detail_parts: str) -> None:
    assert (e.value.status, e.value.code) == (status, code), (e.value.status, e.value.code, e.value.detail)
    for part in detail_parts:
        assert part in e.value.detail, (part, e.value.detail)


# --- runs, workers and updates through the API ------------------------------------------


def register_worker(coord: Coordinator, name: str, gpu: str = "RTX4090", price: str = "1.0") -> CoordinatorClient:
    c = coord.client(name)
    c.post("/workers", {"gpu": gpu, "price": price, "availability": 0.99})
    return c


def create_run(owner: CoordinatorClient, *, target_workers: int = 2, seed: int = 0) -> str:
    """A run with a 100 AIT budget escrowed from the owner's (faucet-funded) wallet."""
    owner.post("/wallets/fund", {"amount": "1000"})
    run = owner.post(
        "/runs",
        {
            "model_type": "mlp",
            "model_options": MODEL_OPTIONS,
            "dataset_size": "1GB",
            "target_workers": target_workers,
            "seed": seed,
            "budget": "100",
        },
    )
    return run["training_id"]


@functools.cache
def _digits(seed: int):
    from aitbc.training.datasets import DataOptions, load_dataset

    return load_dataset("digits", DataOptions(seed=seed))


def upload_digits(owner: CoordinatorClient, run_id: str, shards: int, seed: int = 0) -> str:
    """Package digits into ``shards`` shards, upload them, attach the manifest; its CID."""
    from aitbc.training.packaging import manifest_bytes, package

    data = _digits(seed)
    packaged = package(data, shards, seed=seed)
    cids = []
    for blob in packaged.shards:
        cids.append(cid_of_bytes(blob))
        owner.put_blob(cids[-1], blob)
    val_cid = cid_of_bytes(packaged.val)
    owner.put_blob(val_cid, packaged.val)
    manifest = manifest_bytes(data, packaged, cids, val_cid, seed=seed, alpha=None)
    manifest_cid = cid_of_bytes(manifest)
    owner.put_blob(manifest_cid, manifest)
    owner.post(f"/runs/{run_id}/data", {"manifest_cid": manifest_cid, "source": "digits"})
    return manifest_cid


def wait_status(client: CoordinatorClient, run_id: str, status: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run = client.get(f"/runs/{run_id}")
        if run["status"] == status:
            return run
        assert time.monotonic() < deadline, (
            f"run {run_id} is {run['status']}, never became {status}: {run.get('error')}"
        )
        time.sleep(0.02)


@dataclass
class TrainingRun:
    """A run in ``training`` (round 1 open), hired workers each with an active job."""

    coord: Coordinator
    owner: CoordinatorClient
    run_id: str
    workers: list[CoordinatorClient]
    jobs: dict[str, str]  # worker address -> job id
    d: int
    used: set[int] = field(default_factory=set)

    def take(self) -> tuple[CoordinatorClient, str]:
        """A worker (and its job) no other test has used; the last one is never handed
        out, so round 1 never closes (one job always has not answered)."""
        for i, w in enumerate(self.workers[:-1]):
            if i not in self.used:
                self.used.add(i)
                return w, self.jobs[w.wallet.address]
        raise AssertionError("TrainingRun has no unused worker left; raise its size")


def hired_run(
    coord: Coordinator, n_workers: int, *, prefix: str = "w", gpu: str = "RTX4090"
) -> tuple[list[CoordinatorClient], CoordinatorClient, str]:
    """Register ``n_workers`` workers, create a run for them, upload digits and hire them
    all: the workers, the owner and the run, ready to distribute."""
    workers = [register_worker(coord, f"{prefix}{i}", gpu=gpu) for i in range(n_workers)]
    owner = coord.client(f"{prefix}owner")
    run_id = create_run(owner, target_workers=n_workers)
    upload_digits(owner, run_id, n_workers)
    hired = owner.post(f"/runs/{run_id}/discover", {"required_workers": n_workers, "min_gpu": gpu})
    assert hired["count"] == n_workers
    assert {c["worker_id"] for c in hired["contracts"]} == {w.wallet.address for w in workers}, "hired someone else"
    return workers, owner, run_id


def refuses_distribute(owner: CoordinatorClient, run_id: str, cases: list[tuple[dict[str, Any], str]]) -> None:
    """Each ``(extra body, words)``: distribute with it is a one-line 422 naming ``words``."""
    for extra, words in cases:
        try:
            owner.post(f"/runs/{run_id}/distribute", {"rounds": 3, **extra})
        except ApiError as e:
            assert e.status == 422 and words in e.detail and "\n" not in e.detail, (extra, e.detail)
        else:
            raise AssertionError(f"{extra} accepted")


def start_training_run(
    coord: Coordinator, n_workers: int, *, prefix: str = "w", gpu: str = "RTX4090", **distribute: Any
) -> TrainingRun:
    """Register ``n_workers`` workers, create a run for them, upload digits, hire them all,
    distribute, and wait until the driver opens round 1. ``coord`` should have no other
    free offers (use a coordinator of its own), or they may be hired instead."""
    workers, owner, run_id = hired_run(coord, n_workers, prefix=prefix, gpu=gpu)
    owner.post(f"/runs/{run_id}/distribute", {"rounds": 3, "local_steps": 1, "batch_size": 8, **distribute})
    run = wait_status(owner, run_id, "training")
    jobs = {}
    for w in workers:
        view = w.get(f"/workers/{w.wallet.address}/job", sign=True)["job"]
        assert view["training_id"] == run_id and view["round"] == 1 and view["action"] == "train", view
        jobs[w.wallet.address] = view["job_id"]
    return TrainingRun(coord, owner, run_id, workers, jobs, run["config"]["d"])


def run_manifest(t: TrainingRun) -> dict[str, Any]:
    """Run ``t``'s data manifest (its shards' and validation set's CIDs, the data spec)."""
    manifest = t.coord.rows("SELECT manifest_cid FROM runs WHERE id = :r", r=t.run_id)[0]["manifest_cid"]
    return json.loads(t.owner.get_blob(manifest))


def run_model(t: TrainingRun) -> torch.nn.Module:
    """A fresh model of run ``t``'s kind (the tiny mlp these tests run)."""
    from aitbc.training.data_spec import DataSpec
    from aitbc.training.models import build_model

    spec = run_manifest(t)["spec"]
    return build_model(
        "mlp", DataSpec(spec["task"], tuple(spec["input_shape"]), int(spec["num_classes"])), MODEL_OPTIONS
    )


def round_params(t: TrainingRun, r: int) -> torch.Tensor:
    """Round ``r``'s checkpoint of run ``t`` as one ``(d,)`` vector in the order updates use."""
    from aitbc.training.checkpoint import flat_params, load_checkpoint

    model = run_model(t)
    load_checkpoint(model, t.owner.get_blob(t.owner.get(f"/runs/{t.run_id}/rounds")["data"][r]["checkpoint_cid"]))
    return flat_params(model)


def update_blob(t: torch.Tensor) -> bytes:
    return build_codec("none", {}).encode(t)


def put_update(client: CoordinatorClient, t: torch.Tensor | bytes) -> str:
    blob = t if isinstance(t, bytes) else update_blob(t)
    cid = cid_of_bytes(blob)
    client.put_blob(cid, blob)
    return cid


def job_order(worker: CoordinatorClient) -> dict[str, Any] | None:
    """The worker's open job as the coordinator hands it out (None: none)."""
    assert worker.wallet is not None
    return worker.get(f"/workers/{worker.wallet.address}/job", sign=True)["job"]


def honest_update(worker: CoordinatorClient, spec: dict[str, Any], model_options: dict[str, Any]) -> torch.Tensor:
    """What an honest worker sends for its open round: ``global - local`` after 30 real SGD
    steps of its MLP (``model_options``) on its shard, so the round is scored above zero and
    paid (a random update is noise to scoring, and noise is not paid)."""
    order = job_order(worker)
    assert order is not None, "the worker has no open job"
    spec_ = DataSpec(spec["task"], tuple(spec["input_shape"]), int(spec["num_classes"]))
    model = build_model("mlp", spec_, model_options)
    load_checkpoint(model, worker.get_blob(order["global_model_cid"]))
    x, y = load_shard(worker.get_blob(order["shard_cid"]))
    trainer = LocalTrainer(model, x, y, LocalConfig(steps=30, batch_size=32, optimizer="sgd", lr=0.1), seed=1)
    return trainer.train_round(flat_params(model)).delta


def update_body(round: int, cid: str, **kw: Any) -> dict[str, Any]:
    return {"round": round, "cid": cid, "train_loss": 0.5, "steps": 1, "compute_seconds": 0.1, **kw}


@pytest.fixture(scope="session")
def api():
    """The helpers above, for the test modules (``api.assert_error(...)``): with
    ``--import-mode=importlib`` a test module cannot import this conftest by name."""
    return sys.modules[__name__]


def wait_for(what: str, get: Callable[[], Any], ok: Callable[[Any], bool], timeout: float = 20.0) -> Any:
    """Poll ``get()`` until ``ok`` holds of its value, which is returned; fail naming ``what``
    and the last value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = get()
        if ok(v):
            return v
        assert time.monotonic() < deadline, f"{what}: {v}"
        time.sleep(0.05)
