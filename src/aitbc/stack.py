"""The local stack: one coordinator and N workers as background processes under one HOME.

    HOME/stack.json          {"coordinator": url, "processes": [...], "started_at": t}
    HOME/stack.port          the coordinator's last port, kept after down: the next up takes it
                             again when free, so the URLs runs were started at keep working
    HOME/pids/<name>.pid     one pid per process
    HOME/logs/<name>.log     its stdout and stderr
    HOME/coordinator/        the coordinator's database and blobs
    HOME/workers/wK/         worker K's wallet (provider-K) and blob cache
    HOME/chain.json          ``up --chain evm``: the contracts on the stack's dev node
                             (:mod:`aitbc.stack_chain`; the node is a process of the stack)

:func:`up` starts the processes in their own sessions (they outlive the command that
started them) and returns once the coordinator answers and every worker's offer is live.
:func:`down` stops exactly the processes ``up`` recorded, and their descendants: a pid is
signalled only while it still names the process we started (same start time and command
line, read through psutil), never one that reused the pid. No typer here; ``cli/stack.py``
is the command line over these functions.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from aitbc import stack_chain, stack_procs
from aitbc.client import CoordinatorClient, Unreachable
from aitbc.errors import AitbcError, UsageError
from aitbc.json_value import JSONObject
from aitbc.ledger.wallet import ensure_wallet

# What the workers advertise, cycled: varied classes and prices so the marketplace has
# something to rank.
WORKER_OFFERS: tuple[tuple[str, str], ...] = (
    ("RTX4090", "1.60"),
    ("RTX3090", "1.20"),
    ("A100", "2.50"),
    ("RTX3080", "0.90"),
    ("RTX3070", "0.70"),
    ("RTX4080", "1.40"),
    ("V100", "0.80"),
    ("T4", "0.40"),
)
AVAILABILITIES: tuple[float, ...] = (0.99, 0.97, 0.95)
STACK_MAX_BOND = "10"  # AIT a local worker lets a contract lock (its wallet must hold it: aitbc wallet fund)
MAX_WORKERS = 64
COORDINATOR_FORCE_AFTER = 1.5  # s: then a second signal ends the coordinator's wait for long polls
# s: how far a pid's start time (psutil's, on the wall clock) may be from the recorded one and
# still name our process. A reused pid also needs our exact command line (it names HOME).
START_TIME_SLACK = 1.0


class StackError(AitbcError):
    """The local stack could not be started, found or stopped."""


@dataclass(kw_only=True)
class StackConfig:
    home: Path
    workers: int = 3
    port: int | None = None  # None: a free port found at start
    host: str = "127.0.0.1"
    # s without a heartbeat before the coordinator fails a worker; None: the coordinator's
    # own setting (AITBC_LEASE_SECONDS, else its default)
    lease: float | None = None
    ready_timeout: float = 60.0  # s to wait for the coordinator and every offer
    tls: bool = False  # serve HTTPS with a local CA's certificate (HOME/tls, see aitbc.tls)
    chain: str = "local"  # evm: a dev node of the stack's own holds the money (aitbc.stack_chain)

    def __post_init__(self) -> None:
        if self.chain not in stack_chain.CHAINS:
            raise UsageError(f"--chain must be one of {', '.join(stack_chain.CHAINS)}, got {self.chain!r}")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise UsageError(f"--workers must be in 1..{MAX_WORKERS}, got {self.workers}")
        if self.port is not None and not 1 <= self.port <= 65535:
            raise UsageError(f"--port must be in 1..65535, got {self.port}")
        if self.lease is None:
            from aitbc.coordinator.config import Settings  # pydantic-settings: only for `up`
            from aitbc.settings import load_settings

            self.lease = load_settings(Settings, {"home": self.home / "coordinator"}).lease_seconds
        if self.lease <= 0:
            raise UsageError(f"--lease must be > 0 s, got {self.lease:g}")
        if self.ready_timeout <= 0:
            raise UsageError(f"--timeout must be > 0 s, got {self.ready_timeout:g}")

    @property
    def heartbeat(self) -> float:
        # Several heartbeats per lease, so one late beat never fails a worker.
        from aitbc.settings import load_settings
        from aitbc.worker.config import WorkerSettings

        assert self.lease is not None  # resolved at construction
        return min(load_settings(WorkerSettings, {}).heartbeat_seconds, self.lease / 4)


@dataclass(kw_only=True)
class Proc:
    """One process of the stack, as ``up`` recorded it."""

    name: str  # anvil, coordinator, worker-1, ...
    role: str  # chain | coordinator | worker
    pid: int
    log: str
    cmd: list[str]
    start_time: float  # psutil's create_time() of ``pid``: tells our process from a reused pid
    address: str | None = None  # a worker's wallet address (its id in the marketplace)
    wallet: str | None = None  # a worker's wallet name (provider-K, under HOME/workers/wK)
    gpu: str | None = None
    price: str | None = None
    availability: float | None = None


@dataclass(kw_only=True)
class Stack:
    home: Path
    coordinator: str
    processes: list[Proc]
    started_at: float
    ca_cert: str | None = None  # the local CA clients trust (aitbc up --tls)
    chain: str = "local"  # evm: HOME/chain.json names the contracts on the stack's node
    _popen: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> JSONObject:
        return {
            "coordinator": self.coordinator,
            "started_at": self.started_at,
            **({"ca_cert": self.ca_cert} if self.ca_cert else {}),
            "chain": self.chain,
            "processes": [asdict(p) for p in self.processes],
        }

    @property
    def workers(self) -> list[Proc]:
        return [p for p in self.processes if p.role == "worker"]


# --- files ---------------------------------------------------------------------------


def stack_file(home: Path) -> Path:
    return home / "stack.json"


def _port_file(home: Path) -> Path:
    return home / "stack.port"


def _last_port(home: Path) -> int | None:
    try:
        port = int(_port_file(home).read_text())
    except (OSError, ValueError):
        return None
    return port if 1 <= port <= 65535 else None


def _pid_file(home: Path, name: str) -> Path:
    return home / "pids" / f"{name}.pid"


def load(home: Path) -> Stack | None:
    """The stack recorded in HOME (running or not), or None."""
    path = stack_file(home)
    try:
        raw = json.loads(path.read_text())
        return Stack(
            home=home,
            coordinator=raw["coordinator"],
            started_at=float(raw["started_at"]),
            ca_cert=raw.get("ca_cert"),
            chain=str(raw.get("chain", "local")),
            processes=[Proc(**{**p, "start_time": float(p["start_time"])}) for p in raw["processes"]],
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StackError(
            f"{path} is unreadable ({type(e).__name__}: {e}); stop its processes by hand and remove it"
        ) from None


def _write(stack: Stack) -> None:
    (stack.home / "pids").mkdir(parents=True, exist_ok=True)
    for p in stack.processes:
        _pid_file(stack.home, p.name).write_text(f"{p.pid}\n")
    tmp = stack_file(stack.home).with_suffix(".json.part")
    tmp.write_text(json.dumps(stack.to_json(), indent=2) + "\n")
    tmp.replace(stack_file(stack.home))


def _forget(stack: Stack) -> None:
    for p in stack.processes:
        _pid_file(stack.home, p.name).unlink(missing_ok=True)
    stack_file(stack.home).unlink(missing_ok=True)


def provider_address(home: Path, name: str) -> str | None:
    """The address of the local stack's provider ``name`` (``provider-K``, or its process
    ``worker-K``): its wallet lives under the worker's own home, not HOME/wallets, so
    ``aitbc wallet send OWNER provider-1 5`` finds it here. None if HOME's stack has none."""
    stack = load(home)
    for p in stack.workers if stack is not None else []:
        wallet = p.wallet or p.name.replace("worker-", "provider-")  # a stack.json from before `wallet`
        if name in (wallet, p.name):
            return p.address
    return None


