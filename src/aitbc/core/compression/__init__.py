"""Update codecs: ``encode(tensor) -> bytes`` and ``decode(bytes) -> tensor``.

Every encoded blob is self-describing, so any blob decodes without outside context::

    b"ATBC" | u8 format version | u32 LE header length | header JSON | payload

The header (sorted JSON) names the codec, its parameters, the tensor's shape and dtype,
and the codec's per-blob ``meta`` (e.g. top-k's ``k``, PowerSGD's parameter layout).
Subclasses implement only the math; the base class owns the byte layout and every size
check (the shape of hivemind's ``compression/``). Nothing is pickled.

A subclass implements a few small methods over a flat float32 tensor ``(d,)`` and its
*plan*, a typed record of what the header's ``meta`` says (``PlainCodec``: none):

- ``_plan(shape) -> plan``: the plan for a tensor of ``shape``; ``_plan_json(plan)`` and
  ``_read_plan(meta, d)`` write it into and read it from the header's ``meta``;
- ``_payload_size(d, plan) -> int``: the exact payload length in bytes that ``plan``
  implies. The decoder checks the real payload against it *before* allocating anything,
  so a header that claims ``shape=[10**12]`` is an ``IntegrityError``, not an OOM;
- ``_compress(flat, plan) -> bytes`` and ``_decompress(payload, plan, d) -> flat``.

Sizes are stated, not estimated: ``codec.expected_bytes(shape)`` is the payload a tensor
of that shape encodes to (the header is extra, ``len(blob) - expected_bytes`` bytes), and
``compression_ratio(d, len(blob))`` is always taken on real encoded bytes.

Codecs (``CODEC_NAMES``; the registry is checked complete at import):

============  =================================================  ==========================
name          payload                                            bits per value
============  =================================================  ==========================
none          fp32                                               32
fp16, bf16    half precision, finite values saturate             16
int8          int8 + one fp32 absmax scale per chunk             8 + 32/chunk_size
int4          two 4-bit values a byte + fp32 scale per chunk     4 + 32/chunk_size
topk          k fp32 values + Elias-Fano indices                 ~ratio*(32 + 2 + log2(1/ratio))
topk-int8     k int8 values, one fp32 scale + Elias-Fano         ~ratio*(8 + 2 + log2(1/ratio))
sign          1 bit a value + one fp32 scale (mean |x|)          1
powersgd      rank-r factors P (m, r), Q (n, r) per matrix       r(m+n)/(mn) * 32 per matrix
sparseloco    chunk-wise top-k, ``bits``-bit sign+magnitude       ~density*(bits + 2 + log2(1/density))
              codes, lo/hi fp32 per chunk, Elias-Fano indices     + 64/chunk
============  =================================================  ==========================

``ErrorFeedback(codec)`` (``feedback.py``) wraps any codec with a per-worker residual;
``build_codec(name, options, error_feedback=True)`` builds one, and the codec option
``error_feedback_decay=BETA`` builds SparseLoCo's decayed one (the outer momentum).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

# Importing each codec module registers its codec in CODECS (checked complete below).
from aitbc.core.compression import dense, powersgd, quantize, sign, sparse, sparseloco
from aitbc.core.compression.base import (
    CODEC_NAMES,
    CODECS,
    FORMAT_VERSION,
    MAGIC,
    MAX_HEADER,
    MAX_NUMEL,
    Codec,
    Header,
    Layout,
    _decode_with,
    check_layout,
    decode_pieces_with,
    flat_f32,
    read_header,
    split_blob,
)
from aitbc.core.compression.feedback import ErrorFeedback, check_decay, check_outer
from aitbc.core.options import build_config
from aitbc.errors import IntegrityError, UsageError


@dataclass(kw_only=True, slots=True)
class _WrapConfig:
    error_feedback: bool = False
    error_feedback_decay: float | None = None

    def __post_init__(self) -> None:
        check_decay(self.error_feedback_decay)


def build_codec(
    name: str,
    options: Mapping[str, Any] | None = None,
    *,
    layout: Layout | None = None,
    error_feedback: bool = False,
) -> Codec | ErrorFeedback:
    """The codec ``name`` with typed ``options`` (``key=value`` strings or values).

    ``layout`` lists the model's parameter shapes in flat order (``[tuple(p.shape) for p
    in model.parameters()]``); per-parameter codecs (``powersgd``) use it, the others
    ignore it. ``error_feedback=True`` (or the option ``error_feedback=true``, so a CLI
    spec ``topk:ratio=0.01,error_feedback=true`` works) wraps the codec in
    :class:`ErrorFeedback`: build one per worker, it holds that worker's residual. The
    option ``error_feedback_decay=BETA`` (in [0, 1)) turns it on decayed, as SparseLoCo's
    outer momentum (``sparseloco:density=0.02,error_feedback_decay=0.95``; the run's outer
    optimizer must then be ``fedavg``, see :func:`~feedback.check_outer`)."""
    options = dict(options or {})
    wrap = build_config(
        _WrapConfig,
        {key: options.pop(key) for key in ("error_feedback", "error_feedback_decay") if key in options},
        what=f"codec {name!r}",
    )
    error_feedback = error_feedback or wrap.error_feedback or wrap.error_feedback_decay is not None
    cls = CODECS.get(name)
    codec = cls(build_config(cls.Config, options, what=f"codec {name!r}"), layout=layout)
    return ErrorFeedback(codec, decay=wrap.error_feedback_decay) if error_feedback else codec


def decode(blob: bytes, *, max_numel: int = MAX_NUMEL) -> Tensor:
    """Decode any codec's blob using only its own header. Malformed input is an
    ``IntegrityError``; so is a blob that claims more than ``max_numel`` values."""
    header, payload = split_blob(blob)
    return _decode_with(_codec_for(header), header, payload, max_numel)


def decode_pieces(blob: bytes, *, max_numel: int = MAX_NUMEL, piece: int = 1 << 22) -> Iterator[Tensor]:
    """:func:`decode`, flat and in consecutive pieces of about ``piece`` values each (in
    the header's dtype): the dense codecs (``none``, ``fp16``, ``bf16``), ``int8`` and
    ``int4`` decode piece by piece, so a large update is never whole in float32; other
    codecs yield one piece. The header and sizes are checked
    before this returns (same errors as :func:`decode`), each piece's content as it decodes."""
    header, payload = split_blob(blob)
    return decode_pieces_with(_codec_for(header), header, payload, max_numel, piece)


def _codec_for(header: Header) -> Codec:
    if header.codec not in CODECS:
        raise IntegrityError(f"update blob names unknown codec {header.codec!r}; known: {', '.join(CODECS.names())}")
    cls = CODECS.get(header.codec)
    try:
        return cls(build_config(cls.Config, header.params, what=f"codec {header.codec!r}"))
    except UsageError as e:  # the blob came from someone else: bad params are corruption, not usage
        raise IntegrityError(f"update header has bad parameters: {e}") from None


def compression_ratio(numel: int, nbytes: int) -> float:
    """Bytes of the fp32 tensor over bytes actually sent: ``4 * numel / nbytes``."""
    if nbytes <= 0:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    return 4 * numel / nbytes


_missing = sorted(set(CODEC_NAMES) - set(CODECS.names()))
if _missing:
    raise ImportError(f"codec registry incomplete: {', '.join(_missing)} not registered")

__all__ = [
    "CODECS",
    "CODEC_NAMES",
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_HEADER",
    "MAX_NUMEL",
    "Codec",
    "ErrorFeedback",
    "Header",
    "Layout",
    "build_codec",
    "check_outer",
    "check_layout",
    "compression_ratio",
    "decode",
    "decode_pieces",
    "dense",
    "flat_f32",
    "powersgd",
    "quantize",
    "read_header",
    "sign",
    "sparse",
    "sparseloco",
]
