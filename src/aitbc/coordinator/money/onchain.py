"""Money on an EVM chain (``--chain evm``): the chain holds it, the books mirror it.

The owner deposits a run's escrow on chain and each hired provider posts its bond there;
the coordinator never moves either. It mirrors what the chain shows into its ledger, so
the books keep every entry they keep on a local coordinator (scoring, settlements, the
same audit), with money entering them only as a mirror:

- :func:`sync_deposit`: the run's on-chain deposit (a running total: a top-up adds) as
  ledger entries kind ``chain-deposit`` from ``mint:<network>`` into ``escrow:<run>``,
  one per total seen (key ``chain-deposit:<run>:<total>``), each the difference;
- :func:`sync_bond`: a contract's on-chain bond as kind ``chain-bond`` from
  ``mint:<network>`` into ``bond:<contract>`` (key ``chain-bond:<contract>``), once.

Each is taken under the ledger's write lock and re-read there, so however often and from
however many requests they run, the chain's money enters the books once.

What the chain decides, the coordinator checks before it commits anyone to it: a hire
counts the owner's on-chain AIT (and the mirrored escrow), a provider's bond its on-chain
AIT; distribute needs the deposit mirrored, at a price on chain no lower than any
contract's and a timeout that outlasts a few rounds (:func:`require_distributable`); an
update needs its contract's bond on chain (:func:`require_bond`).
"""

from __future__ import annotations

import re

from eth_utils import is_checksum_address, to_checksum_address
from sqlalchemy import select
from sqlalchemy.orm import Session

from aitbc import run_defaults
from aitbc.chain.evm.contracts import MAX_SETTLE, run_key
from aitbc.chain.evm.proof import proof_message, proof_signer
from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import ApiError, conflict, unprocessable
from aitbc.coordinator.store.models import Contract, Job, Offer, Run
from aitbc.coordinator.store.states import ENGAGED
from aitbc.ledger.chain import bond_account, escrow_account, mint_account
from aitbc.replies.chain import ChainReply, EvmChain, LocalChain
from aitbc.replies.jobs import BondRequired
from aitbc.units import format_price

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
NOT_ON_CHAIN = "not_on_chain"


def chain_view(ctx: Context) -> ChainReply:
    """``GET /v1/chain``: where this coordinator holds runs' money."""
    chain = ctx.chain
    if chain is None:
        return ChainReply(LocalChain(chain="local"))
    d = chain.deployment
    return ChainReply(
        EvmChain(
            chain="evm",
            chain_id=d.chain_id,
            rpc=chain.rpc,
            token=d.token,
            escrow=d.escrow,
            settlement_key=d.settlement_key,
            confirmations=chain.confirmations,
        )
    )


# --- the parties' accounts ------------------------------------------------------------------


def require_settleable(ctx: Context, target_workers: int) -> None:
    """On an EVM coordinator a round settles in one transaction of at most ``MAX_SETTLE``
    contracts (the contract's gas bound): a run of more workers could never be paid, so it
    is refused at ``init`` (422 ``too_many_workers``), before anything is created."""
    if ctx.chain is not None and target_workers > MAX_SETTLE:
        raise unprocessable(
            "too_many_workers",
            f"target_workers {target_workers} is more than a round on chain settles: at most {MAX_SETTLE} "
            "workers a run on an EVM coordinator",
        )


def evm_account(ctx: Context, address: str | None, proof: str | None, *, wallet: str, whose: str) -> str | None:
    """A signed body's ``evm_address``, checksummed: required on an EVM coordinator (422
    ``evm_account_required``), a well-formed address wherever given (422 ``bad_evm_address``;
    a mixed-case address must carry a valid checksum, as wallets write it). On an EVM
    coordinator the body's ``evm_proof`` must show that the account signed for ``wallet``
    (the request's signer) here (:func:`require_proof`). A local coordinator keeps the
    address unused and reads no proof."""
    if address is None:
        if ctx.chain is not None:
            raise unprocessable(
                "evm_account_required",
                f"this coordinator settles on EVM chain {ctx.chain.chain_id}: {whose} must name the EVM account "
                "paid and refunded there (evm_address, 0x and 40 hex digits; aitbc wallet evm NAME shows it)",
            )
        return None
    mixed = address[2:] != address[2:].lower() and address[2:] != address[2:].upper()
    if not _ADDRESS.fullmatch(address) or (mixed and not is_checksum_address(address)):
        raise unprocessable(
            "bad_evm_address",
            f"evm_address {address[:60]!r} is not an EVM address (0x and 40 hex digits, a mixed-case one with "
            "a valid checksum)",
        )
    if int(address, 16) == 0:  # nobody signs for it: no deposit or bond could ever come from it
        raise unprocessable(
            "bad_evm_address",
            "evm_address is the zero address, which no wallet holds: name the EVM account of your wallet "
            "(aitbc wallet evm NAME shows it)",
        )
    checksummed = str(to_checksum_address(address))
    if ctx.chain is not None:
        require_proof(ctx, checksummed, proof, wallet=wallet, whose=whose)
    return checksummed


