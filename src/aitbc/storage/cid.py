"""IPFS content identifiers (CIDs) for files, computed exactly as ``ipfs add --cid-version=1``.

Every blob in the store is named by the CID that kubo (the reference IPFS node) gives the
same bytes with its defaults for CIDv1, so a blob can be checked against, or fetched from,
any IPFS node. Those defaults make a UnixFS file DAG:

- the bytes are cut into fixed 262144-byte chunks (``--chunker=size-262144``);
- each chunk is a *raw leaf*: a block that is the chunk itself, codec ``raw`` (0x55)
  (``--raw-leaves``, implied by ``--cid-version=1``);
- a file of at most one chunk (the empty file too) is that single raw leaf;
- otherwise the leaves are linked by dag-pb (0x70) nodes in the *balanced* layout: the
  links of each level are grouped, in order, into nodes of at most 174 links, level
  after level, until one node (the root) is left;
- every block is hashed with sha2-256, and the CID is printed in multibase base32
  (lower case, prefix ``b``).

The encodings follow the specs:

- CID: https://github.com/multiformats/cid (``<version><codec><multihash>``, varints).
- dag-pb: https://ipld.io/specs/codecs/dag-pb/spec/ -- ``PBNode`` is ``Links`` (field 2,
  repeated) *before* ``Data`` (field 1), the canonical order every implementation writes;
  ``PBLink`` is ``Hash`` (1), ``Name`` (2) and ``Tsize`` (3). UnixFS importers always write
  ``Name`` (empty) and ``Tsize`` (the encoded size of the child's whole subtree).
- UnixFS: https://specs.ipfs.tech/unixfs/ -- ``Data`` is ``Type`` (1, File = 2),
  ``filesize`` (3) and one ``blocksizes`` (4) entry per link, each with its own tag
  (proto2 ``repeated uint64``, not packed).

The computation streams: it keeps one partial chunk and, per tree level, the at most 173
links that wait for their parent node, so memory does not grow with the file.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from aitbc.errors import NotFoundError, UsageError

CHUNK_SIZE = 262_144  # kubo --chunker=size-262144
MAX_LINKS = 174  # kubo's balanced layout: links per dag-pb node

CODEC_RAW = 0x55
CODEC_DAG_PB = 0x70
SHA2_256 = 0x12
SHA2_256_LENGTH = 32

_CODEC_NAMES = {CODEC_RAW: "raw", CODEC_DAG_PB: "dag-pb"}
_UNIXFS_FILE = 2
_READ_SIZE = 1 << 20
_BASE32_BODY = re.compile(r"[a-z2-7]+")


# --- encoders: protobuf wire format and multiformats varints are the same LEB128 --------


def _varint(n: int) -> bytes:
    """Unsigned LEB128, the varint of both protobuf and multiformats."""
    if n < 0:
        raise ValueError(f"varint of a negative number: {n}")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Decode one varint at ``pos``; returns (value, next position)."""
    value = shift = 0
    while pos < len(buf):
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            break
    raise ValueError("truncated or overlong varint")


def _field_varint(field: int, value: int) -> bytes:
    return _varint(field << 3 | 0) + _varint(value)


def _field_bytes(field: int, value: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(value)) + value


# --- CIDs --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cid:
    """A CIDv1 with a sha2-256 multihash: the only kind this store writes or accepts."""

    codec: int  # CODEC_RAW or CODEC_DAG_PB
    digest: bytes  # 32 bytes of sha2-256

    @classmethod
    def of_block(cls, codec: int, block: bytes | bytearray | memoryview) -> Cid:
        return cls(codec, hashlib.sha256(block).digest())

    def to_bytes(self) -> bytes:
        """Binary CID: version 1, codec, multihash (code, length, digest)."""
        return _varint(1) + _varint(self.codec) + _varint(SHA2_256) + _varint(len(self.digest)) + self.digest

    def __str__(self) -> str:
        """Multibase base32 (RFC 4648 alphabet, lower case, no padding), prefix ``b``."""
        return "b" + base64.b32encode(self.to_bytes()).decode("ascii").lower().rstrip("=")

    @property
    def codec_name(self) -> str:
        return _CODEC_NAMES[self.codec]


