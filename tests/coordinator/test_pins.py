"""Folders on the coordinator: their directory nodes are blobs like files (checked against
their CID on arrival), ``POST /v1/blobs/missing`` says what to upload, and a wallet's pin
keeps a whole folder from blob retention, within ``max_pinned_bytes``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from aitbc.coordinator.storage import retention
from aitbc.ledger.signing import sign_request
from aitbc.ledger.wallet import Wallet
from aitbc.storage.cid import CODEC_DAG_PB, Cid, cid_of_bytes
from aitbc.storage.unixfs import read_tree
from aitbc.storage.unixfs_add import Added, add_path
from aitbc_agent_sdk import Agent, AgentConfig
from aitbc_agent_sdk.errors import Conflict, IntegrityFailure, InvalidArgument, NotFound
from aitbc_agent_sdk.ipfs import store_data, store_path


def signed(h: httpx.Client, wallet: Wallet, method: str, path: str, body: object = None) -> httpx.Response:
    data = b"" if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json", **sign_request(wallet, method, path, data)}
    return h.request(method, path, content=data, headers=headers)


def put(h: httpx.Client, wallet: Wallet, cid: str, data: bytes) -> httpx.Response:
    path = f"/v1/blobs/{cid}"
    return h.put(path, content=data, headers=sign_request(wallet, "PUT", path, unsigned_payload=True))


def folder(tmp_path: Path, name: str = "data") -> tuple[Path, dict[str, bytes]]:
    root = tmp_path / name
    files = {
        "readme.txt": b"a dataset\n",
        "train/part-0.txt": b"the quick brown fox\n" * 50,
        "train/naïve 🎉.txt": "unicode names: ü, 日本語\n".encode(),
        "valid/x.txt": b"",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "empty").mkdir()
    return root, files


def upload(h: httpx.Client, wallet: Wallet, added: Added) -> None:
    for cid, data in added.blocks.items():
        r = put(h, wallet, cid, data)
        assert r.status_code in (200, 201), r.text


@pytest.fixture
def pinning(tmp_path, databases, api):
    coord, stop = api.start_on(
        databases,
        tmp_path / "coord",
        max_pinned_bytes=4000,
        max_pinned_bytes_total=6000,
        # An hour's grace: the driver's own collection at start never takes a blob a test has
        # just uploaded and not yet pinned (with grace 0 it once did, on PostgreSQL); the
        # tests collect with no grace themselves (collect_now).
        gc_grace_seconds=3600,
        max_blob_bytes=1 << 20,
    )
    yield coord
    stop()


def collect_now(ctx):
    """Blob retention with the coordinator's settings but no grace period (nor in-flight window)."""
    st = ctx.settings
    return retention.collect(
        ctx.session,
        ctx.store,
        keep_checkpoints=st.keep_checkpoints,
        grace_seconds=0,
        max_loose_bytes=st.max_loose_bytes,
        in_flight_seconds=0,  # the keep rules alone: a blob just unpinned goes now
    )


def test_a_folder_uploads_block_by_block_and_reads_back(server, tmp_path):
    root, files = folder(tmp_path)
    added = add_path(root)
    owner = Wallet.generate("owner")
    with server.http() as h:
        r = signed(h, owner, "POST", "/v1/blobs/missing", {"cids": list(added.blocks)})
        assert r.status_code == 200 and set(r.json()["missing"]) == set(added.blocks)

        upload(h, owner, added)

        r = signed(h, owner, "POST", "/v1/blobs/missing", {"cids": [*added.blocks, added.root]})
        assert r.json() == {"missing": []}

        def get(cid: str) -> bytes:
            resp = h.get(f"/v1/blobs/{cid}")
            assert resp.status_code == 200, resp.text
            return resp.content

        assert dict(read_tree(get, added.root)) == files


