"""Shared fixtures: the real console script, run as a subprocess on a temp home."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# pytest-xdist runs one process per core; one torch thread each avoids oversubscription.
torch.set_num_threads(1)

AITBC = Path(sys.executable).parent / "aitbc"


@pytest.fixture
def aitbc(tmp_path):
    """Run ``aitbc ARGS`` as a real process with its own ``--home``-style env; return
    the CompletedProcess (text mode unless ``binary=True``)."""

    home = tmp_path / "home"

    def run(*args: str, binary: bool = False, input: bytes | str | None = None, timeout: float = 300):
        env = dict(os.environ, AITBC_HOME=str(home), OMP_NUM_THREADS="1", COLUMNS="200")
        return subprocess.run(
            [str(AITBC), *args], capture_output=True, text=not binary, input=input, env=env, timeout=timeout
        )

    run.home = home
    return run
