"""Blobs by CID: streamed in, hash-checked on arrival, streamed out."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from aitbc.coordinator.api.deps import CtxDep, StreamSignerDep
from aitbc.coordinator.errors import ApiError, bad_request, not_found
from aitbc.coordinator.workers import flag_blob
from aitbc.errors import AitbcError, IntegrityError
from aitbc.storage.cid import is_cid

router = APIRouter(prefix="/blobs", tags=["blobs"])


def _check_cid(cid: str) -> None:
    if not is_cid(cid):
        raise bad_request("bad_cid", f"{cid!r} is not a CIDv1 (base32, starts with 'b')")


@router.put("/{cid}", status_code=201)
async def put_blob(cid: str, request: Request, ctx: CtxDep, signer: StreamSignerDep) -> dict:
    """Store the request body under ``cid``; refused (400) unless the bytes hash to it,
    (413) over the size limit. Storing a blob already held is a no-op."""
    _check_cid(cid)
    limit = ctx.settings.max_blob_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "blob_too_large", f"blob is {declared} bytes; this coordinator takes at most {limit}")
    if ctx.store.has(cid):
        received = 0
        async for chunk in request.stream():  # drain: the client is sending it anyway
            received += len(chunk)
            if received > limit:  # a chunked body has no declared length: count it
                raise ApiError(413, "blob_too_large", f"blob is over this coordinator's limit of {limit} bytes")
        return {"cid": cid, "size": (ctx.store.dir / cid).stat().st_size, "stored": False}
    with ctx.store.writer(cid) as w:
        try:
            async for chunk in request.stream():
                w.write(chunk)
        except AitbcError:
            raise ApiError(413, "blob_too_large", f"blob is over this coordinator's limit of {limit} bytes") from None
        try:
            w.commit()
        except IntegrityError:
            detail = f"uploaded bytes do not hash to {cid}; nothing stored"
            flag_blob(ctx, signer.address, detail)
            raise bad_request("cid_mismatch", detail) from None
        return {"cid": cid, "size": w.size, "stored": True}


@router.get("/{cid}")
def get_blob(cid: str, ctx: CtxDep) -> FileResponse:
    _check_cid(cid)
    path = ctx.store.dir / cid
    if not path.is_file():
        raise not_found("unknown_blob", f"no blob {cid} on this coordinator")
    return FileResponse(path, media_type="application/octet-stream", headers={"X-Aitbc-Cid": cid})


@router.head("/{cid}")
def head_blob(cid: str, ctx: CtxDep) -> FileResponse:
    return get_blob(cid, ctx)
