"""Operations on the agent's wallet and on the ledger the coordinator keeps: the local
faucet, balance, transfers and history; the ledger's head, entries and balances (what
``aitbc ledger verify`` re-checks). Registered in
:data:`~aitbc_agent_sdk.operations.OPERATIONS` like the rest."""

from __future__ import annotations

from typing import Any

from aitbc_agent_sdk.operations import _amount, _wallet, operation
from aitbc_agent_sdk.protocol import AgentState, Http, Op

# --- the agent's wallet ------------------------------------------------------------------


@operation
def fund_wallet(self: AgentState, amount: int | float | str) -> Op[dict[str, Any]]:
    """Mint ``amount`` AIT into the agent's wallet from the local network's faucet.
    Returns ``{address, amount, entry, balance}``."""
    return (
        yield Http(
            "POST", "/wallets/fund", {"amount": _amount(amount, "amount"), "network": self.config.blockchain_network}
        )
    )


@operation
def get_balance(self: AgentState) -> Op[dict[str, Any]]:
    """``{address, network, balance, balance_micro}`` of the agent's wallet."""
    wallet = yield from _wallet(self)
    return (yield Http("GET", f"/wallets/{wallet.address}/balance"))


@operation
def transfer_funds(self: AgentState, to: str, amount: int | float | str) -> Op[dict[str, Any]]:
    """Send ``amount`` AIT from the agent's wallet to the address ``to`` (``ait1...``),
    signed by the agent. Returns ``{from, to, amount, entry, balance}``. Not
    enough money, or money the hires of the agent's runs not yet distributed hold (it
    stays in the wallet until they distribute, stop or their hires expire):
    :class:`Conflict` (``insufficient_funds``, naming what is held and what is free)."""
    body = {"to": to, "amount": _amount(amount, "amount"), "network": self.config.blockchain_network}
    return (yield Http("POST", "/wallets/send", body))


@operation
def get_wallet_history(self: AgentState, limit: int = 100) -> Op[list[dict[str, Any]]]:
    """The most recent ``limit`` ledger entries that moved money into or out of the
    agent's wallet, oldest first: ``[{seq, kind, debit, credit, amount, amount_ait, memo,
    created_at, ...}]``."""
    wallet = yield from _wallet(self)
    res = yield Http("GET", f"/wallets/{wallet.address}/history", params={"limit": limit})
    return res["data"]


# --- the ledger (public: a read-only agent can audit it) -----------------------------------------


@operation
def get_ledger_info(self: AgentState) -> Op[dict[str, Any]]:
    """``{network, system_key, entries, head, stored}``: the ledger's network, the
    coordinator's public key (it signs settlements), the head it records (entry count and
    hash) and the entries stored."""
    return (yield Http("GET", "/ledger"))


@operation
def get_ledger_entries(self: AgentState, after: int = 0, limit: int = 1000) -> Op[dict[str, Any]]:
    """One page of ledger entries in chain order, those after sequence number ``after``:
    ``{data: [{seq, kind, debit, credit, amount, key, memo, ...}], count, next}``
    (``next``: the ``after`` of the following page, None at the head)."""
    return (yield Http("GET", "/ledger/entries", params={"after": after, "limit": limit}))


@operation
def get_ledger_balances(self: AgentState) -> Op[dict[str, int]]:
    """Every account's balance in micro-AIT, as the coordinator's ledger holds it."""
    res = yield Http("GET", "/ledger/balances")
    return {k: int(v) for k, v in res["data"].items()}
