"""The codec base: the self-describing byte layout every update blob shares, the
:class:`Codec` base class that owns it and every size check, and the registry the codecs
join at import (see the package docstring for the format and the codecs)."""

from __future__ import annotations

import json
import math
import operator
import re
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import Tensor

from aitbc.core.compression._wire import Payload
from aitbc.core.registry import Registry
from aitbc.errors import IntegrityError, UsageError
from aitbc.json_value import JSONObject

MAGIC = b"ATBC"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<4sBI")  # magic, version, header length
MAX_HEADER = 1 << 20
# A header's arrays and objects nest a few levels deep. Deeper is refused before it is parsed:
# the JSON parser recurses per level, and a process whose recursion limit was raised (a library
# may raise it for the whole process) overflows the C stack on a megabyte of "[" instead of
# raising RecursionError.
MAX_HEADER_DEPTH = 32
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
# Decoding refuses blobs that claim more values than this (PowerSGD's factors expand
# quadratically, so a small payload can claim a huge matrix). Callers that know the
# model's size pass ``max_numel=d``.
MAX_NUMEL = 1 << 28

# Every codec the issue names; ``import aitbc.core.compression`` fails if one is missing.
CODEC_NAMES = ("none", "fp16", "bf16", "int8", "int4", "topk", "topk-int8", "sign", "powersgd", "sparseloco")

Layout = Sequence[Sequence[int]]  # one shape per model parameter, in flat order

CODECS: Registry[type[Codec[Any]]] = Registry("codec")

PlanT = TypeVar("PlanT")


@dataclass(frozen=True, slots=True)
class Header:
    codec: str
    shape: tuple[int, ...]
    dtype: str
    params: JSONObject  # the codec's config, as the blob states it (checked by ``build_config``)
    meta: JSONObject  # the codec's plan, as the blob states it (checked by ``Codec._read_plan``)


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


class Codec(ABC, Generic[PlanT]):
    """A codec whose per-blob plan (what the header's ``meta`` says: top-k's ``k``,
    PowerSGD's layout) is a ``PlanT``; the plan is JSON only where the header is written
    (``_plan_json``) and read (``_read_plan``)."""

    name: ClassVar[str]
    Config: ClassVar[type]

    def __init__(self, cfg: Any, *, layout: Layout | None = None) -> None:
        self.cfg = cfg
        self.layout = None if layout is None else check_layout(layout)

    # --- public API -----------------------------------------------------------------------

    def encode(self, x: Tensor) -> bytes:
        return self._encode_flat(flat_f32(x, self.name), tuple(x.shape), str(x.dtype).removeprefix("torch."))

    def decode(self, blob: bytes, *, max_numel: int = MAX_NUMEL) -> Tensor:
        header, payload = split_blob(blob)
        if header.codec != self.name:
            raise IntegrityError(f"blob was encoded with codec {header.codec!r}, not {self.name!r}")
        return _decode_with(self, header, payload, max_numel)

    def expected_bytes(self, shape: int | Sequence[int]) -> int:
        """Payload bytes ``encode`` writes for a tensor of ``shape`` (an int: a flat
        tensor of that many values). The header comes on top of this."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return self._payload_size(_numel(shape), self._plan(shape))

    def bits_per_value(self, shape: int | Sequence[int]) -> float:
        """Payload bits per value for a tensor of ``shape`` (header excluded)."""
        d = shape if isinstance(shape, int) else _numel(shape)
        return 8 * self.expected_bytes(shape) / d if d else 0.0

    # --- what subclasses implement ------------------------------------------------------------

    @abstractmethod
    def _plan(self, shape: tuple[int, ...]) -> PlanT:
        """The plan for encoding a tensor of ``shape``."""

    @abstractmethod
    def _plan_json(self, plan: PlanT) -> JSONObject:
        """``plan`` as the header's ``meta`` states it."""

    @abstractmethod
    def _read_plan(self, meta: JSONObject, numel: int) -> PlanT:
        """The plan a header's ``meta`` states for ``numel`` values; ``ValueError``,
        ``KeyError`` or ``TypeError`` if it states none."""

    @abstractmethod
    def _payload_size(self, numel: int, plan: PlanT) -> int: ...

    @abstractmethod
    def _compress(self, flat: Tensor, plan: PlanT) -> bytes: ...

    @abstractmethod
    def _decompress(self, payload: Payload, plan: PlanT, numel: int) -> Tensor: ...

    def _decompress_pieces(self, payload: Payload, plan: PlanT, numel: int, piece: int) -> Iterator[Tensor]:
        """The decoded values in consecutive flat pieces of about ``piece`` values. A codec
        whose format allows it decodes piece by piece (bounded temporaries); by default
        the whole tensor is one piece."""
        yield self._decompress(payload, plan, numel)

    # --- shared -------------------------------------------------------------------------------

    def _encode_flat(self, flat: Tensor, shape: tuple[int, ...], dtype: str) -> bytes:
        plan = self._plan(shape)
        payload = self._compress(flat, plan)
        size = self._payload_size(flat.numel(), plan)
        assert len(payload) == size, f"{self.name} wrote {len(payload)} payload bytes, states {size}"
        header = {
            "codec": self.name,
            "shape": list(shape),
            "dtype": dtype,
            "params": asdict(self.cfg),
            "meta": self._plan_json(plan),
        }
        hbytes = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(hbytes)) + hbytes + payload


