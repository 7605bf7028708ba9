"""Low-rank compression per weight matrix: ``powersgd``.

Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization" (NeurIPS 2019), Algorithm 1 with one power iteration. Each
parameter with two or more dimensions is viewed as a matrix ``M`` (m, n) = (first dim,
the rest), and sent as two rank-``r`` factors::

    P = orthonormalise(M Q)     (m, r)   Q from this codec's previous call (warm start),
    Q = M^T P                   (n, r)   else seeded Gaussian -- deterministic
    M ~ P Q^T                   decoded

so a matrix of rank <= r comes back exactly (up to float32 rounding). A parameter is sent
dense (float32) when it is 1-D (biases, norms) or when the factors would not be smaller
(``r (m + n) >= m n``, which includes ``r >= min(m, n)``). The paper runs it with error
feedback: wrap it in ``ErrorFeedback``, one codec per worker (the warm start is per codec).

The codec needs the model's parameter *layout* -- the shapes, in flat order -- given as
``build_codec("powersgd", {...}, layout=[tuple(p.shape) for p in model.parameters()])``.
Without a layout, a tensor with >= 2 dims is taken as one matrix, and a flat tensor is a
``UsageError`` (it would silently not be compressed at all). The layout is written into
the header's ``meta``, so decoding needs nothing else.

Payload: per parameter in layout order, ``P`` then ``Q`` (row-major float32), or the
dense values. Bits a value for one matrix: ``32 r (m + n) / (m n)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from aitbc.core.compression._wire import Payload, read_f32, to_bytes
from aitbc.core.compression.base import CODECS, Codec, Layout
from aitbc.errors import UsageError
from aitbc.json_value import JSONObject


@dataclass(kw_only=True, slots=True)
class PowerSGDConfig:
    rank: int = 4
    seed: int = 0
    warm_start: bool = True

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"rank must be a positive integer, got {self.rank}")


@dataclass(frozen=True, slots=True)
class PowerSGDPlan:
    layout: tuple[tuple[int, ...], ...]  # the parameter shapes the update covers, in flat order


def _read_layout(meta: JSONObject, numel: int) -> tuple[tuple[int, ...], ...]:
    raw = meta["layout"]
    shapes = [s for s in raw if isinstance(s, list)] if isinstance(raw, list) else []
    if not isinstance(raw, list) or len(shapes) != len(raw):
        raise ValueError("layout is not a list of shapes")
    layout = tuple(tuple(v for v in s if type(v) is int and v >= 0) for s in shapes)
    if any(len(dims) != len(s) for dims, s in zip(layout, shapes, strict=True)):
        raise ValueError("layout dimensions must be non-negative integers")
    total = sum(math.prod(s) for s in layout)
    if total != numel:
        raise ValueError(f"layout covers {total} values, header shape has {numel}")
    return layout


@CODECS.register("powersgd")
class PowerSGD(Codec[PowerSGDPlan]):
    name = "powersgd"
    Config = PowerSGDConfig

    def __init__(self, cfg: PowerSGDConfig, *, layout: Layout | None = None) -> None:
        super().__init__(cfg, layout=layout)
        self._warm: dict[int, Tensor] = {}  # parameter index -> last Q (n, r)

    def _matrix(self, shape: tuple[int, ...]) -> tuple[int, int] | None:
        """(m, n) if this parameter is sent as factors, None if dense."""
        if len(shape) < 2:
            return None
        m, n = shape[0], math.prod(shape[1:])
        return (m, n) if self.cfg.rank * (m + n) < m * n else None

    def _plan(self, shape: tuple[int, ...]) -> PowerSGDPlan:
        if self.layout is None:
            if len(shape) < 2:
                raise UsageError(
                    "codec 'powersgd' needs the model's parameter layout to compress a flat update: "
                    "build_codec('powersgd', ..., layout=[tuple(p.shape) for p in model.parameters()])"
                )
            layout: tuple[tuple[int, ...], ...] = (shape,)
        else:
            layout = self.layout
        total, numel = sum(math.prod(s) for s in layout), math.prod(shape)
        if total != numel:
            raise UsageError(f"codec 'powersgd' layout covers {total} values but the update has {numel}")
        return PowerSGDPlan(layout=layout)

    def _plan_json(self, plan: PowerSGDPlan) -> JSONObject:
        return {"layout": [list(s) for s in plan.layout]}

    def _read_plan(self, meta: JSONObject, numel: int) -> PowerSGDPlan:
        return PowerSGDPlan(layout=_read_layout(meta, numel))

    def _payload_size(self, numel: int, plan: PowerSGDPlan) -> int:
        r = self.cfg.rank
        sizes = (r * sum(mn) if (mn := self._matrix(s)) else math.prod(s) for s in plan.layout)
        return 4 * sum(sizes)

    def _start(self, i: int, n: int) -> Tensor:
        """The (n, r) matrix the power iteration starts from."""
        q = self._warm.get(i) if self.cfg.warm_start else None
        if q is not None and q.shape == (n, self.cfg.rank) and q.isfinite().all() and (q.abs().sum(0) > 0).all():
            return q
        g = torch.Generator().manual_seed((self.cfg.seed * 1_000_003 + i) % 2**63)
        return torch.randn(n, self.cfg.rank, generator=g)

    def _compress(self, flat: Tensor, plan: PowerSGDPlan) -> bytes:
        parts, offset = [], 0
        for i, shape in enumerate(plan.layout):
            size = math.prod(shape)
            seg = flat[offset : offset + size]
            offset += size
            if (mn := self._matrix(shape)) is None:
                parts.append(seg)
                continue
            mat = seg.view(mn)  # (m, n)
            p = torch.linalg.qr(mat @ self._start(i, mn[1])).Q  # (m, r), orthonormal columns
            q = mat.T @ p  # (n, r)
            if self.cfg.warm_start:
                self._warm[i] = q
            parts += [p.reshape(-1), q.reshape(-1)]
        return to_bytes(torch.cat(parts) if parts else flat[:0], "<f4")

    def _decompress(self, payload: Payload, plan: PowerSGDPlan, numel: int) -> Tensor:
        r, parts, offset = self.cfg.rank, [], 0
        for shape in plan.layout:
            if (mn := self._matrix(shape)) is None:
                seg, offset = read_f32(payload, offset, math.prod(shape))
                parts.append(seg)
                continue
            m, n = mn
            p, offset = read_f32(payload, offset, m * r)
            q, offset = read_f32(payload, offset, n * r)
            parts.append((p.view(m, r) @ q.view(n, r).T).reshape(-1))  # (m, r) @ (r, n) -> (m*n,)
        return torch.cat(parts) if parts else torch.zeros(0)
