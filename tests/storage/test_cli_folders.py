"""``aitbc ipfs`` on folders, through the real console script: ``add -r`` prints the root
CID kubo prints (checked against the JS importer's vectors in test_unixfs.py), and
``ls``, ``cat`` and ``get`` read folders and paths inside them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aitbc.storage.unixfs_add import add_path

FILES = {
    "README.txt": "a corpus of text files\n",
    "train/part-0.txt": "the quick brown fox jumps over the lazy dog\n" * 2000,  # 88 KB
    "train/naïve 🎉.txt": "unicode names: ü, é, 日本語\n",
    "train/日本語/データ.txt": "データ\n",
    "valid/empty.txt": "",
}


def aitbc(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    exe = Path(sys.executable).parent / "aitbc"
    script = str(exe) if exe.exists() else shutil.which("aitbc")
    assert script, "the aitbc console script is not installed (pip install -e .)"
    base = {k: v for k, v in os.environ.items() if k not in ("AITBC_HOME", "AITBC_COORDINATOR")}
    # No coordinator to fall back on: a port nothing listens on.
    base["AITBC_COORDINATOR"] = "http://127.0.0.1:9"
    return subprocess.run(
        [script, "ipfs", *args, "--home", str(home)], capture_output=True, env={**base, **(env or {})}, timeout=120
    )


def one_line_error(result: subprocess.CompletedProcess[bytes], code: int) -> str:
    stderr = result.stderr.decode()
    assert result.returncode == code, (result.returncode, stderr)
    assert stderr.startswith("error: ") and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    (root / "empty-dir").mkdir()
    (root / ".hidden").write_text("left out, as ipfs add -r does\n")
    return root


@pytest.fixture
def added(corpus: Path, tmp_path: Path) -> tuple[Path, str]:
    home = tmp_path / "home"
    result = aitbc(home, "add", "-r", str(corpus))
    assert result.returncode == 0, result.stderr.decode()
    return home, result.stdout.decode().strip()


def test_add_r_prints_the_root_cid(added, corpus):
    home, cid = added

    assert cid == add_path(corpus).root and cid.startswith("bafybei")
    result = aitbc(home, "add", "-r", "--json", str(corpus))
    out = json.loads(result.stdout)
    assert out["cid"] == cid
    assert {e["path"] for e in out["entries"]} == {*FILES, "", "train", "train/日本語", "valid", "empty-dir"}
    with_hidden = aitbc(home, "add", "-r", "--hidden", str(corpus))
    assert with_hidden.stdout.decode().strip() != cid


def test_ls_lists_a_folder_and_a_folder_inside_it(added):
    home, cid = added

    lines = aitbc(home, "ls", cid).stdout.decode().splitlines()
    names = [line.split("\t")[2] for line in lines]
    assert names == ["README.txt", "empty-dir/", "train/", "valid/"]
    inner = aitbc(home, "ls", f"{cid}/train").stdout.decode().splitlines()
    assert [line.split("\t")[2] for line in inner] == ["naïve 🎉.txt", "part-0.txt", "日本語/"]
    data = json.loads(aitbc(home, "ls", "--json", f"{cid}/train/日本語").stdout)
    assert [(e["name"], e["type"]) for e in data["data"]] == [("データ.txt", "file")]


def test_cat_a_file_inside_a_folder(added):
    home, cid = added

    for rel, text in FILES.items():
        result = aitbc(home, "cat", f"{cid}/{rel}")
        assert result.returncode == 0, result.stderr.decode()
        assert result.stdout == text.encode()


def test_get_writes_the_whole_folder(added, tmp_path):
    home, cid = added
    out = tmp_path / "copy"

    result = aitbc(home, "get", cid, "-o", str(out))

    assert result.returncode == 0, result.stderr.decode()
    for rel, text in FILES.items():
        assert (out / rel).read_text(encoding="utf-8") == text
    assert (out / "empty-dir").is_dir() and not any((out / "empty-dir").iterdir())
    assert add_path(out).root == cid
    one = tmp_path / "one.txt"
    assert aitbc(home, "get", f"{cid}/train/naïve 🎉.txt", "-o", str(one)).returncode == 0
    assert one.read_text(encoding="utf-8") == FILES["train/naïve 🎉.txt"]


def test_bad_input_is_one_line_and_a_non_zero_exit(added, corpus, tmp_path):
    home, cid = added

    assert "no such file" in one_line_error(aitbc(home, "add", "-r", str(tmp_path / "absent")), 1)
    assert "is a folder; add it with -r" in one_line_error(aitbc(home, "add", str(corpus)), 2)
    unknown = "bafybeihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
    assert unknown in one_line_error(aitbc(home, "cat", unknown), 1)
    assert "no 'nope.txt' in folder" in one_line_error(aitbc(home, "cat", f"{cid}/train/nope.txt"), 1)
    assert "is a file, not a folder" in one_line_error(aitbc(home, "ls", f"{cid}/README.txt/x"), 1)
    assert "is a folder" in one_line_error(aitbc(home, "cat", f"{cid}/train"), 2)
    assert "already exists" in one_line_error(aitbc(home, "get", cid, "-o", str(corpus)), 2)
    assert "not a CID" in one_line_error(aitbc(home, "ls", "bafy-nope/x"), 2)
    os.symlink(corpus / "README.txt", corpus / "link")
    assert "is a symlink; only regular files and folders" in one_line_error(aitbc(home, "add", "-r", str(corpus)), 2)


def test_json_errors_are_json_on_stdout(added):
    home, cid = added

    result = aitbc(home, "ls", "--json", f"{cid}/nope")

    assert result.returncode == 1
    assert json.loads(result.stdout)["error"]


# Names whoever made a folder chose: ESC sequences (clear the screen, retitle the terminal),
# BEL, a newline and a tab (a fake line, a fake column), a bidi override, and a quote and
# an escape's letters (which must not read as an escape).
HOSTILE = [
    "clear\x1b[2J\x1b[H.txt",
    "title\x1b]0;pwned\x07.txt",
    "two\nlines.txt",
    "tab\tbed.txt",
    "rtl\u202etxt.exe",
    "'x1b.txt",
]


def test_ls_escapes_the_names_it_prints(tmp_path: Path):
    """Issue 33: such names were stored and printed raw. They are stored as kubo stores them
    (the same CID as ``ipfs add -r``: UnixFS names are any bytes but '/'), and ``ls`` prints
    each, quoted, with its control characters escaped: one line per entry, no ESC or BEL
    written. ``--json`` and ``get`` keep the exact names."""
    root = tmp_path / "hostile"
    root.mkdir()
    for name in HOSTILE:
        (root / name).write_text(name)
    home = tmp_path / "home"
    result = aitbc(home, "add", "-r", str(root))
    assert result.returncode == 0, result.stderr.decode()
    cid = result.stdout.decode().strip()
    assert cid == add_path(root).root

    listed = aitbc(home, "ls", cid)
    assert listed.returncode == 0, listed.stderr.decode()
    text = listed.stdout.decode()
    assert not {"\x1b", "\x07", "\u202e"} & set(text)
    lines = text.splitlines()
    assert len(lines) == len(HOSTILE) and all(line.count("\t") == 2 for line in lines)
    assert sorted(line.split("\t")[2] for line in lines) == sorted(repr(n) for n in HOSTILE)
    assert r"'clear\x1b[2J\x1b[H.txt'" in text and r"'two\nlines.txt'" in text and '"\'x1b.txt"' in text

    data = json.loads(aitbc(home, "ls", "--json", cid).stdout)
    assert sorted(e["name"] for e in data["data"]) == sorted(HOSTILE)
    got = aitbc(home, "get", cid, "-o", str(tmp_path / "back"))
    assert got.returncode == 0, got.stderr.decode()
    assert sorted(os.listdir(tmp_path / "back")) == sorted(HOSTILE)


def test_add_refuses_a_name_with_a_backslash_in_one_line(tmp_path: Path):
    """Every read of a folder refuses such a name (written back, it is a path on Windows):
    add refuses it too, naming it, rather than storing a folder nobody can read."""
    root = tmp_path / "bs"
    root.mkdir()
    (root / "a\\b.txt").write_text("x")
    message = one_line_error(aitbc(tmp_path / "home", "add", "-r", str(root)), 2)
    assert "a\\\\b.txt" in message and "backslash" in message
