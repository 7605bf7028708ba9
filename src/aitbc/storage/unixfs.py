"""Folders as UnixFS directories, with the root CID ``ipfs add -r --cid-version=1`` prints
(:mod:`aitbc.storage.unixfs_add` builds them; this module reads and checks them).

A folder is a DAG of dag-pb directory nodes over its files (see :mod:`aitbc.storage.cid`
for one file's DAG), in kubo's two forms:

- a *basic* directory is one dag-pb node: ``Data`` = UnixFS ``{Type: Directory}``, one
  link per entry (``Hash``, ``Name``, ``Tsize`` = the entry's whole encoded DAG), links
  sorted by the names' UTF-8 bytes (dag-pb's canonical order);
- a *HAMT* (a large folder): a HAMT node is UnixFS ``{Type: HAMTShard, Data:
  bitfield, hashType: 0x22 (murmur3-x64-64), fanout: 256}``: the name's murmur3 x64
  128-bit hash (seed 0), its first 64-bit half big-endian, gives one byte per level; an
  entry alone in its slot is a link named ``"%02X" % slot + name``; two or more names
  sharing a slot go to a sub-shard one level down, linked as ``"%02X" % slot``. The
  bitfield is the set slots as a big-endian integer, in its minimal bytes.

How folders are *stored* here: a blob named by a file's CID is always the whole file (every
reader of a model or shard relies on that), so a folder is stored as its directory and
HAMT nodes, each the block itself (its sha2-256 is the CID's digest), plus its files, each
whole under its own CID. :class:`BlobHasher` accepts exactly these two forms: bytes whose
file CID is the name, or a dag-pb block that decodes as a directory node of the form
written here (canonical: re-encoding gives the same bytes; names that are safe path parts;
at most ``MAX_NODE_BYTES``).

Reading (:func:`walk`, :func:`read_tree`, :func:`resolve`, :func:`list_dir`) takes a
``get(cid) -> bytes`` and checks every blob it gets against its CID; a directory DAG can
share subtrees, so a walk is bounded (``max_entries``) as well as its depth.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import mmh3

from aitbc.errors import IntegrityError, NotFoundError, UsageError
from aitbc.storage.cid import (
    CODEC_DAG_PB,
    CODEC_RAW,
    Cid,
    CidHasher,
    _field_bytes,
    _field_varint,
    _parse_cid_bytes,
    _read_varint,
    parse_cid,
)

HAMT_FANOUT = 256
HAMT_HASH_MURMUR3 = 0x22  # multicodec murmur3-x64-64
MAX_NODE_BYTES = 1 << 20  # kubo's block size limit; a directory node is never larger
MAX_DEPTH = 256  # nested folders (plus HAMT levels) a read follows
MAX_ENTRIES = 1_000_000  # entries a walk visits before it stops (shared subtrees multiply)

_DIRECTORY = 1
_FILE = 2
_HAMT = 5
DIR_DATA = _field_varint(1, _DIRECTORY)

Kind = Literal["file", "dir"]


# --- nodes -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Link:
    """One dag-pb link: the child's CID, its name in the node, the child's DAG bytes."""

    name: str
    cid: Cid
    tsize: int


@dataclass(frozen=True, slots=True)
class DirNode:
    """A decoded directory node: ``hamt`` says which form; ``links`` as stored (a HAMT's
    names carry the two hex digits of their slot)."""

    hamt: bool
    links: tuple[Link, ...]


def encode_node(links: list[Link], data: bytes) -> bytes:
    out = bytearray()
    for link in links:
        pb = _field_bytes(1, link.cid.to_bytes()) + _field_bytes(2, link.name.encode()) + _field_varint(3, link.tsize)
        out += _field_bytes(2, pb)
    out += _field_bytes(1, data)
    return bytes(out)


def hamt_data(bitfield: int) -> bytes:
    bits = bitfield.to_bytes((bitfield.bit_length() + 7) // 8, "big")
    return (
        _field_varint(1, _HAMT)
        + _field_bytes(2, bits)
        + _field_varint(5, HAMT_HASH_MURMUR3)
        + _field_varint(6, HAMT_FANOUT)
    )


def hamt_hash(name: bytes) -> bytes:
    """The 8 bytes a HAMT reads a name's slots from (one per level)."""
    h1, _ = mmh3.hash64(name, seed=0, x64arch=True, signed=False)
    return h1.to_bytes(8, "big")


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a protobuf message; varints and bytes only."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            if pos + length > len(buf):
                raise ValueError("truncated field")
            yield number, wire, buf[pos : pos + length]
            pos += length
        else:
            raise ValueError(f"wire type {wire} is not used by dag-pb or UnixFS")