def flat_f32(x: Tensor, codec: str) -> Tensor:
    """The update ``x`` as a contiguous float32 CPU vector (d,) for encoding."""
    if not x.dtype.is_floating_point:
        raise UsageError(f"codec {codec!r} encodes floating-point tensors, got dtype {x.dtype}")
    return x.detach().reshape(-1).to(device="cpu", dtype=torch.float32).contiguous()  # (d,)


def check_layout(layout: Layout) -> tuple[tuple[int, ...], ...]:
    """A model's parameter shapes as a tuple of int tuples; ``UsageError`` if not."""
    try:
        out = tuple(tuple(operator.index(s) for s in shape) for shape in layout)
    except TypeError:
        msg = f"codec layout must be a list of parameter shapes (lists of ints), got {layout!r}"
        raise UsageError(msg[:300]) from None
    if any(s < 0 for shape in out for s in shape):
        raise UsageError(f"codec layout has a negative dimension: {out!r}"[:300])
    return out


def read_header(blob: bytes) -> tuple[Header, bytes]:
    """The blob's header, checked, and its payload (a copy: decoding reads a view)."""
    header, payload = split_blob(blob)
    return header, bytes(payload)


def split_blob(blob: bytes) -> tuple[Header, memoryview]:
    """:func:`read_header` with the payload as a view of ``blob``'s bytes after the header:
    what decoding reads (a slice would copy the payload, an update's whole size, once more)."""
    if len(blob) < _PREFIX.size:
        raise IntegrityError(f"update blob too short ({len(blob)} bytes) to hold a codec header")
    magic, version, hlen = _PREFIX.unpack_from(blob)
    if magic != MAGIC:
        raise IntegrityError(f"not an aitbc update blob (magic {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise IntegrityError(f"unsupported update format version {version}; this build reads {FORMAT_VERSION}")
    if hlen > MAX_HEADER or _PREFIX.size + hlen > len(blob):
        raise IntegrityError(f"update header length {hlen} is out of range for a {len(blob)}-byte blob")
    text = bytes(blob[_PREFIX.size : _PREFIX.size + hlen])
    if _nesting(text) > MAX_HEADER_DEPTH:
        raise IntegrityError(f"malformed update header: nested deeper than {MAX_HEADER_DEPTH} levels")
    try:
        raw = json.loads(text)
        header = Header(
            codec=str(raw["codec"]),
            shape=tuple(_strict_int(s) for s in raw["shape"]),
            dtype=str(raw["dtype"]),
            params=dict(raw["params"]),
            meta=dict(raw["meta"]),
        )
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise IntegrityError(f"malformed update header: {type(e).__name__}: {_one_line(e)}") from None
    if any(s < 0 for s in header.shape):
        raise IntegrityError(f"update header has a negative dimension: {header.shape}")
    return header, memoryview(blob)[_PREFIX.size + hlen :]


def _nesting(text: bytes) -> int:
    """How deep ``text``'s JSON arrays and objects nest (brackets inside strings not counted)."""
    depth = deepest = 0
    for b in _JSON_STRING.sub(b"", text).translate(None, delete=_NOT_BRACKETS):
        depth += 1 if b in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _one_line(e: BaseException) -> str:
    """An exception's message as one short line (torch appends C++ stack frames)."""
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def _strict_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"dimension {v!r} is not an integer")
    return v


