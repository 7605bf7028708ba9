"""End to end: ``payments`` asked the moment a run ends waits for the coordinator to settle
it, then shows every provider paid; ``--no-wait`` answers at once with the partial payments
and says so; ``--timeout`` bounds the wait with one error line naming the run's state.

The coordinator settles slowly by construction (``--settle-delay``: 8 s a contract, so the
run's last round is settled at least 16 s after the run ends), so the first answers are
certain to come before settlement has caught up."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]  # a minute of real processes and slow settlement

DELAY = 8.0  # s per contract and round: the last round of two contracts settles >= 16 s after the end


def _payments(stack, run_id: str, *args: str):
    return stack.cli("distributed-training", "payments", "--training-id", run_id, *args)


def test_payments_asked_at_the_end_wait_for_settlement(stack):
    stack.start_coordinator(settle_delay=DELAY)
    for i in range(2):
        stack.start_worker(f"w{i}", price=f"1.{i}0")
    stack.wait_offers(2)
    run_id = stack.init_run(workers=2)
    stack.start_run(run_id, workers=2, rounds=2, local_steps=5)
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]

    now = _payments(stack, run_id, "--no-wait", "--json")  # today's immediate answer
    assert now.returncode == 0 and now.stderr == "", now.stderr
    partial = json.loads(now.stdout)
    assert partial["status"] == "complete" and not partial["settled"], partial
    assert partial["settled_round"] < partial["rounds_closed"] == 2, partial

    bound = _payments(stack, run_id, "--timeout", "0")  # the bound passes at once
    assert bound.returncode == 1, bound.stdout + bound.stderr
    error = [line for line in bound.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and f"run {run_id} (complete): its rounds are settled through" in error[0], bound.stderr
    assert "of 2 after 0 s" in error[0] and "--timeout" in error[0] and "--no-wait" in error[0], error

    waited = _payments(stack, run_id)  # the table, once every round is paid
    assert waited.returncode == 0, waited.stderr
    said = waited.stderr.splitlines()  # into a pipe: one line, no redrawing
    assert len(said) <= 1 and all(line.startswith("settling: ") for line in said), waited.stderr
    assert "settled through round 2 of 2; finalized" in waited.stdout and "Partial" not in waited.stdout

    final = json.loads(_payments(stack, run_id, "--json").stdout)
    assert final["settled"] and final["finalized"] and final["settled_round"] == 2
    assert len(final["data"]) == 2 and all(r["paid_micro"] > 0 and r["rounds_scored"] == 2 for r in final["data"])
