"""End to end: a provider states the largest model it trains (``--max-params``), its offer
carries it, hiring passes it over for a larger run and says so, and the worker itself
refuses a job whose model is over it (a ``module:callable`` model, which the coordinator
cannot count before it is built, is hired and then refused there): reported, not slashed,
the money all back."""

from __future__ import annotations

import json
import textwrap

import pytest
from tests.coordinator.conftest import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.long]

MODULE = "aitbc_e2e_capacity_model"


def code_module(stack) -> None:
    """A model of 650 parameters on digits (64 inputs, 10 classes) on every process's path."""
    code = stack.root / "code"
    code.mkdir()
    (code / f"{MODULE}.py").write_text(
        textwrap.dedent(
            """
            from torch import nn

            def build(spec):
                return nn.Sequential(nn.Flatten(), nn.Linear(64, spec.num_classes))
            """
        )
    )
    stack.env["PYTHONPATH"] = str(code) + (":" + stack.env["PYTHONPATH"] if stack.env.get("PYTHONPATH") else "")


def test_a_small_offer_is_passed_over_and_a_worker_refuses_a_model_over_its_cap(stack):
    code_module(stack)
    stack.env["AITBC_ALLOW_CODE"] = json.dumps([MODULE])  # both operators allow the code...
    stack.env["AITBC_WORKER_ALLOW_CODE"] = json.dumps([MODULE])
    stack.start_coordinator()
    stack.start_worker("w1", max_bond="5", funds="10", extra=("--max-params", "100"))  # ...the worker trains 100
    (offer,) = stack.wait_offers(1)
    wid = stack.worker_id("w1")
    assert offer["max_params"] == 100
    r = stack.cli("market", "offers", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["data"][0]["max_params"] == 100, r.stdout + r.stderr

    # The built-in mlp (hidden 128, 64) has 17,226 parameters on digits: counted, so hiring passes the offer over.
    run_id = stack.init_run(workers=1)
    r = stack.cli("distributed-training", "upload-data", "--training-id", run_id, "--data-path", "digits")
    assert r.returncode == 0, r.stderr
    r = stack.cli("distributed-training", "discover-workers", "--training-id", run_id, "--required-workers", "1")
    assert r.returncode != 0 and "17,226 parameters (1 too small)" in r.stderr, r.stdout + r.stderr
    assert stack.rows("SELECT id FROM contracts WHERE run_id = :r", r=run_id) == []
    r = stack.cli("distributed-training", "stop", "--training-id", run_id)
    assert r.returncode == 0, r.stderr

    # Code is counted only once built: hired, then refused by the worker before it trains.
    code_run = stack.init_run("--bond", "2", model=f"{MODULE}:build", workers=1)
    owner_before = stack.api("/ledger/balances")["data"]
    stack.start_run(code_run, workers=1, rounds=3, local_steps=5)

    def refused(run: dict) -> bool:
        return any(w["status"] == "refused: model too large" for w in run["workers"])

    stack.wait_run(code_run, refused, timeout=120, what="the worker's refusal")
    assert "650 parameters for this data; at most 100" in stack.log("w1")
    assert stack.procs["w1"].poll() is None  # the worker carries on, ready for other runs

    r = stack.cli("distributed-training", "stop", "--training-id", code_run)
    assert r.returncode == 0, r.stderr
    pay = wait_for(
        "the stopped run's settlement", lambda: stack.api(f"/runs/{code_run}/payments"), lambda p: p["finalized"], 180
    )
    (row,) = pay["data"]
    assert row["worker_id"] == wid and row["slashed_micro"] == 0 and row["status"] != "slashed", row
    balances = stack.api("/ledger/balances")["data"]
    assert balances[f"wallet:{wid}"] == 10_000_000  # bond back, nothing taken
    owner = next(k for k in owner_before if k.startswith("wallet:") and k != f"wallet:{wid}")
    assert balances[owner] == owner_before[owner]  # escrow refunded in full: nothing was trained
