"""A round's settlement is one transaction whatever its number of contracts, up to
MAX_SETTLE, and its gas grows linearly, well inside a block: measured here on py-evm's
gas schedule (the chain's), execution gas only (a transaction adds 21,000 and its
calldata: 96 bytes a contract, at most 16 gas a byte)."""

from __future__ import annotations

import pytest
from tests.chain.evm_env import fresh_chain

from aitbc.chain.evm import contracts
from aitbc.units import MICRO

pytestmark = pytest.mark.chain
PER_CONTRACT = 30_000  # measured about 26,000 (a first payment writes a fresh storage slot)
BLOCK = 30_000_000  # the usual block gas limit (anvil's default)


def _settle_gas(n: int) -> tuple[int, int]:
    """Execution gas of a round paying ``n`` contracts, then of one paying and slashing them all."""
    with fresh_chain() as c:
        owner = c.account(10 * n * MICRO)
        run = c.deposit(owner, contracts.run_ref("gas"), 10 * n * MICRO, price=MICRO)
        providers = [c.account(MICRO) for _ in range(n)]
        for p in providers:
            c.bond(p, run, MICRO)
        c.settle(run, 1, dict.fromkeys(providers, MICRO))
        paid = c.escrow._computation.get_gas_used()
        c.settle(run, 2, dict.fromkeys(providers, MICRO), slash=frozenset(providers))
        return paid, c.escrow._computation.get_gas_used()


def test_a_round_of_max_settle_contracts_fits_one_transaction_well_inside_a_block():
    one = max(_settle_gas(1))
    paid, slashed = _settle_gas(contracts.MAX_SETTLE)
    assert max(paid, slashed) - one <= PER_CONTRACT * (contracts.MAX_SETTLE - 1)
    calldata = 21_000 + 96 * 16 * contracts.MAX_SETTLE + 16 * 300
    assert max(paid, slashed) + calldata < BLOCK // 6  # room for a larger MAX_SETTLE, if ever needed
