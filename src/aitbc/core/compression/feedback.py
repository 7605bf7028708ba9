"""Error feedback: what a codec drops this round is sent in a later one.

One ``ErrorFeedback`` per worker keeps that worker's residual ``e`` (flat, float32)::

    corrected = x + e
    blob      = codec.encode(corrected)
    e         = corrected - decode(blob)      # exactly what the receiver did not get

so after T rounds ``sum(decoded) == sum(x) - e_T``: nothing is lost, only delayed. This
is the local gradient accumulation of Lin et al., "Deep Gradient Compression" (ICLR
2018) for top-k, the error feedback of Karimireddy et al., "Error Feedback Fixes SignSGD
and other Gradient Compression Schemes" (ICML 2019) for scaled sign, and the error
feedback PowerSGD (Vogels et al., NeurIPS 2019) runs with. Blobs are the wrapped codec's
own, so the plain module-level ``decode`` reads them.

Decayed error feedback (``decay`` = beta < 1) is SparseLoCo's outer momentum (Sarfi et
al., "Communication-Efficient LLM Pre-training with SparseLoCo", 2025)::

    corrected = x + beta * e                  # e <- beta * e + x, the accumulator
    blob      = codec.encode(corrected)
    e         = corrected - decode(blob)

The residual is then a momentum buffer: what was sent leaves it, what was not decays by
beta a round, and a coordinate that keeps its sign grows until it is sent. It replaces the
outer optimizer's momentum, so a run with a decay takes plain outer SGD (``fedavg``);
:func:`check_outer` says so. ``decay=None`` is plain error feedback (beta = 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from aitbc.core.compression.base import MAX_NUMEL, Codec, flat_f32
from aitbc.errors import UsageError


def check_decay(decay: float | None) -> None:
    """``ValueError`` unless ``decay`` is None (plain error feedback) or in [0, 1)."""
    if decay is not None and not 0 <= decay < 1:
        raise ValueError(f"error_feedback_decay must be in [0, 1), got {decay}")


def check_outer(codec: object, outer: str) -> None:
    """``UsageError`` if ``codec`` runs decayed error feedback (the outer momentum) under an
    outer optimizer other than ``fedavg``, which would add a second momentum on top."""
    if isinstance(codec, ErrorFeedback) and codec.decay is not None and outer != "fedavg":
        raise UsageError(
            f"error_feedback_decay={codec.decay:g} is the outer momentum (SparseLoCo): "
            f"use outer 'fedavg' (plain outer SGD), not {outer!r}"
        )


class ErrorFeedback:
    """``codec`` with a per-worker residual; ``encode(x) -> bytes`` like a codec.
    ``decay``: beta of decayed error feedback (None: plain, beta = 1)."""

    def __init__(self, codec: Codec, *, decay: float | None = None) -> None:
        check_decay(decay)
        self.codec = codec
        self.decay = decay
        self.residual: Tensor | None = None  # (d,) float32, None before the first update

    @property
    def name(self) -> str:
        return self.codec.name

    def encode(self, x: Tensor) -> bytes:
        flat = flat_f32(x, self.name)  # (d,)
        if self.residual is None:
            self.residual = torch.zeros_like(flat)
        if self.residual.numel() != flat.numel():
            raise UsageError(
                f"error feedback holds a residual of {self.residual.numel()} values, "
                f"this update has {flat.numel()}; use one ErrorFeedback per worker and model"
            )
        corrected = flat + (self.residual if self.decay is None else self.decay * self.residual)  # (d,)
        blob = self.codec._encode_flat(corrected, tuple(x.shape), str(x.dtype).removeprefix("torch."))
        # decoded in the update's dtype, as the receiver sees it
        self.residual = corrected - self.codec.decode(blob, max_numel=flat.numel()).reshape(-1).to(torch.float32)
        return blob

    def decode(self, blob: bytes, *, max_numel: int = MAX_NUMEL) -> Tensor:
        return self.codec.decode(blob, max_numel=max_numel)

    def expected_bytes(self, shape: int | Sequence[int]) -> int:
        return self.codec.expected_bytes(shape)

    def bits_per_value(self, shape: int | Sequence[int]) -> float:
        return self.codec.bits_per_value(shape)

    def reset(self) -> None:
        """Forget the residual (e.g. when the worker leaves the run)."""
        self.residual = None
