"""Top-k sparsification: ``topk`` and ``topk-int8``.

Keeps the ``k = max(1, round(ratio * d))`` entries of largest magnitude (``torch.topk`` on
``|x|``) and zeros the rest, as in Lin et al., "Deep Gradient Compression" (ICLR 2018),
which pairs it with error feedback (local gradient accumulation; see ``feedback.py``).
``topk`` sends the kept values as float32; ``topk-int8`` sends them as int8 with one
float32 absmax scale (error <= scale / 2, scale = max kept |x| / 127).

Indices are sent sorted, in Elias-Fano form (Elias 1974; Fano 1971), the compact code
for a sorted set of k integers below d: each index is split into ``l = floor(log2(d/k))``
low bits, stored verbatim, and a high part, stored in unary as one set bit at position
``(index >> l) + i`` of a ``k + (d >> l)``-bit vector. That is
``k * (l + 1) + (d >> l) <= k * (2 + log2(d / k))`` bits in all, within ~0.6 bits an
index of the information-theoretic bound, and -- unlike delta codes in the smallest width
that fits the largest gap -- it does not depend on the data, so the stated size is exact.
For d = 10**6 and ratio 0.01 that is 8.6 bits an index (int64 would be 64, a fixed
ceil(log2 d) width 20). Encode and decode are vectorised (``packbits`` / ``flatnonzero``).

Payload: values (``topk``: k float32; ``topk-int8``: one float32 scale, then k int8),
then the index bits packed MSB-first into bytes. ``meta`` holds ``k``.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from aitbc.core.compression._wire import Payload, bits_to_int, int_to_bits, meta_int, read, read_f32, to_bytes
from aitbc.core.compression.base import CODECS, Codec
from aitbc.core.compression.quantize import dequantize_chunks, quantize_chunks
from aitbc.json_value import JSONObject


def topk_count(d: int, ratio: float) -> int:
    """How many entries a top-k codec keeps of ``d``: ``round(ratio * d)``, at least one."""
    return min(d, max(1, int(ratio * d + 0.5))) if d else 0


def _low_bits(d: int, k: int) -> int:
    return (d // k).bit_length() - 1 if k else 0  # floor(log2(d / k)) for 1 <= k <= d


def index_bits(d: int, k: int) -> int:
    """Bits of the Elias-Fano code for k sorted distinct indices below d."""
    low = _low_bits(d, k)
    return k * (low + 1) + (d >> low) if k else 0


def encode_indices(idx: np.ndarray, d: int) -> bytes:
    """Sorted distinct indices (k,) below ``d`` -> Elias-Fano bytes."""
    k = idx.size
    if k == 0:
        return b""
    low = _low_bits(d, k)
    high = np.zeros(k + (d >> low), dtype=np.uint8)  # unary high parts
    high[(idx >> low) + np.arange(k)] = 1
    return np.packbits(np.concatenate([int_to_bits(idx & ((1 << low) - 1), low), high])).tobytes()


def decode_indices(raw: np.ndarray, d: int, k: int) -> np.ndarray:
    """Elias-Fano bytes -> sorted indices (k,) int64; ``ValueError`` unless they are
    k strictly increasing indices below d."""
    low = _low_bits(d, k)
    bits = np.unpackbits(raw, count=index_bits(d, k))
    pos = np.flatnonzero(bits[k * low :])  # (k,) positions of the high parts' set bits
    if pos.size != k:
        raise ValueError(f"index code has {pos.size} high bits set, expected k={k}")
    idx = ((pos - np.arange(k)) << low) | bits_to_int(bits[: k * low], k, low)
    if k and (idx[-1] >= d or (np.diff(idx) <= 0).any()):
        raise ValueError(f"indices are not strictly increasing below d={d}")
    return idx


@dataclass(kw_only=True, slots=True)
class TopKConfig:
    ratio: float = 0.01

    def __post_init__(self) -> None:
        if not 0 < self.ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio}")


@dataclass(frozen=True, slots=True)
class TopKPlan:
    k: int  # values kept


class _TopK(Codec[TopKPlan]):
    Config = TopKConfig

    def _plan(self, shape: tuple[int, ...]) -> TopKPlan:
        return TopKPlan(k=topk_count(math.prod(shape), self.cfg.ratio))

    def _plan_json(self, plan: TopKPlan) -> JSONObject:
        return {"k": plan.k}

    def _read_plan(self, meta: JSONObject, numel: int) -> TopKPlan:
        return TopKPlan(k=meta_int(meta, "k", 0, numel))

    def _payload_size(self, numel: int, plan: TopKPlan) -> int:
        return self._values_size(plan.k) + -(-index_bits(numel, plan.k) // 8)

    def _compress(self, flat: Tensor, plan: TopKPlan) -> bytes:
        k = plan.k
        idx = torch.topk(flat.abs(), k, sorted=False).indices.sort().values  # (k,) ascending
        return self._pack_values(flat[idx]) + encode_indices(idx.numpy(), flat.numel())

    def _decompress(self, payload: Payload, plan: TopKPlan, numel: int) -> Tensor:
        k = plan.k
        values, end = self._unpack_values(payload, k)
        idx = decode_indices(read(payload, end, len(payload) - end, "u1")[0], numel, k)
        out = torch.zeros(numel)
        out[torch.from_numpy(idx)] = values
        return out

    @abstractmethod
    def _values_size(self, k: int) -> int: ...

    @abstractmethod
    def _pack_values(self, values: Tensor) -> bytes: ...

    @abstractmethod
    def _unpack_values(self, payload: Payload, k: int) -> tuple[Tensor, int]: ...


@CODECS.register("topk")
class TopK(_TopK):
    name = "topk"

    def _values_size(self, k: int) -> int:
        return 4 * k

    def _pack_values(self, values: Tensor) -> bytes:
        return to_bytes(values, "<f4")

    def _unpack_values(self, payload: Payload, k: int) -> tuple[Tensor, int]:
        return read_f32(payload, 0, k)


@CODECS.register("topk-int8")
class TopKInt8(_TopK):
    name = "topk-int8"

    def _values_size(self, k: int) -> int:
        return (4 if k else 0) + k  # one scale, k codes

    def _pack_values(self, values: Tensor) -> bytes:
        scale, q = quantize_chunks(values, max(1, values.numel()), 127)  # one chunk
        return to_bytes(scale, "<f4") + q.numpy().tobytes()

    def _unpack_values(self, payload: Payload, k: int) -> tuple[Tensor, int]:
        scale, end = read_f32(payload, 0, 1 if k else 0)
        q, end = read(payload, end, k, "i1")
        if (q == -128).any():
            raise ValueError("topk-int8 code outside [-127, 127]")
        return dequantize_chunks(scale, torch.from_numpy(q), max(1, k)), end
