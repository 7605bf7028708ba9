"""Small byte-level helpers shared by the codecs (little-endian throughout).

Readers take a payload whose total length the base class has already checked against the
header, so every ``count`` here is backed by real bytes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from aitbc.json_value import JSONObject

# An update's payload: the blob's bytes after its header, a view of them (no copy).
Payload = bytes | memoryview


def to_bytes(t: Tensor | np.ndarray, dtype: str) -> bytes:
    """``t`` as little-endian ``dtype`` bytes (``"<f4"``, ``"<f2"``, ``"i1"``, ...)."""
    a = t.numpy() if isinstance(t, Tensor) else t
    return np.ascontiguousarray(a, dtype=dtype).tobytes()


def read(payload: Payload, offset: int, count: int, dtype: str) -> tuple[np.ndarray, int]:
    """``count`` items of ``dtype`` at ``offset``; returns (writable array, next offset)."""
    a = np.frombuffer(payload, dtype=dtype, count=count, offset=offset).copy()
    return a, offset + a.nbytes


def read_f32(payload: Payload, offset: int, count: int) -> tuple[Tensor, int]:
    a, end = read(payload, offset, count, "<f4")
    return torch.from_numpy(a.astype(np.float32, copy=False)), end


def meta_int(meta: JSONObject, key: str, lo: int, hi: int) -> int:
    """``meta[key]`` as an int in ``[lo, hi]``; ``ValueError``/``KeyError`` otherwise."""
    v = meta[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"meta {key}={v!r} is not an integer in [{lo}, {hi}]")
    return v


def n_chunks(numel: int, chunk: int) -> int:
    return -(-numel // chunk)


def chunk_view(flat: Tensor, chunk: int) -> Tensor:
    """``flat`` (d,) zero-padded and viewed as (c, chunk'), where chunk' = min(chunk, d):
    the padding is under one chunk and never more than d, whatever the chunk size says."""
    d = flat.numel()
    width = max(1, min(chunk, d))
    c = n_chunks(d, width)
    return torch.nn.functional.pad(flat, (0, c * width - d)).view(c, width)  # (c, chunk')


def expand_chunks(per_chunk: Tensor, numel: int, chunk: int) -> Tensor:
    """One value per chunk (c,) -> one per element (d,)."""
    return per_chunk.repeat_interleave(max(1, min(chunk, numel)))[:numel]


def int_to_bits(v: np.ndarray, width: int) -> np.ndarray:
    """Non-negative ints (k,) -> their low ``width`` bits, most significant first, (k * width,) uint8."""
    shifts = np.arange(width - 1, -1, -1, dtype=np.int64)
    return ((v.astype(np.int64)[:, None] >> shifts) & 1).astype(np.uint8).reshape(-1)  # (k, width) -> (k*width,)


def bits_to_int(bits: np.ndarray, k: int, width: int) -> np.ndarray:
    """Inverse of :func:`int_to_bits`: (k * width,) bits -> (k,) int64."""
    shifts = np.arange(width - 1, -1, -1, dtype=np.int64)
    return (bits.reshape(k, width).astype(np.int64) << shifts).sum(axis=1)  # (k, width) -> (k,)
