"""The command lines that run the examples (docs/sdk-guide.md and each example's docstring)
stop the local stack whatever the example's exit: a failing example leaves no process
behind, and the line's exit status is the example's."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent  # the interpreter running the tests: its aitbc
EXAMPLES = ("quickstart", "phase_driven", "fault_tolerance")
# a subshell whose EXIT trap runs `aitbc down` on any exit (the example failing, Ctrl-C)
SHAPE = re.compile(r"^\(trap 'aitbc down' EXIT; aitbc up --workers \d+[^;&|]* && python examples/(\w+)\.py[^;&|]*\)$")


def _lines(text: str, example: str) -> list[str]:
    """The lines that start a stack and run the example."""
    return [
        line.strip() for line in text.splitlines() if f"python examples/{example}.py" in line and "aitbc up" in line
    ]


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_documented_line_stops_the_stack_whatever_the_exit(example):
    guide = _lines((ROOT / "docs" / "sdk-guide.md").read_text(), example)
    docstring = _lines((ROOT / "examples" / f"{example}.py").read_text(), example)
    assert guide and docstring
    for line in guide + docstring:
        m = SHAPE.match(line)
        assert m and m[1] == example, line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ours(home: Path) -> list[str]:
    """The processes still running from the stack's home (every process ``aitbc up`` starts
    runs there)."""
    left = []
    for p in psutil.process_iter(["pid", "cwd", "cmdline", "status"]):
        cwd = p.info["cwd"] or ""
        if cwd.startswith(str(home)) and p.info["status"] != psutil.STATUS_ZOMBIE:
            left.append(f"{p.info['pid']}: {' '.join(p.info['cmdline'] or [])}")
    return left


@pytest.mark.long  # a stack of a coordinator and two workers comes up and goes down
def test_a_failing_example_leaves_no_process(tmp_path):
    """The guide's quickstart line, run as written (but for a port picked now), with the
    example pointed at a coordinator that is not there: it fails, and the stack is down."""
    line = _lines((ROOT / "docs" / "sdk-guide.md").read_text(), "quickstart")[0]
    line = line.replace("aitbc up --workers 2", f"aitbc up --workers 2 --port {_free_port()}")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITBC_")}
    env |= {
        "HOME": str(home),
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
        "AITBC_COORDINATOR": f"http://127.0.0.1:{_free_port()}",  # the example's alone: the stack ignores it
    }
    try:
        run = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert run.returncode == 1, (line, run.stdout, run.stderr)  # the example's status, not down's
        assert "error:" in run.stderr and "unreachable" in run.stderr, run.stderr
        stopped = re.findall(r"^\s+(\S+)\s+pid \d+\s+(\S+)$", run.stdout, flags=re.M)
        assert {name for name, _ in stopped} >= {"coordinator", "worker-1", "worker-2"}, run.stdout
        assert not (home / ".aitbc" / "stack.json").exists()
        assert not _ours(home)
    finally:
        if (home / ".aitbc" / "stack.json").exists():
            subprocess.run(["aitbc", "down"], capture_output=True, env=env, timeout=120)
