"""The contracts on a fresh in-process EVM (titanoboa over py-evm): AIT and RunEscrow
deployed from the bytecode the package compiles (what a node gets), and every log of
every transaction kept in order and decoded, for the tests that rebuild balances from
events alone."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boa
from eth_abi import decode, encode
from eth_utils import keccak, to_checksum_address

from aitbc.chain.evm import contracts
from aitbc.chain.evm.books import ChainEvent

DAY = 86_400


@functools.cache
def _factory(name: str) -> tuple[contracts.Compiled, Any]:
    c = contracts.compiled(name)
    return c, boa.loads_abi(json.dumps(c.abi), name=name)


@functools.cache
def _event_specs(name: str) -> dict[int, dict[str, Any]]:
    """topic 0 -> the event's ABI entry."""
    out = {}
    for e in _factory(name)[0].abi:
        if e["type"] == "event":
            sig = f"{e['name']}({','.join(i['type'] for i in e['inputs'])})"
            out[int.from_bytes(keccak(text=sig), "big")] = e
    return out


def _decode(source: str, topics: tuple[int, ...], data: bytes) -> ChainEvent:
    spec = _event_specs(source)[topics[0]]
    indexed = [i for i in spec["inputs"] if i["indexed"]]
    plain = [i for i in spec["inputs"] if not i["indexed"]]
    args: dict[str, Any] = dict(zip((i["name"] for i in plain), decode([i["type"] for i in plain], data)))
    for i, topic in zip(indexed, topics[1:]):
        (args[i["name"]],) = decode([i["type"]], topic.to_bytes(32, "big"))
    for i in spec["inputs"]:
        if i["type"] == "address":
            args[i["name"]] = to_checksum_address(args[i["name"]])
    return ChainEvent(contract=source, name=spec["name"], args=args)


@dataclass
class Chain:
    """AIT and RunEscrow on the current boa environment; ``minter`` deployed both,
    ``key`` is the settlement key; ``events`` holds every log so far, decoded."""

    token: Any
    escrow: Any
    minter: str
    key: str
    events: list[ChainEvent] = field(default_factory=list)

    def send(self, sender: str, contract: Any, fn: str, *args: Any) -> Any:
        """A transaction from ``sender``; its logs join ``events`` (a revert raises, and
        logs nothing)."""
        with boa.env.prank(sender):
            out = getattr(contract, fn)(*args)
        sources = {str(self.token.address): contracts.AIT, str(self.escrow.address): contracts.RUN_ESCROW}
        for _, address, topics, data in sorted(contract._computation.get_raw_log_entries()):
            self.events.append(_decode(sources[to_checksum_address(address)], topics, data))
        return out

    def account(self, funds: int = 0, *, address: str | None = None) -> str:
        """A new address (``address`` when given: a test's fixed one) holding ``funds``
        micro-AIT, minted (the faucet)."""
        address = address or str(boa.env.generate_address())
        if funds:
            self.send(self.minter, self.token, "mint", address, funds)
        return address

    def deposit(self, owner: str, run_id: bytes, amount: int, *, price: int, timeout: int = DAY) -> bytes:
        """``owner`` deposits run ``run_id`` (a ref); the run's key."""
        self.send(owner, self.token, "approve", str(self.escrow.address), amount)
        self.send(owner, self.escrow, "deposit", run_id, amount, price, timeout)
        return bytes(self.escrow.key_of(owner, run_id))

    def top_up(self, owner: str, run: bytes, amount: int) -> None:
        self.send(owner, self.token, "approve", str(self.escrow.address), amount)
        self.send(owner, self.escrow, "top_up", run, amount)

    def bond(self, provider: str, run: bytes, amount: int) -> None:
        self.send(provider, self.token, "approve", str(self.escrow.address), amount)
        self.send(provider, self.escrow, "post_bond", run, amount)

    def settle(
        self, run: bytes, rnd: int, pay: dict[str, int], slash: frozenset[str] = frozenset(), *, sender: str = ""
    ) -> None:
        """Round ``rnd``: ``pay`` provider -> amount (sent sorted by address), ``slash`` the
        providers whose bond burns; from the settlement key unless ``sender`` is given."""
        providers = sorted(set(pay) | slash, key=lambda a: int(a, 16))
        amounts = [pay.get(p, 0) for p in providers]
        self.send(
            sender or self.key, self.escrow, "settle", run, rnd, providers, amounts, [p in slash for p in providers]
        )

    def balance(self, address: str) -> int:
        return self.token.balanceOf(address)

    def contract(self, run: bytes, provider: str) -> Any:
        return self.escrow.contracts(run, provider)


def deploy() -> Chain:
    """Deploy both contracts on the current boa environment."""
    minter, key = str(boa.env.generate_address()), str(boa.env.generate_address())
    ait, ait_abi = _factory(contracts.AIT)
    esc, esc_abi = _factory(contracts.RUN_ESCROW)
    with boa.env.prank(minter):
        token_at, _ = boa.env.deploy_code(bytecode=ait.bytecode)
        args = encode(["address", "address"], [str(token_at), key])
        escrow_at, _ = boa.env.deploy_code(bytecode=esc.bytecode + args)
    return Chain(token=ait_abi.at(token_at), escrow=esc_abi.at(escrow_at), minter=minter, key=key)


@contextlib.contextmanager
def fresh_chain() -> Iterator[Chain]:
    """A new, empty EVM with the contracts deployed; the previous environment after."""
    with boa.swap_env(boa.Env()):
        yield deploy()
