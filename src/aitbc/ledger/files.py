"""Private files that appear whole or not at all: 0700 folders, 0600 files written to a
temporary file beside their place, fsynced, then linked in (wallet keys, their records)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from aitbc.errors import AitbcError

TEMP_PREFIX = ".tmp-"  # a name no wallet can have (they start with a letter or digit)


def mkdir_private(path: Path) -> None:
    """Create ``path`` (0700) if missing; parents as usual. An existing one is left as is."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        if not path.is_dir():
            raise AitbcError(f"{path} exists and is not a directory") from None
        return
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return mkdir_private(path)
    os.chmod(path, 0o700)  # mkdir's mode is masked by the umask; make it exact


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_exclusive(dest: Path, data: bytes) -> bool:
    """Write ``data`` to ``dest`` (mode 0600) atomically, only if ``dest`` does not exist.

    The bytes go to a temporary file beside it, are fsynced, then hard-linked to ``dest``
    (``link`` fails if ``dest`` exists, so of two racing writers exactly one wins).
    Returns False if ``dest`` already existed."""
    temp = dest.parent / f"{TEMP_PREFIX}{secrets.token_hex(8)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, dest)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: best effort, no clobbering
            if dest.exists():
                return False
            os.replace(temp, dest)
    finally:
        temp.unlink(missing_ok=True)
    fsync_dir(dest.parent)
    return True


def replace_private(dest: Path, data: bytes) -> None:
    """Write ``data`` to ``dest`` (0600), replacing it whole (a temporary file renamed over it)."""
    temp = dest.parent / f"{TEMP_PREFIX}{secrets.token_hex(8)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, dest)
    finally:
        temp.unlink(missing_ok=True)
    fsync_dir(dest.parent)
