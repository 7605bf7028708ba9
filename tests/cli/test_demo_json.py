"""`aitbc demo --json`: the steps go to stderr, stdout is one JSON object (the summary), so a
script can read the run's outcome; the stack the demo started is taken down."""

from __future__ import annotations

import json

import pytest

from aitbc import stack as stk


@pytest.mark.slow
def test_demo_json_prints_one_summary_object(aitbc):
    try:
        proc = aitbc("demo", "--workers", "2", "--rounds", "2", "--local-steps", "5", "--json", timeout=300)
    finally:
        if stk.stack_file(aitbc.home).exists():
            stk.down(aitbc.home, grace=5.0)

    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)  # the whole of stdout: one object
    assert summary["status"] == "complete" and summary["rounds_completed"] == 2
    assert summary["final_val_loss"] < summary["initial_val_loss"]
    assert summary["model_cid"].startswith("bafkrei") and summary["ledger_ok"] is True
    assert summary["escrow_balance"] == "0"
    v = summary["verification"]  # the demo spot-checks 10% of each update's steps
    assert v["rate"] == 0.1 and v["failed"] == 0 and v["unanswered"] == 0 and v["updates"] >= 2
    assert (aitbc.home / "demo-model.safetensors").stat().st_size > 0
    assert "[6/7] monitor" in proc.stderr and "Demo summary" in proc.stderr  # the steps, on stderr
    assert summary["training_id"] in proc.stderr
    assert not (aitbc.home / "stack.json").exists()
