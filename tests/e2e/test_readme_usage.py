"""The owner's workflow (README.md, docs/owner.md), tried as a new user on a live run (a real coordinator, real
workers, the owner's CLI as processes): ``monitor`` into a pipe writes each change as it
happens; every table is readable at 80 columns with its ids whole; the coordinator's
422s name the flag and exit 2; a corpus cut to ``--max-bytes`` says so; an owner's
``stop`` ends ``monitor`` with exit 0."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

AITBC = Path(sys.executable).parent / "aitbc"

pytestmark = pytest.mark.slow


def _narrow(stack, *args: str) -> subprocess.CompletedProcess:
    """``aitbc ARGS`` as typed in an 80-column terminal (output piped, COLUMNS=80)."""
    env = dict(stack.env, COLUMNS="80")
    return subprocess.run([str(AITBC), *args], capture_output=True, text=True, env=env, timeout=120)


def _readable(proc: subprocess.CompletedProcess, *ids: str) -> str:
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():
        assert len(line) <= 80, f"{len(line)} columns: {line!r}"
    for i in ids:  # each id whole, on one line
        assert i in proc.stdout, (i, proc.stdout)
    assert "…" not in proc.stdout
    return proc.stdout


def _balance(stack, wallet: str = "my-agent-wallet") -> str:
    r = stack.cli("wallet", "balance", wallet, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["balance"]


@pytest.mark.long  # a minute or more of real processes: make test-long (and test-pg)
def test_monitor_into_a_pipe_and_tables_at_80_columns(stack):
    stack.start_coordinator()
    for name in ("w1", "w2"):
        stack.start_worker(name, step_delay=0.1)
    stack.wait_offers(2)
    workers = [stack.worker_id("w1"), stack.worker_id("w2")]
    run_id = stack.init_run(workers=2)
    r = _narrow(stack, "distributed-training", "upload-data", "--training-id", run_id, "--data-path", "digits")
    assert r.returncode == 0, r.stderr
    hire = _narrow(
        stack, "distributed-training", "discover-workers", "--training-id", run_id, "--required-workers", "2"
    )
    _readable(hire, *workers, run_id)
    # monitor with its stdout a pipe, started before the rounds: each line arrives as it happens.
    mon = subprocess.Popen(
        [str(AITBC), "distributed-training", "monitor", "--training-id", run_id, "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stack.env,
    )
    r = stack.cli("distributed-training", "distribute", "--training-id", run_id, "--rounds", "6", "--local-steps", "10")
    assert r.returncode == 0, r.stderr
    lines, live_at = [], {}
    assert mon.stdout is not None
    for line in mon.stdout:
        lines.append(line.rstrip("\n"))
        if m := re.search(r"round (\d+)/6 closed", line):
            live_at[int(m.group(1))] = stack.api(f"/runs/{run_id}")["rounds_completed"]
    assert mon.wait(timeout=60) == 0, mon.stderr.read() if mon.stderr else ""
    text = "\n".join(lines)
    assert re.match(rf"\d\d:\d\d:\d\d {run_id}: \w+, round \d+/", lines[0]), text
    assert sorted(live_at) == [1, 2, 3, 4, 5, 6], text  # one line per round closed, in order
    assert live_at[1] < 6, (live_at, text)  # written when round 1 closed, not at the end
    assert "round 6/6 closed: val loss" in text and "val acc" in text  # the evaluation
    for w in workers:
        assert re.search(rf"worker {w}: \w+ -> \w+", text), text  # worker state changes, ids whole
    assert re.search(r"run \w+ -> complete", text), text
    assert lines[-1].startswith(f"Run {run_id} complete: val loss")

    # Every table the documented workflow prints, at 80 columns.
    run = stack.wait_run(run_id, lambda r: r["status"] == "complete")
    model_cid = run["global_model_cid"]
    _readable(_narrow(stack, "distributed-training", "list"), run_id)
    _readable(_narrow(stack, "distributed-training", "status", "--training-id", run_id), run_id, *workers)
    _readable(_narrow(stack, "distributed-training", "results", "--training-id", run_id), model_cid, *workers)
    out = _readable(_narrow(stack, "distributed-training", "verify", "--training-id", run_id), model_cid)
    assert "All 7 checkpoints verified" in out
    deadline = time.monotonic() + 60
    while not stack.api(f"/runs/{run_id}/payments")["finalized"] and time.monotonic() < deadline:
        time.sleep(0.2)
    _readable(_narrow(stack, "distributed-training", "payments", "--training-id", run_id), *workers)
    _readable(_narrow(stack, "market", "offers"), *workers)
    _readable(_narrow(stack, "wallet", "list"))
    owner = json.loads(stack.cli("wallet", "show", "my-agent-wallet", "--json").stdout)["address"]
    assert stack.cli("wallet", "send", "my-agent-wallet", workers[0], "1").returncode == 0
    _readable(_narrow(stack, "wallet", "history", "my-agent-wallet"), f"escrow:{run_id}", f"wallet:{workers[0]}")
    _readable(_narrow(stack, "ledger", "entries", "--limit", "50"), f"wallet:{owner}", f"escrow:{run_id}", *workers)


@pytest.mark.long  # ~30 CLI processes, each starting torch: minutes (make test-long)
def test_refusals_name_the_flag_and_stop_is_not_a_failure(stack, tmp_path):
    stack.start_coordinator()
    for name in ("w1", "w2"):
        stack.start_worker(name, step_delay=0.2)
    stack.wait_offers(2)
    run_id = stack.init_run(workers=2)
    stack.fund_owner()

    # The coordinator's own range checks (422) reach the user as the flag, exit 2.
    before = _balance(stack)
    for flag, value, message in (
        ("--rounds", "0", "--rounds must be in [1, 100000], got 0"),
        ("--batch-size", "100000", "--batch-size must be in [1, 65536], got 100000"),
        ("--deadline", "0.01", "--deadline must be in [0.1, 86400], got 0.01"),
    ):
        r = stack.cli("distributed-training", "distribute", "--training-id", run_id, flag, value)
        assert r.returncode == 2, (flag, r.stderr)
        assert r.stderr.strip() == f"error: {message}", r.stderr
        j = stack.cli("distributed-training", "distribute", "--training-id", run_id, flag, value, "--json")
        assert j.returncode == 2 and json.loads(j.stdout)["detail"] == message
    assert _balance(stack) == before  # nothing escrowed
    assert stack.cli("ledger", "verify").returncode == 0

    # A corpus longer than --max-bytes is cut, and says so (with the option to change it).
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"part{i}.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 1500)  # 66,000 bytes
    text_run = stack.init_run(
        "--model-opt", "context=16,d_model=16,n_layers=1,n_heads=2", model="transformer", workers=2
    )
    r = stack.cli(
        "distributed-training", "upload-data", "--training-id", text_run, "--data-path", str(corpus),
        "--max-bytes", "50000",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == (
        f"warning: text corpus {corpus} holds 198,000 bytes; only the first 50,000 (25.3%) are used "
        "(raise the cap with --max-bytes, or max_bytes=)"
    )
    r = stack.cli("distributed-training", "upload-data", "--training-id", text_run, "--data-path", str(corpus))
    assert r.returncode == 0 and "warning" not in r.stderr  # the default cap (128 MiB) takes it whole

    # An owner's stop: the run is stopped, not failed, and monitor ends with 0.
    stack.start_run(run_id, workers=2, rounds=50, local_steps=10)
    stack.wait_run(run_id, lambda r: r["rounds_completed"] >= 1, what="a round")
    mon = subprocess.Popen(
        [str(AITBC), "distributed-training", "monitor", "--training-id", run_id, "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stack.env,
    )
    first = mon.stdout.readline()  # monitor has seen the run training: the stop is a change it sees
    assert f"{run_id}: training" in first, first
    r = stack.cli("distributed-training", "stop", "--training-id", run_id)
    assert r.returncode == 0, r.stderr
    rest, err = mon.communicate(timeout=60)
    out = first + rest
    assert mon.returncode == 0, err
    assert err == ""
    assert re.search(r"run \w+ -> stopped", out), out
    assert out.splitlines()[-1].startswith(f"Run {run_id} stopped by its owner after ")
    once = stack.cli("distributed-training", "monitor", "--training-id", run_id)
    assert once.returncode == 0 and "stopped by its owner" in once.stdout
