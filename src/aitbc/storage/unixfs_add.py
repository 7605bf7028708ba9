"""Adding a file or folder: the blobs and root CID ``ipfs add -r --cid-version=1`` makes.

kubo's defaults, which this module follows (the node formats are :mod:`aitbc.storage.unixfs`'s):

- a directory whose estimate passes ``HAMT_THRESHOLD`` (262144) bytes is a HAMT, else a
  basic directory. The estimate is kubo's (boxo ``SizeEstimationLinks``, the default): the
  sum, over the entries, of the name's UTF-8 bytes plus the binary CID's bytes; a folder
  exactly at the threshold stays basic;
- like ``ipfs add -r``, names starting with ``.`` are left out unless ``hidden``; the
  folder itself is always added. Symlinks and special files are refused (kubo would
  store a symlink as a UnixFS symlink; a dataset has no use for one).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aitbc.errors import NotFoundError, UsageError
from aitbc.storage.cid import CODEC_DAG_PB, Cid, CidHasher
from aitbc.storage.unixfs import DIR_DATA, MAX_DEPTH, Link, check_name, encode_node, hamt_data, hamt_hash

HAMT_THRESHOLD = 262_144  # kubo's Import.UnixFSHAMTDirectorySizeThreshold (boxo HAMTShardingSize)
_READ_SIZE = 1 << 20


@dataclass
class Added:
    """A file or folder as blobs: ``root`` is its CID; ``nodes`` the directory and HAMT
    nodes (block bytes by CID); ``files`` each file's CID and a path it was read from.
    ``blocks`` is every blob by CID, files read into memory: what a store needs to hold
    the whole DAG (:meth:`LocalBlobStore.put_blob` takes each). ``entries``: every file and
    folder's relative posix path (the root's is ``""``) and CID, files then their folder,
    as ``ipfs add -r`` lists them."""

    root: str
    nodes: dict[str, bytes] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # bytes of each blob
    entries: list[tuple[str, str]] = field(default_factory=list)

    @property
    def blocks(self) -> dict[str, bytes]:
        out = dict(self.nodes)
        for cid, path in self.files.items():
            out[cid] = path.read_bytes()
        return out

    @property
    def size(self) -> int:
        """Bytes of all blobs (each counted once)."""
        return sum(self.sizes.values())


@dataclass(frozen=True, slots=True)
class _Child:
    name: bytes  # UTF-8
    cid: Cid
    tsize: int


def _refuse(path: Path, what: str) -> UsageError:
    return UsageError(f"{path} is {what}; only regular files and folders can be added")


def add_path(path: str | Path, *, hidden: bool = False, progress: Callable[[int, int], None] | None = None) -> Added:
    """The DAG of the file or folder at ``path`` (see the module's docstring).

    ``progress(done, total)``: called as the files are read, with the bytes hashed so far
    and :func:`input_bytes` (counted first; raised to ``done`` should a file grow meanwhile),
    from 0 up to the total."""
    path = Path(path)
    on_read: Callable[[int], None] | None = None
    if progress is not None:
        total, done = input_bytes(path, hidden=hidden), 0
        progress(0, total)

        def on_read(n: int) -> None:
            nonlocal done, total
            done += n
            total = max(total, done)
            progress(done, total)

    try:
        st = path.lstat()
    except FileNotFoundError:
        raise NotFoundError(f"no such file or folder: {path}") from None
    added = Added(root="")
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "a symlink")
    if stat.S_ISDIR(st.st_mode):
        root = _add_dir(path, "", added, hidden, 0, on_read)
    elif stat.S_ISREG(st.st_mode):
        root = _add_file(path, "", added, on_read)
    else:
        raise _refuse(path, "a special file (device, pipe or socket)")
    added.root = str(root.cid)
    return added


def input_bytes(path: str | Path, *, hidden: bool = False) -> int:
    """Bytes of the files :func:`add_path` reads for ``path`` (names starting with ``.``
    left out unless ``hidden``; what it would refuse counts 0): a look at sizes only."""
    path = Path(path)
    try:
        st = path.lstat()
    except OSError:
        return 0
    if stat.S_ISREG(st.st_mode):
        return st.st_size
    if not stat.S_ISDIR(st.st_mode):
        return 0
    total = 0
    for top, dirs, files in os.walk(path):
        if not hidden:
            dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if hidden or not name.startswith("."):
                try:
                    fst = os.lstat(os.path.join(top, name))
                except OSError:
                    continue
                total += fst.st_size if stat.S_ISREG(fst.st_mode) else 0
    return total


def _add_file(path: Path, rel: str, added: Added, on_read: Callable[[int], None] | None = None) -> _Child:
    hasher = CidHasher()
    try:
        with path.open("rb") as f:
            while block := f.read(_READ_SIZE):
                hasher.update(block)
                if on_read is not None:
                    on_read(len(block))
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    cid = str(hasher.cid())
    added.files.setdefault(cid, path)
    added.sizes[cid] = hasher.size
    added.entries.append((rel, cid))
    return _Child(b"", hasher.cid(), hasher.tsize)


def _add_dir(
    path: Path, rel: str, added: Added, hidden: bool, depth: int, on_read: Callable[[int], None] | None = None
) -> _Child:
    if depth >= MAX_DEPTH:
        raise UsageError(f"{path}: folders nested over {MAX_DEPTH} deep")
    children: list[_Child] = []
    try:
        listing = sorted(os.scandir(path), key=lambda e: os.fsencode(e.name))
    except OSError as e:
        raise UsageError(f"cannot list {path}: {e.strerror or e}") from None
    for entry in listing:
        if entry.name.startswith(".") and not hidden:
            continue
        try:
            name = entry.name.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"{entry.path!r}: a name that is not UTF-8 cannot be stored in a folder") from None
        try:  # what every read of the folder checks (a backslash: a separator where it is written back)
            check_name(entry.name)
        except ValueError:
            raise UsageError(
                f"{entry.path!r}: a name with a backslash cannot be stored in a folder (it reads back as a path)"
            ) from None
        sub = f"{rel}/{entry.name}" if rel else entry.name
        child_path = Path(entry.path)
        if entry.is_symlink():
            raise _refuse(child_path, "a symlink")
        if entry.is_dir(follow_symlinks=False):
            child = _add_dir(child_path, sub, added, hidden, depth + 1, on_read)
        elif entry.is_file(follow_symlinks=False):
            child = _add_file(child_path, sub, added, on_read)
        else:
            raise _refuse(child_path, "a special file (device, pipe or socket)")
        children.append(_Child(name, child.cid, child.tsize))
    node = _directory(children, added)
    added.entries.append((rel, str(node.cid)))
    return node


def _store_node(block: bytes, links: list[Link], added: Added) -> _Child:
    cid = Cid.of_block(CODEC_DAG_PB, block)
    added.nodes[str(cid)] = block
    added.sizes[str(cid)] = len(block)
    return _Child(b"", cid, len(block) + sum(link.tsize for link in links))


def _directory(children: list[_Child], added: Added) -> _Child:
    """A basic directory, or a HAMT past the threshold (``children`` sorted by name)."""
    estimate = sum(len(c.name) + len(c.cid.to_bytes()) for c in children)
    if estimate > HAMT_THRESHOLD:
        return _shard(children, 0, added)
    links = [Link(c.name.decode(), c.cid, c.tsize) for c in children]
    return _store_node(encode_node(links, DIR_DATA), links, added)


def _shard(children: list[_Child], depth: int, added: Added) -> _Child:
    if depth >= 8:
        raise UsageError("two names with the same 64-bit HAMT hash; rename one of them")
    slots: dict[int, list[_Child]] = {}
    for child in children:
        slots.setdefault(hamt_hash(child.name)[depth], []).append(child)
    links = []
    for slot in sorted(slots):
        group = slots[slot]
        label = f"{slot:02X}"
        if len(group) == 1:
            links.append(Link(label + group[0].name.decode(), group[0].cid, group[0].tsize))
        else:
            sub = _shard(group, depth + 1, added)
            links.append(Link(label, sub.cid, sub.tsize))
    data = hamt_data(sum(1 << slot for slot in slots))
    return _store_node(encode_node(links, data), links, added)