def _not_a_cid(text: str, why: str) -> UsageError:
    shown = text if len(text) <= 80 else text[:77] + "..."
    return UsageError(f"not a CID: {shown!r} ({why}; expected a base32 CIDv1 like bafkrei... or bafybei...)")


def parse_cid(text: str) -> Cid:
    """Parse a CID string, accepting only what this store names blobs by.

    That is: multibase ``b`` (lower-case base32), CID version 1, codec raw or dag-pb,
    multihash sha2-256 of length 32, in canonical form (re-encoding gives the same
    string, so one blob has exactly one name). CIDv0 (``Qm...``) is refused: it names a
    DAG with dag-pb leaves, which ``--cid-version=1`` never builds, so its bytes could not
    be checked here.
    """
    if text.startswith("Qm") and len(text) == 46:
        raise _not_a_cid(text, "CIDv0 is not supported")
    if not text.startswith("b") or not _BASE32_BODY.fullmatch(text[1:]):
        raise _not_a_cid(text, "not lower-case base32 with multibase prefix 'b'")
    body = text[1:].upper()
    try:
        raw = base64.b32decode(body + "=" * (-len(body) % 8))
    except ValueError:
        raise _not_a_cid(text, "bad base32 length") from None
    try:
        cid = _parse_cid_bytes(raw)
    except ValueError as e:
        raise _not_a_cid(text, str(e)) from None
    if str(cid) != text:
        raise _not_a_cid(text, "not in canonical form")
    return cid


def _parse_cid_bytes(raw: bytes) -> Cid:
    version, pos = _read_varint(raw, 0)
    if version != 1:
        raise ValueError(f"CID version {version}, not 1")
    codec, pos = _read_varint(raw, pos)
    if codec not in _CODEC_NAMES:
        raise ValueError(f"codec 0x{codec:x} is neither raw (0x55) nor dag-pb (0x70)")
    hash_code, pos = _read_varint(raw, pos)
    if hash_code != SHA2_256:
        raise ValueError(f"multihash 0x{hash_code:x} is not sha2-256 (0x12)")
    length, pos = _read_varint(raw, pos)
    digest = raw[pos:]
    if length != SHA2_256_LENGTH or len(digest) != SHA2_256_LENGTH:
        raise ValueError(f"sha2-256 digest of {len(digest)} bytes, not 32")
    return Cid(codec, digest)


def is_cid(text: str) -> bool:
    """True if ``text`` is a CID that :func:`parse_cid` accepts."""
    try:
        parse_cid(text)
    except UsageError:
        return False
    return True


# --- the UnixFS file DAG -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Link:
    """A finished child block, as its parent node records it."""

    cid: Cid
    tsize: int  # encoded bytes of the child's whole subtree (dag-pb Tsize)
    filesize: int  # file bytes under the child (UnixFS blocksizes entry)


def _leaf(chunk: bytes | bytearray | memoryview) -> _Link:
    """A raw leaf: the block is the chunk itself."""
    return _Link(Cid.of_block(CODEC_RAW, chunk), len(chunk), len(chunk))


def _node(links: list[_Link]) -> _Link:
    """A dag-pb UnixFS File node over ``links``, in dag-pb's canonical field order."""
    filesize = sum(link.filesize for link in links)
    unixfs = _field_varint(1, _UNIXFS_FILE) + _field_varint(3, filesize)
    unixfs += b"".join(_field_varint(4, link.filesize) for link in links)
    pb_links = (
        _field_bytes(1, link.cid.to_bytes()) + _field_bytes(2, b"") + _field_varint(3, link.tsize) for link in links
    )
    block = b"".join(_field_bytes(2, pb_link) for pb_link in pb_links)
    block += _field_bytes(1, unixfs)
    tsize = len(block) + sum(link.tsize for link in links)
    return _Link(Cid.of_block(CODEC_DAG_PB, block), tsize, filesize)


