"""A local EVM development node: Foundry's ``anvil``, started and stopped by us.

``anvil`` comes from the npm registry (``@foundry-rs/anvil-linux-amd64`` ships the binary;
``make anvil`` installs it under ``.tools/``), so nothing is downloaded at run time. It
listens on 127.0.0.1 on a port the kernel picks (``--port 0``): no free-port guess can be
taken by another process between the guess and the bind. The port is read from the
process's own listening socket, then the node counts as up once its JSON-RPC answers
``eth_chainId``. Its funded development accounts (``--config-out``) are kept for tests
and for ``aitbc up --chain evm``.

Stop sends SIGTERM, then SIGKILL after ``grace`` seconds, and reaps the process: nothing
is left running. A node started with ``state`` keeps its chain in that file: anvil loads it
at start and writes it when it exits on SIGTERM or SIGINT (never on SIGKILL), so a node
stopped and started again is the same chain, its blocks and their hashes included.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from aitbc.chain.evm.rpc import JsonRpc, NodeUnreachable, RpcError
from aitbc.errors import AitbcError

ANVIL_PACKAGE = "@foundry-rs/anvil-linux-amd64"
# Where `make anvil` installs it, relative to a source checkout (src/aitbc/chain/evm/node.py).
CHECKOUT_ANVIL = Path(__file__).resolve().parents[4] / ".tools" / "node_modules" / ".bin" / "anvil"
DEV_CHAIN_ID = 31337  # anvil's default, what wallets and tools expect of a local node


@dataclass(frozen=True, slots=True)
class DevAccount:
    """One of the node's prefunded development accounts (known keys: never on a real chain)."""

    address: str
    private_key: str


@dataclass(slots=True)
class AnvilNode:
    """A running anvil: its URL, process and prefunded accounts. ``stop`` (or ``with``) ends it."""

    process: subprocess.Popen[bytes]
    url: str
    port: int
    chain_id: int
    log_path: Path
    accounts: list[DevAccount] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, grace: float = 10.0) -> None:
        """End the node (SIGTERM, SIGKILL after ``grace`` s) and reap it; idempotent."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> AnvilNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def find_anvil(explicit: Path | None = None) -> Path:
    """The anvil binary: ``explicit``, else ``anvil`` on PATH, else the checkout's ``.tools``."""
    if explicit is not None:
        if not explicit.is_file():
            raise AitbcError(f"no anvil binary at {explicit}")
        return explicit
    on_path = shutil.which("anvil")
    if on_path is not None:
        return Path(on_path)
    if CHECKOUT_ANVIL.exists():
        return CHECKOUT_ANVIL.resolve()
    raise AitbcError(
        f"anvil (the local EVM node) is not installed: run make anvil "
        f"(npm install {ANVIL_PACKAGE} into .tools/), or put anvil on PATH"
    )


def start_anvil(
    workdir: Path,
    *,
    binary: Path | None = None,
    port: int = 0,
    chain_id: int = DEV_CHAIN_ID,
    accounts: int = 10,
    timeout: float = 60.0,
    state: Path | None = None,
) -> AnvilNode:
    """Start anvil on 127.0.0.1 (``port`` 0: one the kernel picks), its log and account list
    under ``workdir``; return once its JSON-RPC answers, or raise ``AitbcError`` with the
    end of its log (the process then stopped). ``state``: the file the chain is loaded from
    (when it exists) and written to at exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path, config_path = workdir / "anvil.log", workdir / "anvil-accounts.json"
    config_path.unlink(missing_ok=True)
    command = [str(find_anvil(binary)), "--host", "127.0.0.1", "--port", str(port), "--chain-id", str(chain_id)]
    command += ["--accounts", str(accounts), "--config-out", str(config_path), "--silent"]
    if state is not None:
        state.parent.mkdir(parents=True, exist_ok=True)
        command += ["--state", str(state)]
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    node = AnvilNode(process=process, url="", port=0, chain_id=chain_id, log_path=log_path)
    try:
        node.port = _wait_listening(node, port, timeout)
        node.url = f"http://127.0.0.1:{node.port}"
        _wait_answering(node, timeout)
        node.accounts = _dev_accounts(config_path)
    except BaseException:
        node.stop(grace=2.0)
        raise
    return node


def _failed(node: AnvilNode, why: str) -> AitbcError:
    tail = ""
    with contextlib.suppress(OSError):
        lines = node.log_path.read_text(errors="replace").strip().splitlines()
        tail = f"; its log ({node.log_path}) ends: {' | '.join(lines[-3:])}" if lines else ""
    return AitbcError(f"anvil {why}{tail}")


def _wait_listening(node: AnvilNode, port: int, timeout: float) -> int:
    """The TCP port the process listens on, once it does."""
    deadline = time.monotonic() + timeout
    proc = psutil.Process(node.pid)
    while True:
        code = node.process.poll()
        if code is not None:
            raise _failed(node, f"exited with status {code} before listening")
        with contextlib.suppress(psutil.Error):
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr and (port == 0 or conn.laddr.port == port):
                    return int(conn.laddr.port)
        if time.monotonic() > deadline:
            raise _failed(node, f"did not listen within {timeout:g} s")
        time.sleep(0.02)


def _wait_answering(node: AnvilNode, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with JsonRpc(node.url, timeout=5.0) as rpc:
        while True:
            try:
                answered = int(rpc.call("eth_chainId"), 16)
            except (NodeUnreachable, RpcError):
                answered = None
            if answered == node.chain_id:
                return
            if answered is not None:
                raise _failed(node, f"answers chain id {answered}, not {node.chain_id}")
            if node.process.poll() is not None:
                raise _failed(node, f"exited with status {node.process.returncode}")
            if time.monotonic() > deadline:
                raise _failed(node, f"did not answer JSON-RPC at {node.url} within {timeout:g} s")
            time.sleep(0.02)


def _dev_accounts(config_path: Path) -> list[DevAccount]:
    try:
        config = json.loads(config_path.read_text())
        pairs = zip(config["available_accounts"], config["private_keys"])
        return [DevAccount(address=str(a), private_key=str(k)) for a, k in pairs]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise AitbcError(f"anvil's account list {config_path} is unreadable: {e}") from None
