"""Ctrl-C in ``monitor`` at a terminal, typed into a real pseudo-terminal: the command says
in one line that the run goes on and how to come back (exit 130), and the live view never
has the terminal echo ``^C`` into it (echoed after a last line as wide as the terminal, it
wrapped the view, and the redraws after it left the view's header printed twice)."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import termios
import time

import pytest
from tests.conftest import wait_until
from tests.e2e.conftest import AITBC, Stack

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def coordinator(stack: Stack) -> Stack:
    stack.start_coordinator()
    return stack


def _controlling_tty() -> None:  # in the child, after setsid: the pty becomes its terminal
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_ctrl_c_in_monitor_leaves_the_run_and_says_how_to_come_back(coordinator: Stack):
    stack = coordinator
    run_id = stack.init_run(workers=1)  # never distributed: it stays "initializing", monitor never ends by itself
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 80, 0, 0))
    echo = termios.tcgetattr(slave)[3] & termios.ECHO
    assert echo  # a new terminal echoes what is typed
    env = {**stack.env, "COLUMNS": "80", "LINES": "40", "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [str(AITBC), "distributed-training", "monitor", "--training-id", run_id, "--interval", "0.2"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
        preexec_fn=_controlling_tty,
    )
    seen = bytearray()

    def read_some() -> bytes:
        while select.select([master], [], [], 0.05)[0]:
            try:
                seen.extend(os.read(master, 65536))
            except OSError:
                break
        return bytes(seen)

    try:
        wait_until(lambda: run_id.encode() in read_some(), "the live view", timeout=120)
        assert not termios.tcgetattr(slave)[3] & termios.ECHO  # keys are not echoed into the view
        os.write(master, b"\x03")  # Ctrl-C, typed
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not read_some().endswith(b"\n"):
        pass
    assert termios.tcgetattr(slave)[3] & termios.ECHO  # the terminal echoes again
    os.close(slave)
    os.close(master)
    assert b"^C" not in seen
    text = ANSI.sub(b"", bytes(seen)).decode().replace("\r", "")
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert last == (
        f"error: interrupted: run {run_id} goes on training; "
        f"re-attach with: aitbc distributed-training monitor --training-id {run_id}"
    )
    assert stack.api(f"/runs/{run_id}")["status"] == "initializing"  # left as it was
