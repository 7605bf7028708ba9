"""A live coordinator for the API conformance suite: the ``aitbc coordinator serve``
process on 127.0.0.1 (port 0: the kernel picks one, read back from its log), with a
small world in it (wallets, offers, runs, jobs, an update) whose ids the generated
requests can name, so they reach the handlers instead of stopping at "no such run"."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from aitbc.client import CoordinatorClient
from aitbc.core.compression import build_codec
from aitbc.ledger.wallet import Wallet
from aitbc.storage.cid import cid_of_bytes

AITBC = Path(sys.executable).parent / "aitbc"
COUNTS = "aitbc/schemathesis-counts"  # pytest cache key: the cases run, for the summary


@dataclass
class Live:
    url: str
    log: Path
    proc: subprocess.Popen


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("live")
    log = root / "coordinator.log"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(AITBC), "coordinator", "serve", "--home", str(root / "home"), "--port", "0"]
            + ["--lease", "600", "--log-level", "info"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        url = _wait_url(proc, log)
        yield Live(url, log, proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)


def _wait_url(proc: subprocess.Popen, log: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(r"running on (http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))
        if m:
            try:
                if httpx.get(m.group(1) + "/v1/health", timeout=2).status_code == 200:
                    return m.group(1)
            except httpx.TransportError:
                pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"coordinator did not start:\n{log.read_text(errors='replace')[-4000:]}")


@dataclass
class World:
    """Who signs the generated requests, and the ids that exist on the coordinator."""

    wallet: Wallet  # signs every signed case; owns the runs below and is a hired worker
    pools: dict[str, list[Any]] = field(default_factory=dict)  # field name -> real values


@pytest.fixture(scope="session")
def world(live: Live) -> Iterator[World]:
    """A manual run in training (round 1 open, one update sent), an automatic run still
    initializing with its data, and a run of another owner (for the 403s)."""
    me, other = Wallet.generate("fuzzer"), Wallet.generate("other")
    with CoordinatorClient(live.url, me) as c, CoordinatorClient(live.url, other) as o:
        for client in (c, o):
            client.post("/wallets/fund", {"amount": "1000"})
            client.post("/workers", {"gpu": "RTX4090", "price": "1.0", "availability": 0.99})
        manual = _run(c, control="manual")
        shards, manifest = _upload(c, manual, 2)
        hired = c.post(f"/runs/{manual}/discover", {"required_workers": 2})
        c.post(f"/runs/{manual}/phase", {"phase": "distributing", "config": {"rounds": 3, "local_steps": 1}})
        jobs = [
            c.post(f"/runs/{manual}/jobs", {"worker_id": w.address, "shard_id": s})["job_id"]
            for w, s in ((me, shards[0]), (other, shards[1]))
        ]
        run = c.post(f"/runs/{manual}/phase", {"phase": "training"})
        deadline = time.monotonic() + 60
        while run["status"] != "training" or run["round"] != 1:
            assert time.monotonic() < deadline, run
            time.sleep(0.05)
            run = c.get(f"/runs/{manual}")
        update = build_codec("none", {}).encode(torch.zeros(run["config"]["d"]))
        update_cid = cid_of_bytes(update)
        c.put_blob(update_cid, update)
        c.post(f"/jobs/{jobs[0]}/updates", {"round": 1, "cid": update_cid, "steps": 1, "train_loss": 0.5})
        automatic = _run(c)
        more_shards, more_manifest = _upload(c, automatic, 2)
        theirs = _run(o)
        cids = [*shards, *more_shards, manifest, more_manifest, update_cid, run["global_model_cid"]]
        yield World(
            me,
            {
                "run_id": [manual, automatic, theirs],
                "job_id": jobs,
                "worker_id": [me.address, other.address],
                "address": [me.address, other.address],
                "to": [other.address],
                "cid": cids,
                "contract_id": [k["contract_id"] for k in hired["contracts"]],
                "shard_id": [*shards, *more_shards],
                "manifest_cid": [manifest, more_manifest],
                "model_cid": [run["global_model_cid"]],
                "updates": [update_cid],
                "owner": [me.address],
                "ending_run_id": [automatic, theirs],
                # values the domain checks accept (the schema says only "a string")
                **{name: ["10", "0.5"] for name in ("amount", "price", "budget", "max_price", "max_cost")},
                **{name: ["0"] for name in ("bond", "max_bond")},
                "dataset_size": ["1GB", "10MB"],
                "model_type": ["mlp"],
                "model_options": [{"hidden": [8]}, {}],
                "gpu": ["RTX4090"],
                "min_gpu": ["RTX3090"],
                "network": ["local"],
                "inner_opt": ["adamw"],
                "outer": ["fedavg"],
                "aggregator": ["mean"],
                "compression": ["none"],
                "run_status": ["training", "complete"],
            },
        )


def _run(c: CoordinatorClient, **extra: Any) -> str:
    body = {"model_type": "mlp", "model_options": {"hidden": [8]}, "dataset_size": "1GB", "target_workers": 2}
    return c.post("/runs", {**body, "budget": "100", **extra})["training_id"]


def _upload(c: CoordinatorClient, run_id: str, n: int) -> tuple[list[str], str]:
    from aitbc.training.datasets import DataOptions, load_dataset
    from aitbc.training.packaging import manifest_bytes, package

    data = load_dataset("digits", DataOptions(seed=0))
    packaged = package(data, n, seed=0)
    cids = []
    for blob in packaged.shards:
        cids.append(cid_of_bytes(blob))
        c.put_blob(cids[-1], blob)
    val = cid_of_bytes(packaged.val)
    c.put_blob(val, packaged.val)
    manifest = manifest_bytes(data, packaged, cids, val, seed=0, alpha=None)
    manifest_cid = cid_of_bytes(manifest)
    c.put_blob(manifest_cid, manifest)
    c.post(f"/runs/{run_id}/data", {"manifest_cid": manifest_cid, "source": "digits"})
    return cids, manifest_cid


_LOADED = time.time()  # counts written before this are another session's


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The cases the conformance suite ran, per kind and status (read back from the
    pytest cache, where the test wrote them, so they show under xdist too)."""
    cache = getattr(config, "cache", None)
    counts = cache.get(COUNTS, None) if cache is not None else None
    if not counts or counts.get("at", 0) < _LOADED:
        return
    terminalreporter.section("schemathesis cases against a live coordinator")
    for line in counts["lines"]:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def record_counts(request: pytest.FixtureRequest) -> Any:
    """``record_counts(lines)``: keep these lines for the terminal summary."""
    cache = getattr(request.config, "cache", None)

    def record(lines: list[str]) -> None:
        if cache is not None:
            cache.set(COUNTS, {"at": time.time(), "lines": lines})

    return record
