"""A dataset folder stored on the coordinator (``upload_to_ipfs``, see
:mod:`aitbc_agent_sdk.ipfs`), read back into a local folder: :func:`fetch_tree`, for an
agent that cuts a run's dataset it did not upload itself (``create_data_shards`` in
another process). Blocking local work, run off the event loop by the clients (``Offload``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx

from aitbc.client import tls_verify
from aitbc.errors import IntegrityError


def fetch_tree(coordinator: str, ca_cert: Path | None, cid: str) -> Path:
    """The folder (or file) ``cid`` read back from the coordinator's blobs into a new
    temporary folder, every blob checked against its CID; returns the local path."""
    from aitbc.storage.unixfs import read_tree

    out = Path(tempfile.mkdtemp(prefix=f"aitbc-{cid[:16]}-"))
    with httpx.Client(base_url=coordinator, timeout=60.0, verify=tls_verify(ca_cert)) as http:

        def get(c: str) -> bytes:
            r = http.get(f"/v1/blobs/{c}")
            if r.status_code != 200:
                raise IntegrityError(f"blob {c} of dataset {cid}: the coordinator answered {r.status_code}")
            return r.content

        for rel, data in read_tree(get, cid):
            target = out / (rel or "data.txt")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return out
