"""bench/chain_gas.py cannot rot, and what it reports holds on a real node: on anvil, a
round's settlement is one transaction of the settlement key for one contract or four, its
gas grows by under 30,000 a contract paid (35,000 paid and slashed), and a whole run's
figures add up by payer."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from tests.chain.anvil import running_anvil

pytestmark = pytest.mark.chain

BENCH = Path(__file__).resolve().parents[3] / "bench"
# gas a contract adds to a round: paid (its earnings slot written fresh: about 28,000), paid and slashed (about 30,500)
PER_CONTRACT = {"first": 30_000, "later": 30_000, "slash_all": 35_000}


@pytest.fixture
def gas_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # its `from _common import ...`, as `python bench/chain_gas.py` has
    spec = importlib.util.spec_from_file_location("bench_chain_gas", BENCH / "chain_gas.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_round_is_one_transaction_and_the_run_adds_up(gas_bench, tmp_path):
    from aitbc.chain.evm.client import EvmClient

    with running_anvil(tmp_path) as node, EvmClient(node.url) as client:
        c = gas_bench.fresh_chain(client)
        one, four = gas_bench.settle_sizes(c, [1, 4])
        assert client.mined_nonce(c.key.address) == 6  # three rounds each: one transaction a round
        for kind, most in PER_CONTRACT.items():
            assert 0 < four[kind] - one[kind] <= 3 * most, (kind, one, four)
        assert one["later"] < one["first"]  # a contract's earnings written over cost less than written fresh
        calls = gas_bench.other_calls(c)
        assert set(calls) == {
            "approve", "deposit", "post_bond", "top_up", "finalize", "withdraw (earned + bond)", "refund",
        }  # fmt: skip
        run = gas_bench.whole_run(c, 3, 2)
        assert run["per_round"] == run["settlement_key"] // 3
        assert run["total"] == run["settlement_key"] + run["owner"] + run["providers_all"]
