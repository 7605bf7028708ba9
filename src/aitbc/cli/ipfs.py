"""``aitbc ipfs``: add, read and list files and folders in the content-addressed store.

The CIDs are the ones ``ipfs add --cid-version=1`` (``-r`` for a folder) prints for the
same file or folder, so what is added here can be checked against any IPFS node. Blobs
live in ``HOME/blobs``; a CID not there is fetched from the coordinator (``--coordinator``,
``AITBC_COORDINATOR``, the local stack's), so the blobs of a training (its model, shards,
uploads) read the same way. Every blob read is checked against its CID.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from aitbc.cli.common import DEFAULT_HOME, CoordinatorOption, HomeOption, err, resolve_home, shown_name
from aitbc.cli.progress import MIN_ADD_BYTES, at_terminal, bars
from aitbc.errors import AitbcError, IntegrityError, NotFoundError, UsageError
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.cid import parse_cid
from aitbc.storage.unixfs import is_dir_block, list_dir, resolve, split_path, walk
from aitbc.storage.unixfs_add import add_path, input_bytes

app = typer.Typer(
    help="Files and folders named by their IPFS CIDv1 (as 'ipfs add --cid-version=1' prints, with -r for folders).",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
TargetArg = Annotated[str, typer.Argument(help="A CID, or CID/path inside a folder.", show_default=False)]


def _store(home: Path) -> LocalBlobStore:
    return LocalBlobStore(resolve_home(home))


class Blobs:
    """Blobs by CID: the local store first, else the coordinator (the SDK's
    ``get_from_ipfs``; :mod:`aitbc.storage.unixfs` checks every blob it reads against its
    CID too)."""

    def __init__(self, home: Path, coordinator: str | None) -> None:
        self.home = resolve_home(home)
        self.store = LocalBlobStore(self.home)
        self.explicit = coordinator
        self._agent: Any = None

    def get(self, cid: str) -> bytes:
        if self.store.has(cid):
            return self.store.get_bytes(cid)
        return self._fetch(cid)

    def _fetch(self, cid: str) -> bytes:
        """From the coordinator, through the SDK (which checks the bytes against the CID)."""
        from aitbc.cli.common import agent
        from aitbc_agent_sdk.errors import CoordinatorUnreachable, NotFound

        if self._agent is None:
            self._agent = agent(self.home, self.explicit)
        try:
            return self._agent.get_from_ipfs(cid)
        except CoordinatorUnreachable as e:
            raise NotFoundError(f"no blob {cid} in {self.store.dir}, and no coordinator to ask: {e.detail}") from None
        except NotFound:
            where = self._agent.config.resolved_coordinator_url
            raise NotFoundError(f"no blob {cid} in {self.store.dir} or on the coordinator at {where}") from None

    def close(self) -> None:
        if self._agent is not None:
            self._agent.stop()


@app.command()
def add(
    path: Annotated[Path, typer.Argument(help="The file (or, with -r, folder) to add.", show_default=False)],
    recursive: Annotated[bool, typer.Option("--recursive", "-r", help="Add a folder and everything in it.")] = False,
    hidden: Annotated[bool, typer.Option("--hidden", "-H", help="Include names starting with '.' (-r).")] = False,
    json_out: JsonOption = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Store a file, or a folder with -r, and print its CID.

    The CID is kubo's for the same input; as with 'ipfs add -r', names starting with '.' are
    left out unless --hidden. At a terminal, an input of 8 MiB or more shows its hashing and
    storing on standard error."""
    if path.is_dir() and not path.is_symlink() and not recursive:
        raise UsageError(f"{path} is a folder; add it with -r (aitbc ipfs add -r {path})")
    if not path.exists() and not path.is_symlink():
        raise NotFoundError(f"no such file: {path}")
    large = at_terminal(json_out) and input_bytes(path, hidden=hidden) >= MIN_ADD_BYTES
    with bars(json_out, show=large) as report:
        hashed = None if report is None else (lambda done, total: report("hash", done, total))
        added = add_path(path, hidden=hidden, progress=hashed)
        blobs: list[tuple[str, bytes | Path]] = [*added.nodes.items(), *added.files.items()]
        stored = 0

        def written(n: int) -> None:
            nonlocal stored
            stored += n
            if report is not None:
                report("store", stored, max(stored, added.size))

        try:
            _store(home).put_many(blobs, progress=None if report is None else written)
        except IntegrityError as e:
            raise AitbcError(f"{e}; add it again") from None
    if json_out:
        entries = [{"path": p, "cid": c} for p, c in added.entries]
        typer.echo(json.dumps({"cid": added.root, "bytes": added.size, "blobs": len(added.sizes), "entries": entries}))
    else:
        typer.echo(added.root)


