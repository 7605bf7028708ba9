"""A coordinator on a real anvil (--chain evm) keeps its books as a mirror of the chain: the
owner's deposit and each provider's bond enter its ledger once each, however often they are
looked at (a top-up as the difference); nothing moves out of a wallet here. Hires count AIT on
chain, distribute needs the deposit (covering the cost, at a price and a timeout that fit),
a job is handed out with ``bond_required`` until its bond is on chain and an update before it
is refused; every refusal is one line and changes nothing, and the ledger's audit passes
with the mirror's entries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.chain.evm_coordinator import coordinator, evm_stack
from tests.coordinator.conftest import (
    MODEL_OPTIONS,
    assert_api_error,
    put_update,
    update_body,
    upload_digits,
    wait_for,
)

from aitbc.chain.evm.contracts import run_key
from aitbc.chain.evm.proof import sign_proof
from aitbc.client import ApiError
from aitbc.coordinator.money.onchain import sync_bond, sync_deposit
from aitbc.coordinator.store.models import Contract, Run

pytestmark = pytest.mark.chain

AIT = 1_000_000
BOND = 2 * AIT
AITBC = Path(sys.executable).parent / "aitbc"


def _state(coord) -> dict[str, Any]:
    """The coordinator's record and its ledger, for "nothing changed" checks."""
    return {**coord.snapshot(), "ledger": coord.rows("SELECT seq, kind, amount FROM ledger_entries ORDER BY seq")}


def _refused(coord, call, status: int, code: str, *words: str) -> None:
    before = _state(coord)
    with pytest.raises(ApiError) as e:
        call()
    assert_api_error(e, status, code, *words)
    assert "\n" not in e.value.detail
    assert _state(coord) == before, f"{code} changed the record"


def _entries(coord, kind: str) -> list[dict[str, Any]]:
    return coord.rows("SELECT credit, amount, key FROM ledger_entries WHERE kind = :k ORDER BY seq", k=kind)


def _proof(coord, client, acct) -> str:
    """``acct``'s proof that it belongs to ``client``'s wallet at ``coord``."""
    return sign_proof(acct, client.wallet.address, coord.ctx.coordinator_id)


def _named(evm: str | None, proof: str | None) -> dict[str, Any]:
    return {k: v for k, v in (("evm_address", evm), ("evm_proof", proof)) if v is not None}


def _run_body(evm: str | None, proof: str | None = None, **over: Any) -> dict[str, Any]:
    body = {"model_type": "mlp", "model_options": MODEL_OPTIONS, "dataset_size": "1GB", "target_workers": 2}
    return {**body, **_named(evm, proof), "bond": "2", **over}


def _offer(evm: str | None, proof: str | None = None) -> dict[str, Any]:
    body = {"gpu": "RTX4090", "price": "1.0", "availability": 0.99, "max_bond": "5"}
    return {**body, **_named(evm, proof)}


def test_refusals_at_init_offer_and_wallet_are_one_line_and_change_nothing(tmp_path):
    with evm_stack(tmp_path) as stack, coordinator(stack.settings()) as coord:
        owner, acct = coord.client("owner"), stack.account()
        proof = _proof(coord, owner, acct)
        cases = [
            (lambda: owner.post("/runs", _run_body(None)), 422, "evm_account_required", "evm_address"),
            (lambda: owner.post("/runs", _run_body("0x12")), 422, "bad_evm_address", "'0x12'"),
            # a mixed-case address whose checksum is wrong: a typo, caught
            (lambda: owner.post("/runs", _run_body(acct.address.swapcase())), 422, "bad_evm_address", "checksum"),
            (
                lambda: owner.post("/runs", _run_body(acct.address, proof, control="manual")),
                422,
                "not_on_chain",
                "manual",
            ),
            (
                lambda: owner.post("/runs", _run_body(acct.address, proof, budget="5")),
                422,
                "not_on_chain",
                "chain deposit",
            ),
            (lambda: owner.post("/wallets/fund", {"amount": "5"}), 422, "not_on_chain", "faucet"),
            # more workers than one settlement transaction pays: the run could never be paid
            (
                lambda: owner.post("/runs", _run_body(acct.address, proof, target_workers=129)),
                422,
                "too_many_workers",
                "at most 128",
            ),
            (lambda: owner.post("/workers", _offer(None)), 422, "evm_account_required", "evm_address"),
        ]
        for call, status, code, words in cases:
            _refused(coord, call, status, code, words)
        run = owner.post("/runs", _run_body(acct.address.lower(), proof))  # all lower case: no checksum to check
        assert coord.rows("SELECT owner_evm FROM runs")[0]["owner_evm"] == acct.address  # stored checksummed
        rid = run["training_id"]
        for call, words in [
            (lambda: owner.post(f"/runs/{rid}/phase", {"phase": "distributing"}), "manual control"),
            (lambda: owner.post(f"/runs/{rid}/payments", {"contract_id": "contract_x", "amount": "1"}), "by hand"),
            (lambda: owner.post("/wallets/send", {"to": "ait1" + "0" * 40, "amount": "1"}), "transfer"),
        ]:
            _refused(coord, call, 422, "not_on_chain", words)


