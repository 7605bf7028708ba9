"""BlobCache: a worker's size-capped LRU cache of verified blobs; LocalBlobStore.touch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aitbc.errors import IntegrityError, UsageError
from aitbc.storage.blobstore import BlobCache, LocalBlobStore
from aitbc.storage.cid import cid_of_bytes


def _blobs(n: int, size: int) -> dict[str, bytes]:
    out = {}
    for i in range(n):
        data = bytes([i]) * size
        out[cid_of_bytes(data)] = data
    return out


class Source:
    """Where a cache miss fetches from (a coordinator, in a worker); counts the fetches."""

    def __init__(self, blobs: dict[str, bytes]) -> None:
        self.blobs, self.fetched = blobs, []

    def __call__(self, cid: str) -> bytes:
        self.fetched.append(cid)
        return self.blobs[cid]


def _age(cache: BlobCache, cid: str, seconds_ago: float) -> None:
    t = os.stat(cache.store.dir / cid).st_mtime - seconds_ago
    os.utime(cache.store.dir / cid, (t, t))


def test_stays_under_its_cap_and_evicts_least_recently_used_first(tmp_path: Path):
    blobs = _blobs(6, 1000)
    cids = list(blobs)
    cache = BlobCache(tmp_path, max_bytes=3000)
    src = Source(blobs)
    for i, cid in enumerate(cids[:3]):
        assert cache.get(cid, src) == blobs[cid]
        _age(cache, cid, 100 - i)  # stored in order 0, 1, 2: 0 is the oldest
    cache.get(cids[0], src)  # a hit: 0 is now the most recently used, 1 the least
    assert src.fetched == cids[:3]
    cache.get(cids[3], src)
    held = {b.cid for b in cache.store.list()}
    assert held == {cids[0], cids[2], cids[3]} and cache.size() <= 3000
    for cid in cids:
        cache.get(cid, src)
        assert cache.size() <= 3000
    assert len(src.fetched) > 6  # evicted blobs were fetched again


def test_a_blob_larger_than_the_cap_is_kept_alone(tmp_path: Path):
    small, big = list(_blobs(1, 10)), list(_blobs(1, 5000))
    blobs = {**_blobs(1, 10), **_blobs(1, 5000)}
    cache = BlobCache(tmp_path, max_bytes=1000)
    cache.get(small[0], Source(blobs))
    assert cache.get(big[0], Source(blobs)) == blobs[big[0]]
    assert [b.cid for b in cache.store.list()] == big  # the one about to be used stays


def test_a_fetch_that_does_not_hash_to_its_cid_is_refused_and_not_kept(tmp_path: Path):
    blobs = _blobs(2, 100)
    a, b = list(blobs)
    cache = BlobCache(tmp_path, max_bytes=10_000)
    with pytest.raises(IntegrityError):
        cache.get(a, lambda _cid: blobs[b])  # a lying source
    assert cache.store.list() == []


def test_a_damaged_cached_copy_is_fetched_again(tmp_path: Path):
    blobs = _blobs(1, 100)
    (cid,) = blobs
    cache = BlobCache(tmp_path, max_bytes=10_000)
    src = Source(blobs)
    cache.get(cid, src)
    (cache.store.dir / cid).write_bytes(b"x" * 100)
    assert cache.get(cid, src) == blobs[cid] and src.fetched == [cid, cid]


def test_a_negative_cap_is_refused(tmp_path: Path):
    with pytest.raises(UsageError):
        BlobCache(tmp_path, max_bytes=-1)


def test_touch_renews_the_mtime_and_says_whether_it_is_held(tmp_path: Path):
    store = LocalBlobStore(tmp_path)
    cid = store.put_bytes(b"data")
    os.utime(store.dir / cid, (1000.0, 1000.0))
    assert store.touch(cid) and os.stat(store.dir / cid).st_mtime > 1000.0
    assert not store.touch(cid_of_bytes(b"other"))