def test_blocks_that_do_not_match_their_cid_are_refused(server, tmp_path, api):
    root, _ = folder(tmp_path)
    (root / "train" / "unique.txt").write_bytes(str(tmp_path).encode())  # nodes no other test uploads
    added = add_path(root)
    attacker = Wallet.generate("attacker")
    node = added.nodes[added.root]
    other = dict(added.entries)["train"]
    junk = b"\x12\x34 not a dag-pb node" * 10
    junk_cid = str(Cid.of_block(CODEC_DAG_PB, junk))  # the sha2-256 matches; the bytes are no node
    file_node = bytes.fromhex("0a0408021800")  # a UnixFS file node: files are stored whole
    file_node_cid = str(Cid.of_block(CODEC_DAG_PB, file_node))
    with server.http() as h:
        before = sorted(p.name for p in server.ctx.store.dir.iterdir()) if server.ctx.store.dir.is_dir() else []
        api.assert_error(put(h, attacker, other, node), 400, "cid_mismatch", "nothing stored")
        api.assert_error(put(h, attacker, junk_cid, junk), 400, "cid_mismatch")
        api.assert_error(put(h, attacker, file_node_cid, file_node), 400, "cid_mismatch")
        api.assert_error(put(h, attacker, "bafyNOTACID", node), 400, "bad_cid")
        after = sorted(p.name for p in server.ctx.store.dir.iterdir()) if server.ctx.store.dir.is_dir() else []
    assert after == before


