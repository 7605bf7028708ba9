"""Scaled sign compression: ``sign``.

One bit a value (set for x < 0) and one float32 scale, the mean absolute value
``||x||_1 / d``; the update decodes to ``sign(x) * mean|x|`` (zeros decode as ``+scale``).
Sign compression is signSGD (Bernstein et al., "signSGD: Compressed Optimisation for
Non-Convex Problems", ICML 2018); the ``||x||_1 / d`` scale and the error feedback that
makes it converge are EF-signSGD (Karimireddy et al., "Error Feedback Fixes SignSGD and
other Gradient Compression Schemes", ICML 2019) -- pair this codec with ``ErrorFeedback``.

Payload: the float32 scale, then ``ceil(d / 8)`` bytes of sign bits (``numpy.packbits``,
first value in the most significant bit). Bits a value: ``1 + 32 / d``. A NaN or inf
anywhere makes the scale non-finite, so the whole update decodes non-finite and the
aggregator rejects it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from aitbc.core.compression._wire import Payload, read, read_f32, to_bytes
from aitbc.core.compression.base import CODECS, PlainCodec


@dataclass(kw_only=True, slots=True)
class SignConfig:
    pass


@CODECS.register("sign")
class Sign(PlainCodec):
    name = "sign"
    Config = SignConfig

    def _payload_size(self, numel: int, plan: None) -> int:
        return 4 + -(-numel // 8)

    def _compress(self, flat: Tensor, plan: None) -> bytes:
        # accumulate in float64: a long float32 sum would drift with d
        scale = flat.double().abs().mean().float() if flat.numel() else torch.tensor(0.0)
        return to_bytes(scale.reshape(1), "<f4") + np.packbits((flat < 0).numpy()).tobytes()

    def _decompress(self, payload: Payload, plan: None, numel: int) -> Tensor:
        scale, end = read_f32(payload, 0, 1)
        negative = np.unpackbits(read(payload, end, len(payload) - end, "u1")[0], count=numel)  # (d,)
        return (1.0 - 2.0 * torch.from_numpy(negative).to(torch.float32)) * scale
