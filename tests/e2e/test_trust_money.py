"""End to end (issue 12, parts 2 and 4): a provider is slashed only for a fault that is
provably its own, and one provider cannot wreck a run under the default ``mean``.

A real coordinator process, real worker processes, the owner's CLI and SDK, SQLite:

- an owner's extreme outer learning rate (the attack: honest providers were slashed into
  the owner's escrow) is refused at ``distribute`` with a 422 naming the option and range;
- an in-range config that still diverges fails the run ``diverged``: nothing of that round
  is committed, nobody is slashed, honest bonds return, the owner ends with no more than it
  started with;
- a provider sending a correctly shaped update of 3e38 per coordinate under ``mean`` is
  rejected and slashed (its bond burned, not the owner's), and training goes on improving.

Every case ends with ``aitbc ledger verify`` OK.
"""

from __future__ import annotations

import json
import re

import pytest

from aitbc_agent_sdk import Agent, AgentConfig
from aitbc_agent_sdk.errors import Unprocessable

pytestmark = [pytest.mark.slow, pytest.mark.long]

BOND = 2_000_000  # micro-AIT each provider locks (--bond 2)
FUNDS = 10_000_000  # each provider's wallet (funds 10)
OWNER = 1000_000_000  # the owner's wallet after init (fund_owner)


def _verify(stack) -> dict:
    r = stack.cli("ledger", "verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    audit = json.loads(r.stdout)
    assert audit["ok"], audit
    return audit


def _balances(stack) -> dict[str, int]:
    return stack.api("/ledger/balances")["data"]


def _owner(stack) -> Agent:
    return Agent(
        AgentConfig(name="owner", wallet_name="my-agent-wallet", coordinator_url=stack.url, home=stack.root / "owner")
    )


def _hire(stack, run_id: str, workers: int) -> None:
    """upload-data and discover-workers as the owner types them (distribute comes next)."""
    r = stack.cli("distributed-training", "upload-data", "--training-id", run_id, "--data-path", "digits")
    assert r.returncode == 0, r.stderr
    r = stack.cli(
        "distributed-training", "discover-workers", "--training-id", run_id, "--required-workers", str(workers)
    )
    assert r.returncode == 0, r.stderr


def _providers(stack, n: int) -> list[str]:
    names = [f"honest{i}" for i in range(n)]
    for name in names:
        stack.start_worker(name, max_bond="5", funds="10")
    return names


def test_owner_config_out_of_range_is_refused_at_distribute(stack):
    stack.start_coordinator()
    names = _providers(stack, 2)
    stack.wait_offers(2)
    run_id = stack.init_run("--bond", "2", workers=2)
    _hire(stack, run_id, 2)
    before = _balances(stack)
    refusals = [
        ({"outer": "fedavg", "outer_options": {"lr": 1e30}}, "lr must be in (0, 10]"),  # the attack of issue 12
        ({"outer": "diloco", "outer_options": {"momentum": 0.999}}, "momentum must be in [0, 0.99]"),
        ({"lr": 5.0}, "lr must be in [1e-08, 1]"),
        ({"local_steps": 10_000_000}, "local_steps must be in [1, 100000]"),
        ({"rounds": 1_000_000}, "rounds must be in [1, 100000]"),
        ({"deadline": 0.01}, "deadline must be in [0.1, 86400]"),
        ({"eval_every": 0}, "eval_every must be in [1, 100000]"),
    ]
    with _owner(stack) as owner:
        owner.start()
        for options, message in refusals:
            with pytest.raises(Unprocessable) as e:
                owner.start_training(run_id, **{"rounds": 3, "local_steps": 5, **options})
            assert e.value.status == 422 and message in str(e.value), (options, str(e.value))
    run = stack.api(f"/runs/{run_id}")
    assert run["status"] == "initializing" and run["round"] == 0
    assert _balances(stack) == before  # nothing escrowed, nothing slashed
    for name in names:
        assert before[f"wallet:{stack.worker_id(name)}"] == FUNDS - BOND  # only the bond, locked at hiring
    _verify(stack)


def test_in_range_config_that_diverges_fails_the_run_and_slashes_nobody(stack):
    stack.start_coordinator()
    names = _providers(stack, 2)
    stack.wait_offers(2)
    run_id = stack.init_run("--bond", "2", workers=2)
    _hire(stack, run_id, 2)
    # Both in range, together far too hot: within a few rounds an aggregate's loss is many times chance.
    with _owner(stack) as owner:
        owner.start()
        owner.start_training(run_id, 4, 20, lr=0.1, outer="fedavg", outer_options={"lr": 10.0})
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=180, what="the end")
    assert run["status"] == "failed" and run["error"].startswith("diverged:"), run["error"]
    pay = stack.finalized(run_id)
    for row in pay["data"]:
        assert row["slashed_micro"] == 0 and row["status"] != "slashed", row
    bad = int(re.match(r"diverged: round (\d+)'s", run["error"]).group(1))
    rounds = stack.api(f"/runs/{run_id}/rounds")["data"]
    assert [r["round"] for r in rounds] == list(range(bad))  # the diverged round was never committed
    assert run["round"] == bad

    balances = _balances(stack)
    paid = {r["worker_id"]: r["paid_micro"] for r in pay["data"]}
    for name in names:  # bond back, plus what the committed rounds earned and the diverged one's delivered update
        wid = stack.worker_id(name)
        assert balances[f"wallet:{wid}"] == FUNDS + paid[wid]
    # The owner received the diverged round's updates (its outer lr made the aggregate diverge, the
    # raw updates stay useful to it): each is paid as delivered, the full price, once (issue 33).
    delivered = stack.rows("SELECT amount FROM ledger_entries WHERE kind = 'settle' AND key LIKE :k", k=f"%:{bad}")
    assert sorted(a for (a,) in delivered) == [1_000_000, 1_000_000]
    owner_wallet = json.loads((stack.root / "owner" / "wallets" / "my-agent-wallet" / "key.json").read_text())
    assert balances[f"wallet:{owner_wallet['address']}"] <= OWNER
    assert balances.get(f"escrow:{run_id}", 0) == 0 and balances.get("burn:local", 0) == 0
    assert stack.api(f"/runs/{run_id}")["flags"] == 0  # no worker flagged for the owner's config
    _verify(stack)


