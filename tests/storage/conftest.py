"""Fixtures for the storage tests: the CID test vectors and the content they describe.

``cid_vectors.json`` was produced once by ``gen_cid_vectors.mjs`` with the JS UnixFS
importer (an implementation independent of ours); see that script for how it was run.
A test that takes a ``cid_vector`` argument runs once per vector (see
``pytest_generate_tests``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

VECTORS_PATH = Path(__file__).with_name("cid_vectors.json")
PATTERN_CHUNK = 262_144  # the (i >> 18) term of the pattern changes once per this many bytes


def _load_vectors() -> list[dict[str, Any]]:
    return json.loads(VECTORS_PATH.read_text())["vectors"]


def p31_chunks(size: int) -> Iterator[bytes]:
    """The pattern "p31" of the generator, byte i = (i*31 + (i>>8) + (i>>18)*101) & 0xff,
    in pieces of 262144 bytes.

    Within piece k (i = k*262144 + j) the first two terms depend on j only, because
    262144*31 and 262144>>8 are multiples of 256; so piece k is one base piece plus k*101.
    """
    j = np.arange(PATTERN_CHUNK, dtype=np.uint32)
    base = ((j * 31 + (j >> 8)) & 0xFF).astype(np.uint8)
    for k, start in enumerate(range(0, size, PATTERN_CHUNK)):
        piece = base + np.uint8(k * 101 & 0xFF)  # uint8 arithmetic wraps mod 256
        yield piece[: min(PATTERN_CHUNK, size - start)].tobytes()


def vector_content(vector: dict[str, Any]) -> bytes:
    if vector["pattern"] == "literal":
        return vector["literal"].encode()
    return b"".join(p31_chunks(vector["size"]))


def _uses_kubo_layout(vector: dict[str, Any]) -> bool:
    return (vector["chunk_size"], vector["max_links"]) == (262_144, 174)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``cid_vector``: every vector; ``kubo_cid_vector``: those with kubo's layout only
    (the others use tiny chunks to reach deep trees, which only ``CidHasher`` can build)."""
    for name, keep in (("cid_vector", None), ("kubo_cid_vector", _uses_kubo_layout)):
        if name in metafunc.fixturenames:
            vectors = [v for v in _load_vectors() if keep is None or keep(v)]
            metafunc.parametrize(name, vectors, ids=[v["name"] for v in vectors])


@pytest.fixture(scope="session")
def vectors_by_name() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in _load_vectors()}


@pytest.fixture(scope="session")
def content_of() -> Callable[[dict[str, Any]], bytes]:
    """The bytes a vector describes (a function, so tests can name any vector)."""
    return vector_content


@pytest.fixture(scope="session")
def chunks_of() -> Callable[[int], Iterator[bytes]]:
    """The p31 pattern of a given size, as an iterator of 262144-byte pieces."""
    return p31_chunks
