"""The round driver's books thread's own copy of each live run's model, and its shards.

The rounds thread aggregates and checkpoints with the runtime's model under the runtime's
lock (:mod:`.runtime`); the books thread evaluates and scores closed rounds, which on a
large model takes longer than a round. With a model of its own (one copy per live run,
made once) it never holds that lock for a forward pass, so a round's close never waits
for the previous round's scoring.

Scoring measures each update on its own shard and on the others' (:mod:`.scoring`): every
round, every shard of the run. Decoded once and kept (:class:`ShardCache`, by content id,
so nothing in it goes stale), a small model's round no longer reads and decodes the whole
dataset again; a dataset past the cache's bound is read each round, as before. A finalized
run's shards leave the cache with its model.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections import OrderedDict
from collections.abc import Iterator

from torch import Tensor, nn

from aitbc.coordinator.context import Context
from aitbc.coordinator.live.runtime import RunRuntime
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.training.checkpoint import load_shard

# The most bytes of decoded shards the books thread keeps (all runs together).
SHARD_CACHE_BYTES = 256 << 20


class ShardCache:
    """Decoded shards ``(x, y)`` by content id; the least recently used leave once the
    cache holds more than ``limit_bytes``, and a shard larger than that is never kept.
    Each is noted under the runs that asked for it (``run``), so a run's can be dropped.
    Callers must not write into the tensors it hands out."""

    def __init__(self, limit_bytes: int = SHARD_CACHE_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self._shards: OrderedDict[str, tuple[Tensor, Tensor]] = OrderedDict()
        self._runs: dict[str, set[str]] = {}  # run -> the cids it asked for
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, store: LocalBlobStore, cid: str, run: str = "") -> tuple[Tensor, Tensor]:
        with self._lock:
            self._runs.setdefault(run, set()).add(cid)
            hit = self._shards.get(cid)
            if hit is not None:
                self._shards.move_to_end(cid)
                return hit
        shard = load_shard(store.get_bytes(cid))  # outside the lock: a large read blocks no other
        with self._lock:
            if _size(shard) <= self.limit_bytes and cid not in self._shards:
                self._shards[cid] = shard
                self._bytes += _size(shard)
                while self._bytes > self.limit_bytes:
                    _, old = self._shards.popitem(last=False)
                    self._bytes -= _size(old)
        return shard

    def drop_run(self, run: str) -> None:
        """Forget the shards ``run`` asked for (another run's use of the same CID reads it again)."""
        with self._lock:
            for cid in self._runs.pop(run, ()):
                shard = self._shards.pop(cid, None)
                if shard is not None:
                    self._bytes -= _size(shard)

    def __len__(self) -> int:
        return len(self._shards)

    @property
    def nbytes(self) -> int:
        return self._bytes


# Which books thread the caller is: the catch-up thread scores with a model of its own, so
# it never loads a checkpoint into the one the books thread is evaluating with.
_lane = threading.local()
CATCH_UP = "catch-up"


@contextlib.contextmanager
def books_lane(name: str) -> Iterator[None]:
    """Within this block, :func:`books_model` hands the calling thread lane ``name``'s copy."""
    before = getattr(_lane, "name", None)
    _lane.name = name
    try:
        yield
    finally:
        _lane.name = before


def books_model(ctx: Context, run_id: str, rt: RunRuntime) -> nn.Module:
    """Run ``run_id``'s model for the books thread, or the catch-up thread's own within
    :func:`books_lane` (copied from ``rt``'s under its lock, once)."""
    lane = getattr(_lane, "name", None)
    key = run_id if lane is None else f"{run_id}#{lane}"
    model = ctx.books_models.get(key)
    if model is None:
        with rt.lock:
            model = ctx.books_models[key] = copy.deepcopy(rt.model)
    return model


def drop_books_model(ctx: Context, run_id: str) -> None:
    """Forget run ``run_id``'s models and shards (it was finalized)."""
    ctx.books_models.pop(run_id, None)
    ctx.books_models.pop(f"{run_id}#{CATCH_UP}", None)
    if ctx.books_shards is not None:
        ctx.books_shards.drop_run(run_id)


def books_shards(ctx: Context, run_id: str, cids: list[str]) -> list[tuple[Tensor, Tensor]]:
    """Run ``run_id``'s decoded shards ``cids`` (from the process's :class:`ShardCache`, made
    on first use)."""
    cache = ctx.books_shards
    if cache is None:
        cache = ctx.books_shards = ShardCache()
    return [cache.get(ctx.store, cid, run_id) for cid in cids]


def _size(shard: tuple[Tensor, Tensor]) -> int:
    return sum(t.element_size() * t.numel() for t in shard)
