"""The clients' side of money on an EVM chain: an owner's deposit and a provider's bond,
each sent at most once, from the wallet's EVM account.

A coordinator says where the money is at ``GET /v1/chain`` (:mod:`aitbc.replies.chain`);
on an EVM coordinator the owner's client (the SDK's ``start_training``, so the CLI's
``distribute``) deposits a run's escrow before asking it to distribute, and a worker posts
its bond when its job says ``bond_required``. Both read the chain first: what is already
there is never sent again (a second distribute after a refused one, a worker asking again
after a crash), so calling either twice moves the money once. A party without the AIT or
the gas is refused in one line naming the command that funds it, before any transaction.

eth-account (seconds to import) is imported here only, so a client pays for it only on an
EVM coordinator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from aitbc.errors import AitbcError
from aitbc.replies.chain import ChainView, EvmChain, LocalChain
from aitbc.units import format_price

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from aitbc.chain.evm.escrow import Escrow

_VIEW: TypeAdapter[LocalChain | EvmChain] = TypeAdapter(ChainView)
ZERO_ADDRESS = "0x" + "00" * 20


class ChainRefused(AitbcError):
    """The chain step cannot be taken: no AIT, no gas, a closed run. Nothing was sent."""


def parse_chain(data: Any) -> LocalChain | EvmChain:
    """A ``GET /v1/chain`` reply; ``None`` (a coordinator older than that route): local."""
    if data is None:
        return LocalChain(chain="local")
    return _VIEW.validate_python(data)


def open_escrow(view: EvmChain) -> Escrow:
    """The escrow and token ``view`` names, through its JSON-RPC URL; refused if the node
    there is another chain, or the contracts are not our code on the token and key named."""
    from aitbc.chain.evm.client import EvmClient
    from aitbc.chain.evm.deploy import Deployment, check_deployment
    from aitbc.chain.evm.escrow import Escrow

    client = EvmClient(view.rpc)
    try:
        if client.chain_id != view.chain_id:
            raise AitbcError(
                f"the node at {view.rpc} is chain {client.chain_id}, the coordinator settles on chain {view.chain_id}"
            )
        # A client knows what the coordinator says: no minter, and event scans from the first block.
        deployment = Deployment(
            rpc=view.rpc,
            chain_id=view.chain_id,
            token=view.token,
            escrow=view.escrow,
            settlement_key=view.settlement_key,
            minter=ZERO_ADDRESS,
            block=0,
            compiler="",
            deployed_at="",
        )
        # The coordinator names the contracts a client approves and sends its AIT to: only
        # our escrow's code, on the token and key named, is trusted with them.
        check_deployment(client, deployment)
        return Escrow(client, deployment)
    except BaseException:
        client.close()
        raise


def _ait(micro: int) -> str:
    return f"{format_price(micro)} AIT"


def check_can_pay(escrow: Escrow, address: str, need: int, *, wallet: str, what: str) -> None:
    """``address`` holds ``need`` micro-AIT and some ether for gas, else :class:`ChainRefused`
    naming what is missing and how to fund it."""
    chain = escrow.client.chain_id
    fund = f"aitbc wallet fund {wallet} AMOUNT on a local stack (aitbc up --chain evm), else aitbc chain fund"
    held = escrow.token_balance(address)
    if held < need:
        raise ChainRefused(
            f"{what} needs {_ait(need)} on chain {chain}; wallet '{wallet}''s EVM account {address} holds "
            f"{_ait(held)}: fund it with {fund} {wallet} AMOUNT"
        )
    if escrow.client.balance(address) == 0:
        raise ChainRefused(
            f"{what}: wallet '{wallet}''s EVM account {address} has no ether on chain {chain} to pay for gas: "
            f"fund it with {fund} {wallet} AMOUNT --gas"
        )


@dataclass(frozen=True, slots=True)
class Deposited:
    """A run's escrow on chain after :func:`ensure_deposit`: its key, the total deposited,
    and what this call added (0: enough was there already)."""

    key: bytes
    deposited: int
    added: int
    tx_hash: str | None


@dataclass(frozen=True, slots=True)
class DepositPlan:
    """What a run's escrow on chain should hold: ``amount`` micro-AIT in total, at most
    ``price`` a contract a round, ``timeout`` seconds without a settlement before it closes."""

    run_id: str
    amount: int
    price: int
    timeout: int


def ensure_deposit(escrow: Escrow, account: LocalAccount, plan: DepositPlan, *, wallet: str) -> Deposited:
    """The run's escrow holds ``plan.amount`` (deposited first, or topped up by what it
    lacks); nothing is sent if it holds that already. The price and timeout of a run
    deposited before stay as they were (the coordinator checks them)."""
    from aitbc.chain.evm.contracts import run_key

    key = run_key(account.address, plan.run_id)
    run = escrow.run(key)
    have = run.deposited if run.exists else 0
    if have >= plan.amount:
        return Deposited(key=key, deposited=have, added=0, tx_hash=None)
    if run.exists and not run.open:
        raise ChainRefused(
            f"run {plan.run_id}'s escrow on chain {escrow.client.chain_id} is {run.state}: nothing more can go in"
        )
    need = plan.amount - have
    check_can_pay(escrow, account.address, need, wallet=wallet, what=f"the deposit for run {plan.run_id}")
    if run.exists:
        receipt = escrow.top_up(account, key, need)
    else:
        receipt = escrow.deposit(account, plan.run_id, plan.amount, plan.price, plan.timeout)
    return Deposited(key=key, deposited=plan.amount, added=need, tx_hash=receipt.tx_hash)


def ensure_bond(escrow: Escrow, account: LocalAccount, key: bytes, amount: int, *, wallet: str) -> str | None:
    """Post ``account``'s bond of ``amount`` in run ``key`` unless it is on chain already;
    the transaction's hash, None if nothing was sent. A bond already there below ``amount``
    is refused (a bond is posted once a run, and the coordinator does not count a short one)."""
    held = escrow.contract(key, account.address)
    if held.bonded and held.bond < amount and not held.slashed:
        raise ChainRefused(
            f"{account.address} bonded {_ait(held.bond)} in run 0x{key.hex()}, which asks {_ait(amount)}: a bond is "
            "posted once a run, so this contract cannot be bonded; its bond comes back when the run closes"
        )
    if held.bonded:
        return None
    check_can_pay(escrow, account.address, amount, wallet=wallet, what=f"the bond in run 0x{key.hex()}")
    return escrow.post_bond(account, key, amount).tx_hash
