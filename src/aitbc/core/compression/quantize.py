"""Chunked absmax quantization: ``int8`` and ``int4``.

The flat update is cut into chunks of ``chunk_size`` values (the last one may be short);
each chunk keeps one float32 scale ``absmax / L`` and every value is rounded to the
nearest integer ``q`` in ``[-L, L]`` of that scale, so ``|x - q * scale| <= scale / 2``.
``L = 127`` for ``int8`` (one byte a value), ``L = 7`` for ``int4`` (two values a byte,
stored as ``q + 8`` in a nibble, the first value in the low nibble).

Block-wise scales are the idea of Dettmers et al., "8-bit Optimizers via Block-wise
Quantization" (ICLR 2022): one outlier only costs precision inside its own chunk. The
per-block rounding here is linear absmax (as in Dettmers et al., "LLM.int8()", 2022), not
the dynamic tree code of the optimizer paper.

Payload: ``c`` float32 scales (``c = ceil(d / chunk_size)``), then the codes.
Bits a value: ``8 + 32 / chunk_size`` (int8, default 1024: 8.03), ``4 + 32 / chunk_size``
(int4, default 128: 4.25). A chunk holding NaN or +-inf gets a NaN scale, so it decodes to
NaN and the aggregator rejects the update instead of the codec hiding it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from aitbc.core.compression._wire import Payload, chunk_view, expand_chunks, n_chunks, read, read_f32, to_bytes
from aitbc.core.compression.base import CODECS, PlainCodec


def quantize_chunks(flat: Tensor, chunk: int, levels: int) -> tuple[Tensor, Tensor]:
    """``flat`` (d,) -> (scales (c,) float32, codes (d,) int8 in [-levels, levels])."""
    d = flat.numel()
    chunks = chunk_view(flat, chunk)  # (c, w)
    absmax = chunks.abs().amax(dim=1)  # (c,), NaN propagates
    finite = absmax.isfinite()
    scale = torch.where(finite, absmax / levels, torch.nan)  # (c,)
    # x / absmax * L rather than x / scale: the codes stay right even where absmax / L underflows
    safe = torch.where(finite & (absmax > 0), absmax, 1.0)[:, None]  # (c, 1)
    q = torch.round(chunks / safe * levels).nan_to_num(0.0, 0.0, 0.0).clamp_(-levels, levels)
    return scale, q.to(torch.int8).reshape(-1)[:d]  # (c, w) -> (d,)


def dequantize_chunks(scale: Tensor, q: Tensor, chunk: int) -> Tensor:
    """(scales (c,), codes (d,)) -> values (d,) float32."""
    return q.to(torch.float32) * expand_chunks(scale, q.numel(), chunk)


@dataclass(kw_only=True, slots=True)
class Int8Config:
    chunk_size: int = 1024

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {self.chunk_size}")


@dataclass(kw_only=True, slots=True)
class Int4Config:
    chunk_size: int = 128

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {self.chunk_size}")


class _Chunked(PlainCodec):
    levels: ClassVar[int]

    @abstractmethod
    def _code_bytes(self, numel: int) -> int: ...

    def _payload_size(self, numel: int, plan: None) -> int:
        return 4 * n_chunks(numel, self.cfg.chunk_size) + self._code_bytes(numel)

    def _compress(self, flat: Tensor, plan: None) -> bytes:
        scale, q = quantize_chunks(flat, self.cfg.chunk_size, self.levels)
        return to_bytes(scale, "<f4") + self._pack(q.numpy())

    def _decompress(self, payload: Payload, plan: None, numel: int) -> Tensor:
        scale, end = read_f32(payload, 0, n_chunks(numel, self.cfg.chunk_size))
        q = self._unpack(read(payload, end, self._code_bytes(numel), "u1")[0], numel)
        if np.abs(q.astype(np.int16)).max(initial=0) > self.levels:
            raise ValueError(f"{self.name} code outside [-{self.levels}, {self.levels}]")
        return dequantize_chunks(scale, torch.from_numpy(q), self.cfg.chunk_size)

    def _decompress_pieces(self, payload: Payload, plan: None, numel: int, piece: int) -> Iterator[Tensor]:
        # Pieces start on a chunk boundary and an even value (int4 packs two a byte), so each
        # decodes from its own scales and code bytes with the same arithmetic as the whole.
        chunk = self.cfg.chunk_size
        step = max(1, -(-piece // (2 * chunk))) * 2 * chunk
        c = n_chunks(numel, chunk)
        codes_at = 4 * c
        for lo in range(0, numel, step):
            hi = min(lo + step, numel)
            scale, _ = read_f32(payload, 4 * (lo // chunk), n_chunks(hi, chunk) - lo // chunk)
            raw, _ = read(payload, codes_at + self._code_bytes(lo), self._code_bytes(hi) - self._code_bytes(lo), "u1")
            q = self._unpack(raw, hi - lo)
            if np.abs(q.astype(np.int16)).max(initial=0) > self.levels:
                raise ValueError(f"{self.name} code outside [-{self.levels}, {self.levels}]")
            yield dequantize_chunks(scale, torch.from_numpy(q), chunk)

    @abstractmethod
    def _pack(self, q: np.ndarray) -> bytes: ...

    @abstractmethod
    def _unpack(self, raw: np.ndarray, numel: int) -> np.ndarray: ...


@CODECS.register("int8")
class Int8(_Chunked):
    name = "int8"
    Config = Int8Config
    levels = 127

    def _code_bytes(self, numel: int) -> int:
        return numel

    def _pack(self, q: np.ndarray) -> bytes:
        return q.tobytes()

    def _unpack(self, raw: np.ndarray, numel: int) -> np.ndarray:
        return raw.view(np.int8)


@CODECS.register("int4")
class Int4(_Chunked):
    name = "int4"
    Config = Int4Config
    levels = 7

    def _code_bytes(self, numel: int) -> int:
        return -(-numel // 2)

    def _pack(self, q: np.ndarray) -> bytes:
        u = (q.astype(np.int16) + 8).astype(np.uint8)  # [-7, 7] -> [1, 15]
        if u.size % 2:
            u = np.append(u, np.uint8(8))
        return (u[0::2] | (u[1::2] << 4)).astype(np.uint8).tobytes()

    def _unpack(self, raw: np.ndarray, numel: int) -> np.ndarray:
        u = np.stack([raw & 0xF, raw >> 4], axis=1).reshape(-1)[:numel]  # (bytes, 2) -> (d,)
        return u.astype(np.int8) - 8  # a 0 nibble gives -8: out of range, rejected
