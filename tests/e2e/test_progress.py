"""Progress on long work: the SDK's ``progress(stage, done, total)`` callback on a real
coordinator, and the CLI's bars (``distributed-training upload-data`` / ``download-model``,
``ipfs add`` of a large input) drawn on a pseudo-terminal's standard error, never in a pipe
and never with ``--json``; standard output keeps only the command's result."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import httpx
import pytest

from aitbc.storage.unixfs_add import add_path
from aitbc_agent_sdk import Agent, AgentConfig, AsyncAgent

pytestmark = pytest.mark.long  # minutes: make test-long (CI runs it)

AITBC = Path(sys.executable).parent / "aitbc"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BAR_SIGNS = ("\u2501", "\x1b[", "hashing", "packaging", "storing", "uploading", "downloading", "/s")
UNITS = {"bytes": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


# --- running the CLI ---------------------------------------------------------------------


def in_terminal(args: list[str], env: dict[str, str], *, timeout: float = 300) -> tuple[int, str, str]:
    """Run ``aitbc ARGS`` with standard error (and input) on a new pseudo-terminal, 120
    columns wide, and standard output in a pipe: ``(exit code, stdout, what the terminal
    showed)``."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {k: v for k, v in env.items() if k not in ("TERM", "COLUMNS", "NO_COLOR")} | {"TERM": "xterm-256color"}
    p = subprocess.Popen([str(AITBC), *args], stdin=slave, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    shown: list[bytes] = []

    def drain() -> None:  # the terminal's output, read as it comes (a full pty would block the CLI)
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out, _ = p.communicate(timeout=timeout)
    finally:
        p.kill()
        reader.join(10)
        os.close(master)
    return p.returncode, out.decode(), b"".join(shown).decode(errors="replace")


def piped(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(AITBC), *args], capture_output=True, text=True, env=env, timeout=300)


def _bytes(number: str, unit: str) -> float:
    return float(number) * UNITS[unit]


def finished(shown: str, label: str) -> tuple[float, float]:
    """The last ``done/total unit`` the terminal showed on ``label``'s bar (asserted there)."""
    frames = re.findall(rf"{label}\s+\S*\s+([\d.]+)/([\d.]+) (bytes|kB|MB|GB)", ANSI.sub("", shown))
    assert frames, f"no {label} bar on the terminal: {ANSI.sub('', shown)[-1500:]!r}"
    done, total, unit = frames[-1]
    return _bytes(done, unit), _bytes(total, unit)


def assert_no_bar(text: str) -> None:
    assert not any(sign in text for sign in BAR_SIGNS), repr(text[-1500:])


# --- the SDK's callback ------------------------------------------------------------------


