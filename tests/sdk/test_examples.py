"""The documentation's phase-driven coordinator and fault-tolerance loop, run as the
scripts in ``examples/`` against a real local stack (``aitbc up --workers 4``); the
fault-tolerance run has one of its workers SIGKILLed mid-run by the test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, start_stack):
    with start_stack(tmp_path_factory.mktemp("examples") / "home", workers=4, lease=4) as s:
        yield s


def _summary(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def test_phase_driven_example(stack):
    home, env, _ = stack
    p = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "phase_driven.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = _summary(p.stdout)
    assert out["status"] == "complete"
    # the agent moved every phase: one aggregation per round, each evaluated, loss falling
    assert [r["round"] for r in out["rounds"]] == [1, 2, 3]
    assert all(r["updates"] == 2 for r in out["rounds"])
    losses = [r["loss"] for r in out["rounds"]]
    assert losses[-1] < losses[0] < out["results"]["initial_val_loss"]
    # the saved result: the last aggregate as uploaded (upload_to_ipfs(data=model)), with the owner's metrics
    assert out["results"]["metrics"] == {"final_loss": losses[-1], "workers": 2, "rounds": 3}
    assert out["results"]["model_cid"] not in (None, out["rounds"][-1]["model"])
    assert len(out["checkpoints"]) == 4 and all(c["valid"] for c in out["checkpoints"])
    # paid by the agent from escrow for scored work, the rest refunded
    rows = out["payments"]["data"]
    assert len(rows) == 2 and all(r["paid_micro"] > 0 and r["paid_micro"] == r["due_micro"] for r in rows), rows
    assert out["payments"]["finalized"] and out["payments"]["escrow_balance"] == "0"
    assert "Round 3/3" in p.stdout and "(manual control)" in p.stdout


def test_fault_tolerance_example_replaces_a_killed_worker(stack):
    home, env, st = stack
    url = st["coordinator"]
    pids = {p["address"]: p["pid"] for p in st["processes"] if p.get("address")}
    proc = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "examples" / "fault_tolerance.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    lines: list[str] = []
    try:
        training_id = None
        while training_id is None:
            line = proc.stdout.readline()
            assert line, "example ended early:\n" + "".join(lines)
            lines.append(line)
            if line.startswith("Distributed training: "):
                training_id = line.split()[2]
        # Kill one of its workers once round 2 is open.
        victim = None
        deadline = time.monotonic() + 120
        while victim is None:
            assert time.monotonic() < deadline, "run never reached round 2"
            run = httpx.get(f"{url}/v1/runs/{training_id}", timeout=10).json()
            active = [w for w in run["workers"] if w["job_status"] == "active"]
            if run["status"] == "training" and run["round"] >= 2 and len(active) == 2:
                victim = active[0]["worker_id"]
                os.kill(pids[victim], signal.SIGKILL)
            else:
                time.sleep(0.1)
        rest, _ = proc.communicate(timeout=300)
        lines.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines)
    assert proc.returncode == 0, text
    out = _summary(text)
    assert out["status"] == "complete", text
    replaced = [e for e in out["events"] if e["event"] == "replaced"]
    assert len(replaced) == 1 and replaced[0]["worker"] == victim, out["events"]
    by = replaced[0]["by"]
    assert by != victim and by in pids
    jobs = {w["job_id"]: w for w in out["workers"]}
    old, new = jobs[replaced[0]["job"]], jobs[replaced[0]["new_job"]]
    assert old["job_status"] == "failed" and "heartbeat" in old["end_reason"]
    assert new["worker_id"] == by and new["replaces"] == old["job_id"] and new["shard_index"] == old["shard_index"]
    assert new["rounds_done"] >= 1  # the replacement trained the victim's shard
    assert [r["round"] for r in out["rounds"]] == [1, 2, 3, 4, 5, 6]
    assert all(c["valid"] for c in out["checkpoints"]) and len(out["checkpoints"]) == 7
    paid = {r["worker_id"]: r["paid_micro"] for r in out["payments"]["data"]}
    assert paid[by] > 0 and out["payments"]["finalized"]
    assert "[replaced]" in text
