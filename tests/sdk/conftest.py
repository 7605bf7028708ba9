"""A real local stack for the SDK's tests: ``aitbc up`` as a subprocess, ``aitbc down`` after."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

AITBC = Path(sys.executable).parent / "aitbc"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_stack(
    home: Path, *, workers: int, lease: float | None = None
) -> Iterator[tuple[Path, dict[str, str], dict[str, Any]]]:
    """``(home, env, stack.json)`` of a coordinator and ``workers`` workers on loopback;
    ``env`` points the SDK and the examples at it (AITBC_HOME)."""
    env = {k: v for k, v in os.environ.items() if k != "AITBC_COORDINATOR"}
    env.update(AITBC_HOME=str(home), OMP_NUM_THREADS="1", COLUMNS="200")
    cmd = [str(AITBC), "up", "--workers", str(workers), "--home", str(home), "--port", str(free_port())]
    if lease is not None:
        cmd += ["--lease", f"{lease:g}"]
    try:
        up = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
        yield home, env, json.loads((home / "stack.json").read_text())
    finally:
        subprocess.run([str(AITBC), "down", "--home", str(home)], capture_output=True, env=env, timeout=60)


@pytest.fixture(scope="session")
def start_stack():
    """:func:`local_stack`, for module-scoped fixtures (test modules cannot import a conftest)."""
    return local_stack
