"""``aitbc ipfs`` through the real console script, as a user runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HELLO_CID = "bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4"


def _console_script() -> Path:
    beside_python = Path(sys.executable).parent / "aitbc"
    if beside_python.exists():
        return beside_python
    found = shutil.which("aitbc")
    if found is None:
        pytest.fail("the aitbc console script is not installed (pip install -e .)")
    return Path(found)


def ipfs(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "AITBC_HOME"}
    return subprocess.run(
        [str(_console_script()), "ipfs", *args, "--home", str(home)],
        capture_output=True,
        env=env,
        timeout=60,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def million_file(tmp_path, vectors_by_name, content_of) -> tuple[Path, str]:
    """A file of all 256 byte values, four chunks long, and its CID."""
    vector = vectors_by_name["irregular 1000000"]
    path = tmp_path / "million.bin"
    path.write_bytes(content_of(vector))
    return path, vector["cid"]


def _assert_one_line_error(result: subprocess.CompletedProcess[bytes], code: int) -> str:
    stderr = result.stderr.decode()
    assert result.returncode == code, stderr
    assert "Traceback" not in stderr
    assert stderr.startswith("error: ")
    assert stderr.count("\n") == 1, stderr
    return stderr


def test_add_prints_the_cid(home, million_file):
    path, cid = million_file

    result = ipfs(home, "add", str(path))

    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode() == cid + "\n"
    assert (home / "blobs" / cid).read_bytes() == path.read_bytes()


def test_cat_writes_the_exact_bytes(home, million_file):
    path, cid = million_file
    ipfs(home, "add", str(path))

    result = ipfs(home, "cat", cid)

    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == path.read_bytes()


def test_get_writes_the_file(home, million_file, tmp_path):
    path, cid = million_file
    ipfs(home, "add", str(path))
    dest = tmp_path / "copy.bin"

    result = ipfs(home, "get", cid, "-o", str(dest))

    assert result.returncode == 0, result.stderr.decode()
    assert dest.read_bytes() == path.read_bytes()


def test_ls_lists_cid_and_size(home, million_file, tmp_path):
    path, cid = million_file
    hello = tmp_path / "hello.txt"
    hello.write_bytes(b"hello world\n")
    ipfs(home, "add", str(path))
    ipfs(home, "add", str(hello))

    result = ipfs(home, "ls")

    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert lines == sorted([f"{cid}\t{1_000_000}", f"{HELLO_CID}\t12"])


@pytest.mark.parametrize("command", ["cat", "get"])
def test_bad_cid_exits_2(home, command):
    result = ipfs(home, command, "bafy-not-a-cid")

    stderr = _assert_one_line_error(result, 2)
    assert "not a CID: 'bafy-not-a-cid'" in stderr


def test_add_missing_file_exits_1(home, tmp_path):
    missing = tmp_path / "absent.bin"

    result = ipfs(home, "add", str(missing))

    stderr = _assert_one_line_error(result, 1)
    assert f"no such file: {missing}" in stderr


def test_add_directory_exits_2(home, tmp_path):
    result = ipfs(home, "add", str(tmp_path))

    stderr = _assert_one_line_error(result, 2)
    assert f"{tmp_path} is a folder; add it with -r (aitbc ipfs add -r {tmp_path})" in stderr


def test_cat_missing_blob_exits_1(home):
    result = ipfs(home, "cat", HELLO_CID)

    stderr = _assert_one_line_error(result, 1)
    assert HELLO_CID in stderr


def test_tampered_blob_exits_1_and_writes_nothing(home, tmp_path):
    hello = tmp_path / "hello.txt"
    hello.write_bytes(b"hello world\n")
    ipfs(home, "add", str(hello))
    (home / "blobs" / HELLO_CID).write_bytes(b"hello world!")
    dest = tmp_path / "copy.txt"

    cat = ipfs(home, "cat", HELLO_CID)
    get = ipfs(home, "get", HELLO_CID, "-o", str(dest))

    assert HELLO_CID in _assert_one_line_error(cat, 1)
    assert cat.stdout == b""
    assert HELLO_CID in _assert_one_line_error(get, 1)
    assert not dest.exists()
