"""Gas of the money on an EVM chain: every transaction of the escrow contract, measured on a
real anvil node (each figure is a mined receipt's ``gasUsed``: execution, the 21,000 a
transaction costs and its calldata).

1. A round's settlement for N = 1, 2, 4, ..., 128 contracts (``MAX_SETTLE``), one
   transaction whatever N: the first round (each contract's earnings written fresh), a later
   round (written over) and a round that also slashes every bond; and per contract.
2. Every other transaction: deposit (and its approve), top_up, post_bond (and its approve),
   finalize, withdraw (earnings and bond), refund.
3. Whole runs of R rounds x M providers: the gas each party pays (the settlement key: R
   settlements and the finalize; the owner: approve, deposit, refund; each provider:
   approve, bond, withdraw) and the total.

Usage: python bench/chain_gas.py [--quick]   (anvil from `make anvil` or PATH)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import print_table, write_json
from aitbc.units import MICRO

PRICE = MICRO  # 1 AIT a round at full quality
BOND = MICRO
GAS_WEI = 10**21


@dataclass
class Chain:
    """A fresh deployment on the node; accounts made and funded on demand."""

    client: Any
    escrow: Any
    minter: Any
    key: Any  # the settlement key

    def account(self, ait: int = 0) -> Any:
        from eth_account import Account

        a = Account.create()
        self.client.rpc.call("anvil_setBalance", a.address, hex(GAS_WEI))
        if ait:
            self.escrow.mint(self.minter, a.address, ait * MICRO)
        return a

    def send(self, signed: Any) -> int:
        self.client.broadcast(signed)
        receipt = self.client.wait_receipt(signed.tx_hash)
        assert receipt.status == 1, f"transaction {signed.tx_hash} reverted"
        return int(receipt.gas_used)

    def settle(self, key: bytes, rnd: int, providers: list[Any], *, slash: bool = False) -> int:
        from aitbc.chain.evm.escrow import Payout

        payouts = [Payout(p.address, PRICE, slash) for p in providers]
        return self.send(self.escrow.sign_settlement(self.key, key, rnd, payouts))


def fresh_chain(client: Any) -> Chain:
    from eth_account import Account

    from aitbc.chain.evm.deploy import deploy_contracts
    from aitbc.chain.evm.escrow import Escrow

    deployer, key = Account.create(), Account.create()
    for a in (deployer, key):
        client.rpc.call("anvil_setBalance", a.address, hex(GAS_WEI))
    deployment = deploy_contracts(client, deployer, settlement_key=key.address)
    return Chain(client=client, escrow=Escrow(client, deployment), minter=deployer, key=key)


def approve(c: Chain, account: Any, amount: int) -> int:
    """Let the escrow take ``amount`` of ``account``'s AIT; the approve's gas (the wrapper's
    own approve then sees the allowance and sends nothing)."""
    return int(c.escrow.token.transact(account, "approve", c.escrow.escrow.address, amount).gas_used)


def open_run(c: Chain, n: int, rounds: int, name: str) -> tuple[bytes, Any, list[Any], dict[str, int]]:
    """A run with ``n`` bonded providers and escrow for ``rounds`` rounds; the gas of its
    owner's and first provider's transactions."""
    from aitbc.chain.evm.contracts import run_key

    amount = n * rounds * PRICE
    owner = c.account(n * rounds + 10)
    gas = {"approve": approve(c, owner, amount)}
    gas["deposit"] = int(c.escrow.deposit(owner, name, amount, PRICE, 3600).gas_used)
    key = run_key(owner.address, name)
    providers = [c.account(1) for _ in range(n)]
    for p in providers:
        approve(c, p, BOND)
        gas["post_bond"] = int(c.escrow.post_bond(p, key, BOND).gas_used)
    return key, owner, providers, gas


def settle_sizes(c: Chain, sizes: list[int]) -> list[dict[str, int]]:
    rows = []
    for n in sizes:
        key, _, providers, _ = open_run(c, n, 3, f"gas-settle-{n}")
        first = c.settle(key, 1, providers)
        later = c.settle(key, 2, providers)
        slashing = c.settle(key, 3, providers, slash=True)
        rows.append({"contracts": n, "first": first, "later": later, "slash_all": slashing})
    return rows


def other_calls(c: Chain) -> dict[str, int]:
    key, owner, providers, gas = open_run(c, 1, 2, "gas-calls")
    approve(c, owner, PRICE)
    gas["top_up"] = int(c.escrow.top_up(owner, key, PRICE).gas_used)
    c.settle(key, 1, providers)
    gas["finalize"] = c.send(c.escrow.sign_finalize(c.key, key))
    gas["withdraw (earned + bond)"] = int(c.escrow.withdraw(providers[0], key).gas_used)
    gas["refund"] = int(c.escrow.refund(owner, key).gas_used)
    return gas


def whole_run(c: Chain, rounds: int, m: int) -> dict[str, int]:
    key, owner, providers, gas = open_run(c, m, rounds, f"gas-run-{rounds}x{m}")
    settlement = sum(c.settle(key, r, providers) for r in range(1, rounds + 1))
    settlement += c.send(c.escrow.sign_finalize(c.key, key))
    withdraw = sum(int(c.escrow.withdraw(p, key).gas_used) for p in providers)
    refund = 0  # the escrow was price x rounds exactly: nothing left to refund
    owner_gas = gas["approve"] + gas["deposit"] + refund
    provider_gas = (gas["approve"] + gas["post_bond"]) * m + withdraw
    return {
        "rounds": rounds,
        "providers": m,
        "settlement_key": settlement,
        "per_round": settlement // rounds,
        "per_round_per_provider": settlement // (rounds * m),
        "owner": owner_gas,
        "providers_all": provider_gas,
        "total": settlement + owner_gas + provider_gas,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 16 and one small run (a smoke test)")
    args = parser.parse_args()
    from aitbc.chain.evm.client import EvmClient
    from aitbc.chain.evm.contracts import MAX_SETTLE
    from aitbc.chain.evm.node import start_anvil

    sizes = [2**i for i in range(8) if 2**i <= (16 if args.quick else MAX_SETTLE)]
    runs = [(10, 2), (10, 8)] if args.quick else [(10, 2), (10, 8), (10, 32), (100, 8)]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        node = start_anvil(Path(tmp))
        try:
            with EvmClient(node.url) as client:
                c = fresh_chain(client)
                versions = {"node": client.rpc.call("web3_clientVersion"), "vyper": c.escrow.deployment.compiler}
                settles = settle_sizes(c, sizes)
                calls = other_calls(c)
                whole = [whole_run(c, r, m) for r, m in runs]
        finally:
            node.stop()
    one = settles[0]
    print_table(
        "settle: one transaction a round (gasUsed; per contract: above a 1-contract round)",
        ["contracts", "first round", "later round", "slash all", "first / contract", "later / contract"],
        [
            [
                r["contracts"],
                r["first"],
                r["later"],
                r["slash_all"],
                (r["first"] - one["first"]) // max(1, r["contracts"] - 1) if r["contracts"] > 1 else None,
                (r["later"] - one["later"]) // max(1, r["contracts"] - 1) if r["contracts"] > 1 else None,
            ]
            for r in settles
        ],
    )
    print_table("the other transactions (gasUsed)", ["transaction", "gas"], sorted(calls.items()))
    print_table(
        "whole runs (gas by payer)",
        ["rounds x providers", "settlement key", "per round", "per round per provider", "owner", "providers", "total"],
        [
            [
                f"{w['rounds']} x {w['providers']}",
                w["settlement_key"],
                w["per_round"],
                w["per_round_per_provider"],
                w["owner"],
                w["providers_all"],
                w["total"],
            ]
            for w in whole
        ],
    )
    print(
        f"measured on {versions['node']}, contracts by vyper {versions['vyper']}, in {time.monotonic() - started:.0f} s"
    )
    write_json(
        "chain_gas", {"settle": settles, "calls": calls, "runs": whole, "price": PRICE, "bond": BOND, **versions}
    )


if __name__ == "__main__":
    main()
