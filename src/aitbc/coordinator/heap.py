"""The coordinator process's C heap: large frees go back to the system.

glibc's malloc serves an allocation of at least its mmap threshold with a mapping of its
own, unmapped when freed; smaller ones come from per-thread arenas, whose freed memory
stays with the process. The threshold starts at 128 KiB but rises to the size of each
mapped block freed (up to 32 MiB), so after the first freed tensor of a few MiB every
later one of that size is carved from an arena: a 25M-parameter model's layers (1-4 MiB
each, loaded, copied and freed by every close, evaluation and score, each on its own
thread) and the 1 MiB blocks of streamed uploads then pile up in the arenas as freed
memory the process keeps (``bench/live_large.py``). :func:`return_large_frees` fixes the
threshold (which also stops it rising), so such blocks are mapped and given back when
freed. Elsewhere than glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # mallopt's parameter (glibc malloc.h)
MMAP_THRESHOLD = 256 << 10  # bytes: allocations from this size up are mapped, and unmapped when freed


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def return_large_frees(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process; False where the
    C library is not glibc (nothing changed) or refused the value."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold)))
