"""What a party with its own ends can do to the money of a run on a real anvil, and what
it cannot: each test is one attack, held off."""

from __future__ import annotations

from typing import Any

import pytest
from tests.chain.evm_coordinator import coordinator, evm_stack
from tests.chain.test_coordinator_money import AIT, _offer, _refused, _run

pytestmark = pytest.mark.chain


def _provider(coord, address: str) -> Any:
    c = coord.client("provider")
    c.post("/workers", _offer(address))
    return c


def test_an_evm_account_holds_one_contract_of_a_run(tmp_path):
    # On chain a contract is (run, account): two contracts of one run naming one account
    # would share one bond (the books minting it twice), one slash would burn it for both,
    # and their settlement (one line per account) could never be sent.
    with evm_stack(tmp_path) as stack, coordinator(stack.settings()) as coord:
        victim = stack.account(5 * AIT)
        _provider(coord, victim.address)
        _provider(coord, victim.address)  # another provider naming the victim's account
        owner, _, run_id = _run(stack, coord, 2)
        _refused(
            coord,
            lambda: owner.post(f"/runs/{run_id}/discover", {"required_workers": 2}),
            409,
            "not_enough_workers",
        )
        other = stack.account(5 * AIT)
        third = _provider(coord, other.address)
        hired = owner.post(f"/runs/{run_id}/discover", {"required_workers": 2})
        assert hired["count"] == 2
        rows = coord.rows("SELECT worker_id, evm_address FROM contracts WHERE run_id = :r", r=run_id)
        assert sorted(r["evm_address"] for r in rows) == sorted([victim.address, other.address])
        assert third.wallet.address in {r["worker_id"] for r in rows}
        twin = next(
            o["worker_id"]
            for o in coord.rows("SELECT id AS worker_id, evm_address FROM offers")
            if o["evm_address"] == victim.address and o["worker_id"] not in {r["worker_id"] for r in rows}
        )
        _refused(
            coord,
            lambda: owner.post(f"/runs/{run_id}/contracts", {"worker_id": twin, "price": "1"}),
            409,
            "evm_account_in_run",
            victim.address,
        )