def require_proof(ctx: Context, address: str, proof: str | None, *, wallet: str, whose: str) -> None:
    """422 ``evm_proof_required`` without ``evm_proof``, ``bad_evm_proof`` unless it is
    ``address``'s signature over :func:`~aitbc.chain.evm.proof.proof_message` for ``wallet``
    at this coordinator: a name alone would let a party spend or block a stranger's account
    (hire checks count the owner account's AIT; an offer's account must bond)."""
    message = proof_message(address, wallet, ctx.coordinator_id)
    if proof is None:
        raise unprocessable(
            "evm_proof_required",
            f"{whose} names EVM account {address} without evm_proof: sign {message!r} with that account "
            "(EIP-191 personal_sign, 0x and 130 hex digits); aitbc's clients do this from the wallet's EVM key",
        )
    signer = proof_signer(address, wallet, ctx.coordinator_id, proof)
    if signer != address:
        got = "is not a signature" if signer is None else f"is signed by {signer}"
        raise unprocessable(
            "bad_evm_proof",
            f"evm_proof {got}, not by {address} over {message!r}: only the account's own key proves {whose}'s "
            "account (a proof made for another wallet or another coordinator does not)",
        )


def refuse_on_chain(ctx: Context, what: str, instead: str) -> None:
    """422 ``not_on_chain`` on an EVM coordinator: ``what`` cannot be done here."""
    if ctx.chain is not None:
        raise unprocessable(
            NOT_ON_CHAIN,
            f"runs on an EVM chain are automatic and their money is on chain: {what} "
            f"is not available on this coordinator; {instead}",
        )


def owner_balance(ctx: Context, run: Run) -> int:
    """The owner's AIT on chain (micro-AIT); 0 without an EVM account."""
    assert ctx.chain is not None
    return ctx.chain.escrow.token_balance(run.owner_evm) if run.owner_evm else 0


def can_bond(ctx: Context, offer: Offer, bond: int) -> bool:
    """Whether a provider can post ``bond`` on chain: an EVM account to be paid at, a signed
    ``max_bond`` that allows it, and that much AIT on chain (a bond of 0 needs only the account)."""
    assert ctx.chain is not None
    if offer.evm_address is None:
        return False
    if bond == 0:
        return True
    return offer.max_bond >= bond and ctx.chain.escrow.token_balance(offer.evm_address) >= bond


def accounts_in_run(ctx: Context, s: Session, run: Run) -> set[str]:
    """The EVM accounts (lower case) with a contract in ``run``. On chain a contract is (run,
    account): two contracts naming one account would share its one bond (each mirrored),
    lose it to either's slash, and get one settlement line between them that the contract
    cannot take, so a hire skips an account already in the run (empty on a local coordinator)."""
    if ctx.chain is None:
        return set()
    rows = s.scalars(select(Contract.evm_address).where(Contract.run_id == run.id, Contract.evm_address.is_not(None)))
    return {a.lower() for a in rows.all() if a}


def account_free(ctx: Context, offer: Offer, taken: set[str]) -> bool:
    """Whether ``offer``'s EVM account is not in ``taken`` (:func:`accounts_in_run`); adds it
    when it is free, so a batch of hires takes each account once."""
    if ctx.chain is None or offer.evm_address is None:
        return True
    account = offer.evm_address.lower()
    if account in taken:
        return False
    taken.add(account)
    return True


def require_account_free(ctx: Context, s: Session, run: Run, offer: Offer) -> None:
    """409 ``evm_account_in_run`` when ``offer``'s EVM account has a contract in ``run`` already."""
    if not account_free(ctx, offer, accounts_in_run(ctx, s, run)):
        raise conflict(
            "evm_account_in_run",
            f"worker {offer.id}'s EVM account {offer.evm_address} already has a contract in run {run.id}: on chain "
            "an account holds one contract of a run (one bond, one pay); hire a provider paid at another account",
        )


def key_of(run: Run) -> bytes:
    """The run's key on chain: derived from its owner's account and its id, as the contract does."""
    if run.owner_evm is None:  # init requires it on an EVM coordinator; reaching here is a bug
        raise RuntimeError(f"run {run.id} has no owner EVM account")
    return run_key(run.owner_evm, run.id)


# --- mirroring the chain into the books ---------------------------------------------------


