"""Blob stores: bytes named by their IPFS CIDv1, checked against that name on every read.

A CID is a hash of the content (see :mod:`aitbc.storage.cid`), so a store never has to be
trusted: whatever a backend returns is hashed again and refused if it does not match the
CID that was asked for. A blob is a whole file under its file CID, or a folder's
directory node under the node's CID (:mod:`aitbc.storage.unixfs`). ``BlobStore`` is the interface every backend implements (this
module's local directory; later the coordinator's HTTP blob endpoint).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO, NamedTuple, Protocol, runtime_checkable

from aitbc.errors import AitbcError, IntegrityError, NotFoundError, UsageError
from aitbc.storage.cid import CODEC_DAG_PB, CidHasher, cid_of_bytes, parse_cid
from aitbc.storage.unixfs import MAX_NODE_BYTES, BlobHasher

_COPY_SIZE = 1 << 20
_TEMP_PREFIX = ".tmp-"


class BlobInfo(NamedTuple):
    cid: str
    size: int  # bytes


BlobList = list[BlobInfo]  # an alias, because ``list`` is a method name in the classes below


@runtime_checkable
class BlobStore(Protocol):
    """Content-addressed storage of whole blobs. Every read verifies the content's CID.

    Errors: an invalid CID string is a ``UsageError``; a blob the store does not hold is a
    ``NotFoundError``; content that does not hash to its CID is an ``IntegrityError``.
    """

    def put_bytes(self, data: bytes) -> str:
        """Store ``data``; returns its CID. Storing the same bytes twice is harmless."""
        ...

    def put_file(self, path: Path) -> str:
        """Store the file at ``path``, streaming; returns its CID."""
        ...

    def get_bytes(self, cid: str) -> bytes:
        """The verified content of ``cid``."""
        ...

    def open(self, cid: str) -> BinaryIO:
        """A binary file object over the content of ``cid``, verified before it is returned."""
        ...

    def get_to_path(self, cid: str, dest: Path) -> None:
        """Write the content of ``cid`` to ``dest``; ``dest`` appears only once verified."""
        ...

    def has(self, cid: str) -> bool:
        """Whether the store holds a blob named ``cid`` (its content is not read)."""
        ...

    def list(self) -> BlobList:
        """Every blob held, sorted by CID."""
        ...

    def delete(self, cid: str) -> None:
        """Remove the blob ``cid``; a ``NotFoundError`` if it is not held."""
        ...


class LocalBlobStore:
    """Blobs as whole files in ``root/blobs/<cid>``: the embedded default backend.

    Writes go to a temporary file in the same directory, are fsynced, then renamed into
    place, so a crash never leaves a partial blob under a CID name. ``max_size`` (bytes)
    refuses larger blobs on write. ``durable=False``: no fsyncs, for a cache that a crash
    may lose (a worker's copies of the global model: each fsync pair cost ~9 ms here, per
    round); a blob is still renamed into place only once it hashes to its CID.
    """

    def __init__(self, root: Path, *, max_size: int | None = None, durable: bool = True) -> None:
        if max_size is not None and max_size < 0:
            raise UsageError(f"max_size must be >= 0 bytes or None, got {max_size}")
        self.root = Path(root)
        self.dir = self.root / "blobs"
        self.max_size = max_size
        self.durable = durable

    # --- writing ---------------------------------------------------------------------

    def put_bytes(self, data: bytes) -> str:
        self._check_size(len(data))
        cid = cid_of_bytes(data)
        self.dir.mkdir(parents=True, exist_ok=True)
        temp = _write_temp(self.dir, lambda f: f.write(data), durable=self.durable)
        _commit(temp, self.dir / cid, durable=self.durable)
        return cid

    def put_file(self, path: Path) -> str:
        path = Path(path)
        if path.is_dir():
            raise UsageError(f"{path} is a directory; a blob is one file")
        try:
            source = path.open("rb")
        except FileNotFoundError:
            raise NotFoundError(f"no such file: {path}") from None
        except OSError as e:
            raise AitbcError(f"cannot read {path}: {e.strerror or e}") from e
        self.dir.mkdir(parents=True, exist_ok=True)
        hasher = CidHasher()
        with source:
            # The CID is known only at the end, so copy under a temporary name first.
            temp = _write_temp(self.dir, _copier(source, hasher, self._check_size), durable=self.durable)
        cid = str(hasher.cid())
        _commit(temp, self.dir / cid, durable=self.durable)
        return cid

    def put_blob(self, cid: str, data: bytes) -> str:
        """Store ``data`` under a CID claimed for it: a file's bytes, or a folder's
        directory node (:class:`~aitbc.storage.unixfs.BlobHasher`); a mismatch is an
        ``IntegrityError`` and stores nothing."""
        with self.writer(cid) as w:
            w.write(data)
            return w.commit()

    def put_many(
        self, blobs: Iterable[tuple[str, bytes | Path]], *, progress: Callable[[int], None] | None = None
    ) -> list[str]:
        """Store many blobs (a folder's nodes and files: bytes, or a file to copy) under the
        CIDs claimed for them, skipping those held; returns the CIDs stored. Each is
        written to a temporary file and checked against its CID; then one ``os.sync``
        makes them all durable before they are renamed into place (one fsync per blob
        made adding a folder of small files ten times slower). A mismatch (a file changed
        since it was hashed) stores none of them. ``progress(n)``: called with the bytes of
        each piece written (a held blob's as it is skipped), so their sum is every blob's."""
        self.dir.mkdir(parents=True, exist_ok=True)
        pending: list[tuple[Path, str]] = []
        taken: set[str] = set()  # the CIDs in pending (a list scan per blob was quadratic: 20k blobs 48 s)
        try:
            for cid, source in blobs:
                if cid in taken or self.has(cid):
                    if progress is not None:
                        progress(source.stat().st_size if isinstance(source, Path) else len(source))
                    continue
                hasher = BlobHasher()
                fd, temp = _new_temp(self.dir)
                pending.append((temp, cid))
                taken.add(cid)
                with os.fdopen(fd, "wb") as f:
                    if isinstance(source, Path):
                        with source.open("rb") as src:
                            _copier(src, hasher, self._check_size, progress)(f)
                    else:
                        self._check_size(len(source))
                        hasher.update(source)
                        f.write(source)
                        if progress is not None:
                            progress(len(source))
                if not hasher.matches(cid):
                    what = source if isinstance(source, Path) else "a blob"
                    raise IntegrityError(f"{what} changed while it was being stored: it no longer hashes to {cid}")
            if pending:
                if self.durable:
                    os.sync()
                for temp, cid in pending:
                    os.replace(temp, self.dir / cid)
                if self.durable:
                    _fsync_dir(self.dir)
        except BaseException:
            for temp, _ in pending:
                temp.unlink(missing_ok=True)
            raise
        return [cid for _, cid in pending]

    def writer(self, cid: str) -> BlobWriter:
        """An incremental write of a blob whose CID is claimed up front (an upload): feed
        chunks as they arrive; :meth:`BlobWriter.commit` stores it only if the bytes hash
        to ``cid``. Over ``max_size`` or a mismatch, nothing is stored."""
        parse_cid(cid)
        self.dir.mkdir(parents=True, exist_ok=True)
        return BlobWriter(self, cid)

    # --- reading ---------------------------------------------------------------------

    def get_bytes(self, cid: str) -> bytes:
        path = self._path(cid)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise self._missing(cid) from None
        hasher = BlobHasher()
        hasher.update(data)
        _verify(cid, hasher)
        return data

    def open(self, cid: str) -> BinaryIO:
        # Hash through the same open file, then rewind: a blob swapped in by rename after
        # the check cannot reach the caller, who reads the inode that was verified.
        try:
            stream = self._path(cid).open("rb")
        except FileNotFoundError:
            raise self._missing(cid) from None
        try:
            hasher = BlobHasher()
            while block := stream.read(_COPY_SIZE):
                hasher.update(block)
            _verify(cid, hasher)
            stream.seek(0)
        except BaseException:
            stream.close()
            raise
        return stream

    def get_to_path(self, cid: str, dest: Path) -> None:
        dest = Path(dest)
        if dest.is_dir():
            raise UsageError(f"{dest} is a directory; give the path of the file to write")
        try:
            source = self._path(cid).open("rb")
        except FileNotFoundError:
            raise self._missing(cid) from None
        if not dest.parent.is_dir():
            source.close()
            raise NotFoundError(f"no such directory: {dest.parent}")
        hasher = BlobHasher()
        with source:
            try:
                temp = _write_temp(dest.parent, _copier(source, hasher))
            except OSError as e:
                raise AitbcError(f"cannot write {dest}: {e.strerror or e}") from e
        try:
            _verify(cid, hasher)
        except IntegrityError:
            temp.unlink()
            raise
        _commit(temp, dest)

    def has(self, cid: str) -> bool:
        return self._path(cid).is_file()

    def list(self) -> BlobList:
        """Blobs in ``root/blobs``; temporary files and names that are not CIDs are skipped."""
        if not self.dir.is_dir():
            return []
        infos = []
        for entry in os.scandir(self.dir):
            if entry.name.startswith(".") or not entry.is_file():
                continue
            try:
                parse_cid(entry.name)
            except UsageError:
                continue  # not ours (an editor's backup, a stray copy): not a blob
            infos.append(BlobInfo(entry.name, entry.stat().st_size))
        return sorted(infos)

    def delete(self, cid: str) -> None:
        try:
            self._path(cid).unlink()
        except FileNotFoundError:
            raise self._missing(cid) from None

    def size(self, cid: str) -> int:
        """Bytes of the blob ``cid``; a ``NotFoundError`` if it is not held."""
        try:
            return self._path(cid).stat().st_size
        except FileNotFoundError:
            raise self._missing(cid) from None

    def peek_node(self, cid: str) -> bytes | None:
        """The bytes of ``cid`` when it could be a folder's directory node (dag-pb, at
        most ``MAX_NODE_BYTES``), else None; unverified (the caller checks what it
        decodes, see :func:`aitbc.storage.unixfs.reachable`). A ``NotFoundError`` if not held."""
        path = self._path(cid)
        try:
            size = path.stat().st_size
            if parse_cid(cid).codec != CODEC_DAG_PB or size > MAX_NODE_BYTES:
                return None
            return path.read_bytes()
        except FileNotFoundError:
            raise self._missing(cid) from None

    def touch(self, cid: str) -> bool:
        """Set the blob's mtime to now (a use: see :class:`BlobCache`; a PUT of a blob
        already held, so retention's grace period starts again). False if not held."""
        try:
            os.utime(self._path(cid))
        except FileNotFoundError:
            return False
        return True

    # --- helpers ---------------------------------------------------------------------

    def _path(self, cid: str) -> Path:
        parse_cid(cid)  # canonical form is checked, so the string is the file name
        return self.dir / cid

    def _missing(self, cid: str) -> NotFoundError:
        return NotFoundError(f"no blob {cid} in {self.dir}")

    def _check_size(self, size: int) -> None:
        if self.max_size is not None and size > self.max_size:
            raise AitbcError(
                f"blob too large: at least {size} bytes, over this store's max_size of {self.max_size} bytes"
            )


class BlobCache:
    """A size-capped cache of blobs by CID (a worker's copies of models and shards): least
    recently used blobs go first once the total passes ``max_bytes``.

    Recency is the file's mtime, set on every hit and store, so it survives restarts and
    does not depend on how the file system keeps access times. The blob just stored is never
    evicted, even alone over the cap (it is about to be used); ``max_bytes`` 0 keeps only it.
    """

    def __init__(self, root: Path, *, max_bytes: int) -> None:
        if max_bytes < 0:
            raise UsageError(f"max_bytes must be >= 0, got {max_bytes}")
        self.store = LocalBlobStore(root)
        self.max_bytes = max_bytes

    def get(self, cid: str, fetch: Callable[[str], bytes]) -> bytes:
        """The verified content of ``cid``: from the cache, else ``fetch(cid)`` (checked
        against ``cid`` and stored)."""
        cached = self._read(cid)
        if cached is not None:
            return cached
        data = fetch(cid)
        stored = self.store.put_bytes(data)
        if stored != cid:
            self.store.delete(stored)
            raise IntegrityError(f"blob {cid} is corrupt: its content hashes to {stored}")
        self.evict(keep=cid)
        return data

    def get_path(self, cid: str, fetch_into: Callable[[str, LocalBlobStore], object]) -> Path:
        """The path of the cached, verified blob ``cid``: from the cache (re-hashed as it is
        read, in 1 MiB blocks), else ``fetch_into(cid, store)``, which must stream it into
        the store (see :meth:`LocalBlobStore.writer`: checked against ``cid`` on the way
        in). No whole copy of the blob is held in memory either way."""
        if self.store.touch(cid):
            # NotFoundError: evicted by another process between the touch and the read; fetched below
            with contextlib.suppress(NotFoundError):
                try:
                    self.store.open(cid).close()  # verifies it
                    return self.store.dir / cid
                except IntegrityError:
                    self.store.delete(cid)  # damaged on disk: fetched again
        self.store.dir.mkdir(parents=True, exist_ok=True)
        fetch_into(cid, self.store)
        if not self.store.has(cid):
            raise IntegrityError(f"blob {cid} was not stored by its fetch")
        self.evict(keep=cid)
        return self.store.dir / cid

    def _read(self, cid: str) -> bytes | None:
        """The cached, verified content of ``cid`` (its recency renewed), or None when it
        must be fetched: not cached, evicted by another process between the touch and
        the read, or damaged (the damaged copy is deleted)."""
        if not self.store.touch(cid):
            return None
        try:
            return self.store.get_bytes(cid)
        except NotFoundError:
            return None
        except IntegrityError:
            self.store.delete(cid)
            return None

    def size(self) -> int:
        return sum(b.size for b in self.store.list())

    def evict(self, keep: str | None = None) -> list[str]:
        """Delete least recently used blobs until the total is within ``max_bytes``;
        returns the CIDs deleted."""
        entries = []
        for info in self.store.list():
            try:
                entries.append((os.stat(self.store.dir / info.cid).st_mtime, info))
            except FileNotFoundError:
                continue
        total = sum(info.size for _, info in entries)
        gone = []
        for _, info in sorted(entries):
            if total <= self.max_bytes:
                break
            if info.cid == keep:
                continue
            with contextlib.suppress(NotFoundError):  # another process evicted it first
                self.store.delete(info.cid)
            total -= info.size
            gone.append(info.cid)
        return gone


class BlobWriter:
    """See :meth:`LocalBlobStore.writer`. A context manager: leaving it without a
    successful :meth:`commit` removes the temporary file."""

    def __init__(self, store: LocalBlobStore, cid: str) -> None:
        self.store, self.cid = store, cid
        self.hasher = BlobHasher()
        fd, self.temp = _new_temp(store.dir)
        self.file = os.fdopen(fd, "wb")
        self.done = False

    @property
    def size(self) -> int:
        return self.hasher.size

    def write(self, chunk: bytes) -> None:
        self.store._check_size(self.hasher.size + len(chunk))
        self.hasher.update(chunk)
        self.file.write(chunk)

    def commit(self) -> str:
        try:
            self.file.flush()
            if self.store.durable:
                os.fsync(self.file.fileno())
            self.file.close()
            _verify(self.cid, self.hasher)
        except BaseException:
            self.abort()
            raise
        _commit(self.temp, self.store.dir / self.cid, durable=self.store.durable)
        self.done = True
        return self.cid

    def abort(self) -> None:
        if not self.file.closed:
            self.file.close()
        self.temp.unlink(missing_ok=True)
        self.done = True

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.done:
            self.abort()


def _verify(cid: str, hasher: BlobHasher) -> None:
    if not hasher.matches(cid):
        raise IntegrityError(
            f"blob {cid} is corrupt: its content hashes to {hasher.found()}; delete it and add or fetch the blob again"
        )


def _new_temp(directory: Path) -> tuple[int, Path]:
    """An exclusive new file in ``directory``, mode 0666 less the umask like any new file."""
    while True:
        path = directory / f"{_TEMP_PREFIX}{secrets.token_hex(8)}"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), path
        except FileExistsError:
            continue


def _write_temp(directory: Path, write: Callable[[BinaryIO], object], *, durable: bool = True) -> Path:
    """Run ``write`` on a new temporary file in ``directory``, then (``durable``) fsync it.

    On any error (including one ``write`` raises to stop early) the file is removed.
    """
    fd, temp = _new_temp(directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def _copier(
    source: BinaryIO,
    hasher: CidHasher | BlobHasher,
    limit: Callable[[int], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Callable[[BinaryIO], None]:
    """A ``write`` for :func:`_write_temp` that copies ``source`` and hashes what it copies.

    ``limit`` is called with the running size and may raise to stop the copy; ``progress``
    with each block's bytes once written.
    """

    def copy(f: BinaryIO) -> None:
        while block := source.read(_COPY_SIZE):
            hasher.update(block)
            if limit is not None:
                limit(hasher.size)
            f.write(block)
            if progress is not None:
                progress(len(block))

    return copy


def _commit(temp: Path, dest: Path, *, durable: bool = True) -> None:
    """Rename ``temp`` over ``dest`` and (``durable``) fsync the directory so the rename is durable."""
    try:
        os.replace(temp, dest)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(dest.parent)


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
