"""Pins: a wallet keeps a blob DAG (a file, or a folder stored as in
:mod:`aitbc.storage.unixfs`) from blob retention, within its ``max_pinned_bytes``.

A pin names a root CID; every blob reachable from it must be on this coordinator when it
is pinned (so retention never keeps half a folder), and its bytes (each blob once) count
against the signer's cap (``max_pinned_bytes``) and everyone's together
(``max_pinned_bytes_total``: a wallet costs nothing to make, so only a total bounds the
disk; past it, pins wait for unpins). Pinning touches every blob under the root, so a collection whose
database snapshot predates the pin finds them inside the grace period. Unpinning is the
same wallet's. ``missing_blobs`` is the upload's first step: which CIDs this coordinator
lacks (the ones held are touched, for the same reason).
"""

from __future__ import annotations

import threading
import time

from sqlalchemy import func, select

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import conflict, not_found
from aitbc.coordinator.store.models import Pin
from aitbc.errors import NotFoundError, UsageError
from aitbc.replies.blobs import PinList, PinView
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.unixfs import reachable

_quota = threading.Lock()  # one coordinator process: the cap's check and the insert in one step


def pin_view(p: Pin) -> PinView:
    return PinView(cid=p.cid, owner=p.owner, bytes=p.bytes, blobs=p.blobs, created_at=p.created_at)


def dag_blobs(store: LocalBlobStore, root: str) -> dict[str, int]:
    """Every blob under ``root`` with its size; a missing one is a ``NotFoundError``."""
    found = reachable(store.peek_node, root)
    return {cid: store.size(cid) for cid in found}


def pin(ctx: Context, owner: str, cid: str) -> tuple[PinView, bool]:
    """Pin ``cid`` for ``owner``; returns (the pin, whether it is new)."""
    store = ctx.store
    with ctx.session() as s:  # pinned already: answered without walking the DAG again
        held = s.scalar(select(Pin).where(Pin.owner == owner, Pin.cid == cid))
        if held is not None:
            return pin_view(held), False
    if not store.has(cid):
        raise not_found("unknown_blob", f"no blob {cid} on this coordinator; upload it first")
    try:
        blobs = dag_blobs(store, cid)
    except NotFoundError as e:
        raise conflict("incomplete_dag", f"cannot pin {cid}: {e}; upload every blob of the folder first") from None
    except UsageError as e:
        raise conflict("dag_too_large", f"cannot pin {cid}: {e}") from None
    for c in blobs:
        store.touch(c)
    size = sum(blobs.values())
    cap = ctx.settings.max_pinned_bytes
    with _quota, ctx.session() as s:
        held = s.scalar(select(Pin).where(Pin.owner == owner, Pin.cid == cid))
        if held is not None:
            return pin_view(held), False
        used = s.scalar(select(func.coalesce(func.sum(Pin.bytes), 0)).where(Pin.owner == owner)) or 0
        if used + size > cap:
            raise conflict(
                "pin_quota_exceeded",
                f"pinning {cid} ({size} bytes) would make {used + size} bytes pinned by {owner}, over this "
                f"coordinator's max_pinned_bytes of {cap}; unpin something first",
            )
        total = s.scalar(select(func.coalesce(func.sum(Pin.bytes), 0))) or 0
        if total + size > ctx.settings.max_pinned_bytes_total:
            raise conflict(
                "pins_full",
                f"pinning {cid} ({size} bytes) would make {total + size} bytes pinned on this coordinator, over its "
                f"max_pinned_bytes_total of {ctx.settings.max_pinned_bytes_total}; the blobs stay until retention",
            )
        row = Pin(owner=owner, cid=cid, bytes=size, blobs=len(blobs), created_at=time.time())
        s.add(row)
        s.commit()
        return pin_view(row), True


def unpin(ctx: Context, owner: str, cid: str) -> PinView:
    with ctx.session() as s:
        row = s.scalar(select(Pin).where(Pin.owner == owner, Pin.cid == cid))
        if row is None:
            raise not_found("unknown_pin", f"{owner} has no pin of {cid}")
        view = pin_view(row)
        s.delete(row)
        s.commit()
    return view


def pins_of(ctx: Context, owner: str) -> PinList:
    with ctx.session() as s:
        rows = s.scalars(select(Pin).where(Pin.owner == owner).order_by(Pin.created_at, Pin.id)).all()
        data = [pin_view(p) for p in rows]
    return PinList(
        data=data,
        count=len(data),
        pinned_bytes=sum(p.bytes for p in data),
        max_pinned_bytes=ctx.settings.max_pinned_bytes,
    )


def missing_blobs(ctx: Context, cids: list[str]) -> list[str]:
    """The CIDs of ``cids`` this coordinator does not hold (in order, once each); the ones
    it holds are touched (see the module's docstring)."""
    missing: list[str] = []
    for cid in dict.fromkeys(cids):
        if not ctx.store.touch(cid):
            missing.append(cid)
    return missing
