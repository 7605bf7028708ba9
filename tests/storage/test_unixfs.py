"""Folders as UnixFS directories: root CIDs against the JS importer's vectors
(``folder_vectors.json``, made by ``gen_cid_vectors.mjs --folders``), reading them back,
paths inside them, and what is refused."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from aitbc.errors import IntegrityError, NotFoundError, UsageError
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.cid import CODEC_DAG_PB, Cid, cid_of_bytes
from aitbc.storage.unixfs import (
    DIR_DATA,
    MAX_NODE_BYTES,
    Link,
    decode_dir,
    encode_node,
    list_dir,
    reachable,
    read_tree,
    resolve,
    walk,
)
from aitbc.storage.unixfs_add import HAMT_THRESHOLD, add_path

VECTORS = json.loads(Path(__file__).with_name("folder_vectors.json").read_text())["vectors"]
EMPTY_DIR = "bafybeiczsscdsbs7ffqz55asqdf3smv6klcw3gofszvwlyarci47bgf354"  # kubo's empty folder


def listing(spec: dict[str, Any]) -> list[tuple[str, int]]:
    """The vector's files (path, size), generated entries as the generator makes them."""
    files = [(p, s) for p, s in spec.get("files", [])]
    for g in spec.get("generated", []):
        for i in range(g["count"]):
            name = (
                f"{i:04d}-" + "x" * g["name_pad"] + (g.get("first_extra", "") if i == 0 else "") + g.get("suffix", "")
            )
            files.append((f"{g['dir']}/{name}" if g["dir"] else name, i % 50))
    return files


def content(path: str, size: int) -> bytes:
    unit = (path + "\n").encode()
    return (unit * (size // len(unit) + 1))[:size]


def make_folder(root: Path, spec: dict[str, Any]) -> dict[str, bytes]:
    root.mkdir()
    files = {}
    for path, size in listing(spec):
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(files.setdefault(path, content(path, size)))
    for d in spec.get("empty_dirs", []):
        (root / d).mkdir(parents=True, exist_ok=True)
    return files


@pytest.fixture(params=VECTORS, ids=[v["name"] for v in VECTORS])
def vector(request) -> dict[str, Any]:
    return request.param


def test_folder_cid_matches_the_js_importer(vector, tmp_path):
    make_folder(tmp_path / "root", vector)

    added = add_path(tmp_path / "root")

    assert added.root == vector["cid"]


def test_folder_reads_back(vector, tmp_path):
    files = make_folder(tmp_path / "root", vector)
    blocks = add_path(tmp_path / "root").blocks
    root = add_path(tmp_path / "root").root

    got = dict(read_tree(blocks.__getitem__, root))

    assert got == files
    dirs = {e.path for e in walk(blocks.__getitem__, root) if e.kind == "dir"}
    for d in vector.get("empty_dirs", []):
        assert d in dirs


def test_sharding_starts_one_byte_past_the_threshold(tmp_path):
    at, over = (next(v for v in VECTORS if v["name"].startswith(s)) for s in ("exactly at", "one byte over"))
    for name, spec, hamt in (("at", at, False), ("over", over, True)):
        make_folder(tmp_path / name, spec)
        added = add_path(tmp_path / name)
        total = sum(len(p.encode()) + 36 for p, _ in listing(spec))

        assert total == HAMT_THRESHOLD + (1 if hamt else 0)
        assert decode_dir(added.nodes[added.root]).hamt is hamt


def test_empty_folder_is_kubos(tmp_path):
    (tmp_path / "e").mkdir()

    assert add_path(tmp_path / "e").root == EMPTY_DIR


def test_a_file_is_its_file_cid(tmp_path):
    (tmp_path / "f").write_bytes(b"hello world\n")

    added = add_path(tmp_path / "f")

    assert added.root == cid_of_bytes(b"hello world\n")
    assert list(read_tree(added.blocks.__getitem__, added.root)) == [("", b"hello world\n")]


def test_resolve_paths_in_basic_folders_and_hamts(tmp_path):
    spec = next(v for v in VECTORS if v["name"].startswith("many entries"))
    files = make_folder(tmp_path / "root", spec)
    added = add_path(tmp_path / "root")
    get = added.blocks.__getitem__

    for path in ("readme.txt", "many/ünï-🎉.txt", "many/inner/x.txt", "many/0007-" + "x" * 200):
        assert resolve(get, f"{added.root}/{path}") == cid_of_bytes(files[path])
    assert resolve(get, f"/ipfs/{added.root}/many/inner/") == dict(added.entries)["many/inner"]
    with pytest.raises(NotFoundError, match="no 'nope' in folder"):
        resolve(get, f"{added.root}/many/nope")
    with pytest.raises(NotFoundError, match="is a file"):
        resolve(get, f"{added.root}/readme.txt/x")
    with pytest.raises(UsageError):
        resolve(get, f"{added.root}/../etc")
    names = [name for name, _, _ in list_dir(get, resolve(get, f"{added.root}/many"))]
    assert len(names) == 1500 + 300 + 2 and names == sorted(names, key=str.encode)


def test_hidden_entries_are_left_out_unless_asked(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"a")
    (tmp_path / "d" / ".git").mkdir()
    (tmp_path / "d" / ".git" / "x").write_bytes(b"x")
    only_a = tmp_path / "only"
    only_a.mkdir()
    (only_a / "a").write_bytes(b"a")

    assert add_path(tmp_path / "d").root == add_path(only_a).root
    assert add_path(tmp_path / "d", hidden=True).root != add_path(only_a).root


def test_symlinks_and_special_files_are_refused(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "target").write_bytes(b"t")
    os.symlink(tmp_path / "d" / "target", tmp_path / "d" / "link")
    with pytest.raises(UsageError, match="is a symlink; only regular files and folders"):
        add_path(tmp_path / "d")
    (tmp_path / "s").mkdir()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "s" / "sock"))
        with pytest.raises(UsageError, match="special file"):
            add_path(tmp_path / "s")
    with pytest.raises(NotFoundError):
        add_path(tmp_path / "missing")