def provider_names(home: Path) -> list[str]:
    """The local stack's provider wallets, for a message naming what exists."""
    stack = load(home)
    return [p.wallet or p.name.replace("worker-", "provider-") for p in stack.workers] if stack is not None else []


# --- processes -------------------------------------------------------------------------


def _process(p: Proc) -> psutil.Process | None:
    """The live process ``up`` started as ``p``, or None: gone, a zombie, or its pid now
    names another process (another start time or command line)."""
    try:
        proc = psutil.Process(p.pid)
        if abs(proc.create_time() - p.start_time) > START_TIME_SLACK:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE or proc.cmdline() != p.cmd:
            return None
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):  # gone, not ours to read, or no pid
        return None
    return proc


def is_ours(p: Proc) -> bool:
    """``p.pid`` is alive and still the process ``up`` started (not a reused pid)."""
    return _process(p) is not None


def alive(stack: Stack) -> list[Proc]:
    return [p for p in stack.processes if is_ours(p)]


def running(home: Path) -> Stack | None:
    """The stack of HOME if any of its processes is still running."""
    stack = load(home)
    return stack if stack is not None and alive(stack) else None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_free(host: str, port: int) -> bool:
    """No socket listens on ``port``. With SO_REUSEADDR, as uvicorn binds: the connections a
    stopped coordinator left in TIME_WAIT do not keep its port from the next ``up``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # several torch processes on a few cores
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop("AITBC_COORDINATOR", None)  # every child is told its coordinator explicitly
    return env


def _spawn(stack: Stack, *, name: str, role: str, args: list[str], env: dict[str, str], **extra: Any) -> Proc:
    log = stack.home / "logs" / f"{name}.log"
    cmd = [sys.executable, "-m", "aitbc", *args]
    with log.open("ab") as f:
        f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
        f.flush()
        popen = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=stack.home,
            start_new_session=True,
        )
    try:
        start_time = psutil.Process(popen.pid).create_time()
    except psutil.NoSuchProcess:  # already gone (and reaped): never ours again
        start_time = 0.0
    p = Proc(name=name, role=role, pid=popen.pid, log=str(log), cmd=cmd, start_time=start_time, **extra)
    stack._popen[p.pid] = popen
    stack.processes.append(p)
    return p


# --- up --------------------------------------------------------------------------------


def up(cfg: StackConfig, *, on_start: Callable[[str], None] | None = None) -> Stack:
    """Start the coordinator and ``cfg.workers`` workers; return once all are ready.
    ``on_start(url)`` is called once the checks pass, just before the processes start.
    On any failure what was started is stopped again and :class:`StackError` says which
    log to read."""
    home = cfg.home
    port = _claim(cfg)
    stack_chain.check_database(home, cfg.chain)
    for d in ("logs", "pids", "coordinator", "workers"):
        (home / d).mkdir(parents=True, exist_ok=True)
    _port_file(home).write_text(f"{port}\n")
    tls = _tls(cfg)
    url = f"{'https' if cfg.tls else 'http'}://{cfg.host}:{port}"
    if on_start is not None:
        on_start(url)
    stack = Stack(
        home=home, coordinator=url, processes=[], started_at=time.time(), ca_cert=tls.ca_cert, chain=cfg.chain
    )
    env = _child_env()
    try:
        chain_args = _start_chain(stack) if cfg.chain == "evm" else []
        _spawn_coordinator(stack, cfg, port, tls, env, chain_args)
        for k in range(1, cfg.workers + 1):
            _spawn_worker(stack, cfg, k, env)
        _write(stack)
        _wait_ready(stack, cfg.ready_timeout)
    except BaseException:
        stop(stack)
        raise
    return stack


def _claim(cfg: StackConfig) -> int:
    """The coordinator's port, once no stack of ``cfg.home`` runs (one that died without
    ``down`` is forgotten) and the port is free: ``--port``, else the last one when free."""
    home = cfg.home
    previous = load(home)
    if previous is not None:
        live = alive(previous)
        if live:
            raise StackError(
                f"a stack from {home} is already running (coordinator {previous.coordinator}, "
                f"{len(live)} process{'es' if len(live) != 1 else ''}); stop it first: aitbc down --home {home}"
            )
        _forget(previous)  # a stack that died without `down`
    if cfg.port is None:
        last = _last_port(home)
        return last if last is not None and _port_free(cfg.host, last) else free_port(cfg.host)
    port = cfg.port
    if not _port_free(cfg.host, port):
        raise StackError(
            f"port {port} on {cfg.host} is in use; pick another with --port, or leave it out for a free one"
        )
    return port


@dataclass(frozen=True, slots=True)
class _Tls:
    """``up --tls``: the coordinator's certificate flags and the CA the workers trust."""

    serve_args: list[str]
    ca_cert: str | None


