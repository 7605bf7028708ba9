"""AIT, the ERC-20 runs are paid in: 6 decimals (1 unit = 1 micro-AIT), a minter (the
faucet), burn; every function and every revert."""

from __future__ import annotations

import boa
import pytest
from tests.chain.evm_env import fresh_chain

from aitbc.chain.evm.books import ChainEvent
from aitbc.units import MICRO

pytestmark = pytest.mark.chain
ZERO = "0x" + "00" * 20


@pytest.fixture
def chain():
    with fresh_chain() as c:
        yield c


def test_one_unit_is_one_micro_ait(chain):
    t = chain.token
    assert (t.name(), t.symbol(), t.decimals()) == ("AIT", "AIT", 6)
    assert 10 ** t.decimals() == MICRO
    assert t.minter() == chain.minter and t.totalSupply() == 0


def test_the_minter_mints_and_nobody_else(chain):
    a = chain.account(5 * MICRO)
    assert chain.balance(a) == chain.token.totalSupply() == 5 * MICRO
    assert chain.events[-1] == ChainEvent("AIT", "Transfer", {"sender": ZERO, "receiver": a, "value": 5 * MICRO})
    with boa.reverts("AIT: only the minter mints"):
        chain.send(a, chain.token, "mint", a, 1)
    with boa.reverts("AIT: mint to the zero address"):
        chain.send(chain.minter, chain.token, "mint", ZERO, 1)


def test_transfer_moves_the_callers_tokens_only_within_its_balance(chain):
    a, b = chain.account(3), chain.account()
    assert chain.send(a, chain.token, "transfer", b, 2) is True
    assert (chain.balance(a), chain.balance(b)) == (1, 2)
    with boa.reverts("AIT: transfer above balance"):
        chain.send(a, chain.token, "transfer", b, 2)
    with boa.reverts("AIT: transfer to the zero address"):
        chain.send(a, chain.token, "transfer", ZERO, 1)
    assert chain.token.totalSupply() == 3


def test_transfer_from_spends_the_allowance_and_max_is_unlimited(chain):
    a, spender, b = chain.account(10), chain.account(), chain.account()
    chain.send(a, chain.token, "approve", spender, 4)
    assert chain.events[-1] == ChainEvent("AIT", "Approval", {"owner": a, "spender": spender, "value": 4})
    chain.send(spender, chain.token, "transferFrom", a, b, 3)
    assert chain.token.allowance(a, spender) == 1 and chain.balance(b) == 3
    with boa.reverts("AIT: allowance too low"):
        chain.send(spender, chain.token, "transferFrom", a, b, 2)
    chain.send(a, chain.token, "approve", spender, 2**256 - 1)
    chain.send(spender, chain.token, "transferFrom", a, b, 7)
    assert chain.token.allowance(a, spender) == 2**256 - 1 and chain.balance(a) == 0
    with boa.reverts("AIT: transfer above balance"):
        chain.send(spender, chain.token, "transferFrom", a, b, 1)


def test_burn_lowers_the_supply_and_no_balance_rises(chain):
    a = chain.account(10)
    chain.send(a, chain.token, "burn", 4)
    assert chain.balance(a) == 6 and chain.token.totalSupply() == 6
    assert chain.events[-1] == ChainEvent("AIT", "Transfer", {"sender": a, "receiver": ZERO, "value": 4})
    with boa.reverts("AIT: burn above balance"):
        chain.send(a, chain.token, "burn", 7)


def test_the_minter_hands_the_role_on_or_ends_minting(chain):
    a, b = chain.account(), chain.account()
    with boa.reverts("AIT: only the minter hands the role on"):
        chain.send(a, chain.token, "set_minter", a)
    chain.send(chain.minter, chain.token, "set_minter", a)
    assert chain.token.minter() == a
    assert chain.events[-1] == ChainEvent("AIT", "MinterChanged", {"previous": chain.minter, "minter": a})
    chain.send(a, chain.token, "mint", b, 1)
    with boa.reverts("AIT: only the minter mints"):
        chain.send(chain.minter, chain.token, "mint", b, 1)
    chain.send(a, chain.token, "set_minter", ZERO)
    with boa.reverts("AIT: only the minter mints"):
        chain.send(a, chain.token, "mint", b, 1)
    assert chain.token.totalSupply() == 1
