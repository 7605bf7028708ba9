"""CIDs against vectors from the JS UnixFS importer, and CID string parsing."""

from __future__ import annotations

import base64
import hashlib
import io
import tracemalloc

import pytest

from aitbc.errors import NotFoundError, UsageError
from aitbc.storage.cid import (
    CHUNK_SIZE,
    CODEC_DAG_PB,
    CODEC_RAW,
    MAX_LINKS,
    CidHasher,
    cid_of_bytes,
    cid_of_chunks,
    cid_of_file,
    cid_of_stream,
    is_cid,
    parse_cid,
)

KUBO_EMPTY_FILE = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"


def _is_kubo_layout(vector: dict) -> bool:
    return (vector["chunk_size"], vector["max_links"]) == (CHUNK_SIZE, MAX_LINKS)


def _hasher_for(vector: dict) -> CidHasher:
    return CidHasher(chunk_size=vector["chunk_size"], max_links=vector["max_links"])


# --- the vectors -------------------------------------------------------------------------


def test_content_matches_generator(cid_vector, content_of):
    # If this fails, the content differs from the generator's: fix the pattern, not cid.py.
    data = content_of(cid_vector)

    assert len(data) == cid_vector["size"]
    assert hashlib.sha256(data).hexdigest() == cid_vector["sha256"]


def test_cid_of_whole_bytes(cid_vector, content_of):
    data = content_of(cid_vector)
    hasher = _hasher_for(cid_vector)

    hasher.update(data)

    assert str(hasher.cid()) == cid_vector["cid"]
    if _is_kubo_layout(cid_vector):
        assert cid_of_bytes(data) == cid_vector["cid"]


def test_cid_of_odd_sized_pieces(cid_vector, content_of):
    # Pieces that never line up with chunk boundaries: the hasher must re-cut them.
    data = memoryview(content_of(cid_vector))
    piece = 7 if cid_vector["chunk_size"] < 4096 else 100_003
    hasher = _hasher_for(cid_vector)

    for start in range(0, len(data), piece):
        hasher.update(data[start : start + piece])

    assert str(hasher.cid()) == cid_vector["cid"]


def test_cid_of_file(kubo_cid_vector, content_of, tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(content_of(kubo_cid_vector))

    assert cid_of_file(path) == kubo_cid_vector["cid"]


def test_empty_file_matches_kubo():
    assert cid_of_bytes(b"") == KUBO_EMPTY_FILE
    assert cid_of_stream(io.BytesIO(b"")) == KUBO_EMPTY_FILE


def test_streaming_memory_does_not_grow_with_the_file(vectors_by_name, chunks_of):
    vector = vectors_by_name["200 chunks plus 12345 (two levels)"]  # 50 MiB
    tracemalloc.start()
    try:
        cid = cid_of_chunks(chunks_of(vector["size"]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert cid == vector["cid"]
    assert peak < 4 << 20, f"peak {peak} bytes while hashing {vector['size']} bytes"


def test_cid_of_file_missing(tmp_path):
    with pytest.raises(NotFoundError, match="no such file"):
        cid_of_file(tmp_path / "absent")


def test_hasher_rejects_degenerate_layouts():
    with pytest.raises(ValueError, match="max_links"):
        CidHasher(max_links=1)
    with pytest.raises(ValueError, match="chunk_size"):
        CidHasher(chunk_size=0)


# --- parsing -----------------------------------------------------------------------------


def test_parse_round_trips_raw_and_dag_pb(vectors_by_name):
    raw = vectors_by_name["literal hello world"]["cid"]
    dag = vectors_by_name["irregular 1000000"]["cid"]

    assert parse_cid(raw).codec == CODEC_RAW
    assert parse_cid(dag).codec == CODEC_DAG_PB
    assert str(parse_cid(raw)) == raw
    assert str(parse_cid(dag)) == dag
    assert is_cid(raw) and is_cid(dag)


def _cid_string(cid_bytes: bytes) -> str:
    return "b" + base64.b32encode(cid_bytes).decode().lower().rstrip("=")


_DIGEST = hashlib.sha256(b"x").digest()

INVALID = {
    "empty": "",
    "word": "xyz",
    "upper case": KUBO_EMPTY_FILE.upper(),
    "base58btc multibase": "zb2rhe5P4gXftAwvA4eXQ5HJwsER2owDyS9sKaQRRVQPn93bA",
    "CIDv0": "QmbWqxBEKC3P8tqsKc98xmWNzrzDtRLMiMPL8wBuTGsMnR",
    "not base32": "bafk!reihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku",
    "truncated": KUBO_EMPTY_FILE[:-5],
    "trailing garbage": KUBO_EMPTY_FILE + "aa",
    "dag-cbor codec": _cid_string(b"\x01\x71\x12\x20" + _DIGEST),
    "blake2b hash": _cid_string(b"\x01\x55\xa0\xe4\x02\x20" + _DIGEST),
    "short digest": _cid_string(b"\x01\x55\x12\x10" + _DIGEST[:16]),
    "version 2": _cid_string(b"\x02\x55\x12\x20" + _DIGEST),
    "non-canonical last char": KUBO_EMPTY_FILE[:-1] + "v",
}


@pytest.mark.parametrize("text", INVALID.values(), ids=INVALID.keys())
def test_parse_rejects_invalid(text):
    with pytest.raises(UsageError) as info:
        parse_cid(text)

    message = str(info.value)
    assert message.startswith("not a CID: ")
    assert "expected a base32 CIDv1" in message
    assert "\n" not in message
    assert not is_cid(text)


def test_parse_error_shortens_long_input():
    with pytest.raises(UsageError) as info:
        parse_cid("b" + "a" * 5000)

    assert len(str(info.value)) < 300
