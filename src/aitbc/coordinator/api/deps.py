"""Typed dependencies of the routes: the shared context, a database session, and the
verified signer of a request."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from aitbc.coordinator.context import Context
from aitbc.ledger.book import RequestAuth
from aitbc.ledger.signing import (
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    UNSIGNED_PAYLOAD,
    SignatureError,
    body_digest,
    verify_request,
)
from aitbc.ledger.wallet import address_of


async def get_context(request: Request) -> Context:
    # async: a plain def would run in the thread pool on every request (a thread hop and
    # enough garbage to trigger full collections under load).
    return request.app.state.ctx


def get_session(ctx: Annotated[Context, Depends(get_context)]) -> Iterator[Session]:
    with ctx.session() as s:
        yield s


@dataclass(frozen=True, slots=True)
class Signer:
    address: str
    public_key: str
    request: RequestAuth | None = None  # the signed request itself (JSON requests)

    def auth(self, field: str | None = None) -> RequestAuth:
        """This request as the authorisation of a ledger entry (``field`` bounds its amount)."""
        assert self.request is not None, "a streamed request cannot authorise an entry"
        return dataclasses.replace(self.request, field=field)


STREAM_SIGNER = "aitbc_stream_signer"  # the request's state attribute Limits leaves a verified upload's signer in


def _target(request: Request) -> str:
    """The path exactly as the client sent (and signed) it: raw, not percent-decoded."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    q = request.scope.get("query_string", b"")
    return (raw + (b"?" + q if q else b"")).decode("latin-1")


def _verify(ctx: Context, request: Request, digest: str, body: bytes | None = None) -> Signer:
    target = _target(request)
    key = verify_request(
        request.headers,
        request.method,
        target,
        digest,
        now=time.time(),
        max_skew=ctx.settings.max_skew_seconds,
        nonces=ctx.nonces,
        not_before=ctx.started_at,
    )
    req = None
    if body is not None:
        h = request.headers
        req = RequestAuth(
            method=request.method,
            path=target,
            body=body.decode("utf-8", "replace"),
            timestamp=h[HEADER_TIMESTAMP],
            nonce=h[HEADER_NONCE],
            public_key=key,
            signature=h[HEADER_SIGNATURE],
        )
    return Signer(address=address_of(key), public_key=key, request=req)


async def signed(request: Request, ctx: Annotated[Context, Depends(get_context)]) -> Signer:
    """The signer of a request whose body digest is signed (every JSON request).
    A missing, wrong, expired or replayed signature raises ``SignatureError`` (401)."""
    body = await request.body()
    if ctx.nonces.shared:  # the nonce check is a database round trip: not on the event loop
        return await run_in_threadpool(_verify, ctx, request, body_digest(body), body)
    return _verify(ctx, request, body_digest(body), body)


async def verify_stream(ctx: Context, request: Request) -> Signer:
    """The signer of a streamed upload, its signature checked (``SignatureError``: 401): the
    body is not read; the CID in the path, checked as the bytes arrive, binds the content
    instead of a digest."""
    if ctx.nonces.shared:
        return await run_in_threadpool(_verify, ctx, request, UNSIGNED_PAYLOAD)
    return _verify(ctx, request, UNSIGNED_PAYLOAD)


async def signed_stream(request: Request, ctx: Annotated[Context, Depends(get_context)]) -> Signer:
    """The signer of a streamed upload: the one the app's ``Limits`` verified before it gave
    the upload a slot (its nonce is spent: checked once), else verified here."""
    signer = getattr(request.state, STREAM_SIGNER, None)
    return signer if isinstance(signer, Signer) else await verify_stream(ctx, request)


CtxDep = Annotated[Context, Depends(get_context)]
SessionDep = Annotated[Session, Depends(get_session)]
SignerDep = Annotated[Signer, Depends(signed)]
StreamSignerDep = Annotated[Signer, Depends(signed_stream)]

__all__ = ["CtxDep", "SessionDep", "SignatureError", "Signer", "SignerDep", "StreamSignerDep"]