def check_name(name: str) -> str:
    """A directory entry's name is one safe path part: what ``get`` may create on disk."""
    if not name or name in (".", "..") or "/" in name or "\x00" in name or "\\" in name:
        raise ValueError(f"entry name {name!r} is not a single file name")
    return name


def decode_dir(block: bytes) -> DirNode:
    """Decode a directory or HAMT node written as this module writes them; anything else
    (another UnixFS type, extra fields, a non-canonical encoding, unsafe names) is a
    ``ValueError``."""
    if len(block) > MAX_NODE_BYTES:
        raise ValueError(f"a node of {len(block)} bytes, over {MAX_NODE_BYTES}")
    links: list[Link] = []
    data: bytes | None = None
    for number, wire, value in _fields(block):
        if number == 2 and wire == 2 and data is None:
            assert isinstance(value, bytes)
            links.append(_decode_link(value))
        elif number == 1 and wire == 2 and data is None:
            assert isinstance(value, bytes)
            data = value
        else:
            raise ValueError("not a dag-pb node (links, then data)")
    if data is None:
        raise ValueError("a dag-pb node without UnixFS data")
    if data == DIR_DATA:
        node = DirNode(False, tuple(links))
        for link in links:
            check_name(link.name)
        names = [link.name.encode() for link in links]
        if names != sorted(names) or len(set(names)) != len(names):
            raise ValueError("directory links are not sorted by name, or repeat a name")
    else:
        node = DirNode(True, tuple(links))
        _check_hamt(data, links)
    if encode_node(links, data) != block:
        raise ValueError("not the canonical encoding of its node")
    return node


def _decode_link(buf: bytes) -> Link:
    seen: dict[int, int | bytes] = {}
    for number, wire, value in _fields(buf):
        if number in seen or number not in (1, 2, 3) or (wire == 0) != (number == 3):
            raise ValueError("malformed dag-pb link")
        seen[number] = value
    if set(seen) != {1, 2, 3}:
        raise ValueError("a directory link needs a hash, a name and a size")
    raw, name, tsize = seen[1], seen[2], seen[3]
    assert isinstance(raw, bytes) and isinstance(name, bytes) and isinstance(tsize, int)
    try:
        return Link(name.decode("utf-8"), _parse_cid_bytes(raw), tsize)
    except UnicodeDecodeError:
        raise ValueError("a link name that is not UTF-8") from None


def _check_hamt(data: bytes, links: list[Link]) -> None:
    values: dict[int, int | bytes] = {}
    for number, _, value in _fields(data):
        if number in values:
            raise ValueError("a repeated UnixFS field")
        values[number] = value
    if values.get(1) != _HAMT or set(values) != {1, 2, 5, 6}:
        raise ValueError("not a UnixFS directory or HAMT node")
    if values[5] != HAMT_HASH_MURMUR3 or values[6] != HAMT_FANOUT:
        raise ValueError(f"a HAMT with hash {values[5]!r} and fanout {values[6]!r}, not murmur3 (0x22) and 256")
    bits = values[2]
    assert isinstance(bits, bytes)
    slots = []
    for link in links:
        label = link.name[:2]
        if len(label) != 2 or label.upper() != label or not all(c in "0123456789ABCDEF" for c in label):
            raise ValueError(f"HAMT link {link.name!r} does not start with its slot")
        if len(link.name) > 2:
            check_name(link.name[2:])
        slots.append(int(label, 16))
    if slots != sorted(set(slots)):
        raise ValueError("HAMT links are not one per slot, in slot order")
    if hamt_data(sum(1 << s for s in slots)) != data:
        raise ValueError("the HAMT bitfield does not match its links")


def is_dir_block(cid: Cid, block: bytes) -> bool:
    """Whether ``block`` is the directory node named ``cid`` (its sha2-256, and it decodes)."""
    if cid.codec != CODEC_DAG_PB or len(block) > MAX_NODE_BYTES or hashlib.sha256(block).digest() != cid.digest:
        return False
    try:
        decode_dir(block)
    except ValueError:
        return False
    return True