class PlainCodec(Codec[None]):
    """A codec whose blobs need no plan beyond its config (the header's ``meta`` is ``{}``)."""

    def _plan(self, shape: tuple[int, ...]) -> None:
        return None

    def _plan_json(self, plan: None) -> JSONObject:
        return {}

    def _read_plan(self, meta: JSONObject, numel: int) -> None:
        return None


def _decode_with(codec: Codec[PlanT], header: Header, payload: Payload, max_numel: int) -> Tensor:
    numel, dtype, plan = _checked(codec, header, payload, max_numel)
    try:
        flat = codec._decompress(payload, plan, numel)
    except (ValueError, RuntimeError, KeyError, TypeError, IndexError, ArithmeticError) as e:
        raise IntegrityError(f"corrupt {header.codec} payload: {_one_line(e)}") from None
    if flat.numel() != numel:
        raise IntegrityError(f"{header.codec} payload decodes to {flat.numel()} values, header says {numel}")
    return flat.reshape(header.shape).to(dtype)


def decode_pieces_with(
    codec: Codec[Any], header: Header, payload: Payload, max_numel: int, piece: int
) -> Iterator[Tensor]:
    """Like :func:`_decode_with`, flat, in consecutive pieces (see ``Codec._decompress_pieces``);
    the sizes are checked before this returns, the payload's content as each piece decodes."""
    if piece < 1:
        raise UsageError(f"piece must be at least one value, got {piece}")
    numel, dtype, plan = _checked(codec, header, payload, max_numel)
    return _pieces(codec, header, payload, plan, numel, dtype, piece)


def _pieces(
    codec: Codec[PlanT], header: Header, payload: Payload, plan: PlanT, numel: int, dtype: torch.dtype, piece: int
) -> Iterator[Tensor]:
    done = 0
    try:
        for flat in codec._decompress_pieces(payload, plan, numel, piece):
            done += flat.numel()
            if done > numel:
                break
            flat = flat.reshape(-1).to(dtype)
            yield flat
            del flat  # not held while the next piece decodes
    except (ValueError, RuntimeError, KeyError, TypeError, IndexError, ArithmeticError) as e:
        raise IntegrityError(f"corrupt {header.codec} payload: {_one_line(e)}") from None
    if done != numel:
        raise IntegrityError(f"{header.codec} payload decodes to {done} values, header says {numel}")


def _checked(codec: Codec[PlanT], header: Header, payload: Payload, max_numel: int) -> tuple[int, torch.dtype, PlanT]:
    """The header's value count, dtype and plan, once every size it implies matches the payload."""
    numel = _numel(header.shape)
    dtype = getattr(torch, header.dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise IntegrityError(f"update header names unknown dtype {header.dtype!r}")
    try:  # every size the header implies is checked against the payload before any allocation
        plan = codec._read_plan(header.meta, numel)
        size = codec._payload_size(numel, plan)
    except (ValueError, KeyError, TypeError, ArithmeticError) as e:
        raise IntegrityError(f"bad {header.codec} header meta: {_one_line(e)}") from None
    if len(payload) != size:
        raise IntegrityError(f"{header.codec} payload is {len(payload)} bytes; the header implies {size}")
    # each dimension too: shape (0, 10**30) holds no values but no tensor can take that shape
    if numel > max_numel or any(s > max_numel for s in header.shape):
        msg = f"update header claims shape {header.shape}, more than the allowed {max_numel} values"
        raise IntegrityError(
            msg if len(msg) < 300 else f"update header claims more than the allowed {max_numel} values"
        )
    return numel, dtype, plan