@app.command()
def cat(
    target: TargetArg,
    coordinator: CoordinatorOption = None,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Write a file's bytes to standard output, verified before the first byte.

    A file inside a folder is CID/path."""
    root, parts = split_path(target)
    store = _store(home)
    if not parts and store.has(root):
        with store.open(root) as blob:  # streamed: a large file is not held in memory
            _write_stdout(blob)
        return
    blobs = Blobs(home, coordinator)
    try:
        cid = resolve(blobs.get, target)
        entry = next(walk(blobs.get, cid, max_entries=1))
    finally:
        blobs.close()
    if entry.kind == "dir":
        raise UsageError(f"{target} is a folder; list it with aitbc ipfs ls, or write it with aitbc ipfs get")
    assert entry.data is not None
    _write_stdout(_Bytes(entry.data))


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        out, self.pos = self.data[self.pos : end], min(end, len(self.data))
        return out


def _write_stdout(blob: Any) -> None:
    try:
        shutil.copyfileobj(blob, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        # The reader left (`aitbc ipfs cat CID | head`): stop quietly, as cat does,
        # and keep Python from failing again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(1) from None


@app.command()
def get(
    target: TargetArg,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="File or folder to write (must not exist for a folder).  \\[default: ./NAME]"
        ),
    ] = None,
    json_out: JsonOption = False,
    coordinator: CoordinatorOption = None,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Write a file, or a folder with everything in it, to disk.

    It appears only once all of it is verified."""
    root, parts = split_path(target)
    dest = output if output is not None else Path(parts[-1] if parts else root)
    store = _store(home)
    if not parts and store.has(root) and not _is_folder(store, root):
        store.get_to_path(root, dest)
        _saved(target, dest, 1, json_out)
        return
    blobs = Blobs(home, coordinator)
    try:
        cid = resolve(blobs.get, target)
        entries = walk(blobs.get, cid)
        first = next(entries)
        if first.kind == "file":
            assert first.data is not None
            _write_file(dest, first.data)
            _saved(target, dest, 1, json_out)
            return
        if dest.exists():
            raise UsageError(f"{dest} already exists; choose another with -o")
        if not dest.parent.is_dir():
            raise NotFoundError(f"no such directory: {dest.parent}")
        files = _write_folder(dest, entries)
    finally:
        blobs.close()
    _saved(target, dest, files, json_out)


def _is_folder(store: LocalBlobStore, cid: str) -> bool:
    block = store.peek_node(cid)  # None: too large, or raw, to be a folder's node
    return block is not None and is_dir_block(parse_cid(cid), block)


def _write_file(dest: Path, data: bytes) -> None:
    if dest.is_dir():
        raise UsageError(f"{dest} is a directory; give the path of the file to write")
    if not dest.parent.is_dir():
        raise NotFoundError(f"no such directory: {dest.parent}")
    fd, temp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, dest)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _write_folder(dest: Path, entries: Any) -> int:
    """Write the rest of a folder's walk under a temporary folder beside ``dest``, then
    rename it into place: nothing appears at ``dest`` unless every blob checked out."""
    temp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".tmp-"))
    files = 0
    try:
        for entry in entries:
            target = temp / entry.path  # each part is a checked single name (unixfs.check_name)
            if entry.kind == "dir":
                target.mkdir()
            else:
                target.write_bytes(entry.data)
                files += 1
        temp.chmod(0o777 & ~_umask())
        os.rename(temp, dest)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return files


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _saved(target: str, dest: Path, files: int, json_out: bool) -> None:
    if json_out:
        typer.echo(json.dumps({"target": target, "path": str(dest), "files": files}))
    else:
        err.print(f"saved {target} to {dest}", highlight=False)


@app.command("ls")
def ls(
    target: Annotated[
        str | None, typer.Argument(help="A folder's CID (or CID/path); none: the local blobs.", show_default=False)
    ] = None,
    json_out: JsonOption = False,
    coordinator: CoordinatorOption = None,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """List a folder: one line per entry, its CID, size and name.

    The size is the DAG's, in bytes; folders end with '/'; a name with a control character,
    which whoever made the folder chose, is printed quoted with it escaped, as Python writes
    it, never raw. Without a CID: the local blobs, CID and size."""
    if target is None:
        store = _store(home)
        blobs = store.list()
        if json_out:
            typer.echo(json.dumps({"data": [{"cid": b.cid, "size": b.size} for b in blobs], "count": len(blobs)}))
            return
        for blob in blobs:
            typer.echo(f"{blob.cid}\t{blob.size}")
        if not blobs:
            err.print(f"no blobs in {store.dir}", highlight=False)
        return
    getter = Blobs(home, coordinator)
    try:
        cid = resolve(getter.get, target)
        rows = [(name, c, size, _kind(getter, c)) for name, c, size in list_dir(getter.get, cid)]
    finally:
        getter.close()
    if json_out:
        data = [{"name": n, "cid": c, "size": s, "type": k} for n, c, s, k in rows]
        typer.echo(json.dumps({"cid": cid, "data": data, "count": len(data)}))
        return
    for name, c, size, kind in rows:
        typer.echo(f"{c}\t{size}\t{shown_name(name)}{'/' if kind == 'dir' else ''}")


def _kind(blobs: Blobs, cid: str) -> str:
    return next(walk(blobs.get, cid, max_entries=1, read_files=False)).kind
