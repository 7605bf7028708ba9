"""End to end on a real chain: the coordinator killed for good in the middle of a run. Once
the run's on-chain timeout has passed (the dev chain's clock moved past the deadline: the
timeout is the one the owner's distribute set, and the test waits on the chain saying the
run is closed), the owner takes the escrow left back with ``aitbc chain refund`` and each
provider its bond and what it earned with ``aitbc chain withdraw``: the command line and
the chain alone, no coordinator, no one else's signature."""

from __future__ import annotations

import pytest
from tests.chain.e2e.conftest import OWNER, key_of
from tests.conftest import wait_until

from aitbc.units import MICRO

pytestmark = [pytest.mark.chain, pytest.mark.long]

CHAIN_TIMEOUT = 2400  # the least the coordinator takes with the default round deadline (4 x 600 s)
BOND = 1


def test_killed_coordinator_the_owner_and_providers_recover_their_money_with_the_cli(evm_stack):
    s = evm_stack
    s.start_coordinator()
    workers = {name: s.start_evm_worker(name, ait=10, step_delay=0.05) for name in ("w0", "w1")}
    s.wait_offers(2)
    owner = s.owner_address(ait=1000)  # price 1 x 100 rounds x 2 workers, deposited whole
    run_id = s.init("--bond", str(BOND))
    s.start_run(run_id, workers=2, rounds=100, local_steps=5, chain_timeout=CHAIN_TIMEOUT)

    # a round paid on chain, then the coordinator is gone for good (and the workers with it)
    def one_round_final() -> dict | None:
        p = s.payments(run_id)
        return p if any(t["kind"] == "settle" and t["status"] == "final" for t in p["chain"]["txs"]) else None

    pay = wait_until(one_round_final, "a round settled on chain", timeout=300, poll=0.2)
    key = key_of(pay)
    s.kill("coordinator")
    for name in workers:
        s.kill(name)

    with s.client() as client:
        escrow = s.escrow(client)
        run = escrow.run(key)
        assert run.open and run.timeout == CHAIN_TIMEOUT and run.escrow > 0
        owed = {name: escrow.contract(key, a) for name, a in workers.items()}
        assert all(c.bond == BOND * MICRO for c in owed.values())
        assert sum(c.earned for c in owed.values()) > 0
        before = {a: escrow.token_balance(a) for a in (owner, *workers.values())}

        refused = s.cli("chain", "refund", "--training-id", run_id, "--wallet", OWNER, "--home", str(s.home("owner")))
        assert refused.returncode != 0 and "open" in refused.stderr, refused.stderr  # not before the timeout

        block = client.rpc.call("eth_getBlockByNumber", "latest", False)
        s.time_travel(run.deadline - int(block["timestamp"], 16) + 1)
        wait_until(lambda: not escrow.run(key).open, "the run timed out on chain", timeout=60, poll=0.2)

        r = s.cli("chain", "refund", "--training-id", run_id, "--wallet", OWNER, "--home", str(s.home("owner")))
        assert r.returncode == 0, r.stderr
        assert escrow.token_balance(owner) == before[owner] + run.escrow
        for name, address in workers.items():
            w = s.cli("chain", "withdraw", "--training-id", run_id, "--wallet", name, "--home", str(s.home(name)))
            assert w.returncode == 0, w.stderr
            assert escrow.token_balance(address) == before[address] + owed[name].earned + owed[name].bond
            again = s.cli("chain", "withdraw", "--training-id", run_id, "--wallet", name, "--home", str(s.home(name)))
            assert again.returncode != 0 and len(again.stderr.strip().splitlines()) == 1, again.stderr

        after = escrow.run(key)
        assert after.escrow == 0 and after.timed_out
        assert all((c.bond, c.earned) == (0, 0) for c in (escrow.contract(key, a) for a in workers.values()))
        assert escrow.token_balance(s.deployment.escrow) == 0  # the only run: nothing left in the contract
