"""How large a model a provider's device can train, in parameters: the ``max_params`` of
its offer, and the one place its formula lives.

A worker trains with AdamW and keeps, per parameter, in float32:

==============================  =====  ==========================================
weights                         4 B
gradients                       4 B
Adam's two moments              8 B
the round's start model         4 B    the pseudo-gradient is ``start - end``
bf16 only: autocast's cast      2 B    a bfloat16 copy of each weight per step
==============================  =====  ==========================================

so 20 bytes a parameter at ``fp32`` and 22 at ``bf16`` (autocast keeps float32 master
weights, gradients and optimizer state: bf16 saves activations, not state). A quarter of
the device's memory is left for activations, the CUDA context and the allocator's slack::

    max_params = floor(memory_bytes * 3/4 / bytes_per_param(precision))

An offer is made before any run's precision is known, so it states the least over the
precisions a run may ask for (:func:`offer_max_params`). An H100 (80 GB) offers about 2.9
billion parameters, an RTX 4090 (24 GB) about 880 million. The operator of a worker may
state another number (``aitbc worker start --max-params``); the worker refuses a job whose
model counts more, whatever the coordinator hired it for.
"""

from __future__ import annotations

from collections.abc import Iterable

from aitbc.run_defaults import PRECISIONS

BYTES_PER_PARAM = {"fp32": 20, "bf16": 22}
# The share of a device's memory the training state may take; the rest is for activations,
# the CUDA context and the allocator's slack.
STATE_SHARE_NUM, STATE_SHARE_DEN = 3, 4
# The most an offer may state: a bound on what a provider sends (a petabyte of state).
MAX_OFFER_PARAMS = 10**15 // 20


def trainable_params(memory_bytes: int, precision: str) -> int:
    """Parameters a device of ``memory_bytes`` can train at ``precision`` (module docstring)."""
    if precision not in BYTES_PER_PARAM:
        raise ValueError(f"precision must be one of {', '.join(BYTES_PER_PARAM)}, got {precision!r}")
    if memory_bytes < 0:
        raise ValueError(f"memory_bytes must be >= 0, got {memory_bytes}")
    return memory_bytes * STATE_SHARE_NUM // (STATE_SHARE_DEN * BYTES_PER_PARAM[precision])


def offer_max_params(memory_bytes: int | None, *, override: int | None = None, sharing: int = 1) -> int | None:
    """What an offer states it can train: ``override`` (the operator's ``--max-params``) if
    given, else the least :func:`trainable_params` over every precision a run may ask for,
    of the memory's share of each of the ``sharing`` processes that hold a copy of the model
    in it (data-parallel ranks on one CPU's RAM; one per GPU otherwise); None where the
    device's memory is unknown (the offer then states no limit)."""
    if override is not None:
        return override
    if memory_bytes is None:
        return None
    if sharing < 1:
        raise ValueError(f"sharing must be >= 1, got {sharing}")
    return min(trainable_params(memory_bytes // sharing, p) for p in PRECISIONS)


def too_small(max_params: int | None, params: int | None) -> bool:
    """Whether an offer stating ``max_params`` cannot take a model of ``params``. Unknown on
    either side is no reason to refuse: an offer of no stated limit (a device whose memory
    torch does not report, a worker older than the field) takes any run, and refuses itself
    a job it cannot build; a run whose model is not counted (``module:callable`` code,
    counted only once imported) fits any offer."""
    return max_params is not None and params is not None and params > max_params


def count_too_small(limits: Iterable[int | None], params: int | None) -> int:
    """How many of ``limits`` (offers' ``max_params``) are :func:`too_small` for ``params``."""
    return sum(too_small(m, params) for m in limits)


def format_params(n: int | None) -> str:
    """A parameter count for a table: ``2.9B``, ``880M``, ``12k``, ``950``; ``any`` for None
    (no stated limit)."""
    if n is None:
        return "any"
    for size, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "k")):
        if n >= size:
            return f"{n / size:.3g}{suffix}"
    return str(n)