def sync_deposit(ctx: Context, s: Session, run: Run) -> int:
    """Mirror run ``run``'s on-chain deposit into its escrow: the difference between the
    chain's running total and what the books hold of it (``run.chain_deposited``), as one
    ``chain-deposit`` entry. Returns the micro-AIT added (0: nothing new, or a local
    coordinator). The caller commits."""
    chain = ctx.chain
    if chain is None or run.owner_evm is None:
        return 0
    view = chain.escrow.run(key_of(run))
    if view.deposited <= run.chain_deposited:
        return 0
    ctx.ledger.lock(s)  # then re-read: another request may have mirrored this total meanwhile
    s.refresh(run, ["chain_deposited", "escrowed"])
    added = view.deposited - run.chain_deposited
    if added <= 0:
        return 0
    ctx.ledger.post(
        s,
        kind="chain-deposit",
        debit=mint_account(ctx.ledger.network),
        credit=escrow_account(run.id),
        amount=added,
        memo={"run": run.id, "chain_id": chain.chain_id, "key": "0x" + key_of(run).hex(), "deposited": view.deposited},
        key=f"chain-deposit:{run.id}:{view.deposited}",
    )
    run.chain_deposited = view.deposited
    run.escrowed += added
    return added


def sync_bond(ctx: Context, s: Session, run: Run, contract: Contract) -> bool:
    """Whether ``contract``'s bond is on chain (always, on a local coordinator), mirroring
    it the first time it is seen: ``contract.bond`` the amount bonded, ``chain_bonded``
    set, and a ``chain-bond`` entry when the amount is over 0. A bond short of the run's is
    not a bond for it. The caller commits."""
    chain = ctx.chain
    if chain is None or contract.chain_bonded:
        return True
    if contract.evm_address is None:
        return False
    view = chain.escrow.contract(key_of(run), contract.evm_address)
    if not view.bonded or view.bond < run.bond:
        return False
    ctx.ledger.lock(s)
    s.refresh(contract, ["chain_bonded", "bond"])
    if contract.chain_bonded:
        return True
    if view.bond > 0:
        ctx.ledger.post(
            s,
            kind="chain-bond",
            debit=mint_account(ctx.ledger.network),
            credit=bond_account(contract.id),
            amount=view.bond,
            memo={"run": run.id, "contract": contract.id, "chain_id": chain.chain_id, "provider": contract.evm_address},
            key=f"chain-bond:{contract.id}",
        )
    contract.bond, contract.chain_bonded = view.bond, True
    return True


def sync_run(ctx: Context, s: Session, run: Run) -> None:
    """At a run's end, before anything goes back: its deposit and every contract's bond as
    the chain shows them now (a late top-up, a bond posted after its job's last pickup), so
    what the books pay and return is what the chain holds. The caller holds the run's lock."""
    if ctx.chain is None or run.owner_evm is None:
        return
    sync_deposit(ctx, s, run)
    for c in s.scalars(select(Contract).where(Contract.run_id == run.id).order_by(Contract.id)).all():
        sync_bond(ctx, s, run, c)


# --- what the chain must show before the coordinator goes on --------------------------------


def bond_order(ctx: Context, run: Run, contract: Contract) -> BondRequired:
    """What a provider posts on chain for ``contract``'s bond (a job's ``bond_required``)."""
    assert ctx.chain is not None
    d = ctx.chain.deployment
    return BondRequired(
        chain_id=d.chain_id, escrow=d.escrow, token=d.token, key="0x" + key_of(run).hex(), amount_micro=run.bond
    )


def bond_required(ctx: Context, s: Session, run: Run, job: Job) -> BondRequired | None:
    """At a job's pickup: None once its contract's bond is on chain (mirrored and committed
    here the first time it is seen), else what to post."""
    if ctx.chain is None:
        return None
    contract = s.get(Contract, job.contract_id)
    if contract is None or contract.chain_bonded:
        return None
    if sync_bond(ctx, s, run, contract):
        s.commit()
        return None
    return bond_order(ctx, run, contract)


def require_bond(ctx: Context, s: Session, run: Run, job: Job) -> None:
    """409 ``bond_required`` (nothing written) when the job's contract has no bond on chain
    yet; it is mirrored by :func:`sync_bond` under the run's lock."""
    if ctx.chain is None:
        return
    contract = s.get(Contract, job.contract_id)
    if contract is None or contract.chain_bonded:
        return
    view = ctx.chain.escrow.contract(key_of(run), contract.evm_address) if contract.evm_address else None
    if view is None or not view.bonded or view.bond < run.bond:
        raise bond_refusal(ctx, run, contract)


