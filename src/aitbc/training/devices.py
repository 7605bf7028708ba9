"""Where a worker trains: ``--device`` and ``--gpus`` checked against what this machine has.

``auto`` is ``cuda:0`` where torch sees a CUDA GPU and the CPU otherwise (an Apple GPU is
reported in the offer but not trained on: the CPU path is the tested one). ``cuda`` is
``cuda:0``. With ``gpus`` N > 1 the worker trains one process per rank, rank ``r`` on
``cuda:r`` (N must not exceed the GPUs torch sees), or, with ``--device cpu``, N CPU
processes (the gloo backend: how data parallelism is tested on a machine without a GPU).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from aitbc.errors import UsageError
from aitbc.run_defaults import PRECISIONS  # a run's inner-step arithmetic: float32, or bfloat16 autocast

if TYPE_CHECKING:  # torch is imported where a device is resolved: a bad flag is refused without it (1 s)
    import torch

_SPEC = re.compile(r"^(auto|cpu|cuda)(?::(\d{1,4}))?$")


def check_device_spec(spec: str) -> str:
    """The spelling of ``--device`` alone (no hardware looked at): ``auto``, ``cpu``,
    ``cuda`` or ``cuda:N``. Returns it lower-cased."""
    s = spec.strip().lower()
    m = _SPEC.match(s)
    if m is None or (m.group(2) is not None and m.group(1) != "cuda"):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N (N a GPU index), got {spec!r}")
    return s


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def resolve_devices(spec: str, gpus: int = 1) -> list[torch.device]:
    """The device of each rank (``gpus`` of them) for ``spec`` on this machine; a
    ``UsageError`` naming what is missing when the machine does not have it."""
    import torch

    s = check_device_spec(spec)
    if gpus < 1:
        raise UsageError(f"--gpus must be >= 1, got {gpus}")
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if s == "auto":
        s = "cuda" if have else "cpu"
    if s == "cpu":
        return [torch.device("cpu")] * gpus
    if have == 0:
        raise UsageError(f"--device {spec}: this machine has no CUDA GPU torch can use (give --device cpu or auto)")
    if ":" in s:
        index = int(s.split(":")[1])
        if gpus > 1:
            raise UsageError(
                f"--device {spec} with --gpus {gpus}: several GPUs are cuda:0..cuda:{gpus - 1}; give --device cuda"
            )
        if index >= have:
            raise UsageError(f"--device {spec}: no such GPU; this machine has cuda:0..cuda:{have - 1}")
        return [torch.device("cuda", index)]
    if gpus > have:
        raise UsageError(f"--gpus {gpus}: this machine has {have} CUDA GPU{'s' if have != 1 else ''}")
    return [torch.device("cuda", r) for r in range(gpus)]