def _tls(cfg: StackConfig) -> _Tls:
    if not cfg.tls:
        return _Tls([], None)
    from aitbc.tls import local_tls  # cryptography's x509: only for `up --tls`

    # a local CA (kept across restarts) and a new server certificate for this host
    certs = local_tls(cfg.home / "tls", [cfg.host])
    return _Tls(["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)], str(certs.ca_cert))


def _start_chain(stack: Stack) -> list[str]:
    """``up --chain evm``: the dev node, recorded first (so a failure after stops it), and
    the contracts deployed on it; the coordinator's flags to settle there."""
    chain = stack_chain.start_chain(stack.home)
    node = chain.node
    try:
        proc = psutil.Process(node.pid)
        cmd, start_time = proc.cmdline(), proc.create_time()
    except psutil.Error:  # gone already: recorded so its log is named, never ours again
        cmd, start_time = [], 0.0
    p = Proc(
        name=stack_chain.NODE_NAME, role="chain", pid=node.pid, log=str(node.log_path), cmd=cmd, start_time=start_time
    )
    stack._popen[p.pid] = node.process
    stack.processes.append(p)
    _write(stack)
    return chain.coordinator_args


def _deployment(stack: Stack) -> Any:
    from aitbc.chain.evm.deploy import read_deployment

    return read_deployment(stack.home)


def _spawn_coordinator(
    stack: Stack, cfg: StackConfig, port: int, tls: _Tls, env: dict[str, str], chain_args: list[str]
) -> None:
    args = ["coordinator", "serve", "--home", str(cfg.home / "coordinator"), "--host", cfg.host, "--port", str(port)]
    _spawn(
        stack,
        name="coordinator",
        role="coordinator",
        env=env,
        args=[*args, "--lease", f"{cfg.lease:g}", *tls.serve_args, *chain_args],
    )


def _spawn_worker(stack: Stack, cfg: StackConfig, k: int, env: dict[str, str]) -> None:
    """Worker ``k`` (from 1), with the ``k``-th offer of the built-in list."""
    gpu, price = WORKER_OFFERS[(k - 1) % len(WORKER_OFFERS)]
    availability = AVAILABILITIES[(k - 1) % len(AVAILABILITIES)]
    whome = cfg.home / "workers" / f"w{k}"
    wallet = ensure_wallet(whome, f"provider-{k}")  # made here, so we know the offer to wait for
    if stack.chain == "evm":  # its bonds are posted on chain: gas and AIT before it starts
        stack_chain.fund_worker(stack.home, _deployment(stack), whome, wallet.name)
    offer = ["--wallet", wallet.name, "--gpu", gpu, "--price", price, "--availability", f"{availability:g}"]
    _spawn(
        stack,
        name=f"worker-{k}",
        role="worker",
        env=env,
        address=wallet.address,
        wallet=wallet.name,
        gpu=gpu,
        price=price,
        availability=availability,
        args=[
            *("worker", "start", "--coordinator", stack.coordinator, "--home", str(whome)),
            *offer,
            *("--heartbeat", f"{cfg.heartbeat:g}", "--max-bond", STACK_MAX_BOND),
            *(["--ca-cert", stack.ca_cert] if stack.ca_cert else []),
        ],
    )


def _wait_ready(stack: Stack, timeout: float) -> None:
    """Until the coordinator answers and every worker has been heard from by it.

    An offer counts once its last heartbeat is later than the coordinator's clock at the
    first health answer: a coordinator restarted on an old database lists its known
    workers as live for one lease without having heard from them (they may not run)."""
    deadline = time.monotonic() + timeout
    wanted = {p.address: p for p in stack.workers}
    coordinator = next(p for p in stack.processes if p.role == "coordinator")
    since: float | None = None  # the coordinator's clock when it first answered
    heard: set[str | None] = set()
    with CoordinatorClient(stack.coordinator, timeout=2.0, ca_cert=stack.ca_cert) as c:
        while True:
            for p in stack.processes:
                code = stack._popen[p.pid].poll()
                if code is not None:
                    raise StackError(
                        f"{p.name} exited with status {code} while starting{_last_line(p.log)}; read {p.log}"
                    )
            try:
                if since is None:
                    health = c.get("/health")
                    if health.get("status") == "ok":
                        since = float(health["time"])
                if since is not None:
                    heard = {o["worker_id"] for o in c.get("/market/offers")["data"] if o["last_heartbeat"] > since}
                    if wanted.keys() <= heard:
                        return
            except Unreachable:
                pass
            if time.monotonic() > deadline:
                if since is None:
                    raise StackError(
                        f"the coordinator did not answer {stack.coordinator}/v1/health within {timeout:g} s; "
                        f"read {coordinator.log}"
                    )
                missing = [p for a, p in wanted.items() if a not in heard]
                raise StackError(
                    f"{len(missing)} worker{'s' if len(missing) != 1 else ''} did not appear in the marketplace "
                    f"within {timeout:g} s; read {', '.join(p.log for p in missing)}"
                )
            time.sleep(0.1)


def _last_line(log: str) -> str:
    try:
        lines = [ln for ln in Path(log).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return f" ({lines[-1].strip()})" if lines else ""


# --- down ------------------------------------------------------------------------------


def stop(stack: Stack, *, grace: float = 10.0) -> dict[str, str]:
    """Stop the stack's processes and their descendants: SIGTERM, up to ``grace`` seconds,
    then SIGKILL. Returns what happened to each (``stopped``: on its own; ``forced``: the
    coordinator needed a second signal, which skips its clean shutdown; ``killed``; ``not
    running``) and forgets the stack."""
    outcome: dict[str, str] = {}
    ours: dict[str, psutil.Process] = {}
    for p in stack.processes:
        proc = _process(p)
        if proc is None:
            outcome[p.name] = "not running"
        else:
            ours[p.name] = proc
    # The chain's node last: it writes the chain's state as it exits, after the coordinator's last transaction
    nodes = {p.name: ours.pop(p.name) for p in stack.processes if p.role == "chain" and p.name in ours}
    t0 = time.monotonic()
    procs = stack_procs.send(stack_procs.with_descendants(ours.values()), signal.SIGTERM)
    procs = stack_procs.wait_ended(procs, min(COORDINATOR_FORCE_AFTER, grace))
    coordinator = [proc for p in stack.processes if p.role == "coordinator" and (proc := ours.get(p.name)) in procs]
    if coordinator:
        # uvicorn waits for open requests (the coordinator ends its long polls at once, an
        # upload may take longer). A second signal (its "CTRL+C to force quit") ends that wait.
        stack_procs.send(coordinator, signal.SIGINT)
        outcome.update((name, "forced") for name, proc in ours.items() if proc in coordinator)
    procs = stack_procs.wait_ended(procs, max(0.0, grace - (time.monotonic() - t0)))
    if procs:
        procs = stack_procs.send(
            stack_procs.with_descendants(procs), signal.SIGKILL
        )  # and whatever they started meanwhile
        outcome.update((name, "killed") for name, proc in ours.items() if proc in procs)
        stack_procs.wait_ended(procs, 5.0)
    outcome.update(_stop_nodes(nodes, grace))
    for popen in stack._popen.values():  # collect the exit status of our own children
        if popen.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=1.0)
    _forget(stack)
    return {p.name: outcome.get(p.name, "stopped") for p in stack.processes}


def _stop_nodes(nodes: dict[str, psutil.Process], grace: float) -> dict[str, str]:
    """SIGTERM (anvil dumps its state on it), SIGKILL after ``grace`` s: the names killed."""
    left = stack_procs.wait_ended(stack_procs.send(list(nodes.values()), signal.SIGTERM), grace)
    if left:
        stack_procs.wait_ended(stack_procs.send(left, signal.SIGKILL), 5.0)
    return {name: "killed" for name, proc in nodes.items() if proc in left}


def down(home: Path, *, grace: float = 10.0) -> tuple[Stack, dict[str, str]] | None:
    """Stop HOME's stack; None if HOME has none recorded."""
    stack = load(home)
    if stack is None:
        return None
    return stack, stop(stack, grace=grace)