def test_a_local_coordinator_keeps_an_evm_address_unused(tmp_path):
    from eth_utils import to_checksum_address

    from aitbc.coordinator.config import Settings

    with coordinator(Settings(home=tmp_path / "local", lease_seconds=600.0)) as coord:
        owner = coord.client("owner")
        address = "0x" + "ab" * 20
        run = owner.post("/runs", _run_body(address))
        stored = coord.rows("SELECT owner_evm FROM runs WHERE id = :r", r=run["training_id"])
        assert stored == [{"owner_evm": to_checksum_address(address)}]
        assert owner.post("/runs", _run_body(None))["training_id"]  # not required here
        _refused(coord, lambda: owner.post("/runs", _run_body("0xnope")), 422, "bad_evm_address", "'0xnope'")


def _providers(stack, coord, n: int) -> list[tuple[Any, Any]]:
    """``n`` providers on the market, each with 5 AIT on chain for its bond: (client, account)."""
    providers = []
    for _ in range(n):
        acct = stack.account(5 * AIT)
        c = coord.client("provider")
        c.post("/workers", _offer(acct.address, _proof(coord, c, acct)))
        providers.append((c, acct))
    return providers


def _run(stack, coord, n: int, *, owner_ait: int = 100 * AIT) -> tuple[Any, Any, str]:
    """An owner with ``owner_ait`` on chain and its run of ``n`` digits shards, bond 2 AIT:
    (client, account, run id)."""
    owner, acct = coord.client("owner"), stack.account(owner_ait)
    run_id = owner.post("/runs", _run_body(acct.address, _proof(coord, owner, acct), target_workers=n))["training_id"]
    upload_digits(owner, run_id, max(n, 2))  # one digits shard is over the test blob limit
    return owner, acct, run_id


def _hired(stack, coord, n: int):
    """``n`` providers and a run that hired them all: (owner, owner account, run id, providers)."""
    providers = _providers(stack, coord, n)
    owner, acct, run_id = _run(stack, coord, n)
    assert owner.post(f"/runs/{run_id}/discover", {"required_workers": n})["count"] == n
    return owner, acct, run_id, providers


def test_hires_count_ait_on_chain_and_post_no_bond_here(tmp_path):
    with evm_stack(tmp_path) as stack, coordinator(stack.settings()) as coord:
        providers = _providers(stack, coord, 2)
        poor = coord.client("poor")  # no AIT on chain: cannot bond
        broke = stack.account()
        poor.post("/workers", _offer(broke.address, _proof(coord, poor, broke)))
        short, _, short_run = _run(stack, coord, 2, owner_ait=AIT)  # 1 AIT: short of 2 x 1 AIT x 10 rounds
        _refused(
            coord,
            lambda: short.post(f"/runs/{short_run}/discover", {"required_workers": 2}),
            409,
            "insufficient_funds",
            "EVM account",
            "short by 19 AIT",
        )
        owner, _, run_id = _run(stack, coord, 2)
        _refused(
            coord,
            lambda: owner.post(f"/runs/{run_id}/discover", {"required_workers": 3}),
            409,
            "not_enough_workers",
            "able to bond 2 AIT (1 cannot)",
        )
        assert owner.post(f"/runs/{run_id}/discover", {"required_workers": 2})["count"] == 2
        rows = coord.rows("SELECT evm_address, bond, chain_bonded FROM contracts WHERE run_id = :r", r=run_id)
        assert sorted(r["evm_address"] for r in rows) == sorted(a.address for _, a in providers)
        assert {(r["bond"], r["chain_bonded"]) for r in rows} == {(0, False)}  # nothing bonded here
        assert _entries(coord, "bond") == []


