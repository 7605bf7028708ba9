"""Blobs by CID over HTTP: stored only when the bytes hash to the CID named in the path and
fit the size limit (with or without a declared length); read back byte for byte."""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest

from aitbc.ledger.signing import sign_request
from aitbc.storage.cid import cid_of_bytes


def chunks(data: bytes, size: int = 64 << 10):
    """A body without Content-Length: httpx sends a generator chunked."""
    for i in range(0, len(data), size):
        yield data[i : i + size]


def put(h, wallet, cid: str, content, **headers):
    path = f"/v1/blobs/{cid}"
    return h.put(path, content=content, headers={**sign_request(wallet, "PUT", path, unsigned_payload=True), **headers})


def test_put_then_get_round_trip(server, api):
    c = server.client("owner")
    for data in (b"", b"hello blob", os.urandom(300_000)[: api.MAX_BLOB]):
        cid = cid_of_bytes(data)
        assert c.put_blob(cid, data) == {"cid": cid, "size": len(data), "stored": True}
        assert c.get_blob(cid) == data
        with server.http() as h:
            r = h.get(f"/v1/blobs/{cid}")
        assert (r.status_code, r.content) == (200, data)
        assert r.headers["content-type"] == "application/octet-stream"
        assert r.headers["x-aitbc-cid"] == cid
        assert (server.ctx.store.dir / cid).read_bytes() == data
        # the same blob again: already held, nothing written
        assert c.put_blob(cid, data) == {"cid": cid, "size": len(data), "stored": False}


def test_streamed_upload_without_length(server, api):
    c = server.client("owner")
    data = os.urandom(200_000)
    cid = cid_of_bytes(data)
    with server.http() as h:
        r = put(h, c.wallet, cid, chunks(data, 7000))
    assert r.status_code == 201 and r.json() == {"cid": cid, "size": len(data), "stored": True}
    assert c.get_blob(cid) == data


def test_head(server, api):
    c = server.client("owner")
    data = b"head me" * 100
    cid = cid_of_bytes(data)
    c.put_blob(cid, data)
    with server.http() as h:
        r = h.head(f"/v1/blobs/{cid}")
        assert (r.status_code, r.content) == (200, b"")
        assert int(r.headers["content-length"]) == len(data)
        assert r.headers["x-aitbc-cid"] == cid
        missing = cid_of_bytes(b"never uploaded")
        r = h.head(f"/v1/blobs/{missing}")
        assert r.status_code == 404 and r.content == b""  # a HEAD reply has no body
        assert h.head("/v1/blobs/not-a-cid").status_code == 400


def test_get_unknown_and_invalid(server, api):
    missing = cid_of_bytes(b"never uploaded")
    with server.http() as h:
        api.assert_error(h.get(f"/v1/blobs/{missing}"), 404, "unknown_blob", missing)
        for bad in ("not-a-cid", "Qmd286K6pohQcTKYqnS1YhWrCiS4gz7Xi34sdwMe9USZ7u", missing.upper(), missing[:-1], "b"):
            api.assert_error(h.get(f"/v1/blobs/{bad}"), 400, "bad_cid", "CIDv1")


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_oversized_blob(server, api, declared):
    c = server.client("owner")
    data = os.urandom(api.MAX_BLOB + 1)
    cid = cid_of_bytes(data)
    before = server.snapshot()
    with server.http() as h:
        r = put(h, c.wallet, cid, data if declared else chunks(data))
        api.assert_error(r, 413, "blob_too_large", str(api.MAX_BLOB))
        r = put(h, c.wallet, cid_of_bytes(data * 4), data * 4 if declared else chunks(data * 4))
        api.assert_error(r, 413, "blob_too_large")
    assert server.snapshot() == before  # nothing stored, no temporary file left behind
    with server.http() as h:
        api.assert_error(h.get(f"/v1/blobs/{cid}"), 404, "unknown_blob")
    # exactly the limit is fine
    ok = data[: api.MAX_BLOB]
    assert c.put_blob(cid_of_bytes(ok), ok)["stored"] is True


def test_oversized_body_for_a_blob_already_held(server, api):
    """Re-sending a held blob is drained, not stored; an endless body is still cut off."""
    c = server.client("owner")
    data = b"held" * 1000
    cid = cid_of_bytes(data)
    c.put_blob(cid, data)
    before = server.snapshot()
    with server.http() as h:
        api.assert_error(put(h, c.wallet, cid, chunks(os.urandom(api.MAX_BLOB + 10))), 413, "blob_too_large")
    assert server.snapshot() == before
    assert c.get_blob(cid) == data