class CidHasher:
    """Incremental CID of a file, like a ``hashlib`` object: ``update()`` then ``cid()``.

    Blocks are hashed as they fill, so a caller can compute the CID while it copies
    the bytes somewhere (the blob store does). ``chunk_size`` and ``max_links`` exist for
    tests of deep trees; the defaults are kubo's and the only ones the store uses.
    """

    def __init__(self, *, chunk_size: int = CHUNK_SIZE, max_links: int = MAX_LINKS) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        if max_links < 2:
            raise ValueError(f"max_links must be >= 2, got {max_links}")
        self._chunk_size = chunk_size
        self._max_links = max_links
        self._partial = bytearray()  # bytes of the chunk being filled
        self._leaves = 0
        self._levels: list[list[_Link]] = [[]]  # links waiting for a parent, per level
        self._result: Cid | None = None
        self._root: _Link | None = None
        self.size = 0  # bytes seen so far

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._result is not None:
            raise RuntimeError("CidHasher.update() after cid()")
        view = memoryview(data).cast("B")
        self.size += len(view)
        if self._partial:
            take = min(self._chunk_size - len(self._partial), len(view))
            self._partial += view[:take]
            view = view[take:]
            if len(self._partial) == self._chunk_size:
                self._add_leaf(self._partial)
                self._partial = bytearray()
        while len(view) >= self._chunk_size:  # whole chunks straight from the caller's bytes
            self._add_leaf(view[: self._chunk_size])
            view = view[self._chunk_size :]
        self._partial += view

    def cid(self) -> Cid:
        """Finish the DAG and return the root's CID (later calls return the same)."""
        if self._result is None:
            if self._partial or self._leaves == 0:  # the chunker always emits one chunk
                self._add_leaf(self._partial)
                self._partial = bytearray()
            self._result = self._finish_levels()
        return self._result

    @property
    def tsize(self) -> int:
        """Encoded bytes of the whole DAG (a directory's dag-pb ``Tsize`` of this file),
        known once :meth:`cid` has been called."""
        self.cid()
        assert self._root is not None
        return self._root.tsize

    def _add_leaf(self, chunk: bytes | bytearray | memoryview) -> None:
        self._leaves += 1
        self._push(0, _leaf(chunk))

    def _push(self, level: int, link: _Link) -> None:
        # A full group becomes a node at once: the balanced layout cuts each level's links,
        # in order, into groups of max_links, so every full group is final when it fills.
        if level == len(self._levels):
            self._levels.append([])
        pending = self._levels[level]
        pending.append(link)
        if len(pending) == self._max_links:
            self._levels[level] = []
            self._push(level + 1, _node(pending))

    def _finish_levels(self) -> Cid:
        # Bottom-up, close each level's last (partial) group, as the balanced layout
        # does. The root is the single link left on the highest level; a lone link on a
        # lower level still gets a parent (kubo wraps it, so the tree stays balanced).
        level = 0
        while True:
            pending = self._levels[level]
            is_top = not any(self._levels[level + 1 :])
            if is_top and len(pending) == 1:
                self._root = pending[0]
                return pending[0].cid
            if pending:
                self._levels[level] = []
                self._push(level + 1, _node(pending))
            level += 1


# --- entry points ------------------------------------------------------------------------


def cid_of_bytes(data: bytes | bytearray | memoryview) -> str:
    """CID of ``data``, as ``ipfs add --cid-version=1`` prints it."""
    hasher = CidHasher()
    hasher.update(data)
    return str(hasher.cid())


def cid_of_chunks(chunks: Iterable[bytes | bytearray | memoryview]) -> str:
    """CID of the concatenation of ``chunks`` (any sizes; they need not be aligned)."""
    hasher = CidHasher()
    for chunk in chunks:
        hasher.update(chunk)
    return str(hasher.cid())


def cid_of_stream(stream: BinaryIO) -> str:
    """CID of everything left to read in a binary file object, in constant memory."""
    hasher = CidHasher()
    while block := stream.read(_READ_SIZE):
        hasher.update(block)
    return str(hasher.cid())


def cid_of_file(path: str | Path) -> str:
    """CID of the file at ``path``; a missing file is a :class:`NotFoundError`."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path} is a directory; a CID here names one file")
    try:
        with path.open("rb") as stream:
            return cid_of_stream(stream)
    except FileNotFoundError:
        raise NotFoundError(f"no such file: {path}") from None
