"""Update codecs: ``encode(tensor) -> bytes`` and ``decode(bytes) -> tensor``.

Every encoded blob is self-describing, so any blob decodes without outside context::

    b"ATBC" | u8 format version | u32 LE header length | header JSON | payload

The header names the codec, its parameters, the tensor's shape and dtype. Subclasses
implement only the math (``_compress`` / ``_decompress`` on a flat float32 tensor); the
base class owns the byte layout (the shape of hivemind's ``compression/``). Nothing is
pickled. The compression ratio of a codec is always measured on real encoded bytes.
"""

from __future__ import annotations

import json
import struct
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from aitbc.core.options import build_config
from aitbc.core.registry import Registry
from aitbc.errors import IntegrityError, UsageError

MAGIC = b"ATBC"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<4sBI")  # magic, version, header length
MAX_HEADER = 1 << 20

CODECS: Registry[type[Codec]] = Registry("codec")


@dataclass(frozen=True, slots=True)
class Header:
    codec: str
    shape: tuple[int, ...]
    dtype: str
    params: dict[str, Any]
    meta: dict[str, Any]


class Codec(ABC):
    name: ClassVar[str]
    Config: ClassVar[type]

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def encode(self, x: Tensor) -> bytes:
        flat = x.detach().reshape(-1).to(torch.float32)  # (d,)
        payload, meta = self._compress(flat)
        header = {
            "codec": self.name,
            "shape": list(x.shape),
            "dtype": str(x.dtype).removeprefix("torch."),
            "params": asdict(self.cfg),
            "meta": meta,
        }
        hbytes = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(hbytes)) + hbytes + payload

    def decode(self, blob: bytes) -> Tensor:
        header, payload = read_header(blob)
        if header.codec != self.name:
            raise IntegrityError(f"blob was encoded with codec {header.codec!r}, not {self.name!r}")
        return _decode_with(self, header, payload)

    @abstractmethod
    def _compress(self, flat: Tensor) -> tuple[bytes, dict[str, Any]]: ...

    @abstractmethod
    def _decompress(self, payload: bytes, meta: dict[str, Any], numel: int) -> Tensor: ...


def read_header(blob: bytes) -> tuple[Header, bytes]:
    if len(blob) < _PREFIX.size:
        raise IntegrityError(f"update blob too short ({len(blob)} bytes) to hold a codec header")
    magic, version, hlen = _PREFIX.unpack_from(blob)
    if magic != MAGIC:
        raise IntegrityError(f"not an aitbc update blob (magic {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise IntegrityError(f"unsupported update format version {version}; this build reads {FORMAT_VERSION}")
    if hlen > MAX_HEADER or _PREFIX.size + hlen > len(blob):
        raise IntegrityError(f"update header length {hlen} is out of range for a {len(blob)}-byte blob")
    try:
        raw = json.loads(blob[_PREFIX.size : _PREFIX.size + hlen])
        header = Header(
            codec=str(raw["codec"]),
            shape=tuple(int(s) for s in raw["shape"]),
            dtype=str(raw["dtype"]),
            params=dict(raw["params"]),
            meta=dict(raw["meta"]),
        )
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise IntegrityError(f"malformed update header: {type(e).__name__}: {e}"[:300]) from None
    if any(s < 0 for s in header.shape):
        raise IntegrityError(f"update header has a negative dimension: {header.shape}")
    return header, blob[_PREFIX.size + hlen :]


def _decode_with(codec: Codec, header: Header, payload: bytes) -> Tensor:
    numel = 1
    for s in header.shape:
        numel *= s
    try:
        flat = codec._decompress(payload, header.meta, numel)
    except (ValueError, RuntimeError, KeyError, TypeError) as e:
        raise IntegrityError(f"corrupt {header.codec} payload: {e}") from None
    if flat.numel() != numel:
        raise IntegrityError(f"{header.codec} payload decodes to {flat.numel()} values, header says {numel}")
    dtype = getattr(torch, header.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise IntegrityError(f"update header names unknown dtype {header.dtype!r}")
    return flat.reshape(header.shape).to(dtype)


def build_codec(name: str, options: dict[str, Any] | None = None) -> Codec:
    cls = CODECS.get(name)
    return cls(build_config(cls.Config, options, what=f"codec {name!r}"))


def decode(blob: bytes) -> Tensor:
    """Decode any codec's blob using only its own header."""
    header, payload = read_header(blob)
    if header.codec not in CODECS:
        raise IntegrityError(f"update blob names unknown codec {header.codec!r}; known: {', '.join(CODECS.names())}")
    cls = CODECS.get(header.codec)
    try:
        codec = cls(build_config(cls.Config, header.params, what=f"codec {header.codec!r}"))
    except UsageError as e:  # the blob came from someone else: bad params are corruption, not usage
        raise IntegrityError(f"update header has bad parameters: {e}") from None
    return _decode_with(codec, header, payload)


from aitbc.core.compression import dense as _dense  # noqa: E402,F401

__all__ = ["CODECS", "Codec", "Header", "build_codec", "decode", "read_header"]