def test_cid_mismatch_from_an_owner(server, api):
    c = server.client("owner")
    data, other = b"the bytes sent", b"the bytes named"
    before = server.snapshot()
    with server.http() as h:
        for body in (data, chunks(data, 3)):
            r = put(h, c.wallet, cid_of_bytes(other), body)
            api.assert_error(r, 400, "cid_mismatch", cid_of_bytes(other), "nothing stored")
    assert server.snapshot() == before  # stored nothing; an owner is not flagged
    assert not server.ctx.store.has(cid_of_bytes(other)) and not server.ctx.store.has(cid_of_bytes(data))


def test_cid_mismatch_from_a_worker_flags_it(server, api):
    w = api.register_worker(server, "liar")
    data, other = b"poisoned update", b"what it claims to be"
    blobs = sorted(os.listdir(server.ctx.store.dir)) if server.ctx.store.dir.is_dir() else []
    with server.http() as h:
        r = put(h, w.wallet, cid_of_bytes(other), data)
    api.assert_error(r, 400, "cid_mismatch")
    assert (sorted(os.listdir(server.ctx.store.dir)) if server.ctx.store.dir.is_dir() else []) == blobs
    assert server.rows("SELECT flags FROM offers WHERE id = :w", w=w.wallet.address) == [{"flags": 1}]
    [flag] = server.rows("SELECT kind, reason, run_id FROM flags WHERE worker_id = :w", w=w.wallet.address)
    assert flag["kind"] == "bad_blob" and cid_of_bytes(other) in flag["reason"] and flag["run_id"] is None


def test_invalid_cid_on_upload(server, api):
    c = server.client("owner")
    before = server.snapshot()
    with server.http() as h:
        for bad in ("not-a-cid", "Qmd286K6pohQcTKYqnS1YhWrCiS4gz7Xi34sdwMe9USZ7u", cid_of_bytes(b"x").upper(), "b"):
            api.assert_error(put(h, c.wallet, bad, b"x"), 400, "bad_cid", repr(bad))
    assert server.snapshot() == before


def test_a_client_hanging_up_mid_upload_leaves_nothing_and_is_no_internal_error(server, api, caplog):
    # A worker killed while its update uploads: the coordinator keeps no partial blob and
    # logs no internal error (the fault is the client's; there is nobody left to answer).
    wallet = server.client("owner").wallet
    data = os.urandom(api.MAX_BLOB)
    cid = cid_of_bytes(data)
    path = f"/v1/blobs/{cid}"
    host, port = server.url.removeprefix("http://").split(":")
    head = {**sign_request(wallet, "PUT", path, unsigned_payload=True), "content-length": str(len(data))}

    def files() -> list[str]:
        d = server.ctx.store.dir
        return sorted(p.name for p in d.iterdir()) if d.exists() else []

    before = files()
    with caplog.at_level(logging.INFO, logger="aitbc.coordinator"):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            lines = [f"PUT {path} HTTP/1.1", f"Host: {host}:{port}", *(f"{k}: {v}" for k, v in head.items())]
            s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + data[: len(data) // 3])
            time.sleep(0.5)  # the route is reading the body when the connection goes
        api.wait_for(
            "the hang-up noticed",
            lambda: [r.getMessage() for r in caplog.records],
            lambda msgs: any("disconnected" in m for m in msgs),
        )
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert files() == before
    assert server.client("owner").put_blob(cid, data)["stored"] is True  # and it can still be sent whole


def test_streamed_download_checks_the_cid_and_keeps_nothing_else(server, api, tmp_path):
    """``download_blob`` (what a worker fetches models and shards with) against a real
    coordinator: the bytes land in the store under their CID; a blob damaged on the
    coordinator's disk (a byte changed, cut short) is refused as it is checked, and neither
    a file under its name nor a temporary one is left."""
    from aitbc.client import ApiError
    from aitbc.errors import IntegrityError
    from aitbc.storage.blobstore import LocalBlobStore

    c = server.client("owner")
    data = os.urandom(api.MAX_BLOB)  # several CID chunks
    cid = cid_of_bytes(data)
    c.put_blob(cid, data)
    store = LocalBlobStore(tmp_path / "fetched")
    assert c.download_blob(cid, store) == len(data)
    assert (store.dir / cid).read_bytes() == data and os.listdir(store.dir) == [cid]
    served = server.ctx.store.dir / cid
    for damaged in (data[:-1] + bytes([data[-1] ^ 1]), data[: len(data) // 2]):
        served.write_bytes(damaged)
        other = LocalBlobStore(tmp_path / f"damaged-{len(damaged)}")
        with pytest.raises(IntegrityError, match=f"blob {cid} from .* does not hash to its CID"):
            c.download_blob(cid, other)
        assert os.listdir(other.dir) == []
    missing = cid_of_bytes(b"never uploaded")
    with pytest.raises(ApiError, match=missing) as e:
        c.download_blob(missing, store)
    assert (e.value.status, e.value.code) == (404, "unknown_blob")
    assert os.listdir(store.dir) == [cid]