def _node(links: list[tuple[str, str | Cid, int]]) -> tuple[str, bytes]:
    block = encode_node([Link(n, c if isinstance(c, Cid) else _cid(c), t) for n, c, t in links], DIR_DATA)
    return str(Cid.of_block(CODEC_DAG_PB, block)), block


def _cid(text: str) -> Cid:
    from aitbc.storage.cid import parse_cid

    return parse_cid(text)


def test_a_tampered_blob_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"aaa")
    added = add_path(tmp_path / "d")
    blocks = added.blocks
    file_cid = dict(added.entries)["a"]
    blocks[file_cid] = b"bbb"

    with pytest.raises(IntegrityError):
        list(read_tree(blocks.__getitem__, added.root))
    blocks[added.root] = blocks[added.root][:-1] + b"\x02"
    with pytest.raises(IntegrityError):
        list(read_tree(blocks.__getitem__, added.root))


def test_unsafe_names_never_decode():
    leaf = cid_of_bytes(b"x")
    for bad in ("..", ".", "a/b", "", "a\x00b"):
        cid, block = _node([(bad, leaf, 1)])
        with pytest.raises(ValueError):
            decode_dir(block)
        with pytest.raises(IntegrityError):
            list(read_tree({cid: block, leaf: b"x"}.__getitem__, cid))
    _, unsorted = _node([("b", leaf, 1), ("a", leaf, 1)])
    with pytest.raises(ValueError, match="sorted"):
        decode_dir(unsorted)


def test_a_shared_subtree_bomb_is_bounded():
    # Each level links its child twice: 2**40 paths from 41 small blocks.
    leaf = cid_of_bytes(b"x")
    blocks = {leaf: b"x"}
    child: str = leaf
    for _ in range(40):
        child, block = _node([("a", child, 1), ("b", child, 1)])
        blocks[child] = block

    with pytest.raises(UsageError, match="over 1000 entries"):
        list(walk(blocks.__getitem__, child, max_entries=1000))
    assert len(reachable(blocks.get, child)) == 41  # each blob once


def test_blob_store_takes_nodes_and_refuses_other_dag_pb_blocks(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"a" * 10)
    added = add_path(tmp_path / "d")
    for cid, data in added.blocks.items():
        assert store.put_blob(cid, data) == cid

    assert dict(read_tree(store.get_bytes, added.root)) == {"a": b"a" * 10}
    # A dag-pb block that hashes to its CID but is not a directory node (a UnixFS file node).
    file_node = bytes.fromhex("0a0408021800")
    cid = str(Cid.of_block(CODEC_DAG_PB, file_node))
    with pytest.raises(IntegrityError):
        store.put_blob(cid, file_node)
    with pytest.raises(IntegrityError):
        store.put_blob(added.root, b"not the node")
    assert not store.has(cid)


def test_an_oversized_node_is_refused(tmp_path):
    leaf = cid_of_bytes(b"x")
    cid, block = _node([(f"{i:07d}" + "n" * 200, leaf, 1) for i in range(MAX_NODE_BYTES // 240 + 10)])
    assert len(block) > MAX_NODE_BYTES
    assert hashlib.sha256(block).digest() == _cid(cid).digest

    with pytest.raises(IntegrityError):
        LocalBlobStore(tmp_path).put_blob(cid, block)


def test_put_many_stores_a_folder_at_once_or_nothing(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    root = tmp_path / "d"
    (root / "sub").mkdir(parents=True)
    for i in range(5):
        (root / "sub" / f"{i}.txt").write_bytes(b"x" * i)
    added = add_path(root)
    (root / "sub" / "4.txt").write_bytes(b"changed")

    with pytest.raises(IntegrityError, match="changed while it was being stored"):
        store.put_many([*added.nodes.items(), *added.files.items()])
    assert store.list() == [] and not any(store.dir.iterdir())  # no temporary file left either

    (root / "sub" / "4.txt").write_bytes(b"x" * 4)
    stored = store.put_many([*added.nodes.items(), *added.files.items()])
    assert set(stored) == set(added.sizes)
    assert store.put_many([*added.nodes.items(), *added.files.items()]) == []  # all held
    assert dict(read_tree(store.get_bytes, added.root)) == {f"sub/{i}.txt": b"x" * i for i in range(5)}


def test_a_hamt_entry_outside_its_slot_is_refused():
    from aitbc.storage.unixfs import hamt_data, hamt_hash

    leaf = cid_of_bytes(b"x")
    name = "a.txt"
    wrong = (hamt_hash(name.encode())[0] + 1) % 256
    block = encode_node([Link(f"{wrong:02X}{name}", _cid(leaf), 1)], hamt_data(1 << wrong))
    cid = str(Cid.of_block(CODEC_DAG_PB, block))
    assert decode_dir(block).hamt  # well-formed on its own

    with pytest.raises(IntegrityError, match="not under the slots"):
        list(read_tree({cid: block, leaf: b"x"}.__getitem__, cid))