def test_deposit_and_bond_mirrored_once_and_gating(tmp_path):
    with evm_stack(tmp_path) as stack, coordinator(stack.settings()) as coord:
        owner, acct, run_id, providers = _hired(stack, coord, 2)
        distribute = {"rounds": 3, "local_steps": 1, "batch_size": 8, "max_cost": "6"}  # 2 x 1 AIT x 3 rounds
        go = lambda: owner.post(f"/runs/{run_id}/distribute", distribute)
        _refused(coord, go, 409, "insufficient_escrow", "short by 6 AIT", "aitbc chain deposit")

        stack.escrow.deposit(acct, run_id, 4 * AIT, AIT, 3600)
        _refused(coord, go, 409, "insufficient_escrow", "holds 4 AIT", "short by 2 AIT")
        key = run_key(acct.address, run_id)
        for _ in range(3):  # however often it is looked at, a total enters the books once
            _sync_deposit(coord, run_id)
        assert _entries(coord, "chain-deposit") == [
            {"credit": f"escrow:{run_id}", "amount": 4 * AIT, "key": f"chain-deposit:{run_id}:{4 * AIT}"}
        ]
        stack.escrow.top_up(acct, key, 2 * AIT)
        _sync_deposit(coord, run_id)
        _sync_deposit(coord, run_id)
        assert [e["amount"] for e in _entries(coord, "chain-deposit")] == [
            4 * AIT,
            2 * AIT,
        ]  # the top-up: the difference
        assert coord.rows("SELECT escrowed, chain_deposited FROM runs WHERE id = :r", r=run_id) == [
            {"escrowed": 6 * AIT, "chain_deposited": 6 * AIT}
        ]

        go()
        job = _job(providers[0][0])
        assert job["action"] == "wait"
        assert job["bond_required"] == {
            "chain_id": 31337,
            "escrow": stack.deployment.escrow,
            "token": stack.deployment.token,
            "key": "0x" + key.hex(),
            "amount_micro": BOND,
        }
        worker, w_acct = providers[0]
        blob = put_update(worker, torch.zeros(_d(coord, run_id)))
        _refused(
            coord,
            lambda: worker.post(f"/jobs/{job['job_id']}/updates", update_body(1, blob)),
            409,
            "bond_required",
            "post_bond(0x" + key.hex(),
        )

        stack.escrow.post_bond(w_acct, key, BOND)
        for _ in range(2):
            after = _job(worker)
            assert after["bond_required"] is None and after["action"] == "train", after
        assert _job(providers[1][0])["bond_required"] is not None  # the other has not bonded
        contract = coord.rows(
            "SELECT id, bond, chain_bonded FROM contracts WHERE worker_id = :w", w=worker.wallet.address
        )
        assert contract == [{"id": contract[0]["id"], "bond": BOND, "chain_bonded": True}]
        with coord.ctx.session() as s:  # looked at again: nothing more
            c = s.get(Contract, contract[0]["id"])
            assert sync_bond(coord.ctx, s, s.get(Run, run_id), c)
            s.commit()
        assert _entries(coord, "chain-bond") == [
            {"credit": f"bond:{contract[0]['id']}", "amount": BOND, "key": f"chain-bond:{contract[0]['id']}"}
        ]
        accepted = worker.post(f"/jobs/{job['job_id']}/updates", update_body(1, blob))
        assert accepted["status"] == "accepted"

        verified = _verify_ledger(coord.url, tmp_path)
        assert verified["ok"], verified


