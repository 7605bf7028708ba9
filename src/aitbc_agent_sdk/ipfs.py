"""Storing on the coordinator, as sans-IO steps the operations ``yield from``: a file or a
folder (a UnixFS DAG whose root CID equals ``ipfs add -r --cid-version=1``'s, see
:mod:`aitbc.storage.unixfs`), or in-memory data (bytes, a torch model or a state dict,
stored as a safetensors checkpoint). Only the blobs the coordinator lacks are uploaded
(``POST /v1/blobs/missing``); ``pin`` pins the root for the agent's wallet
(``POST /v1/blobs/{cid}/pin``), so blob retention keeps all of it.

    cid = yield from store_path(self, "data/", pin=True)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aitbc.storage.unixfs_add import Added, add_path
from aitbc_agent_sdk.errors import AgentError, IntegrityFailure, InvalidArgument
from aitbc_agent_sdk.protocol import AgentState, Http, Meter, Offload, Op, Progress

ASK_BATCH = 10_000  # CIDs per POST /v1/blobs/missing (the coordinator's MAX_ASKED)
STATE_DICT_FORMAT = "aitbc.state_dict/1"  # the metadata "format" of a stored model or state dict


def store_path(self: AgentState, path: str | Path, pin: bool, progress: Progress | None = None) -> Op[str]:
    """Store the file or folder at ``path`` (names starting with ``.`` left out, as ``ipfs
    add -r`` does; symlinks and special files refused) and return its root CID.
    ``progress``: stages ``hash`` (the files' bytes) and ``upload`` (the blobs sent)."""
    p = Path(path).expanduser()
    hashing = Meter(progress, "hash", None)
    added: Added = yield Offload(functools.partial(add_path, p, progress=hashing.local()))
    yield from _upload(added, progress)
    if pin:
        yield Http("POST", f"/blobs/{added.root}/pin", {})
    return added.root


def store_data(self: AgentState, data: Any, pin: bool, progress: Progress | None = None) -> Op[str]:
    """Store ``data`` and return its CID: bytes as they are; a torch ``nn.Module`` (its
    state dict) or a state dict (names to tensors) as a safetensors checkpoint (metadata
    ``format`` = ``aitbc.state_dict/1``; the same tensors give the same bytes, so the same CID).
    ``progress``: stage ``upload`` (0 bytes when the coordinator has the blob)."""
    blob = data if isinstance(data, bytes) else (yield Offload(to_bytes, (data,)))
    from aitbc.storage.cid import cid_of_bytes

    cid = yield Offload(cid_of_bytes, (blob,))
    missing = yield Http("POST", "/blobs/missing", {"cids": [cid]})
    sending = Meter(progress, "upload", len(blob) if missing["missing"] else 0)
    if missing["missing"]:
        yield Http("PUT", f"/blobs/{cid}", content=blob, progress=sending.request())
    sending.end()
    if pin:
        yield Http("POST", f"/blobs/{cid}/pin", {})
    return cid


def to_bytes(data: Any) -> bytes:
    """What :func:`store_data` stores for ``data`` (see there); anything else is refused."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    import torch  # imported on use: storing bytes needs no torch
    from torch import nn

    from aitbc.training.checkpoint import tensors_to_bytes

    if isinstance(data, nn.Module):
        data = data.state_dict()
    if isinstance(data, Mapping) and data:
        bad = [k for k, v in data.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if not bad:
            tensors = {k: v.detach().cpu() for k, v in data.items()}
            return tensors_to_bytes(tensors, {"format": STATE_DICT_FORMAT})
        raise InvalidArgument(
            "bad_argument", f"data: a state dict maps names to tensors; {bad[0]!r} is not a name with a tensor"
        )
    raise InvalidArgument(
        "bad_argument",
        f"data must be bytes, a torch nn.Module or a state dict (names to tensors), got {type(data).__name__}",
    )


def _upload(added: Added, progress: Progress | None = None) -> Op[None]:
    """PUT every blob of ``added`` the coordinator lacks (``progress``: stage ``upload``,
    their bytes)."""
    cids = list(added.nodes) + [c for c in added.files if c not in added.nodes]
    missing: list[str] = []
    for start in range(0, len(cids), ASK_BATCH):
        reply = yield Http("POST", "/blobs/missing", {"cids": cids[start : start + ASK_BATCH]})
        missing += reply["missing"]
    sending = Meter(progress, "upload", sum(added.sizes[c] for c in missing))
    for cid in missing:
        if cid in added.nodes:
            yield Http("PUT", f"/blobs/{cid}", content=added.nodes[cid], progress=sending.request())
            continue
        source = added.files[cid]
        blob = yield Offload(source.read_bytes)
        try:
            yield Http("PUT", f"/blobs/{cid}", content=blob, progress=sending.request())
        except AgentError as e:
            if e.code == "cid_mismatch":
                raise IntegrityFailure(
                    "changed",
                    f"{source} changed while it was being stored (it no longer hashes to {cid}); store it again",
                ) from None
            raise
    sending.end()
