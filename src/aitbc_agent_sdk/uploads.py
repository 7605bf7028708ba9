"""What :meth:`~aitbc_agent_sdk.Agent.upload_to_ipfs` stores, as blocks to PUT: a file
or folder as its UnixFS DAG (:func:`aitbc.storage.unixfs.add_path`, the root CID ``ipfs
add -r --cid-version=1`` prints), or in-memory data (bytes; a model or state dict as a
safetensors checkpoint). Pure local work, run off the event loop by the clients
(``Offload``); the operation does the HTTP. Also :func:`fetch_tree`, which writes a
stored folder back to a local one (a dataset another process uploaded)."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from aitbc.client import tls_verify
from aitbc.errors import IntegrityError, UsageError


@dataclass(frozen=True, slots=True)
class Blocks:
    """``root``: the CID to return; ``blocks``: ``(cid, bytes)`` to store, each once."""

    root: str
    blocks: list[tuple[str, bytes]]


def path_blocks(path: Path) -> Blocks:
    """A file or folder as its UnixFS DAG (a folder's files each whole under its CID)."""
    from aitbc.storage.unixfs import add_path

    added = add_path(path)
    return Blocks(added.root, list(added.blocks.items()))


def data_bytes(data: Any) -> bytes:
    """``data`` as the bytes to store: bytes as they are; a ``torch.nn.Module`` or a state
    dict (tensors by name) as a safetensors checkpoint."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    import torch  # imported on use: bytes need no torch

    from aitbc.training.checkpoint import tensors_to_bytes

    if isinstance(data, torch.nn.Module):
        data = data.state_dict()
    if isinstance(data, Mapping) and data and all(isinstance(v, torch.Tensor) for v in data.values()):
        if not all(isinstance(k, str) for k in data):
            raise UsageError("a state dict's keys must be parameter names (str)")
        return tensors_to_bytes({k: v.detach().cpu().contiguous() for k, v in data.items()})
    raise UsageError(f"data must be bytes, a torch.nn.Module or a state dict of tensors, got {type(data).__name__}")


def data_blocks(data: Any) -> Blocks:
    """``data`` (see :func:`data_bytes`) as one file: its CID and its bytes."""
    from aitbc.storage.cid import cid_of_bytes

    blob = data_bytes(data)
    cid = cid_of_bytes(blob)
    return Blocks(cid, [(cid, blob)])


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
