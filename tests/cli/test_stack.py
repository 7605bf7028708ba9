"""`aitbc up / status / down / demo` as a user runs them: real processes on a temp home."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from aitbc import stack as stk


@pytest.fixture
def home_stack(aitbc):
    """The ``aitbc`` runner; whatever stack its home holds at the end is stopped."""
    yield aitbc
    if stk.stack_file(aitbc.home).exists():
        stk.down(aitbc.home, grace=5.0)


def _status(aitbc) -> dict:
    proc = aitbc("status", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _processes_mentioning(path: Path) -> list[int]:
    """Pids of live processes whose command line names ``path`` (Linux)."""
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(path) in cmd and state != "Z":
            found.append(int(d.name))
    return found


def test_up_status_down_stops_exactly_the_stack(home_stack):
    aitbc, home = home_stack, home_stack.home

    up = aitbc("up", "--workers", "2", timeout=120)
    assert up.returncode == 0, up.stderr
    assert "2 workers in the marketplace" in up.stdout
    recorded = json.loads((home / "stack.json").read_text())
    assert f"Dashboard: {recorded['coordinator']}/\n" in up.stdout  # the page it serves
    page = httpx.get(recorded["coordinator"] + "/", timeout=10)
    assert page.status_code == 200 and "aitbc dashboard" in page.text
    assert f"Metrics (Prometheus): {recorded['coordinator']}/metrics\n" in up.stdout
    assert httpx.get(recorded["coordinator"] + "/metrics", timeout=10).text.count("aitbc_rounds_total") > 0
    procs = [stk.Proc(**p) for p in recorded["processes"]]
    assert [p.name for p in procs] == ["coordinator", "worker-1", "worker-2"]
    assert all(stk.is_ours(p) for p in procs)  # they outlive the `up` command
    assert {p.gpu for p in procs[1:]} == {"RTX4090", "RTX3090"}
    for p in procs:
        assert (home / "pids" / f"{p.name}.pid").read_text().strip() == str(p.pid)
        assert Path(p.log).is_file()

    s = _status(aitbc)
    assert s["running"] and s["healthy"] and s["live_offers"] == 2
    assert s["coordinator"] == recorded["coordinator"]
    assert [(p["name"], p["pid"], p["alive"]) for p in s["processes"]] == [(p.name, p.pid, True) for p in procs]
    human = aitbc("status")
    assert "running, 3/3 processes alive" in human.stdout and "live offers: 2" in human.stdout

    again = aitbc("up", "--workers", "1")
    assert again.returncode == 1
    assert again.stderr.startswith("error: a stack from") and "already running" in again.stderr
    assert "Traceback" not in again.stderr
    assert all(stk.is_ours(p) for p in procs)  # the refusal touched nothing

    down = aitbc("down", timeout=60)
    assert down.returncode == 0, down.stderr
    for p in procs:
        assert f"{p.name}" in down.stdout and str(p.pid) in down.stdout
        assert not stk.is_ours(p)
    assert not (home / "stack.json").exists() and not list((home / "pids").iterdir())

    after = aitbc("status")
    assert after.returncode == 0 and f"no stack running in {home}" in after.stdout
    assert _status(aitbc)["running"] is False


def test_down_stops_every_process_on_its_own_while_workers_poll(home_stack):
    # Idle workers hold long polls open on the coordinator; a stop must not wait them out
    # (nor need the second signal, which skips the coordinator's clean shutdown).
    aitbc, home = home_stack, home_stack.home
    up = aitbc("up", "--workers", "2", timeout=120)
    assert up.returncode == 0, up.stderr
    procs = [stk.Proc(**p) for p in json.loads((home / "stack.json").read_text())["processes"]]

    down = aitbc("down", "--json", timeout=60)

    assert down.returncode == 0, down.stderr
    assert json.loads(down.stdout)["stopped"] == {p.name: "stopped" for p in procs}
    assert not any(stk.is_ours(p) for p in procs)
    assert not _processes_mentioning(home)  # no descendant left either
    log = Path(procs[0].log).read_text()
    assert "Application shutdown complete" in log  # the round driver stopped and the lease was released


def test_down_with_nothing_running(aitbc):
    proc = aitbc("down")

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"no stack running in {aitbc.home}"


def test_down_never_signals_a_process_that_reused_a_pid(aitbc):
    # A stack record whose pid now belongs to an unrelated process (another start time).
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        home = aitbc.home
        home.mkdir(parents=True)
        (home / "stack.json").write_text(
            json.dumps(
                {
                    "coordinator": "http://127.0.0.1:9",
                    "started_at": 0,
                    "processes": [
                        {
                            "name": "coordinator",
                            "role": "coordinator",
                            "pid": other.pid,
                            "log": "x.log",
                            "cmd": other.args,
                            "start_time": "1",
                        }
                    ],
                }
            )
        )

        proc = aitbc("down")

        assert proc.returncode == 0, proc.stderr
        assert "already exited" in proc.stdout
        assert other.poll() is None  # still running
        assert not (home / "stack.json").exists()
    finally:
        other.kill()
        other.wait()


def _record(tmp_path: Path, popen: subprocess.Popen, **kw) -> stk.Stack:
    """A stack record naming ``popen`` as its one worker, as ``up`` would write it."""
    proc = stk.Proc(
        name="worker-1",
        role="worker",
        pid=popen.pid,
        log=str(tmp_path / "c.log"),
        cmd=kw.pop("cmd", list(popen.args)),
        start_time=kw.pop("start_time", psutil.Process(popen.pid).create_time()),
    )
    return stk.Stack(home=tmp_path, coordinator="http://127.0.0.1:9", processes=[proc], started_at=0.0)


def test_a_pid_with_our_start_time_but_another_command_is_not_signalled(tmp_path):
    # Same pid and start time (as if the pid were reused within the slack), another command line.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stack = _record(tmp_path, other, cmd=[sys.executable, "-m", "aitbc", "coordinator", "serve"])

        assert not stk.is_ours(stack.processes[0])
        assert stk.stop(stack, grace=1.0) == {"worker-1": "not running"}
        assert other.poll() is None  # still running
    finally:
        other.kill()
        other.wait()


def test_stop_ends_a_process_and_its_descendants(tmp_path):
    # The child leaves the process group (its own session), so only the process tree finds it.
    child_pid = tmp_path / "child.pid"
    code = (
        "import pathlib, subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
        f"pathlib.Path({str(child_pid)!r}).write_text(str(c.pid)); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while not child_pid.exists() or not child_pid.read_text():
            assert time.monotonic() < deadline, "the child did not start"
            time.sleep(0.05)
        child = psutil.Process(int(child_pid.read_text()))
        stack = _record(tmp_path, parent)
        stack._popen[parent.pid] = parent

        ours = psutil.Process(parent.pid)

        assert stk.stop(stack, grace=5.0) == {"worker-1": "stopped"}
        assert not ours.is_running()  # psutil tells a reused pid from this process
        child.wait(timeout=5)  # gone too
        assert not child.is_running()
    finally:
        for p in psutil.Process().children(recursive=True):
            p.kill()
        parent.wait()


def test_stop_kills_what_ignores_sigterm_after_the_grace(tmp_path):
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
    )
    stubborn = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline()  # the handler is set
        stack = _record(tmp_path, stubborn)
        stack._popen[stubborn.pid] = stubborn
        ours = psutil.Process(stubborn.pid)

        t0 = time.monotonic()
        assert stk.stop(stack, grace=0.5) == {"worker-1": "killed"}
        assert time.monotonic() - t0 < 5
        assert not ours.is_running()
    finally:
        stubborn.kill()
        stubborn.wait()
        assert stubborn.stdout is not None
        stubborn.stdout.close()


def test_up_on_a_busy_port_is_one_error_line(aitbc):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]

        proc = aitbc("up", "--workers", "1", "--port", str(port))

    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        == f"error: port {port} on 127.0.0.1 is in use; pick another with --port, or leave it out for a free one"
    )
    assert not (aitbc.home / "stack.json").exists()


def test_up_rejects_bad_numbers(aitbc):
    proc = aitbc("up", "--workers", "0")

    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --workers must be in 1..64, got 0"


@pytest.mark.slow
def test_demo_end_to_end(home_stack):
    aitbc, home = home_stack, home_stack.home

    proc = aitbc("demo", "--workers", "2", "--rounds", "2", "--local-steps", "5", "--timeout", "120", timeout=240)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for step in ("[1/7]", "[3/7] upload-data", "[4/7] discover-workers", "[6/7] monitor", "Demo summary"):
        assert step in out
    summary = dict(re.findall(r"^  (\S.*?)  +(\S.*)$", out.split("Demo summary", 1)[1], re.M))
    assert summary["status"] == "complete" and summary["rounds"] == "2/2"
    start, end = map(float, summary["validation loss"].split(" -> "))
    assert end < start
    assert summary["model CID"].startswith("bafkrei") and summary["model CID"] in out.split("Demo summary")[0]
    run_id = summary["training id"]
    assert re.search(r"^Dashboard: http://127\.0\.0\.1:\d+/$", out, re.M)
    assert re.search(rf"^Watch it live: http://127\.0\.0\.1:\d+/runs/{run_id}$", out, re.M)
    assert summary["rounds done by worker-1 (RTX4090, 1.60 AIT)"].startswith("2 ")
    assert summary["rounds done by worker-2 (RTX3090, 1.20 AIT)"].startswith("2 ")
    assert (home / "demo-model.safetensors").stat().st_size > 0
    assert "Stopped the demo's stack (3 processes)" in proc.stderr
    # Taken down afterwards: no record, no process left that was started for this home.
    assert not (home / "stack.json").exists()
    if Path("/proc").is_dir():
        assert _processes_mentioning(home) == []
    # The run stays on record in the coordinator's database for a later `up`.
    assert (home / "coordinator").is_dir()
    assert os.listdir(home / "runs")
