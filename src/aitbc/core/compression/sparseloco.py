"""Chunk-wise top-k with low-bit values: ``sparseloco``.

The compressor of SparseLoCo (Sarfi et al., "Communication-Efficient LLM Pre-training
with SparseLoCo", 2025): the flat update ``(d,)`` is cut into chunks of ``chunk`` values
(the last may be shorter); each chunk keeps its ``k = round(density * width)`` entries of
largest magnitude (at least one), and each kept value is sent in ``bits`` bits. Top-k per
chunk rather than over the whole vector spreads the kept entries over every parameter, and
makes each chunk's index set small enough to code in ~``log2(width / k) + 2`` bits.

Pair it with decayed error feedback (``error_feedback_decay=0.95``, see ``feedback.py``):
SparseLoCo's accumulator ``e <- beta * e + delta`` is the outer momentum, the server
applies the mean of the decoded updates with plain outer SGD (``fedavg``, lr 1).

Values: sign-and-magnitude codes. The top bit is the sign; the other ``bits - 1`` bits pick
one of ``L = 2**(bits-1)`` magnitudes spaced evenly from the chunk's smallest kept
magnitude ``lo`` to its largest ``hi`` (rounded to the nearest). A chunk sends ``lo`` and
``hi`` as float32. With ``bits=1`` there is one magnitude, the mean kept magnitude (scaled
sign, as EF-signSGD), and one float32 a chunk. Kept entries are the top tail of their
chunk, so ``[lo, hi]`` is where they are; the rounding error goes to error feedback.

Indices: the chunk-wise selection, sorted, is one sorted set of ``K = sum(k)`` indices
below ``d``, sent as one Elias-Fano code (``sparse.py``): ``K * (l + 1) + (d >> l)`` bits,
``l = floor(log2(d / K))``, i.e. ~``log2(chunk / k) + 2`` bits an index (2% density:
~7.6 bits, where a position within a 4096 chunk stated verbatim is 12). The decoder
rejects any index set that is not exactly ``k`` strictly increasing indices in each chunk.

Payload (``meta`` is empty: every size follows from ``d`` and the parameters)::

    scales   c * s float32   (s = 2: lo, hi per chunk; s = 1 with bits=1: mean)
    codes    K * bits bits, MSB-first, padded to a byte
    indices  Elias-Fano, padded to a byte

Robust aggregation of sparse updates. Each update is nonzero on about ``density`` of the
coordinates, and different workers' top-k sets mostly differ, so a rule sees, per
coordinate, a few values among zeros:

- ``mean``: keeps every sent value, divided by n (support up to n x density); what one
  worker sent alone moves the model 1/n as far, and its error feedback keeps the rest;
- ``median``: the coordinate-wise median of mostly zeros is zero: only coordinates more
  than half the workers chose move; the aggregate is nearly empty and training stalls;
- ``trimmed-mean`` (beta): a value sent by at most ``floor(beta n)`` workers is an
  extreme of its coordinate and is trimmed away: nearly empty as well;
- ``multi-krum``, ``centered-clip``: judge whole updates (distances, or clipped
  differences from the medoid update), so they keep sparse updates whole and train
  (under a sign-flip attack on digits only ``multi-krum`` still trained, short of the
  dense loss).

So coordinate-wise rules are unfit for sparse updates; ``sparse-robust``
(``aitbc.core.aggregation.sparse``) is the rule for them, the simulator's default with
this codec.
``bench/communication.py`` measures each, with and without attackers.

Untrusted blobs: the base class checks the payload length against ``d`` and the
parameters before anything is allocated; this module refuses non-finite or negative
scales, ``lo > hi``, and index sets that break the chunk structure (``ValueError``, which
the base class reports as an ``IntegrityError`` of one line).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from aitbc.core.compression._wire import Payload, bits_to_int, int_to_bits, read, read_f32, to_bytes
from aitbc.core.compression.base import CODECS, PlainCodec
from aitbc.core.compression.sparse import decode_indices, encode_indices, index_bits

MAX_CHUNK = 1 << 24
MAX_BITS = 8


@dataclass(kw_only=True, slots=True)
class SparseLoCoConfig:
    chunk: int = 4096  # values a chunk
    density: float = 0.02  # share of each chunk kept
    bits: int = 2  # bits a kept value: 1 sign bit + (bits - 1) magnitude bits

    def __post_init__(self) -> None:
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or not 1 <= self.chunk <= MAX_CHUNK:
            raise ValueError(f"chunk must be an integer in [1, {MAX_CHUNK}], got {self.chunk!r}")
        if not 0 < self.density <= 1:
            raise ValueError(f"density must be in (0, 1], got {self.density}")
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 1 <= self.bits <= MAX_BITS:
            raise ValueError(f"bits must be an integer in [1, {MAX_BITS}], got {self.bits!r}")


def chunk_plan(d: int, chunk: int, density: float) -> tuple[int, int, int, int]:
    """``(full, k, tail, k_tail)``: ``full`` chunks of ``chunk`` values keeping ``k`` each,
    then one chunk of ``tail`` values (0: none) keeping ``k_tail``."""
    full, tail = divmod(d, chunk)
    return full, _keep(chunk, density), tail, _keep(tail, density)


def _keep(width: int, density: float) -> int:
    return min(width, max(1, int(density * width + 0.5))) if width else 0


@CODECS.register("sparseloco")
class SparseLoCo(PlainCodec):
    name = "sparseloco"
    Config = SparseLoCoConfig

    def _scales_per_chunk(self) -> int:
        return 1 if self.cfg.bits == 1 else 2

    def _payload_size(self, numel: int, plan: None) -> int:
        full, k, tail, k_tail = chunk_plan(numel, self.cfg.chunk, self.cfg.density)
        chunks, kept = full + (tail > 0), full * k + k_tail
        return 4 * self._scales_per_chunk() * chunks + -(-kept * self.cfg.bits // 8) + -(-index_bits(numel, kept) // 8)

    def _compress(self, flat: Tensor, plan: None) -> bytes:
        d, w = flat.numel(), self.cfg.chunk
        full, k, tail, k_tail = chunk_plan(d, w, self.cfg.density)
        idx = []  # global indices, ascending: chunk by chunk, sorted within each
        if full:
            rows = flat[: full * w].view(full, w)  # (c, w)
            top = torch.topk(rows.abs(), k, dim=1, sorted=False).indices.sort(dim=1).values  # (c, k)
            idx.append((top + torch.arange(full).unsqueeze(1) * w).reshape(-1))  # (c, k) -> (c*k,)
        if tail:
            top = torch.topk(flat[full * w :].abs(), k_tail, sorted=False).indices.sort().values  # (k_tail,)
            idx.append(top + full * w)
        index = torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long)  # (K,)
        values = flat[index]  # (K,)
        finite = bool(torch.isfinite(values).all())  # a NaN/inf sends NaN scales: the receiver rejects it
        chunk_of = index // w  # (K,) which chunk each kept value is in
        chunks = full + (tail > 0)
        mag = values.abs()
        codes = (values < 0).to(torch.int64) << (self.cfg.bits - 1)  # (K,) sign in the top bit
        if self.cfg.bits == 1:
            total = torch.zeros(chunks, dtype=torch.float64).index_add_(0, chunk_of, mag.double())
            count = torch.bincount(chunk_of, minlength=chunks).clamp(min=1)
            scales = (total / count).float()  # (c,) mean kept magnitude
        else:
            lo = torch.full((chunks,), torch.inf).scatter_reduce(0, chunk_of, mag, "amin")  # (c,)
            hi = torch.zeros(chunks).scatter_reduce(0, chunk_of, mag, "amax")  # (c,)
            levels = (1 << (self.cfg.bits - 1)) - 1
            span = (hi - lo)[chunk_of]  # (K,)
            step = torch.where(span > 0, span / levels, torch.ones_like(span))
            m = ((mag - lo[chunk_of]) / step).round().clamp(0, levels)  # NaN stays NaN: scale check below
            codes |= torch.nan_to_num(m, nan=0.0).to(torch.int64)
            scales = torch.stack([lo, hi], dim=1).reshape(-1)  # (c, 2) -> (2c,)
        if not finite:
            scales = torch.full_like(scales, torch.nan)
        return (
            to_bytes(scales, "<f4")
            + np.packbits(int_to_bits(codes.numpy(), self.cfg.bits)).tobytes()
            + encode_indices(index.numpy(), d)
        )

    def _decompress(self, payload: Payload, plan: None, numel: int) -> Tensor:
        w, bits = self.cfg.chunk, self.cfg.bits
        full, k, tail, k_tail = chunk_plan(numel, w, self.cfg.density)
        chunks, kept = full + (tail > 0), full * k + k_tail
        scales, end = read_f32(payload, 0, self._scales_per_chunk() * chunks)
        if not torch.isfinite(scales).all() or (scales < 0).any():
            raise ValueError("sparseloco chunk scales must be finite and non-negative")
        code_bytes = -(-kept * bits // 8)
        raw_codes, end = read(payload, end, code_bytes, "u1")
        codes = torch.from_numpy(bits_to_int(np.unpackbits(raw_codes, count=kept * bits), kept, bits))  # (K,)
        index = decode_indices(read(payload, end, len(payload) - end, "u1")[0], numel, kept)  # (K,) ascending
        per_chunk = np.bincount(index // w, minlength=chunks)  # (c,)
        want = np.full(chunks, k)
        if tail:
            want[-1] = k_tail
        if not np.array_equal(per_chunk, want):
            raise ValueError(f"sparseloco indices are not {k} a chunk of {w}")
        chunk_of = torch.from_numpy(index // w)  # (K,)
        negative = codes >> (bits - 1)
        if bits == 1:
            mag = scales[chunk_of]
        else:
            lo, hi = scales.view(chunks, 2).unbind(1)  # (c,), (c,)
            if (lo > hi).any():
                raise ValueError("sparseloco chunk has lo > hi")
            levels = (1 << (bits - 1)) - 1
            m = (codes & levels).to(torch.float32)
            mag = lo[chunk_of] + m * ((hi - lo)[chunk_of] / levels)
        out = torch.zeros(numel)
        out[torch.from_numpy(index)] = torch.where(negative.bool(), -mag, mag)
        return out
