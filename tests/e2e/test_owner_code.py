"""End to end: an owner cannot run code on the coordinator or on a provider.

A real coordinator refuses ``os:system`` and an importable module with an import-time side
effect at ``init`` (422, nothing imported, no sentinel file); with ``--allow-code`` for the
module on the coordinator only, a real worker refuses the job (nothing imported there),
reports it, is not slashed, and the money all goes back: the ledger verifies."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from aitbc.client import ApiError, CoordinatorClient
from aitbc.ledger.wallet import Wallet

pytestmark = [pytest.mark.slow, pytest.mark.long]

MODULE = "aitbc_e2e_sentinel_model"


def sentinel_module(stack) -> None:
    """A module on every process's path whose import writes ``IMPORTED-<who>``."""
    code = stack.root / "code"
    code.mkdir()
    (code / f"{MODULE}.py").write_text(
        textwrap.dedent(
            f"""
            import pathlib, sys
            who = "worker" if "worker" in sys.argv else "coordinator" if "coordinator" in sys.argv else "owner"
            pathlib.Path({str(stack.root)!r}, "IMPORTED-" + who).write_text(" ".join(sys.argv))
            from torch import nn

            def build(spec):
                return nn.Sequential(nn.Flatten(), nn.Linear(64, spec.num_classes))
            """
        )
    )
    stack.env["PYTHONPATH"] = str(code) + (":" + stack.env["PYTHONPATH"] if stack.env.get("PYTHONPATH") else "")


def imported(stack) -> list[str]:
    return sorted(p.name for p in stack.root.glob("IMPORTED-*"))


def verify(stack) -> dict:
    r = stack.cli("ledger", "verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_owner_code_is_refused_at_init_and_nothing_is_imported(stack):
    sentinel_module(stack)
    stack.start_coordinator()
    owner = CoordinatorClient(stack.url, Wallet.generate("owner"))
    owner.post("/wallets/fund", {"amount": "100"})
    target = stack.root / "pwned"
    for model, options in [
        ("os:system", {"command": f"touch {target}"}),
        (f"{MODULE}:build", {}),
        ("subprocess:run", {"args": ["touch", str(target)]}),
    ]:
        with pytest.raises(ApiError) as e:
            owner.post(
                "/runs",
                {"model_type": model, "model_options": options, "dataset_size": "1GB", "target_workers": 1},
            )
        assert (e.value.status, e.value.code) == (422, "bad_model"), e.value.detail
        assert "--allow-code" in e.value.detail and "cnn, mlp, transformer" in e.value.detail
    # Out of range, unknown, wrong type: 422 naming the option and what is allowed.
    for options, words in [
        ({"d_model": 1 << 20}, ["d_model", "[1, 8192]"]),
        ({"n_layers": 1000}, ["n_layers", "[1, 48]"]),
        ({"command": "x"}, ["unknown", "'command'", "d_model"]),
        ({"d_model": "huge"}, ["d_model='huge' must be int"]),
        ({"d_model": 8192, "n_layers": 48, "n_heads": 8}, ["parameters", "1,000,000,000", "--max-params"]),
    ]:
        with pytest.raises(ApiError) as e:
            owner.post(
                "/runs",
                {"model_type": "transformer", "model_options": options, "dataset_size": "1GB", "target_workers": 1},
            )
        assert (e.value.status, e.value.code) == (422, "bad_model"), e.value.detail
        assert all(w in e.value.detail for w in words), (words, e.value.detail)
    # The owner's CLI says so in one line and exits non-zero.
    r = stack.cli(
        "distributed-training", "init", "--wallet", "w", "--model-type", "os:system", "--model-opt",
        f"command=touch {target}", "--dataset-size", "1GB", "--target-workers", "1",
    )  # fmt: skip
    assert r.returncode != 0 and "--allow-code" in r.stderr, r.stdout + r.stderr
    owner.close()

    assert not target.exists() and imported(stack) == []
    assert stack.api("/runs")["count"] == 0
    assert stack.api(f"/wallets/{owner.wallet.address}/balance")["balance"] == "100"
    verify(stack)


def test_a_worker_refuses_code_its_operator_did_not_allow(stack):
    sentinel_module(stack)
    stack.env["AITBC_ALLOW_CODE"] = json.dumps([MODULE])  # the coordinator's operator allows it...
    stack.start_coordinator()
    del stack.env["AITBC_ALLOW_CODE"]  # ...the worker's does not
    stack.start_worker("w1", max_bond="5", funds="10")
    stack.wait_offers(1)
    wid = stack.worker_id("w1")
    run_id = stack.init_run("--bond", "2", model=f"{MODULE}:build", workers=1)
    owner_before = stack.api("/ledger/balances")["data"]
    stack.start_run(run_id, workers=1, rounds=3, local_steps=5)

    def refused(run: dict) -> bool:
        return any(w["status"] == "refused: model not allowed" for w in run["workers"])

    stack.wait_run(run_id, refused, timeout=120, what="the worker's refusal")
    assert "refused" in stack.log("w1") and f"{MODULE}:build" in stack.log("w1")
    # The owner's machine (upload-data) and the allowing coordinator imported it; the worker never did.
    assert imported(stack) == ["IMPORTED-coordinator", "IMPORTED-owner"]
    assert stack.procs["w1"].poll() is None  # the worker carries on, ready for other runs

    r = stack.cli("distributed-training", "stop", "--training-id", run_id)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 60
    while not (pay := stack.api(f"/runs/{run_id}/payments"))["finalized"]:
        assert time.monotonic() < deadline, pay
        time.sleep(0.2)
    (row,) = pay["data"]
    assert row["worker_id"] == wid and row["slashed_micro"] == 0 and row["status"] != "slashed", row
    balances = stack.api("/ledger/balances")["data"]
    assert balances[f"wallet:{wid}"] == 10_000_000  # bond back, nothing taken
    owner = next(k for k in owner_before if k.startswith("wallet:") and k != f"wallet:{wid}")
    assert balances[owner] == owner_before[owner]  # escrow refunded in full: nothing was trained
    assert not any(k.startswith(("bond:", "escrow:")) and v for k, v in balances.items())
    assert not [e for e in stack.api("/ledger/entries")["data"] if e["kind"] == "slash"]
    assert imported(stack) == ["IMPORTED-coordinator", "IMPORTED-owner"]
    verify(stack)
