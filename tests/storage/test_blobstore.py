"""LocalBlobStore: round trips, verification on every read, atomic writes, errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aitbc.errors import AitbcError, IntegrityError, NotFoundError, UsageError
from aitbc.storage.blobstore import BlobInfo, BlobStore, LocalBlobStore
from aitbc.storage.cid import cid_of_bytes

HELLO = b"hello world\n"
HELLO_CID = "bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4"
ABSENT_CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"  # the empty file


@pytest.fixture
def store(tmp_path: Path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "home")


@pytest.fixture
def million(vectors_by_name, content_of) -> tuple[bytes, str]:
    """A four-chunk blob (a dag-pb root over raw leaves) and its CID."""
    vector = vectors_by_name["irregular 1000000"]
    return content_of(vector), vector["cid"]


def _tamper(store: LocalBlobStore, cid: str) -> None:
    path = store.dir / cid
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    path.write_bytes(bytes(data))


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_is_a_blob_store(store):
    assert isinstance(store, BlobStore)


def test_put_bytes_get_bytes_round_trip(store):
    cid = store.put_bytes(HELLO)

    assert cid == HELLO_CID
    assert (store.root / "blobs" / cid).read_bytes() == HELLO
    assert store.get_bytes(cid) == HELLO


def test_put_file_get_to_path_round_trip(store, million, tmp_path):
    data, expected_cid = million
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    dest = tmp_path / "copy.bin"

    cid = store.put_file(source)
    store.get_to_path(cid, dest)

    assert cid == expected_cid
    assert dest.read_bytes() == data
    assert _leftovers(store.dir) == []
    assert _leftovers(tmp_path) == []


def test_open_gives_verified_bytes(store, million):
    data, _ = million
    cid = store.put_bytes(data)

    with store.open(cid) as blob:
        assert blob.read() == data


def test_putting_twice_keeps_one_blob(store):
    first = store.put_bytes(HELLO)
    second = store.put_bytes(HELLO)

    assert first == second
    assert store.list() == [BlobInfo(HELLO_CID, len(HELLO))]


def test_has_list_delete(store, million):
    data, million_cid = million
    store.put_bytes(data)
    store.put_bytes(HELLO)

    listed = store.list()
    store.delete(HELLO_CID)

    assert listed == sorted([BlobInfo(million_cid, len(data)), BlobInfo(HELLO_CID, len(HELLO))])
    assert store.has(million_cid)
    assert not store.has(HELLO_CID)
    assert store.list() == [BlobInfo(million_cid, len(data))]


def test_list_of_a_new_store_is_empty(store):
    assert store.list() == []


def test_list_skips_temporary_and_foreign_files(store):
    store.put_bytes(HELLO)
    (store.dir / ".tmp-0123456789abcdef").write_bytes(b"partial")
    (store.dir / "notes.txt").write_text("not a blob")

    assert store.list() == [BlobInfo(HELLO_CID, len(HELLO))]


# --- tampering -----------------------------------------------------------------------------


def test_get_bytes_detects_tampering(store, million):
    data, _ = million
    cid = store.put_bytes(data)
    _tamper(store, cid)

    with pytest.raises(IntegrityError, match=cid):
        store.get_bytes(cid)


def test_open_detects_tampering(store):
    cid = store.put_bytes(HELLO)
    (store.dir / cid).write_bytes(b"hello world!")

    with pytest.raises(IntegrityError, match=cid):
        store.open(cid)


def test_get_to_path_leaves_no_file_when_tampered(store, million, tmp_path):
    data, _ = million
    cid = store.put_bytes(data)
    _tamper(store, cid)
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    with pytest.raises(IntegrityError, match=cid):
        store.get_to_path(cid, out_dir / "copy.bin")

    assert list(out_dir.iterdir()) == []


def test_get_to_path_keeps_old_file_when_tampered(store, tmp_path):
    cid = store.put_bytes(HELLO)
    (store.dir / cid).write_bytes(b"evil")
    dest = tmp_path / "existing.txt"
    dest.write_bytes(b"keep me")

    with pytest.raises(IntegrityError):
        store.get_to_path(cid, dest)

    assert dest.read_bytes() == b"keep me"


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda s, tmp: s.get_bytes(ABSENT_CID),
        lambda s, tmp: s.open(ABSENT_CID),
        lambda s, tmp: s.get_to_path(ABSENT_CID, tmp / "out"),
        lambda s, tmp: s.delete(ABSENT_CID),
    ],
    ids=["get_bytes", "open", "get_to_path", "delete"],
)
def test_missing_blob_is_not_found_naming_the_cid(store, tmp_path, call):
    with pytest.raises(NotFoundError, match=ABSENT_CID):
        call(store, tmp_path)

    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.get_bytes("bafyNOTACID"),
        lambda s: s.has("../../etc/passwd"),
        lambda s: s.delete("Qm"),
        lambda s: s.get_to_path("", Path("x")),
    ],
    ids=["get_bytes", "has", "delete", "get_to_path"],
)
def test_invalid_cid_is_usage_error(store, call):
    with pytest.raises(UsageError, match="not a CID"):
        call(store)


def test_put_file_missing(store, tmp_path):
    with pytest.raises(NotFoundError, match="no such file"):
        store.put_file(tmp_path / "absent.bin")


def test_put_file_directory(store, tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        store.put_file(tmp_path)


def test_get_to_path_into_missing_directory(store, tmp_path):
    cid = store.put_bytes(HELLO)

    with pytest.raises(NotFoundError, match="no such directory"):
        store.get_to_path(cid, tmp_path / "nowhere" / "copy.txt")


def test_max_size_refuses_bigger_blobs_and_leaves_nothing(tmp_path, million):
    data, _ = million
    source = tmp_path / "big.bin"
    source.write_bytes(data)
    store = LocalBlobStore(tmp_path / "home", max_size=len(data) - 1)

    with pytest.raises(AitbcError, match="max_size"):
        store.put_bytes(data)
    with pytest.raises(AitbcError, match="max_size"):
        store.put_file(source)

    assert store.list() == []
    assert _leftovers(store.dir) == []


def test_max_size_allows_blobs_at_the_limit(tmp_path):
    store = LocalBlobStore(tmp_path, max_size=len(HELLO))

    assert store.put_bytes(HELLO) == HELLO_CID


@pytest.mark.parametrize("durable", [True, False])
def test_a_cache_store_writes_without_fsync_and_still_checks_the_cid(tmp_path, monkeypatch, durable):
    # durable=False (a worker's model cache): no fsync at all; the CID check stays.
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    store = LocalBlobStore(tmp_path, durable=durable)
    data = b"a model" * 1000
    cid = cid_of_bytes(data)
    with store.writer(cid) as w:
        w.write(data)
        w.commit()
    assert store.get_bytes(cid) == data
    assert bool(synced) is durable
    bad = b"not the model"
    with store.writer(cid_of_bytes(data + b"!")) as w:
        w.write(bad)
        with pytest.raises(IntegrityError):
            w.commit()
    assert sorted(p.name for p in store.dir.iterdir()) == [cid]


@pytest.mark.parametrize("durable", [True, False])
def test_every_way_into_a_store_syncs_only_a_durable_one(tmp_path, monkeypatch, durable):
    # put_bytes, put_file and put_many too, not only an upload's writer: a worker's gossip
    # store (durable=False) took an fsync a round through put_bytes that it never needed.
    synced = []
    real_fsync, real_sync = os.fsync, os.sync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(os, "sync", lambda: (synced.append("sync"), real_sync()))
    store = LocalBlobStore(tmp_path / "store", durable=durable)
    source = tmp_path / "file.bin"
    source.write_bytes(b"a file" * 100)
    many = b"many" * 10
    stored = [
        store.put_bytes(b"bytes" * 100),
        store.put_file(source),
        *store.put_many([(cid_of_bytes(many), many)]),
    ]
    assert [store.get_bytes(c) for c in stored] == [b"bytes" * 100, source.read_bytes(), many]
    assert bool(synced) is durable, synced
    if durable:  # each of the three made its bytes and its name durable
        assert synced.count("fsync") >= 4 and "sync" in synced, synced
