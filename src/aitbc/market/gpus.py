"""GPU classes: canonical names, a score per class, and what this machine really has.

A *GPU class* is a canonical key such as ``RTX3090`` or ``H200``: upper case, letters
and digits only, vendor words dropped. Offers, ``--min-gpu`` and the worker's own
detection all go through ``normalize_gpu`` so that ``"rtx 3090"``, ``"RTX-3090"``,
``"GeForce RTX 3090"`` and ``torch.cuda.get_device_name()``'s
``"NVIDIA GeForce RTX 3090"`` are one class.

Scores are in ``[0, 1]``: 1.0 is the top of the scale, not a claim of parity (an H100
trains faster than an RTX 4090; both are "as good as the ranking cares about"). The four
consumer values are fixed by the design; the others are placed by their dense
FP16/BF16 tensor throughput and memory as published in NVIDIA's data sheets, checked
against the order of Lambda Labs' public PyTorch training benchmarks. Unknown GPUs get
``UNKNOWN_GPU_SCORE``, neither rewarded nor shut out.
"""

from __future__ import annotations

import os
import platform
import re
from typing import Any

from aitbc.errors import UsageError

GPU_SCORES: dict[str, float] = {
    # Data centre.
    "H200": 1.0,
    "H100": 1.0,
    "A100": 0.95,
    "L40S": 0.95,
    "L40": 0.9,
    "A6000": 0.85,  # RTX A6000: GA102 like the RTX 3090, with 48 GB
    "A40": 0.8,  # GA102, passively cooled, lower clocks than the A6000
    "V100": 0.7,
    "A10": 0.6,  # also AWS's A10G
    "L4": 0.45,
    "T4": 0.35,
    # Consumer; RTX4090, RTX3090, RTX3080 and RTX3070 are fixed by the design.
    "RTX4090": 1.0,
    "RTX4080": 0.9,
    "RTX3090": 0.85,
    "RTX3080": 0.75,
    "RTX4070": 0.7,
    "RTX3070": 0.65,
    "RTX3060": 0.45,
    # Not CUDA.
    "MPS": 0.3,  # Apple-silicon GPU through Metal (torch "mps")
    "CPU": 0.1,
}

UNKNOWN_GPU_SCORE = 0.5

# Other spellings of a known class, after the vendor words are dropped and the tokens joined.
_ALIASES: dict[str, str] = {
    "RTXA6000": "A6000",
    "A10G": "A10",
}

# Words that name the vendor or product line, not the class: "NVIDIA GeForce RTX 3090",
# "Tesla T4", "Quadro RTX 8000".
_VENDOR_WORDS = frozenset({"NVIDIA", "GEFORCE", "TESLA", "QUADRO"})

_TOKEN = re.compile(r"[A-Z0-9]+")


def _lookup(key: str) -> str | None:
    key = _ALIASES.get(key, key)
    return key if key in GPU_SCORES else None


def normalize_gpu(name: str) -> str:
    """The canonical key of a GPU name.

    The name is split into letter/digit words (case, spaces and dashes do not matter) and
    the leading vendor words are dropped. The longest run of leading words that spells a
    known class wins, so memory and form-factor suffixes fall away:
    ``"NVIDIA A100-SXM4-80GB"`` -> ``"A100"``, ``"Tesla V100-SXM2-16GB"`` -> ``"V100"``.
    A name of no known class comes back as its words joined in upper case
    (``"GeForce GTX 1080"`` -> ``"GTX1080"``).
    """
    words = _TOKEN.findall(name.upper())
    start = 0
    while start < len(words) and words[start] in _VENDOR_WORDS:
        start += 1
    if start == len(words):  # only vendor words (or nothing): keep them rather than return ""
        start = 0
    words = words[start:]
    for end in range(len(words), 0, -1):
        known = _lookup("".join(words[:end]))
        if known is not None:
            return known
    return "".join(words)


def gpu_score(name: str) -> float:
    """The class's score in ``[0, 1]``, or ``UNKNOWN_GPU_SCORE`` for a class not in the table."""
    return GPU_SCORES.get(normalize_gpu(name), UNKNOWN_GPU_SCORE)


def known_gpu_classes() -> list[str]:
    """The known classes, strongest first (ties by name)."""
    return sorted(GPU_SCORES, key=lambda k: (-GPU_SCORES[k], k))


def check_gpu_class(name: str) -> str:
    """Check a ``--min-gpu`` value: it must be a known class. Returns its canonical key."""
    key = normalize_gpu(name)
    if key not in GPU_SCORES:
        raise UsageError(f"unknown GPU class {name!r}; known: {', '.join(known_gpu_classes())}")
    return key


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX, or the name is unsupported
        return None


def detect_device(train_on: list[Any] | None = None) -> dict[str, Any]:
    """What this worker really has, for its offer.

    ``{"device": "cuda" | "mps" | "cpu", "name": str, "memory_bytes": int | None,
    "gpu_class": str}``. On CUDA the name is the training GPU's (device 0 by default) and
    the class its canonical key (unknown cards keep their own key); ``mps`` is class
    ``MPS``, the CPU class ``CPU``. ``memory_bytes`` is the GPU's memory on CUDA, the
    recommended Metal working set on ``mps`` where torch reports it, and physical RAM on CPU.

    ``train_on``: the torch devices the worker trains on, one per data-parallel rank
    (:func:`aitbc.training.devices.resolve_devices`); the offer then describes those (a
    worker told ``--device cpu`` on a GPU machine offers the CPU) and adds
    ``"train_device"`` (rank 0's, e.g. ``"cuda:0"``) and ``"processes"`` (the ranks).
    """
    import torch  # lazily: the marketplace logic itself does not need torch

    extra: dict[str, Any] = {}
    index: int | None = 0 if torch.cuda.is_available() else None
    if train_on:
        first = torch.device(train_on[0])
        index = (first.index or 0) if first.type == "cuda" else None
        extra = {"train_device": str(first) if first.type != "cuda" else f"cuda:{index}", "processes": len(train_on)}

    memory: int | None
    if index is not None:
        name = torch.cuda.get_device_name(index)
        memory = int(torch.cuda.get_device_properties(index).total_memory)
        return {"device": "cuda", "name": name, "memory_bytes": memory, "gpu_class": normalize_gpu(name), **extra}

    cpu_name = platform.processor() or "cpu"
    mps = getattr(torch.backends, "mps", None)
    if not train_on and mps is not None and mps.is_available():
        recommended = getattr(getattr(torch, "mps", None), "recommended_max_memory", None)
        memory = int(recommended()) if recommended is not None else None
        return {"device": "mps", "name": cpu_name, "memory_bytes": memory, "gpu_class": "MPS"}

    return {"device": "cpu", "name": cpu_name, "memory_bytes": _physical_memory(), "gpu_class": "CPU", **extra}