def test_distribute_needs_the_deposits_price_and_timeout(tmp_path):
    with evm_stack(tmp_path) as stack, coordinator(stack.settings()) as coord:
        for price, timeout, code, words in [
            (AIT // 2, 3600, "price_above_deposit", "--price 1"),
            (AIT, 100, "timeout_too_short", "--timeout 2400"),  # 4 x the default 600 s deadline
        ]:
            owner, acct, run_id, _ = _hired(stack, coord, 1)
            stack.escrow.deposit(acct, run_id, 10 * AIT, price, timeout)
            _refused(
                coord,
                lambda o=owner, r=run_id: o.post(f"/runs/{r}/distribute", {"rounds": 3, "max_cost": "3"}),
                409,
                code,
                words,
            )
        # a hire at more than the deposit's price (a settlement could not pay it): refused
        (late, _), *_ = _providers(stack, coord, 1)
        _refused(
            coord,
            lambda: owner.post(f"/runs/{run_id}/contracts", {"worker_id": late.wallet.address, "price": "1.5"}),
            409,
            "price_above_deposit",
            "at most 1 AIT",
        )


def _sync_deposit(coord, run_id: str) -> None:
    with coord.ctx.session() as s:
        sync_deposit(coord.ctx, s, s.get(Run, run_id))
        s.commit()


def _job(worker) -> dict[str, Any]:
    job = worker.get(f"/workers/{worker.wallet.address}/job", sign=True)["job"]
    assert job is not None
    return job


def _d(coord, run_id: str) -> int:
    cfg = wait_for(
        "the run training",
        lambda: coord.rows("SELECT status, config FROM runs WHERE id = :r", r=run_id)[0],
        lambda row: row["status"] == "training",
        timeout=120,
    )
    config = cfg["config"]
    return int((json.loads(config) if isinstance(config, str) else config)["d"])


def _verify_ledger(url: str, tmp: Path) -> dict[str, Any]:
    """``aitbc ledger verify`` against the coordinator, as a user runs it."""
    env = {**os.environ, "AITBC_HOME": str(tmp / "cli-home")}
    r = subprocess.run(
        [str(AITBC), "ledger", "verify", "--coordinator", url, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    return json.loads(r.stdout)


def test_a_gossip_record_before_the_bond_is_refused(tmp_path):
    with evm_stack(tmp_path) as stack, coordinator(stack.settings()) as coord:
        owner, acct, run_id, providers = _hired(stack, coord, 2)
        stack.escrow.deposit(acct, run_id, 6 * AIT, AIT, 3600)
        owner.post(f"/runs/{run_id}/distribute", {"rounds": 3, "local_steps": 1, "mode": "gossip", "max_cost": "6"})
        _d(coord, run_id)  # training
        worker = providers[0][0]
        job = _job(worker)
        assert job["bond_required"] is not None
        _refused(
            coord,
            lambda: worker.post(f"/jobs/{job['job_id']}/records", {"record": {}, "signature": "00"}),
            409,
            "bond_required",
            "post_bond(",
        )


def test_money_that_reached_the_chain_late_is_in_the_books_before_the_run_is_finalized(tmp_path):
    """A top-up after distribute, and a bond posted after its job's last pickup, are mirrored
    when the run ends, before its bonds and escrow go back in the books."""
    with evm_stack(tmp_path) as stack, coordinator(stack.settings()) as coord:
        owner, acct, run_id, providers = _hired(stack, coord, 2)
        stack.escrow.deposit(acct, run_id, 6 * AIT, AIT, 3600)
        owner.post(f"/runs/{run_id}/distribute", {"rounds": 3, "local_steps": 1, "batch_size": 8, "max_cost": "6"})
        _d(coord, run_id)
        key = run_key(acct.address, run_id)
        stack.escrow.top_up(acct, key, AIT)
        stack.escrow.post_bond(providers[0][1], key, BOND)  # never picked up again
        owner.post(f"/runs/{run_id}/stop")
        wait_for(
            "the run finalized",
            lambda: coord.rows("SELECT finalized FROM runs WHERE id = :r", r=run_id)[0]["finalized"],
            bool,
            timeout=60,
        )
        assert [e["amount"] for e in _entries(coord, "chain-deposit")] == [6 * AIT, AIT]
        assert [e["amount"] for e in _entries(coord, "chain-bond")] == [BOND]
        refunds = coord.rows("SELECT amount FROM ledger_entries WHERE kind = 'refund'")
        assert refunds == [{"amount": 7 * AIT}]  # nothing was settled: every deposited AIT goes back