class BlobHasher:
    """Checks a blob against its name as it streams in: it is either the whole file whose
    CID is the name (:class:`CidHasher`), or the directory node the name hashes (see the
    module's docstring). ``update`` then ``matches(cid)``."""

    def __init__(self) -> None:
        self.file = CidHasher()
        self._sha = hashlib.sha256()
        self._head = bytearray()  # the bytes, while they could still be a node

    @property
    def size(self) -> int:
        return self.file.size

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self.file.update(data)
        self._sha.update(data)
        if self.file.size <= MAX_NODE_BYTES:
            self._head += data
        elif self._head:
            self._head = bytearray()

    def matches(self, cid: str) -> bool:
        name = parse_cid(cid)
        if str(self.file.cid()) == cid:
            return True
        if name.codec != CODEC_DAG_PB or self.size > MAX_NODE_BYTES or self._sha.digest() != name.digest:
            return False
        try:
            decode_dir(bytes(self._head))
        except ValueError:
            return False
        return True

    def found(self) -> str:
        """What the bytes hash to as a file (for an error message)."""
        return str(self.file.cid())


# --- reading --------------------------------------------------------------------------------


Get = Callable[[str], bytes]


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a folder: its relative posix path, kind, CID; a file's bytes."""

    path: str
    kind: Kind
    cid: str
    data: bytes | None = None


def check_blob(cid: str, data: bytes) -> DirNode | None:
    """``data`` is the blob ``cid`` (a whole file, or a folder's directory node): the node
    decoded for a directory, None for a file; :class:`IntegrityError` if it is not."""
    name = parse_cid(cid)
    if name.codec == CODEC_RAW:
        if hashlib.sha256(data).digest() != name.digest:
            raise IntegrityError(f"blob {cid} is corrupt: its bytes do not hash to its CID")
        return None
    if is_dir_block(name, data):
        return decode_dir(data)
    hasher = CidHasher()
    hasher.update(data)
    if str(hasher.cid()) != cid:
        if hashlib.sha256(data).digest() == name.digest:
            raise IntegrityError(f"blob {cid} is a dag-pb node of a kind this store does not read")
        raise IntegrityError(f"blob {cid} is corrupt: its bytes hash to {hasher.cid()}")
    return None


def _load(get: Get, cid: str) -> tuple[DirNode | None, bytes]:
    """The blob ``cid`` checked against its name: (the node, b"") for a directory, else
    (None, the file's bytes)."""
    data = get(cid)
    node = check_blob(cid, data)
    return (node, b"") if node is not None else (None, data)


def _entries(get: Get, node: DirNode) -> list[tuple[str, Cid]]:
    """(name, CID) of a directory's entries, a HAMT's sub-shards followed, in link order."""
    return [(link.name, link.cid) for link in dir_links(get, node)]


def dir_links(get: Get, node: DirNode) -> list[Link]:
    """A directory's entries as links named by the entry's own name: a basic node's
    links, or a HAMT's leaves (sub-shards followed, each name checked to hash to the slots
    it sits under, so a walk and :func:`resolve` agree). A name listed twice is refused."""
    links = list(node.links) if not node.hamt else list(_hamt_leaves(get, node, b""))
    names = [link.name for link in links]
    if len(set(names)) != len(names):
        raise IntegrityError("a folder lists one name twice")
    return links


def _hamt_leaves(get: Get, node: DirNode, slots: bytes) -> Iterator[Link]:
    depth = len(slots)
    for link in node.links:
        slot = int(link.name[:2], 16)
        if len(link.name) > 2:
            name = link.name[2:]
            if hamt_hash(name.encode())[: depth + 1] != slots + bytes([slot]):
                raise IntegrityError(f"HAMT entry {name!r} is not under the slots its name hashes to")
            yield Link(name, link.cid, link.tsize)
            continue
        if depth >= 7:
            raise IntegrityError("a HAMT deeper than its 64-bit hash")
        sub, _ = _load(get, str(link.cid))
        if sub is None or not sub.hamt:
            raise IntegrityError(f"HAMT link {link.name} to {link.cid} is not a sub-shard")
        yield from _hamt_leaves(get, sub, slots + bytes([slot]))