def test_scaled_update_under_mean_is_rejected_and_slashed_and_training_improves(stack):
    stack.start_coordinator()
    names = _providers(stack, 2)
    stack.start_worker("byz", price="0.50", max_bond="5", funds="10", attack="scale:value=3e38")
    stack.wait_offers(3)
    run_id = stack.init_run("--bond", "2", workers=3)
    # mean on purpose (the default is trend+centered-clip): the norm bound alone must save a plain mean
    stack.start_run(run_id, workers=3, rounds=5, local_steps=20, aggregator="mean")
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=240, what="the end")
    assert run["status"] == "complete", run["error"]
    assert run["config"]["aggregator"] == "mean"
    pay = stack.finalized(run_id)

    byz_id = stack.worker_id("byz")
    rows = {r["worker_id"]: r for r in pay["data"]}
    byz = rows.pop(byz_id)
    assert byz["status"] == "slashed" and byz["slashed_micro"] == BOND and byz["paid_micro"] == 0
    updates = stack.rows("SELECT status, reason FROM updates WHERE run_id = :r AND worker_id = :w", r=run_id, w=byz_id)
    assert updates and all(st == "rejected" and "median" in why for st, why in updates), updates
    for honest in rows.values():
        assert honest["slashed_micro"] == 0 and honest["paid_micro"] > 0

    losses = [r["val_loss"] for r in stack.api(f"/runs/{run_id}/rounds")["data"]]
    assert all(x is not None for x in losses), losses
    assert losses[-1] < 0.5 * losses[0], losses  # the model learned despite the attacker
    assert run["val_accuracy"] > 0.8

    balances = _balances(stack)
    assert balances["burn:local"] == BOND  # the slashed bond is burned: not the owner's, not anyone's
    assert balances[f"wallet:{byz_id}"] == FUNDS - BOND
    for name in names:
        wid = stack.worker_id(name)
        assert balances[f"wallet:{wid}"] == FUNDS + rows[wid]["paid_micro"]
    assert balances.get(f"escrow:{run_id}", 0) == 0
    audit = _verify(stack)
    assert sum(v for k, v in balances.items() if not k.startswith("mint:")) == audit["minted"]
