"""Running simulations from benchmark programs: one temp store per run, quiet, in-process."""

from __future__ import annotations

import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from aitbc.sim.config import SimConfig
from aitbc.sim.runner import SimResult, run_simulation


def simulate(**options: Any) -> SimResult:
    with tempfile.TemporaryDirectory() as tmp:
        return run_simulation(SimConfig(**options), home=Path(tmp) / "home", out_dir=Path(tmp) / "run")


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
