"""The run's money held in trust: the owner's escrow, the providers' bonds, and their
release when a run ends. Every movement is one ledger entry (:mod:`aitbc.ledger`) with a key
the ledger never writes twice (``escrow:<run>:<n>``, ``bond:<contract>``,
``bond-return:<contract>``, ``owed:<contract>:<paid before>``, ``refund:<run>``), so a
restart cannot move money twice.

An owner-driven (manual) run's owner pays its providers (``POST .../payments``), but can
never take back what their scores earned: the escrow goes back to the owner only after
every contract has been paid at least its settled ``due`` (price x quality per round),
topped up from escrow (:func:`pay_owed`) when the owner paid less.
"""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import ApiError, conflict, unprocessable
from aitbc.coordinator.models import Contract, Offer, Run, Settlement
from aitbc.coordinator.repository import lock_run, row
from aitbc.coordinator.states import ENDED, ContractStatus, Control
from aitbc.ledger.book import LedgerError, RequestAuth, check_network
from aitbc.ledger.chain import bond_account, escrow_account, wallet_account
from aitbc.units import format_price


def ledger_error(e: LedgerError, *, wallet_hint: str | None = None) -> ApiError:
    """A refused posting as an API error (no entry was written)."""
    if e.code == "insufficient_funds":
        return ApiError(409, "insufficient_funds", e.detail + (f"; {wallet_hint}" if wallet_hint else ""))
    if e.code == "duplicate":
        return conflict("duplicate_entry", e.detail)
    return unprocessable(e.code, e.detail)


def require_network(ctx: Context, network: str) -> None:
    """422 unless ``network`` is the one this coordinator settles on."""
    try:
        check_network(network)
    except LedgerError as e:
        raise unprocessable("bad_network", e.detail) from None
    if network != ctx.ledger.network:
        raise unprocessable("bad_network", f"this coordinator settles on {ctx.ledger.network!r}, not {network!r}")


def _fund_hint(needed: int) -> str:
    return f"fund it with: aitbc wallet fund WALLET {format_price(needed)}"


# --- escrow and bonds -------------------------------------------------------------------


def escrow(ctx: Context, s: Session, run: Run, amount: int, request: RequestAuth, *, why: str) -> None:
    """Move ``amount`` from the owner's wallet into the run's escrow (caller commits)."""
    try:
        ctx.ledger.post(
            s,
            kind="escrow",
            debit=wallet_account(run.owner),
            credit=escrow_account(run.id),
            amount=amount,
            memo={"run": run.id, "why": why},
            key=f"escrow:{run.id}:{run.escrowed}",
            request=request,
        )
    except LedgerError as e:
        have = ctx.ledger.balance(s, wallet_account(run.owner))
        if e.code == "insufficient_funds":
            raise ApiError(
                409,
                "insufficient_funds",
                f"wallet {run.owner} holds {format_price(have)} AIT; {format_price(amount)} AIT needed for {why}; "
                f"{_fund_hint(amount - have)}",
            ) from None
        raise ledger_error(e) from None
    run.escrowed += amount


def can_bond(ctx: Context, s: Session, offer: Offer, bond: int) -> bool:
    """Whether this provider allowed and can afford a bond of ``bond``."""
    if bond == 0:
        return True
    return (
        offer.max_bond >= bond
        and offer.registration is not None
        and ctx.ledger.balance(s, wallet_account(offer.id)) >= bond
    )


def post_bond(ctx: Context, s: Session, run: Run, contract: Contract, offer: Offer) -> None:
    """The provider's bond, authorised by its signed offer (``max_bond``)."""
    if run.bond == 0:
        return
    registration = offer.registration
    if registration is None:  # can_bond refuses such an offer; reaching here is a bug
        raise RuntimeError(f"offer {offer.id} has no signed registration to authorise its bond")
    ctx.ledger.post(
        s,
        kind="bond",
        debit=wallet_account(offer.id),
        credit=bond_account(contract.id),
        amount=run.bond,
        memo={"run": run.id, "contract": contract.id},
        key=f"bond:{contract.id}",
        request=RequestAuth.from_dict({**registration, "field": "max_bond"}),
    )
    contract.bond = run.bond


