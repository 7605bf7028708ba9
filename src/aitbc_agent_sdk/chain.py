"""The owner's money on an EVM coordinator (``GET /v1/chain`` says ``evm``): the run's
owner is the wallet's EVM account, named at init with its proof, and ``start_training`` deposits the
run's escrow on chain before it asks the coordinator to distribute
(:mod:`aitbc.chain_clients` sends it, at most once). On a local coordinator nothing here
sends anything."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from aitbc import run_defaults
from aitbc.chain.evm.proof import sign_proof
from aitbc.chain_clients import (
    ChainRefused,
    Deposited,
    DepositPlan,
    check_can_pay,
    ensure_deposit,
    open_escrow,
    parse_chain,
)
from aitbc.errors import AitbcError
from aitbc.replies.chain import EvmChain, LocalChain
from aitbc.replies.health import Health
from aitbc.replies.runs import RunDetail
from aitbc.units import parse_price
from aitbc_agent_sdk.errors import AgentError, Conflict, Forbidden, InvalidArgument, NotFound
from aitbc_agent_sdk.protocol import AgentState, Http, Meter, Offload, Op, Progress, ask

ENGAGED = ("hired", "working")  # contracts whose price the deposit must cover


def chain_of(self: AgentState) -> Op[LocalChain | EvmChain]:
    """Where the coordinator holds runs' money (a coordinator without the route: local)."""
    try:
        data = yield Http("GET", "/chain", sign=False)
    except NotFound:
        data = None
    return parse_chain(data)


def _wallet_name(self: AgentState) -> str:
    if self.config.wallet_name is None:
        raise InvalidArgument("no_wallet", "this agent is read-only (AgentConfig(wallet_name=None)); name a wallet")
    return self.config.wallet_name


def _owner_account(home: Path, name: str, coordinator_id: str) -> dict[str, str]:
    """Run in a thread: the init body's ``evm_address`` and ``evm_proof``: the wallet's EVM
    account (made first if it has none; an encrypted wallet's passphrase asked as for its
    other key) signs that it belongs to the wallet at ``coordinator_id``."""
    from eth_account import Account

    from aitbc.ledger.evm_keys import ensure_evm_account
    from aitbc.ledger.wallet import wallet_info

    account = Account.from_key(ensure_evm_account(home, name).private_key)
    proof = sign_proof(account, wallet_info(home, name).address, coordinator_id)
    return {"evm_address": account.address, "evm_proof": proof}


def owner_evm(self: AgentState) -> Op[dict[str, str] | None]:
    """On an EVM coordinator, the fields naming a new run's owner there: the wallet's EVM
    address and the proof that the wallet holds it (:mod:`aitbc.chain.evm.proof`), bound to
    the coordinator's id; on a local coordinator None."""
    view = yield from chain_of(self)
    if not isinstance(view, EvmChain):
        return None
    health = yield from ask(Health, Http("GET", "/health", sign=False))
    work = functools.partial(_owner_account, self.config.resolved_home, _wallet_name(self), health.coordinator_id)
    return (yield Offload(work))


def chain_timeout_of(chain_timeout: int | None, deadline: float | None) -> int:
    """The run's timeout on chain: ``chain_timeout`` if given (refused under the least the
    coordinator accepts), else :data:`~aitbc.run_defaults.CHAIN_TIMEOUT` or that least."""
    least = run_defaults.min_chain_timeout(deadline)
    if chain_timeout is None:
        return max(run_defaults.CHAIN_TIMEOUT, least)
    if isinstance(chain_timeout, bool) or not isinstance(chain_timeout, int) or chain_timeout < least:
        raise InvalidArgument(
            "bad_chain_timeout",
            f"chain_timeout must be whole seconds >= {least} (600, and four round deadlines of "
            f"{deadline or run_defaults.DEADLINE:g} s), got {chain_timeout!r}",
        )
    return chain_timeout


