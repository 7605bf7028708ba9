"""Dense codecs: every value is sent, at 32 or 16 bits.

- ``none``: float32 as it is, the uncompressed baseline (32 bits a value).
- ``fp16``: IEEE half precision (16 bits; relative error <= 2**-11 in the normal range).
- ``bf16``: bfloat16, fp32's exponent range with a 7-bit mantissa (relative error <= 2**-8).

The half-precision codecs round to nearest and *saturate* finite values that are out of
their range (fp16 overflows at 65504), so a large but finite update never turns into an
infinity; NaN and +-inf pass through unchanged, for the aggregator to reject.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from aitbc.core.compression._wire import Payload, read, read_f32, to_bytes
from aitbc.core.compression.base import CODECS, PlainCodec


@dataclass(kw_only=True, slots=True)
class NoneConfig:
    pass


@CODECS.register("none")
class NoCompression(PlainCodec):
    name = "none"
    Config = NoneConfig

    def _payload_size(self, numel: int, plan: None) -> int:
        return 4 * numel

    def _compress(self, flat: Tensor, plan: None) -> bytes:
        return to_bytes(flat, "<f4")

    def _decompress(self, payload: Payload, plan: None, numel: int) -> Tensor:
        return read_f32(payload, 0, numel)[0]

    def _decompress_pieces(self, payload: Payload, plan: None, numel: int, piece: int) -> Iterator[Tensor]:
        for lo in range(0, numel, piece):
            yield read_f32(payload, 4 * lo, min(piece, numel - lo))[0]


@dataclass(kw_only=True, slots=True)
class HalfConfig:
    pass


class _Half(PlainCodec):
    """16 bits a value; ``dtype`` is the half type, sent as its raw little-endian bits."""

    dtype: ClassVar[torch.dtype]
    Config = HalfConfig

    def _payload_size(self, numel: int, plan: None) -> int:
        return 2 * numel

    def _compress(self, flat: Tensor, plan: None) -> bytes:
        top = torch.finfo(self.dtype).max
        flat = torch.where(flat.isfinite(), flat.clamp(-top, top), flat)  # saturate, keep nan/inf
        return to_bytes(flat.to(self.dtype).view(torch.int16), "<i2")

    def _decompress(self, payload: Payload, plan: None, numel: int) -> Tensor:
        return self._values(payload, 0, numel)

    def _decompress_pieces(self, payload: Payload, plan: None, numel: int, piece: int) -> Iterator[Tensor]:
        for lo in range(0, numel, piece):
            yield self._values(payload, lo, min(piece, numel - lo))

    def _values(self, payload: Payload, lo: int, count: int) -> Tensor:
        raw = read(payload, 2 * lo, count, "<i2")[0].astype("=i2", copy=False)
        return torch.from_numpy(raw).view(self.dtype).to(torch.float32)


@CODECS.register("fp16")
class Float16(_Half):
    name = "fp16"
    dtype = torch.float16


@CODECS.register("bf16")
class BFloat16(_Half):
    name = "bf16"
    dtype = torch.bfloat16