def mirror_bond(ctx: Context, s: Session, run: Run, job: Job) -> None:
    """Under the run's lock, before an update or a record is admitted: the job's contract's
    bond mirrored (:func:`sync_bond`), or the transaction rolled back and 409 ``bond_required``."""
    if ctx.chain is None:
        return
    contract = s.get(Contract, job.contract_id)
    if contract is not None and not sync_bond(ctx, s, run, contract):
        s.rollback()
        raise bond_refusal(ctx, run, contract)


def bond_refusal(ctx: Context, run: Run, contract: Contract) -> ApiError:
    """The 409 ``bond_required`` of an update from a contract not bonded on chain."""
    order = bond_order(ctx, run, contract)
    return conflict(
        "bond_required",
        f"contract {contract.id}'s bond of {format_price(run.bond)} AIT is not on chain {order.chain_id} yet: post it "
        f"from {contract.evm_address} with post_bond({order.key}, {order.amount_micro}) on escrow {order.escrow} "
        "(the worker does when its job asks), then send the update again",
    )


def price_on_chain(ctx: Context, run: Run) -> int | None:
    """The most a contract of ``run`` may be paid a round on chain: the deposit's price
    (None: no deposit yet, or a local coordinator)."""
    if ctx.chain is None or run.owner_evm is None:
        return None
    view = ctx.chain.escrow.run(key_of(run))
    return view.price if view.exists else None


def require_distributable(ctx: Context, s: Session, run: Run, cost: int, deadline: float) -> None:
    """Distribute on an EVM coordinator moves no money: it needs the run's deposit on chain,
    mirrored into escrow (:func:`sync_deposit`), covering ``cost``; a price on chain no
    lower than any engaged contract's (a settlement pays at most that); and a timeout of
    at least ``max(600, 4 x deadline)`` seconds (past it with no settlement, the contract
    lets the owner take the escrow back). 409 naming what is short; the caller commits."""
    assert ctx.chain is not None
    sync_deposit(ctx, s, run)
    view = ctx.chain.escrow.run(key_of(run))
    rid, have = run.id, ctx.ledger.balance(s, escrow_account(run.id))
    if have < cost:
        raise conflict(
            "insufficient_escrow",
            f"run {rid}'s escrow on chain {ctx.chain.chain_id} holds {format_price(have)} AIT; distributing needs "
            f"{format_price(cost)} AIT, short by {format_price(cost - have)} AIT; deposit it with: aitbc chain "
            f"deposit --training-id {rid} --wallet WALLET --amount {format_price(cost - have)}",
        )
    prices = s.scalars(select(Contract.price).where(Contract.run_id == rid, Contract.status.in_(ENGAGED))).all()
    top = max(prices, default=0)
    if top > view.price:
        raise conflict(
            "price_above_deposit",
            f"run {rid}'s deposit on chain pays at most {format_price(view.price)} AIT per round and contract; a "
            f"hired contract's price is {format_price(top)} AIT: deposit with --price {format_price(top)} or more",
        )
    least = run_defaults.min_chain_timeout(deadline)  # the rule the owner's client deposits by
    if view.timeout < least:
        raise conflict(
            "timeout_too_short",
            f"run {rid}'s deposit on chain times out after {view.timeout} s without a settlement; this run needs at "
            f"least {least} s (600, or 4 round deadlines of {deadline:g} s): deposit with --timeout {least} or more",
        )


def require_price(ctx: Context, run: Run, price: int) -> None:
    """409 ``price_above_deposit`` when a hire at ``price`` could not be paid on chain: over
    the run's deposited price (no deposit yet: anything goes, distribute checks it)."""
    top = price_on_chain(ctx, run)
    if top is not None and price > top:
        raise conflict(
            "price_above_deposit",
            f"run {run.id}'s deposit on chain pays at most {format_price(top)} AIT per round and contract; "
            f"{format_price(price)} AIT was offered",
        )


def pause_limit(ctx: Context, run: Run, wait: float) -> float:
    """How long ``run`` may stay paused: ``wait``, and on chain at most half its deposit's
    timeout. Past the timeout with no settlement the owner may take the escrow back, the pay
    of the updates delivered before the pause included; stopped at half of it, those are
    settled with a round deadline or more to spare (the timeout is 4 deadlines or more)."""
    if ctx.chain is None or run.owner_evm is None:
        return wait
    view = ctx.chain.escrow.run(key_of(run))
    return min(wait, view.timeout / 2) if view.exists else wait


def hire_shortfall_hint(ctx: Context) -> str | None:
    """How an owner short for a hire adds AIT on an EVM coordinator (None: a local one)."""
    if ctx.chain is None:
        return None
    return f"its EVM account needs more AIT on chain {ctx.chain.chain_id} (aitbc chain balance --wallet WALLET)"