def walk(get: Get, cid: str, *, max_entries: int = MAX_ENTRIES, read_files: bool = True) -> Iterator[Entry]:
    """Every entry of the folder (or file) ``cid``, parents before their contents, each
    entry of a folder in name order of its links; the root is ``Entry("", ...)``. Every
    blob read is checked against its CID; ``read_files=False`` reads only folders (a
    file's ``data`` is then None and its blob is not fetched unless it could be a folder)."""
    count = 0
    stack: list[tuple[str, str, int]] = [("", cid, 0)]
    while stack:
        path, at, depth = stack.pop()
        count += 1
        if count > max_entries:
            raise UsageError(f"{cid} has over {max_entries} entries; refusing to walk further")
        codec = parse_cid(at).codec
        if codec == CODEC_RAW and not read_files:
            yield Entry(path, "file", at)
            continue
        node, data = _load(get, at)
        if node is None:
            yield Entry(path, "file", at, data if read_files else None)
            continue
        yield Entry(path, "dir", at)
        if depth >= MAX_DEPTH:
            raise UsageError(f"{cid}: folders nested over {MAX_DEPTH} deep")
        children = list(_entries(get, node))
        for name, child in reversed(children):
            stack.append((f"{path}/{name}" if path else name, str(child), depth + 1))


def read_tree(get: Get, cid: str) -> Iterator[tuple[str, bytes]]:
    """Every file of the folder ``cid`` as (relative posix path, bytes); a file CID is one
    file with path ``""``. Every blob is checked against its CID."""
    for entry in walk(get, cid):
        if entry.kind == "file":
            assert entry.data is not None
            yield entry.path, entry.data


def split_path(target: str) -> tuple[str, list[str]]:
    """``"CID/a/b"`` (or ``/ipfs/CID/a/b``) as the CID and its path parts."""
    text = target.removeprefix("/ipfs/")
    root, _, rest = text.partition("/")
    parse_cid(root)
    parts = [p for p in rest.split("/") if p]
    for part in parts:
        if part in (".", ".."):
            raise UsageError(f"{target!r}: a path inside a folder cannot contain {part!r}")
    return root, parts


def resolve(get: Get, target: str) -> str:
    """The CID at ``"CID/sub/path"`` inside a folder (``"CID"`` alone: the CID itself)."""
    root, parts = split_path(target)
    at = root
    for i, part in enumerate(parts):
        node, _ = _load(get, at)
        where = "/".join([root, *parts[:i]])
        if node is None:
            raise NotFoundError(f"{where} is a file, not a folder: no {part!r} in it")
        found = _find(get, node, part)
        if found is None:
            raise NotFoundError(f"no {part!r} in folder {where}")
        at = str(found)
    return at


def _find(get: Get, node: DirNode, name: str) -> Cid | None:
    if not node.hamt:
        for link in node.links:
            if link.name == name:
                return link.cid
        return None
    key = hamt_hash(name.encode())
    for depth in range(8):
        label = f"{key[depth]:02X}"
        found = next((x for x in node.links if x.name[:2] == label), None)
        if found is None:
            return None
        if len(found.name) > 2:
            return found.cid if found.name[2:] == name else None
        sub, _ = _load(get, str(found.cid))
        if sub is None or not sub.hamt:
            raise IntegrityError(f"HAMT link {found.name} to {found.cid} is not a sub-shard")
        node = sub
    return None


def list_dir(get: Get, cid: str) -> list[tuple[str, str, int]]:
    """The entries of one folder as (name, CID, Tsize), sorted by name; a
    ``NotFoundError`` names a file."""
    node, _ = _load(get, cid)
    if node is None:
        raise UsageError(f"{cid} is a file, not a folder")
    out = []
    for link in dir_links(get, node):
        out.append((link.name, str(link.cid), link.tsize))
    return sorted(out, key=lambda e: e[0].encode())


def reachable(read_node: Callable[[str], bytes | None], root: str, *, max_entries: int = MAX_ENTRIES) -> set[str]:
    """Every CID a store must hold for the DAG at ``root``: the root, every directory and
    HAMT node under it, and every file. ``read_node(cid)`` returns the blob's bytes, or
    None when it is too large to be a node (so a file); a blob it lacks is its
    ``NotFoundError``. Each CID is visited once (shared subtrees too)."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        cid = todo.pop()
        if cid in seen:
            continue
        seen.add(cid)
        if len(seen) > max_entries:
            raise UsageError(f"{root} reaches over {max_entries} blobs")
        name = parse_cid(cid)
        data = read_node(cid)
        if name.codec != CODEC_DAG_PB or data is None or not is_dir_block(name, data):
            continue
        todo.extend(str(link.cid) for link in decode_dir(data).links)
    return seen
