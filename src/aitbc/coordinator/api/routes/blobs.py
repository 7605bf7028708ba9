"""Blobs by CID: streamed in, hash-checked on arrival, streamed out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from aitbc.coordinator.api.deps import CtxDep, SignerDep, StreamSignerDep
from aitbc.coordinator.api.responses import errors
from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import ApiError, bad_request, not_found
from aitbc.coordinator.rounds import gossip
from aitbc.coordinator.rounds.workers import flag_blob, holders, require_known
from aitbc.coordinator.schemas import BadPeer
from aitbc.coordinator.storage import pins
from aitbc.coordinator.transfer.peers import check_report
from aitbc.coordinator.transfer.uploads import paced
from aitbc.errors import AitbcError, IntegrityError
from aitbc.replies.blobs import BlobsMissing, BlobStored, Holders, PeerRef, PeerVerdict, PinList, PinView
from aitbc.storage.cid import is_cid

router = APIRouter(prefix="/blobs", tags=["blobs"])
pins_router = APIRouter(prefix="/pins", tags=["blobs"])
MAX_ASKED = 10_000  # CIDs one POST /v1/blobs/missing may ask about
_BLOCK = 1 << 20  # bytes buffered per write to disk
# Blobs up to this size are read in one go and sent whole (a round's model or update):
# FileResponse's stat, open and each chunk's read are one thread hop apiece.
SMALL_BLOB = 4 << 20
BINARY: dict[str, Any] = {"schema": {"type": "string", "format": "binary"}}
BLOB: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The blob's bytes",
        "content": {"application/octet-stream": BINARY},
        "headers": {"X-Aitbc-Cid": {"description": "the blob's CID", "schema": {"type": "string"}}},
    }
}


def _check_cid(cid: str) -> None:
    if not is_cid(cid):
        raise bad_request("bad_cid", f"{cid!r} is not a CIDv1 (base32, starts with 'b')")


class MissingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cids: list[str] = Field(max_length=MAX_ASKED, description="CIDs to look for")


@router.post("/missing", response_model=BlobsMissing)
async def missing_blobs(body: MissingRequest, ctx: CtxDep, signer: SignerDep) -> BlobsMissing:
    """Which of ``cids`` this coordinator lacks (upload those); the ones it holds have
    their retention grace period renewed, as a PUT of a held blob does."""
    for cid in body.cids:
        _check_cid(cid)
    return BlobsMissing(missing=await run_in_threadpool(pins.missing_blobs, ctx, body.cids))


@router.post(
    "/{cid}/pin",
    response_model=PinView,
    status_code=201,
    responses={200: {"model": PinView, "description": "Pinned already by the signer"}, **errors(400, 404, 409)},
)
def pin_blob(cid: str, ctx: CtxDep, signer: SignerDep, response: Response) -> PinView:
    """Pin the file or folder ``cid`` for the signer: blob retention keeps every blob under
    it. Every blob must be here (409 ``incomplete_dag``); the pinned bytes count against the
    signer's ``max_pinned_bytes`` (409 ``pin_quota_exceeded``). Pinning again answers 200."""
    _check_cid(cid)
    view, new = pins.pin(ctx, signer.address, cid)
    if not new:
        response.status_code = 200
    return view


@router.delete("/{cid}/pin", response_model=PinView, responses=errors(400, 404))
def unpin_blob(cid: str, ctx: CtxDep, signer: SignerDep) -> PinView:
    """Remove the signer's pin of ``cid`` (404 ``unknown_pin`` if it has none); the blobs
    go at retention's next collection unless something else keeps them."""
    _check_cid(cid)
    return pins.unpin(ctx, signer.address, cid)


@pins_router.get("", response_model=PinList, responses=errors(422))
def list_pins(ctx: CtxDep, owner: Annotated[str, Query(max_length=64, description="a wallet address")]) -> PinList:
    """A wallet's pins, the bytes they keep and the cap."""
    return pins.pins_of(ctx, owner)


@router.get("/{cid}/holders", response_model=Holders, responses=errors(400, 422))
def blob_holders(
    cid: str,
    ctx: CtxDep,
    exclude: Annotated[str | None, Query(max_length=64, description="a worker to leave out: the asker")] = None,
) -> Holders:
    """Peer transport: up to a few live workers (other than ``exclude``) that announced
    ``cid``, chosen at random to spread the load; empty: fetch it from the coordinator.
    Public, like every ``/v1`` GET (holders' URLs are what peers connect to anyway)."""
    _check_cid(cid)
    data = [PeerRef(**p) for p in holders(ctx, cid, exclude or "")]
    return Holders(cid=cid, data=data, count=len(data))


@router.post("/{cid}/bad-peer", response_model=PeerVerdict, responses=errors(400, 404))
def bad_peer(cid: str, body: BadPeer, ctx: CtxDep, signer: SignerDep) -> dict:
    """Peer transport: the signer fetched ``cid`` from worker ``peer`` and the bytes did not
    hash to it. The coordinator fetches ``cid`` from that peer itself and flags it only if
    those bytes do not hash either; otherwise the report only counts (a peer reported by
    several workers is no longer handed out). See :mod:`aitbc.coordinator.transfer.peers`."""
    _check_cid(cid)
    require_known(ctx, signer.address)
    signed = None
    if not ctx.store.has(cid) and gossip.named_by_record(ctx, body.peer, cid):  # a gossip model it signed for
        signed = partial(gossip.fetch_model, ctx, body.peer, cid)
    return check_report(ctx, signer.address, body.peer, cid, signed=signed)


