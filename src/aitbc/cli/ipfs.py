"""``aitbc ipfs``: add, read and list blobs in the local content-addressed store.

The CIDs are the ones ``ipfs add --cid-version=1`` prints for the same file, so a blob
added here can be checked against any IPFS node. Blobs live in ``HOME/blobs``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from aitbc.cli.common import DEFAULT_HOME, HomeOption, err, resolve_home
from aitbc.errors import NotFoundError, UsageError
from aitbc.storage.blobstore import LocalBlobStore

app = typer.Typer(
    help="Content-addressed blobs named by their IPFS CIDv1 (as `ipfs add --cid-version=1`).",
    no_args_is_help=True,
)


def _store(home: Path) -> LocalBlobStore:
    return LocalBlobStore(resolve_home(home))


@app.command()
def add(
    path: Annotated[Path, typer.Argument(help="The file to add.", show_default=False)],
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Store a file and print its CID."""
    if path.is_dir():
        raise UsageError(f"{path} is a directory; aitbc ipfs add takes one file")
    if not path.exists():
        raise NotFoundError(f"no such file: {path}")
    typer.echo(_store(home).put_file(path))


@app.command()
def cat(
    cid: Annotated[str, typer.Argument(help="The blob's CID.", show_default=False)],
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Write a blob's bytes to standard output (verified before the first byte)."""
    with _store(home).open(cid) as blob:
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
    cid: Annotated[str, typer.Argument(help="The blob's CID.", show_default=False)],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="File to write.  [default: ./CID]"),
    ] = None,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Write a blob to a file; the file appears only once its content is verified."""
    dest = output if output is not None else Path(cid)
    _store(home).get_to_path(cid, dest)
    err.print(f"saved {cid} to {dest}", highlight=False)


@app.command("ls")
def ls(home: HomeOption = DEFAULT_HOME) -> None:
    """List the blobs held: one line per blob, its CID and its size in bytes."""
    store = _store(home)
    blobs = store.list()
    for blob in blobs:
        typer.echo(f"{blob.cid}\t{blob.size}")
    if not blobs:
        err.print(f"no blobs in {store.dir}", highlight=False)