def distribution_cost(rounds: int, contracts: list[Contract]) -> int:
    """Agreed price x rounds, summed over the workers that will train."""
    return sum(c.price for c in contracts) * rounds


# --- end of run ---------------------------------------------------------------------------


def owner_may_still_pay(ctx: Context, run: Run, now: float) -> bool:
    """Whether an ended manual run's escrow still waits for its owner: for
    ``owner_pay_seconds`` after the end, then the coordinator pays what is owed and
    refunds the rest itself (an owner who never comes back frees nobody's pay)."""
    ended = run.finished_at or run.updated_at
    return run.control == Control.MANUAL and now - ended < ctx.settings.owner_pay_seconds


def pay_owed(ctx: Context, s: Session, run: Run) -> int:
    """Pay each contract of ``run`` what its settled rounds are still owed: the sum of
    their ``due`` less what escrow already paid them and what the owner paid by hand
    (``paid_manual``), as far as the escrow goes. The top-up is recorded on the
    settlements it covers (oldest round first, after the owner's payments). Returns the
    micro-AIT paid; idempotent (each entry's key names what was paid before it)."""
    total = 0
    for c in s.scalars(select(Contract).where(Contract.run_id == run.id).order_by(Contract.id)).all():
        rows = s.scalars(select(Settlement).where(Settlement.contract_id == c.id).order_by(Settlement.round)).all()
        paid_before = sum(r.paid for r in rows) + c.paid_manual
        owed = sum(r.due for r in rows) - paid_before
        amount = min(owed, ctx.ledger.balance(s, escrow_account(run.id)))
        if amount <= 0:
            continue
        entry = ctx.ledger.post(
            s,
            kind="settle",
            debit=escrow_account(run.id),
            credit=wallet_account(c.worker_id),
            amount=amount,
            memo={"run": run.id, "contract": c.id, "owed": True},
            key=f"owed:{c.id}:{paid_before}",
        )
        credit, left = c.paid_manual, amount  # the owner's payments cover the oldest rounds
        for r in rows:
            short = r.due - r.paid
            covered = min(credit, short)
            credit -= covered
            top = min(left, short - covered)
            if top > 0:
                r.paid += top
                r.entry_seq = entry.seq
                left -= top
        total += amount
    return total


def finalize(ctx: Context, run_id: str, *, refund_escrow: bool | None = None) -> None:
    """After an ended run's last closed round is settled: return honest providers' bonds
    and the unspent escrow to the owner. Exactly once (ledger keys). ``refund_escrow``
    None: automatic runs yes; a manual run's escrow waits for its owner (``refund``) for
    ``owner_pay_seconds``, but its providers' bonds never wait for anyone. Before a
    manual run's escrow goes back, every contract is paid what it is owed (:func:`pay_owed`)."""
    with ctx.session() as s:
        run = lock_run(s, row(s, Run, run_id))
        if run.finalized or run.status not in ENDED:
            return
        if refund_escrow is None:
            refund_escrow = not owner_may_still_pay(ctx, run, time.time())
        for c in s.scalars(select(Contract).where(Contract.run_id == run_id).order_by(Contract.id)).all():
            held = ctx.ledger.balance(s, bond_account(c.id))
            if held > 0 and c.status != ContractStatus.SLASHED:
                ctx.ledger.post(
                    s,
                    kind="bond_return",
                    debit=bond_account(c.id),
                    credit=wallet_account(c.worker_id),
                    amount=held,
                    memo={"run": run.id, "contract": c.id},
                    key=f"bond-return:{c.id}",
                )
        run.bonds_returned = True
        if refund_escrow:
            if run.control == Control.MANUAL:
                pay_owed(ctx, s, run)
            left = ctx.ledger.balance(s, escrow_account(run.id))
            if left > 0:
                ctx.ledger.post(
                    s,
                    kind="refund",
                    debit=escrow_account(run.id),
                    credit=wallet_account(run.owner),
                    amount=left,
                    memo={"run": run.id, "status": run.status},
                    key=f"refund:{run.id}",
                )
            run.finalized = True
        s.commit()