class Calls:
    """Every ``(stage, done, total)`` reported, and the checks each stage must pass."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def __call__(self, stage: str, done: int, total: int) -> None:
        self.calls.append((stage, done, total))

    def stages(self) -> list[tuple[str, list[tuple[int, int]]]]:
        """The stages in order, a new one at each change of name, each with its calls."""
        out: list[tuple[str, list[tuple[int, int]]]] = []
        for stage, done, total in self.calls:
            if not out or out[-1][0] != stage:
                out.append((stage, []))
            out[-1][1].append((done, total))
        return out

    def checked(self) -> dict[str, int]:
        """Each stage's final total, after checking its ``done`` only rises, never passes
        the total, and ends at it."""
        totals: dict[str, int] = {}
        for stage, calls in self.stages():
            dones = [d for d, _ in calls]
            assert dones == sorted(dones), (stage, calls)
            assert all(0 <= d <= t for d, t in calls if t), (stage, calls)
            assert calls[-1][0] == calls[-1][1], (stage, calls[-1])
            totals[stage] = calls[-1][1]
        return totals


def _files(folder: Path) -> int:
    """A folder of random files, one of them several upload pieces long; their bytes."""
    folder.mkdir()
    sizes = {"big.bin": 3_000_000, "small.txt": 1234, "sub/more.bin": 700_000}
    for name, size in sizes.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(os.urandom(size))
    return sum(sizes.values())


def test_sdk_reports_bytes_of_each_stage(stack, tmp_path: Path) -> None:
    """upload_to_ipfs reports ``hash`` (the files' bytes) then ``upload`` (the blobs' bytes,
    0 once the coordinator holds them), get_from_ipfs ``download`` (the blob's bytes), each
    rising to its total; AsyncAgent reports the same stages and totals."""
    stack.start_coordinator()
    config = AgentConfig(name="t", wallet_name="uploader", coordinator_url=stack.url, home=tmp_path / "home")
    folder = tmp_path / "data"
    file_bytes = _files(folder)
    added = add_path(folder)
    with Agent(config) as agent:
        agent.start()
        calls = Calls()
        cid = agent.upload_to_ipfs(path=folder, progress=calls)
        assert cid == added.root
        assert [s for s, _ in calls.stages()] == ["hash", "upload"]
        assert calls.checked() == {"hash": file_bytes, "upload": added.size}
        assert len(calls.stages()[1][1]) > 12  # the 3 MB file went in 256 KiB pieces, each reported

        again = Calls()
        assert agent.upload_to_ipfs(path=folder, progress=again) == cid
        assert again.checked() == {"hash": file_bytes, "upload": 0}

        big = next(c for p, c in added.entries if p == "big.bin")
        got = Calls()
        assert len(agent.get_from_ipfs(big, progress=got)) == 3_000_000
        assert [s for s, _ in got.stages()] == ["download"] and got.checked() == {"download": 3_000_000}
        assert len(got.calls) > 2

        none_asked = agent.upload_to_ipfs(path=folder)  # no callback: the same result
        assert none_asked == cid

    other = tmp_path / "other"
    other_bytes = _files(other)

    async def async_upload() -> tuple[str, Calls]:
        seen = Calls()
        async with AsyncAgent(config) as a:
            await a.start()
            return await a.upload_to_ipfs(path=other, progress=seen), seen

    cid2, seen = asyncio.run(async_upload())
    assert cid2 == add_path(other).root
    assert seen.checked() == {"hash": other_bytes, "upload": add_path(other).size}


# --- the CLI's bars on a real run -----------------------------------------------------------


def test_bars_at_a_terminal_only(stack, tmp_path: Path) -> None:
    """On a real run: upload-data and download-model draw their bars on a terminal up to the
    total, and none with --json (at a terminal) or in a pipe (standard error clean, standard
    output the result); the SDK's upload_data and download_model report the bytes the
    coordinator holds and the file written."""
    stack.start_coordinator()
    for name in ("w0", "w1"):
        stack.start_worker(name)
    stack.wait_offers(2)
    run_id = stack.init_run(workers=2)
    upload = ["distributed-training", "upload-data", "--training-id", run_id, "--data-path", "digits"]

    code, out, shown = in_terminal([*upload, "--json"], stack.env)  # --json at a terminal: no bar
    assert code == 0 and json.loads(out)["training_id"] == run_id, shown
    assert_no_bar(shown)

    # the SDK: packaging then uploading, the bytes of every piece the manifest names, and the manifest
    calls = Calls()
    config = AgentConfig(name="t", wallet_name="my-agent-wallet", coordinator_url=stack.url, home=stack.root / "owner")
    with Agent(config) as agent:
        up = agent.upload_data(run_id, "digits", progress=calls)
    manifest = httpx.get(f"{stack.url}/v1/blobs/{up['manifest_cid']}", timeout=10).content
    assert [s for s, _ in calls.stages()] == ["package", "upload"]
    totals = calls.checked()
    assert totals["upload"] == totals["package"] == up["data_bytes"] + len(manifest)
    assert calls.stages()[0][1][0] == (0, 0)  # packaging's size is known only at its end

    code, out, shown = in_terminal(upload, stack.env)  # a terminal: the bars, to the total
    assert code == 0, shown
    assert "Data uploaded" in out and not ANSI.search(out), out
    done, total = finished(shown, "uploading")
    assert done == total and total > 0.9 * totals["upload"], (done, total)
    assert "packaging" in ANSI.sub("", shown)

    r = stack.cli("distributed-training", "discover-workers", "--training-id", run_id, "--required-workers", "2")
    assert r.returncode == 0, r.stderr
    r = stack.cli("distributed-training", "distribute", "--training-id", run_id, "--rounds", "1", "--local-steps", "3")
    assert r.returncode == 0, r.stderr
    stack.wait_run(run_id, lambda run: run["status"] == "complete", timeout=180, what="complete")

    model = tmp_path / "model.safetensors"
    download = ["distributed-training", "download-model", "--training-id", run_id, "-o", str(model)]
    code, out, shown = in_terminal(download, stack.env)
    assert code == 0 and out.startswith("Wrote ") and not ANSI.search(out), (out, shown)
    done, total = finished(shown, "downloading")
    size = model.stat().st_size
    assert done == total and abs(total - size) <= 0.05 * size + 100, (done, total, size)

    code, out, shown = in_terminal([*download, "--json"], stack.env)
    assert code == 0 and json.loads(out)["bytes"] == size
    assert_no_bar(shown)
    r = piped(download, stack.env)
    assert r.returncode == 0 and r.stdout.startswith("Wrote ")
    assert_no_bar(r.stderr)

    got = Calls()
    with Agent(config) as agent:
        res = agent.download_model(run_id, tmp_path / "again.safetensors", progress=got)
    assert got.checked() == {"download": res["bytes"]} and res["bytes"] == size


# --- ipfs add --------------------------------------------------------------------------------


def test_ipfs_add_bar_for_large_inputs_at_a_terminal(tmp_path: Path) -> None:
    """``ipfs add`` of 8 MiB or more at a terminal shows hashing and storing up to the
    input's size, standard output only the CID; under 8 MiB, in a pipe or with --json: none."""
    env = dict(os.environ, AITBC_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(9 << 20))
    small = tmp_path / "small.bin"
    small.write_bytes(os.urandom(1 << 20))
    cid = add_path(big).root

    code, out, shown = in_terminal(["ipfs", "add", str(big)], env)
    assert code == 0 and out == cid + "\n", (out, shown)
    for label in ("hashing", "storing"):
        done, total = finished(shown, label)
        assert done == total and abs(total - (9 << 20)) < 0.01 * (9 << 20), (label, done, total)  # shown to 0.1 MB

    folder = tmp_path / "folder"
    folder.mkdir()
    for i in range(3):
        (folder / f"part{i}.bin").write_bytes(os.urandom(3 << 20))
    code, out, shown = in_terminal(["ipfs", "add", "-r", str(folder)], env)  # a folder's files, summed
    assert code == 0 and out == add_path(folder).root + "\n"
    assert finished(shown, "hashing")[1] == finished(shown, "hashing")[0] >= 9e6

    for args in (["ipfs", "add", str(small)], ["ipfs", "add", "--json", str(big)]):
        code, out, shown = in_terminal(args, env)
        assert code == 0, shown
        assert_no_bar(shown)
    code, out, _ = in_terminal(["ipfs", "add", "--json", str(big)], env)
    assert json.loads(out)["cid"] == cid
    r = piped(["ipfs", "add", str(big)], env)
    assert r.returncode == 0 and r.stdout == cid + "\n"
    assert_no_bar(r.stderr)


def test_ipfs_add_refusal_at_a_terminal_is_one_line(tmp_path: Path) -> None:
    """A refused add at a terminal prints its one error line, no bar."""
    env = dict(os.environ, AITBC_HOME=str(tmp_path / "home"))
    code, out, shown = in_terminal(["ipfs", "add", str(tmp_path / "missing.bin")], env)
    assert code != 0 and out == ""
    text = ANSI.sub("", shown).strip()
    assert text.startswith("error:") and "missing.bin" in text and len(text.splitlines()) == 1, text