def test_an_oversized_node_is_refused(server, api):
    leaf = cid_of_bytes(b"x")
    from aitbc.storage.unixfs import DIR_DATA, Link, encode_node, parse_cid

    links = [Link(f"{i:06d}" + "n" * 200, parse_cid(leaf), 1) for i in range(api.MAX_BLOB // 200 + 10)]
    block = encode_node(links, DIR_DATA)
    cid = str(Cid.of_block(CODEC_DAG_PB, block))
    assert hashlib.sha256(block).digest() == parse_cid(cid).digest and len(block) > api.MAX_BLOB
    with server.http() as h:
        api.assert_error(put(h, Wallet.generate("a"), cid, block), 413, "blob_too_large")
    assert not server.ctx.store.has(cid)


def test_missing_is_signed_and_bounded(server, api):
    with server.http() as h:
        assert h.post("/v1/blobs/missing", json={"cids": []}).status_code == 401
        w = Wallet.generate("w")
        api.assert_error(signed(h, w, "POST", "/v1/blobs/missing", {"cids": ["nope"]}), 400, "bad_cid")
        r = signed(h, w, "POST", "/v1/blobs/missing", {"cids": [cid_of_bytes(b"x")] * 10_001})
        assert r.status_code in (413, 422), r.text


def test_pins_keep_a_folder_through_retention_within_the_cap(pinning, tmp_path, api):
    coord = pinning
    root, files = folder(tmp_path)
    added = add_path(root)
    owner, other = Wallet.generate("owner"), Wallet.generate("other")
    with coord.http() as h:
        # Nothing uploaded yet: unknown; the root alone: incomplete.
        api.assert_error(signed(h, owner, "POST", f"/v1/blobs/{added.root}/pin"), 404, "unknown_blob")
        assert put(h, owner, added.root, added.nodes[added.root]).status_code == 201
        api.assert_error(signed(h, owner, "POST", f"/v1/blobs/{added.root}/pin"), 409, "incomplete_dag")
        upload(h, owner, added)
        assert h.post(f"/v1/blobs/{added.root}/pin").status_code == 401

        r = signed(h, owner, "POST", f"/v1/blobs/{added.root}/pin")
        assert r.status_code == 201, r.text
        pin = r.json()
        assert (pin["cid"], pin["owner"], pin["blobs"]) == (added.root, owner.address, len(added.blocks))
        assert pin["bytes"] == added.size
        assert signed(h, owner, "POST", f"/v1/blobs/{added.root}/pin").status_code == 200  # again: the same pin

        # A second folder, over the cap of 4000 bytes with the first: refused, nothing changed.
        big_root = tmp_path / "big"
        big_root.mkdir()
        (big_root / "a.txt").write_bytes(b"y" * 3000)
        big = add_path(big_root)
        upload(h, owner, big)
        pins_before = coord.rows("SELECT * FROM pins")
        api.assert_error(signed(h, owner, "POST", f"/v1/blobs/{big.root}/pin"), 409, "pin_quota_exceeded", "4000")
        assert coord.rows("SELECT * FROM pins") == pins_before
        # Another wallet has its own cap; it cannot unpin the owner's pin.
        assert signed(h, other, "POST", f"/v1/blobs/{big.root}/pin").status_code == 201
        # Every wallet together is capped too (6000 bytes): a third wallet past it is refused.
        third = Wallet.generate("third")
        extra_root = tmp_path / "extra"
        extra_root.mkdir()
        (extra_root / "e.txt").write_bytes(b"e" * 3500)
        extra = add_path(extra_root)
        upload(h, third, extra)
        api.assert_error(signed(h, third, "POST", f"/v1/blobs/{extra.root}/pin"), 409, "pins_full", "6000")
        api.assert_error(signed(h, other, "DELETE", f"/v1/blobs/{added.root}/pin"), 404, "unknown_pin")

        listed = h.get("/v1/pins", params={"owner": owner.address}).json()
        assert (listed["count"], listed["pinned_bytes"], listed["max_pinned_bytes"]) == (1, added.size, 4000)

        # Retention (grace 0) keeps every blob under a pin and deletes an unpinned folder's.
        loose_root = tmp_path / "loose"
        loose_root.mkdir()
        (loose_root / "l.txt").write_bytes(b"loose")
        loose = add_path(loose_root)
        upload(h, owner, loose)
        report = collect_now(coord.ctx)
        assert set(loose.blocks) <= set(report.deleted)
        assert not set(added.blocks) & set(report.deleted)
        assert not set(big.blocks) & set(report.deleted)

        def get(cid: str) -> bytes:
            return h.get(f"/v1/blobs/{cid}").content

        assert dict(read_tree(get, added.root)) == files

        # Unpinned, the folder goes at the next collection.
        r = signed(h, owner, "DELETE", f"/v1/blobs/{added.root}/pin")
        assert r.status_code == 200 and r.json()["cid"] == added.root
        report = collect_now(coord.ctx)
        assert set(added.blocks) - set(big.blocks) <= set(report.deleted)
        assert h.get(f"/v1/blobs/{added.root}").status_code == 404


# --- the SDK's storing steps (aitbc_agent_sdk.ipfs), driven by a real Agent ----------------


def agent_for(coord, home: Path) -> Agent:
    agent = Agent(AgentConfig(name="owner", wallet_name="owner", coordinator_url=coord.url, home=home))
    agent.start()
    return agent


def test_sdk_stores_and_pins_a_folder_uploading_only_what_is_missing(pinning, tmp_path):
    root, files = folder(tmp_path)
    with agent_for(pinning, tmp_path / "home") as agent:
        cid = agent._run(store_path(agent, root, pin=True))

        assert cid == add_path(root).root
        with pinning.http() as h:
            assert dict(read_tree(lambda c: h.get(f"/v1/blobs/{c}").content, cid)) == files
            pins = h.get("/v1/pins", params={"owner": agent.address}).json()
        assert [p["cid"] for p in pins["data"]] == [cid]
        # Again, plus one file: only the new file and the nodes above it travel.
        (root / "train" / "new.txt").write_bytes(b"new")
        held = set(os.listdir(pinning.ctx.store.dir))
        cid2 = agent._run(store_path(agent, root, pin=False))
        new = set(os.listdir(pinning.ctx.store.dir)) - held
        assert cid2 != cid and new == {add_path(root).root, dict(add_path(root).entries)["train"], cid_of_bytes(b"new")}
        # A missing path, a symlink: refused before anything is sent.
        with pytest.raises(NotFound):
            agent._run(store_path(agent, tmp_path / "nope", pin=False))
        os.symlink(root / "readme.txt", root / "link")
        with pytest.raises(InvalidArgument, match="symlink"):
            agent._run(store_path(agent, root, pin=False))


def test_sdk_stores_models_and_state_dicts_as_safetensors(pinning, tmp_path):
    import torch

    from aitbc.training.checkpoint import bytes_to_tensors, read_metadata

    model = torch.nn.Linear(3, 2)
    with agent_for(pinning, tmp_path / "home") as agent:
        cid = agent._run(store_data(agent, model, pin=True))
        assert agent._run(store_data(agent, model.state_dict(), pin=False)) == cid  # same tensors, same CID
        with pinning.http() as h:
            blob = h.get(f"/v1/blobs/{cid}").content
        assert read_metadata(blob) == {"format": "aitbc.state_dict/1"}
        got = bytes_to_tensors(blob)
        assert set(got) == {"weight", "bias"} and torch.equal(got["weight"], model.weight.detach())
        assert agent._run(store_data(agent, b"raw bytes", pin=False)) == cid_of_bytes(b"raw bytes")
        for bad in ("bafkreia-cid-string", {"w": [1, 2]}, {}, 3):
            with pytest.raises(InvalidArgument, match="data"):
                agent._run(store_data(agent, bad, pin=False))
        # Over the wallet's cap (4000 bytes): a clear refusal, the blob stored but not pinned.
        with pytest.raises(Conflict) as e:
            agent._run(store_data(agent, torch.nn.Linear(40, 40), pin=True))
        assert e.value.code == "pin_quota_exceeded"


def test_sdk_says_when_a_file_changed_while_stored(pinning, tmp_path):
    root, _ = folder(tmp_path)
    added = add_path(root)
    (root / "readme.txt").write_bytes(b"changed after hashing")
    from aitbc_agent_sdk.ipfs import _upload

    with agent_for(pinning, tmp_path / "home") as agent, pytest.raises(IntegrityFailure, match="changed while"):
        agent._run(_upload(added))


# --- aitbc ipfs reads the coordinator's blobs (issue 13: `ipfs cat <model CID>`) -------------


def aitbc_ipfs(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    exe = Path(sys.executable).parent / "aitbc"
    base = {k: v for k, v in os.environ.items() if k not in ("AITBC_HOME", "AITBC_COORDINATOR")}
    return subprocess.run(
        [str(exe), "ipfs", *args, "--home", str(home)], capture_output=True, env={**base, **(env or {})}, timeout=120
    )


def test_ipfs_commands_fetch_what_the_local_store_lacks_from_the_coordinator(pinning, tmp_path):
    root, files = folder(tmp_path)
    model = bytes(range(256)) * 2000  # 512000 bytes: two chunks under a dag-pb root, like a checkpoint
    with agent_for(pinning, tmp_path / "owner") as agent:
        cid = agent._run(store_path(agent, root, pin=False))
        model_cid = agent._run(store_data(agent, model, pin=False))
    assert model_cid.startswith("bafybei")
    home = tmp_path / "reader"  # an empty local store

    r = aitbc_ipfs(home, "cat", model_cid, "--coordinator", pinning.url)
    assert r.returncode == 0 and r.stdout == model, r.stderr.decode()
    r = aitbc_ipfs(home, "cat", f"{cid}/train/naïve 🎉.txt", env={"AITBC_COORDINATOR": pinning.url})
    assert r.stdout == files["train/naïve 🎉.txt"], r.stderr.decode()
    r = aitbc_ipfs(home, "ls", cid, "--coordinator", pinning.url)
    assert [line.split("\t")[2] for line in r.stdout.decode().splitlines()] == [
        "empty/",
        "readme.txt",
        "train/",
        "valid/",
    ]
    out = tmp_path / "copy"
    r = aitbc_ipfs(home, "get", cid, "-o", str(out), "--coordinator", pinning.url)
    assert r.returncode == 0, r.stderr.decode()
    assert add_path(out).root == cid

    # A coordinator that serves other bytes is caught: exit 1, one line, nothing written.
    (pinning.ctx.store.dir / cid_of_bytes(files["readme.txt"])).write_bytes(b"tampered")
    r = aitbc_ipfs(home, "get", cid, "-o", str(tmp_path / "bad"), "--coordinator", pinning.url)
    assert r.returncode == 1 and r.stderr.decode().count("\n") == 1 and "corrupt" in r.stderr.decode()
    assert not (tmp_path / "bad").exists()
    # No coordinator there: says where it looked.
    r = aitbc_ipfs(home, "cat", cid_of_bytes(b"never stored"), "--coordinator", "http://127.0.0.1:9")
    assert r.returncode == 1 and "no coordinator to ask" in r.stderr.decode()


def test_sdk_reads_a_folder_back_blob_by_blob_checked_against_each_cid(pinning, tmp_path):
    """get_from_ipfs: a directory node and a file come back as stored; a blob whose bytes
    on the coordinator were changed is refused; a bad or unknown CID is a clear error."""
    root, files = folder(tmp_path)
    with agent_for(pinning, tmp_path / "home") as agent:
        cid = agent.upload_to_ipfs(path=root, pin=False)
        assert dict(read_tree(agent.get_from_ipfs, cid)) == files
        readme = cid_of_bytes(files["readme.txt"])
        assert agent.get_from_ipfs(readme) == files["readme.txt"]
        (pinning.ctx.store.dir / readme).write_bytes(b"not the readme")  # the coordinator's disk, tampered
        with pytest.raises(IntegrityFailure, match=readme):
            agent.get_from_ipfs(readme)
        with pytest.raises(InvalidArgument, match="not a CIDv1"):
            agent.get_from_ipfs("not-a-cid")
        with pytest.raises(NotFound):
            agent.get_from_ipfs(cid_of_bytes(b"never uploaded"))