@router.put(
    "/{cid}",
    status_code=201,
    response_model=BlobStored,
    responses=errors(400, 408, 413),
    openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": BINARY}}},
)
async def put_blob(cid: str, request: Request, ctx: CtxDep, signer: StreamSignerDep) -> BlobStored:
    """Store the request body under ``cid``; refused (400) unless the bytes hash to it,
    (413) over the size limit, (429) past the signer's share of the upload slots, (408) a
    body slower than ``min_upload_rate`` (:mod:`aitbc.coordinator.transfer.uploads`). Storing a blob
    already held is a no-op."""
    _check_cid(cid)
    limit = ctx.settings.max_blob_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "blob_too_large", f"blob is {declared} bytes; this coordinator takes at most {limit}")
    # the upload's slot, and its signer's share of them, are held by the app's Limits
    body = paced(request.stream(), rate=ctx.settings.min_upload_rate, window=ctx.settings.upload_rate_window_seconds)
    return await _store(ctx, cid, signer.address, body, declared, limit)


async def _store(
    ctx: Context, cid: str, signer: str, body: AsyncIterator[bytes], declared: str | None, limit: int
) -> BlobStored:
    """The upload's ``body`` stored under ``cid`` (``declared``: its Content-Length, if any)."""
    if ctx.store.touch(cid):  # held already; touched, so blob retention's grace period starts again
        received = 0
        async for chunk in body:  # drain: the client is sending it anyway
            received += len(chunk)
            if received > limit:  # a chunked body has no declared length: count it
                raise ApiError(413, "blob_too_large", f"blob is over this coordinator's limit of {limit} bytes")
        return BlobStored(cid=cid, size=(ctx.store.dir / cid).stat().st_size, stored=False)
    if declared is not None and declared.isdigit() and int(declared) <= _BLOCK:
        # A small blob (a round's update of a small model): received whole, then stored in
        # one worker-thread call. Each hop to the thread pool waits its turn for the GIL
        # behind the round driver's threads, and this upload stands between a worker's
        # compute and the round's close (bench/live_utilization.py).
        data = bytearray()
        async for chunk in body:
            data += chunk
            if len(data) > limit:  # the declared length is checked above; this is what came
                raise ApiError(413, "blob_too_large", f"blob is over this coordinator's limit of {limit} bytes")
        try:
            size = await run_in_threadpool(_store_whole, ctx, cid, bytes(data))
        except IntegrityError:
            detail = f"uploaded bytes do not hash to {cid}; nothing stored"
            await run_in_threadpool(flag_blob, ctx, signer, detail)
            raise bad_request("cid_mismatch", detail) from None
        except AitbcError:
            raise ApiError(413, "blob_too_large", f"blob is over this coordinator's limit of {limit} bytes") from None
        return BlobStored(cid=cid, size=size, stored=True)
    # File work (open, write, fsync, rename) runs in a worker thread, in blocks of up to
    # 1 MiB: on the event loop it would stall every other request, heartbeats included.
    w = await run_in_threadpool(ctx.store.writer, cid)
    with w:
        block = bytearray()
        try:
            async for chunk in body:
                block += chunk
                if len(block) >= _BLOCK:
                    await run_in_threadpool(w.write, bytes(block))
                    block.clear()
            await run_in_threadpool(w.write, bytes(block))
        except AitbcError:
            raise ApiError(413, "blob_too_large", f"blob is over this coordinator's limit of {limit} bytes") from None
        try:
            await run_in_threadpool(w.commit)
        except IntegrityError:
            detail = f"uploaded bytes do not hash to {cid}; nothing stored"
            await run_in_threadpool(flag_blob, ctx, signer, detail)
            raise bad_request("cid_mismatch", detail) from None
        return BlobStored(cid=cid, size=w.size, stored=True)


def _store_whole(ctx: Context, cid: str, data: bytes) -> int:
    """Store ``data`` under ``cid`` (checked against it; nothing stored on a mismatch or over
    the store's size limit): its size."""
    with ctx.store.writer(cid) as w:
        w.write(data)
        w.commit()
        return w.size


@router.get("/{cid}", response_class=FileResponse, responses={**BLOB, **errors(400, 404)})
def get_blob(cid: str, ctx: CtxDep) -> Response:
    path = _blob_path(cid, ctx)
    try:
        if path.stat().st_size <= SMALL_BLOB:  # this runs in a worker thread already: read it here
            return Response(path.read_bytes(), media_type="application/octet-stream", headers={"X-Aitbc-Cid": cid})
    except FileNotFoundError:  # deleted since (blob retention)
        raise not_found("unknown_blob", f"no blob {cid} on this coordinator") from None
    return FileResponse(path, media_type="application/octet-stream", headers={"X-Aitbc-Cid": cid})


@router.head("/{cid}", response_class=FileResponse, responses={**BLOB, **errors(400, 404)})
def head_blob(cid: str, ctx: CtxDep) -> FileResponse:
    return FileResponse(_blob_path(cid, ctx), media_type="application/octet-stream", headers={"X-Aitbc-Cid": cid})


def _blob_path(cid: str, ctx: Context) -> Path:
    _check_cid(cid)
    path = ctx.store.dir / cid
    if not path.is_file():
        raise not_found("unknown_blob", f"no blob {cid} on this coordinator")
    return path