def deposit_plan(run: RunDetail, rounds: int, max_cost: str | None, timeout: int) -> DepositPlan:
    """What the run's escrow must hold: ``max_cost`` (AIT) if given, else its engaged
    contracts' price x ``rounds``; at the highest price among them, for ``timeout`` s."""
    prices = [c.price_micro for c in run.contracts if c.status in ENGAGED]
    amount = parse_price(max_cost) if max_cost is not None else sum(prices) * rounds
    return DepositPlan(run_id=run.training_id, amount=amount, price=max(prices, default=0), timeout=timeout)


def _deposit(home: Path, wallet: str, owner: str, view: EvmChain, plan: DepositPlan, meter: Meter) -> Deposited:
    """Run in a thread: the wallet's EVM account deposits (or tops up) what ``plan`` lacks;
    only the run's owner (``owner``), whose deposit is the one the coordinator counts."""
    from eth_account import Account

    from aitbc.chain.evm.client import TxReverted
    from aitbc.ledger.evm_keys import load_evm_account
    from aitbc.ledger.wallet import load_wallet

    mine = load_wallet(home, wallet).address
    if mine != owner:
        raise Forbidden(
            "not_owner", f"run {plan.run_id} is owned by {owner}, not wallet '{wallet}' ({mine}): nothing deposited"
        )
    escrow = open_escrow(view)
    try:
        account = Account.from_key(load_evm_account(home, wallet).private_key)
        run = escrow.run(_key(account.address, plan.run_id))
        have = run.deposited if run.exists else 0
        if have < plan.amount:  # refused before anything is said to be sent
            check_can_pay(
                escrow, account.address, plan.amount - have, wallet=wallet, what=f"the deposit for run {plan.run_id}"
            )
            meter.update(have, plan.amount)
        done = ensure_deposit(escrow, account, plan, wallet=wallet)
        if done.added:
            meter.update(done.deposited, done.deposited)
        return done
    except ChainRefused as e:
        raise Conflict("chain_refused", str(e)) from None
    except TxReverted as e:
        raise AgentError("chain_reverted", str(e)) from None
    except AitbcError as e:
        if isinstance(e, AgentError):
            raise
        raise AgentError("chain_error", str(e)) from None
    finally:
        escrow.client.close()


def _key(owner: str, run_id: str) -> bytes:
    from aitbc.chain.evm.contracts import run_key

    return run_key(owner, run_id)


def deposit_for_distribute(
    self: AgentState,
    run: RunDetail,
    body: dict[str, Any],
    *,
    rounds: int,
    chain_timeout: int | None,
    progress: Progress | None,
) -> Op[Deposited | None]:
    """``start_training``'s step before it sends the distribute request ``body``. On an EVM
    coordinator the run's escrow is deposited on chain from the wallet's EVM account (the
    run's owner named at init): the body's ``max_cost`` (AIT; None: the engaged contracts'
    price x ``rounds``) at their highest price, closing after ``chain_timeout`` seconds
    without a settlement (None: :data:`~aitbc.run_defaults.CHAIN_TIMEOUT`; at least four
    round deadlines, else :class:`InvalidArgument` before anything is sent). What is
    deposited already is not sent again; a shortfall is topped up. ``progress``: stage
    ``deposit`` in micro-AIT, reported only when a transaction is sent. Not enough AIT or
    gas: :class:`Conflict` (``chain_refused``) naming the command that funds the wallet,
    before any transaction. On a local coordinator (or with nothing to cover yet, which
    the coordinator then names) nothing is sent: None."""
    deadline, max_cost = body.get("deadline"), body.get("max_cost")
    timeout = chain_timeout_of(chain_timeout, deadline)
    view = yield from chain_of(self)
    if not isinstance(view, EvmChain):
        return None
    plan = deposit_plan(run, rounds, max_cost, timeout)
    if plan.amount <= 0:
        return None
    meter = Meter(progress, "deposit", None)  # its first report comes before a transaction
    work = functools.partial(_deposit, self.config.resolved_home, _wallet_name(self), run.owner, view, plan, meter)
    return (yield Offload(work))
