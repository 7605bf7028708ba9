"""A real local deployment for end-to-end tests: one coordinator process and worker
processes on 127.0.0.1 (ports picked free at run time), the owner's CLI as subprocesses.
The coordinator's database is of the backend under test: SQLite in its home, or a
PostgreSQL database of its own where ``AITBC_TEST_DB=postgresql`` (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

AITBC = Path(sys.executable).parent / "aitbc"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    def __init__(self, root: Path, db_url: str) -> None:
        self.root = root
        self.db_url = db_url  # the coordinator's database (it keeps it across restarts)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = dict(
            os.environ, OMP_NUM_THREADS="1", COLUMNS="200", AITBC_COORDINATOR=self.url, AITBC_HOME=str(root / "owner")
        )

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """``env``: variables added to the stack's for this process alone."""
        log = (self.root / f"{name}.log").open("ab")
        p = subprocess.Popen(
            [str(AITBC), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**self.env, **(env or {})},
            start_new_session=True,
        )
        self.procs[name] = p
        return p

    def start_coordinator(
        self,
        *,
        lease: float = 3.0,
        settle_delay: float = 0.0,
        name: str = "coordinator",
        port: int | None = None,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        """Start coordinator ``name`` on ``port`` (default: the stack's), with home
        ``root/coordinator`` (every replica of a stack shares it: blobs and wallet);
        ``env``: variables of its process alone."""
        port = self.port if port is None else port
        self._spawn(
            name,
            [
                "coordinator",
                "serve",
                "--home",
                str(self.root / "coordinator"),
                "--port",
                str(port),
                "--db",
                self.db_url,
                "--lease",
                str(lease),
                "--log-level",
                "warning",
                "--settle-delay",
                str(settle_delay),
                *extra,
            ],
            env,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.procs[name].poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"coordinator did not start:\n{self.log(name)}")

    def start_worker(
        self,
        name: str,
        *,
        gpu: str = "RTX3090",
        price: str = "1.00",
        step_delay: float = 0.0,
        max_bond: str = "0",
        attack: str | None = None,
        cheat: str | None = None,
        funds: str | None = None,
        metrics_port: int | None = None,
        extra: tuple[str, ...] = (),
        coordinator: str | None = None,
    ) -> None:
        """``coordinator``: the URL (or comma-separated URLs) it is given; default the stack's."""
        if funds is not None:  # the provider funds its own wallet first (its bond comes from it)
            r = self.cli("wallet", "fund", name, funds, "--home", str(self.root / name))
            if r.returncode != 0:  # the wallet does not exist yet
                self.cli("wallet", "create", name, "--home", str(self.root / name))
                r = self.cli("wallet", "fund", name, funds, "--home", str(self.root / name))
            assert r.returncode == 0, r.stderr
        self._spawn(
            name,
            [
                "worker",
                "start",
                "--coordinator",
                coordinator or self.url,
                "--home",
                str(self.root / name),
                "--wallet",
                name,
                "--gpu",
                gpu,
                "--price",
                price,
                "--heartbeat",
                "0.5",
                "--log-level",
                "info",
                "--step-delay",
                str(step_delay),
                "--max-bond",
                max_bond,
                *(["--attack", attack] if attack else []),
                *(["--cheat", cheat] if cheat else []),
                *(["--metrics-port", str(metrics_port)] if metrics_port else []),
                *extra,
            ],
        )

    def fund_owner(self, amount: str = "1000") -> None:
        r = self.cli("wallet", "fund", "my-agent-wallet", amount)
        assert r.returncode == 0, r.stderr

    def wait_offers(self, n: int, timeout: float = 60) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            offers = httpx.get(f"{self.url}/v1/market/offers", timeout=5).json()["data"]
            if len(offers) >= n:
                return offers
            time.sleep(0.2)
        raise RuntimeError(f"only {len(offers)} of {n} offers appeared")

    def worker_id(self, name: str) -> str:
        """The address of worker ``name`` (its wallet is created by its first start)."""
        key = self.root / name / "wallets" / name / "key.json"
        return json.loads(key.read_text())["address"]

    def init_run(self, *extra: str, model: str = "mlp", workers: int = 3) -> str:
        r = self.cli(
            "distributed-training",
            "init",
            "--wallet",
            "my-agent-wallet",
            "--model-type",
            model,
            "--dataset-size",
            "100GB",
            "--target-workers",
            str(workers),
            *extra,
        )
        assert r.returncode == 0, r.stderr
        self.fund_owner()
        return re.search(r"Training ID: (training_\w+)", r.stdout).group(1)

    def start_run(self, run_id: str, *, workers: int, data: str = "digits", min_gpu: str = "RTX3090", **dist) -> None:
        """upload-data, discover-workers and distribute, as the owner types them."""
        r = self.cli("distributed-training", "upload-data", "--training-id", run_id, "--data-path", data)
        assert r.returncode == 0, r.stderr
        r = self.cli(
            "distributed-training",
            "discover-workers",
            "--training-id",
            run_id,
            "--min-gpu",
            min_gpu,
            "--required-workers",
            str(workers),
        )
        assert r.returncode == 0, r.stderr
        args = [f"--{k.replace('_', '-')}={v}" for k, v in dist.items()]
        r = self.cli(
            "distributed-training", "distribute", "--training-id", run_id, "--strategy", "data-parallel", *args
        )
        assert r.returncode == 0, r.stderr

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[name]
        os.killpg(p.pid, sig)
        p.wait(timeout=30)

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(AITBC), *args], capture_output=True, text=True, env=self.env, timeout=timeout)

    def api(self, path: str) -> dict:
        r = httpx.get(f"{self.url}/v1{path}", timeout=10)
        if r.status_code >= 500:  # a coordinator bug: fail here with its traceback, not on a missing key
            raise AssertionError(f"GET {path}: {r.status_code} {r.text}\ncoordinator log:\n{self.log('coordinator')}")
        return r.json()

    def wait_run(self, run_id: str, cond, timeout: float = 120, what: str = "condition") -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                run = self.api(f"/runs/{run_id}")
                if cond(run):
                    return run
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"run {run_id}: {what} not reached in {timeout} s; last: {json.dumps(run)[:2000]}")

    def finalized(self, run_id: str, timeout: float = 120) -> dict:
        """The run's payments once the coordinator has finalized them (every round settled,
        bonds returned, the rest of the escrow refunded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pay = self.api(f"/runs/{run_id}/payments")
            if pay["finalized"]:
                return pay
            time.sleep(0.2)
        raise AssertionError(f"payments of {run_id} not finalized: {pay}")

    def start_honest_and_skipper(self) -> list[str]:
        """Three honest workers (honest0 keeps its committed states on disk, not in memory)
        and ``skipper``, which skips half its steps; all four offers up. The honest names."""
        honest = [f"honest{i}" for i in range(3)]
        for name in honest:
            extra = ("--proof-memory-mb", "0") if name == "honest0" else ()
            self.start_worker(name, max_bond="5", funds="10", extra=extra)
        self.start_worker("skipper", max_bond="5", funds="10", cheat="skip-half")
        self.wait_offers(4)
        return honest

    def engine(self) -> Engine:
        """An engine on the coordinator's database, to read (or change) what it holds; the
        caller disposes of it."""
        return create_engine(self.db_url, poolclass=NullPool)

    def rows(self, sql: str, **params: Any) -> list[tuple]:
        """The rows ``sql`` selects from the coordinator's database, as tuples."""
        engine = self.engine()
        try:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.execute(text(sql), params).all()]
        finally:
            engine.dispose()

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)


@pytest.fixture
def stack(tmp_path, databases):
    url = databases.new(tmp_path / "coordinator")
    s = Stack(tmp_path, url)
    yield s
    s.close()
    databases.drop(url)
