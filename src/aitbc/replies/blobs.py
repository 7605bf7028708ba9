"""Blobs: what was stored, what is missing, the pins a wallet keeps, and the workers
that serve a blob to their peers (peer transport)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from aitbc.replies.base import Reply


class BlobStored(Reply):
    cid: str
    size: int
    stored: bool = Field(description="false: the coordinator already held this blob")


class BlobsMissing(Reply):
    missing: list[str] = Field(description="the CIDs asked about that this coordinator does not hold")


class PinView(Reply):
    cid: str = Field(description="the pinned root: a file's CID or a folder's")
    owner: str
    bytes: int = Field(description="bytes of every blob under the root, each once")
    blobs: int
    created_at: float


class PinList(Reply):
    data: list[PinView]
    count: int
    pinned_bytes: int
    max_pinned_bytes: int = Field(description="what one wallet may keep pinned")


class PeerRef(Reply):
    """A worker that serves a blob (peer transport): fetch ``{url}/v1/blobs/{cid}``."""

    worker: str
    url: str


class Holders(Reply):
    cid: str
    data: list[PeerRef]
    count: int


class PeerVerdict(Reply):
    verdict: Literal["bad", "gone", "ok", "unknown"] = Field(
        description="the coordinator's own fetch from the peer: bad (flagged), gone (its claim dropped), "
        "ok (served right: the report counts only as a signal), unknown (nothing to check)"
    )
    reports: int = Field(description="distinct workers that have reported this peer")
