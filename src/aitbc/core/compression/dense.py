"""Dense codecs: ``none`` sends float32 values as they are (the uncompressed baseline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aitbc.core.compression import CODECS, Codec


@dataclass(kw_only=True, slots=True)
class NoneConfig:
    pass


@CODECS.register("none")
class NoCompression(Codec):
    name = "none"
    Config = NoneConfig

    def _compress(self, flat: Tensor) -> tuple[bytes, dict[str, Any]]:
        return flat.numpy().astype("<f4", copy=False).tobytes(), {}

    def _decompress(self, payload: bytes, meta: dict[str, Any], numel: int) -> Tensor:
        if len(payload) != 4 * numel:
            raise ValueError(f"expected {4 * numel} payload bytes, got {len(payload)}")
        return torch.from_numpy(np.frombuffer(payload, dtype="<f4").copy())
