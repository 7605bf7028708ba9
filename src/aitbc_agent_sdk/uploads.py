"""A dataset folder stored on the coordinator (``upload_to_ipfs``, see
:mod:`aitbc_agent_sdk.ipfs`), read back into a local folder: :func:`fetch_tree`, for an
agent that cuts a run's dataset it did not upload itself (``create_data_shards`` in
another process). Blocking local work, run off the event loop by the clients (``Offload``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from aitbc.client import CoordinatorClient
from aitbc.errors import IntegrityError


def fetch_tree(coordinator: str, ca_cert: Path | None, cid: str) -> Path:
    """The folder (or file) ``cid`` read back from the coordinator's blobs into a new
    temporary folder, every blob checked against its CID; returns the local path.
    ``coordinator``: one URL, or replicas' separated by commas (the next one is tried
    while one cannot be connected to)."""
    from aitbc.storage.unixfs import read_tree

    out = Path(tempfile.mkdtemp(prefix=f"aitbc-{cid[:16]}-"))
    with CoordinatorClient(coordinator, timeout=60.0, ca_cert=ca_cert) as client:

        def get(c: str) -> bytes:
            r = client.send(lambda http: http.get(f"/v1/blobs/{c}"), retry_dropped=True)
            if r.status_code != 200:
                raise IntegrityError(f"blob {c} of dataset {cid}: the coordinator answered {r.status_code}")
            return r.content

        for rel, data in read_tree(get, cid):
            target = out / (rel or "data.txt")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return out
