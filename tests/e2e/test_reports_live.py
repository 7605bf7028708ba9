"""Reports and experiment trackers of a live run: a real coordinator, real workers, the
owner's CLI as processes. ``distribute --log-to tensorboard:DIR`` follows the run and its
event files (read back with TensorBoard's own EventAccumulator) hold the run's rounds;
``monitor --log-to`` backfills without writing a step twice; ``report`` writes valid
PNGs and a page with the run's numbers, of a running run and of an ended one; the
refusals change nothing."""

from __future__ import annotations

import fcntl
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

from aitbc.reports import PLOTS
from aitbc.trackers import LOCK_FILE

from .conftest import AITBC

pytestmark = pytest.mark.long  # minutes: make test-long (CI runs it)

ROUNDS = 4


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def _wait_locked(lock: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until another process holds ``lock`` (the tracker folder's writer lock)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if lock.exists():
            with lock.open("a") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return  # held by the writer
                fcntl.flock(f, fcntl.LOCK_UN)
        time.sleep(0.1)
    raise AssertionError(f"{lock} not taken in {timeout} s")


def _balance(stack, wallet: str = "my-agent-wallet") -> str:
    r = stack.cli("wallet", "balance", wallet, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["balance"]


def _one_line(r: subprocess.CompletedProcess, code: int) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def _check_report(folder, *, status: str) -> str:
    for name in PLOTS:
        png = folder / f"{name}.png"
        assert png.stat().st_size > 5000
        with Image.open(png) as im:
            assert im.format == "PNG" and im.size[0] >= 400
    page = (folder / "report.html").read_text()
    assert len(re.findall(r'src="data:image/png;base64,', page)) == len(PLOTS)
    assert f"<th>status</th><td>{status}</td>" in page
    return page


def test_tensorboard_log_report_and_refusals(stack, tmp_path):
    stack.start_coordinator()
    for name in ("w1", "w2"):
        stack.start_worker(name, step_delay=0.3)
    stack.wait_offers(2)
    run_id = stack.init_run(workers=2)
    r = stack.cli("distributed-training", "upload-data", "--training-id", run_id, "--data-path", "digits")
    assert r.returncode == 0, r.stderr
    r = stack.cli("distributed-training", "discover-workers", "--training-id", run_id, "--required-workers", "2")
    assert r.returncode == 0, r.stderr
    before = (stack.api(f"/runs/{run_id}")["status"], _balance(stack))
    dist = ["distributed-training", "distribute", "--training-id", run_id, "--rounds", str(ROUNDS)]
    dist += ["--local-steps", "5"]

    # Refusals, before anything is distributed: an unknown tracker; TensorBoard missing
    # (a module on the path that fails to import, as an install without the extra).
    line = _one_line(stack.cli(*dist, "--log-to", "wandb:x"), 2)
    assert "allowed: tensorboard:DIR" in line
    shadow = tmp_path / "no-tensorboard"
    shadow.mkdir()
    (shadow / "tensorboard.py").write_text("raise ImportError(\"No module named 'tensorboard'\")\n")
    env = dict(stack.env, PYTHONPATH=str(shadow))
    r = subprocess.run([str(AITBC), *dist, "--log-to", f"tensorboard:{tmp_path / 'x'}"], capture_output=True,
                       text=True, env=env, timeout=120)  # fmt: skip
    assert "pip install 'aitbc[tensorboard]'" in _one_line(r, 2)
    assert not (tmp_path / "x").exists()
    assert (stack.api(f"/runs/{run_id}")["status"], _balance(stack)) == before

    # distribute --log-to stays attached and writes each closed round as it arrives.
    tb = tmp_path / "tb"
    proc = subprocess.Popen([str(AITBC), *dist, "--log-to", f"tensorboard:{tb}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=stack.env)  # fmt: skip
    try:
        # A report of a run that has not ended (held paused so it cannot end meanwhile).
        stack.wait_run(run_id, lambda run: run["rounds_completed"] >= 1, timeout=120, what="a round closed")
        deadline = time.monotonic() + 180  # each try is a CLI start: seconds on a loaded machine
        while stack.cli("distributed-training", "pause", "--training-id", run_id).returncode != 0:
            assert time.monotonic() < deadline, "pause refused for 180 s"  # refused while a round aggregates
            time.sleep(0.2)
        held = stack.wait_run(run_id, lambda run: run["status"] == "paused", timeout=60, what="paused")
        live = tmp_path / "live-report"
        r = stack.cli("distributed-training", "report", "--training-id", run_id, "-o", str(live))
        assert r.returncode == 0, r.stderr
        page = _check_report(live, status="paused")
        assert f"<th>rounds</th><td>{held['rounds_completed']}/{ROUNDS}</td>" in page
        assert held["rounds_completed"] < ROUNDS
        r = stack.cli("distributed-training", "resume", "--training-id", run_id)
        assert r.returncode == 0, r.stderr
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    assert "Training distributed" in out and f"Run {run_id} complete" in out

    rounds = [r for r in stack.api(f"/runs/{run_id}/rounds")["data"] if r["round"] > 0]
    scores = stack.api(f"/runs/{run_id}/scores")["data"]
    assert len(rounds) == ROUNDS
    got = _scalars(tb)
    assert got["train/loss"] == [(r["round"], pytest.approx(r["train_loss"], rel=1e-6)) for r in rounds]
    assert got["val/loss"] == [(r["round"], pytest.approx(r["val_loss"], rel=1e-6)) for r in rounds]
    assert got["val/accuracy"] == [(r["round"], pytest.approx(r["val_accuracy"], rel=1e-6)) for r in rounds]
    # real workers on digits report their training accuracy: a share, and the tracker writes it
    assert all(0 < r["train_accuracy"] <= 1 for r in rounds), rounds
    assert got["train/accuracy"] == [(r["round"], pytest.approx(r["train_accuracy"], rel=1e-6)) for r in rounds]
    assert got["bytes/up"] == [(r["round"], pytest.approx(r["bytes_up"], rel=1e-6)) for r in rounds]
    assert got["bytes/down"] == [(r["round"], pytest.approx(r["bytes_down"], rel=1e-6)) for r in rounds]
    assert got["updates/accepted"] == [(r["round"], r["accepted"]) for r in rounds]
    mean = {}
    for s in scores:
        mean.setdefault(s["round"], []).append(s["quality"])
    assert got["score/mean"] == [(k, pytest.approx(sum(v) / len(v), rel=1e-6)) for k, v in sorted(mean.items())]

    # monitor --log-to: into the same folder, nothing twice; into a new one, the backfill.
    r = stack.cli("distributed-training", "monitor", "--training-id", run_id, "--log-to", f"tensorboard:{tb}")
    assert r.returncode == 0, r.stderr
    assert _scalars(tb) == got
    r = stack.cli("distributed-training", "monitor", "--training-id", run_id, "--log-to", f"tensorboard:{tmp_path / 'tb2'}")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert _scalars(tmp_path / "tb2") == got

    # The report of the ended run shows its numbers.
    rep = tmp_path / "report"
    r = stack.cli("distributed-training", "report", "--training-id", run_id, "-o", str(rep), "--json")
    assert r.returncode == 0, r.stderr
    paths = json.loads(r.stdout)
    assert {k: paths[k] for k in (*PLOTS, "html")} == {
        **{k: str(rep / f"{k}.png") for k in PLOTS},
        "html": str(rep / "report.html"),
    }
    page = _check_report(rep, status="complete")
    res = stack.api(f"/runs/{run_id}/results")
    assert f"{res['final_val_loss']:.4f}" in page and f"{res['final_val_accuracy']:.4f}" in page
    assert all(stack.worker_id(w) in page for w in ("w1", "w2"))
    assert all(f"{r['val_loss']:.4f}" in page for r in rounds)

    # Refusals of report: an unknown run (exit 1); a file for a folder (exit 2, before
    # fetching: the coordinator named does not even answer).
    line = _one_line(stack.cli("distributed-training", "report", "--training-id", "training_nope", "-o", str(tmp_path / "n")), 1)  # fmt: skip
    assert "training_nope" in line
    f = tmp_path / "file"
    f.write_text("mine")
    r = stack.cli("distributed-training", "report", "--training-id", run_id, "-o", str(f), "--coordinator",
                  "http://127.0.0.1:9")  # fmt: skip
    assert "is a file, not a folder" in _one_line(r, 2)
    assert f.read_text() == "mine"

    deadline = time.monotonic() + 60
    while not stack.api(f"/runs/{run_id}/payments")["finalized"] and time.monotonic() < deadline:
        time.sleep(0.2)
    r = stack.cli("ledger", "verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ctrl_c_detaches_distribute_and_one_writer_per_folder(stack, tmp_path):
    # Ctrl-C while `distribute --log-to` follows its run: the run goes on training, the
    # CLI exits 130 with one line naming the command that re-attaches; a second writer
    # into the folder meanwhile is refused (it would write every step again).
    stack.start_coordinator()
    stack.start_worker("w1", step_delay=0.3)
    stack.wait_offers(1)
    run_id = stack.init_run(workers=1)
    for step in (["upload-data", "--data-path", "digits"], ["discover-workers", "--required-workers", "1"]):
        r = stack.cli("distributed-training", step[0], "--training-id", run_id, *step[1:])
        assert r.returncode == 0, r.stderr
    tb = tmp_path / "tb"
    proc = subprocess.Popen([str(AITBC), "distributed-training", "distribute", "--training-id", run_id, "--rounds",
                             "500", "--local-steps", "5", "--log-to", f"tensorboard:{tb}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=stack.env)  # fmt: skip
    try:
        stack.wait_run(run_id, lambda run: run["rounds_completed"] >= 1, timeout=120, what="a round closed")
        second = stack.cli("distributed-training", "monitor", "--training-id", run_id, "--log-to", f"tensorboard:{tb}")
        assert "another aitbc process is writing to this folder" in _one_line(second, 2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    again = f"aitbc distributed-training monitor --training-id {run_id} --log-to tensorboard:{tb}"
    assert err.strip().splitlines()[-1] == f"error: interrupted: run {run_id} goes on training; re-attach with: {again}"
    assert "Traceback" not in err
    held = stack.api(f"/runs/{run_id}")["rounds_completed"]
    run = stack.wait_run(run_id, lambda run: run["rounds_completed"] > held, timeout=120, what="training went on")
    assert run["status"] in ("training", "aggregating")
    # the folder is free again: a re-attached writer opens it (and is stopped by the test)
    mon = subprocess.Popen([str(AITBC), *again.split()[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=stack.env)  # fmt: skip
    try:
        # Ctrl-C once it follows the run (holds the folder's lock), not while it is still
        # importing (a loaded machine takes seconds): that would be Python's own interrupt.
        _wait_locked(tb / LOCK_FILE, mon)
        mon.send_signal(signal.SIGINT)  # Ctrl-C ends monitor too: exit 130, no traceback
        mon_out, mon_err = mon.communicate(timeout=60)
    finally:
        if mon.poll() is None:
            mon.kill()
            mon.communicate()
    assert mon.returncode == 130, mon_out + mon_err
    assert "Traceback" not in mon_err, mon_err
    r = stack.cli("distributed-training", "stop", "--training-id", run_id)
    assert r.returncode == 0, r.stderr
