"""The run's money held in trust: the owner's escrow, the providers' bonds, and their
release when a run ends. Every movement is one ledger entry (:mod:`aitbc.ledger`) with a key
the ledger never writes twice (``escrow:<run>:<n>``, ``bond:<contract>``,
``bond-return:<contract>``, ``owed:<contract>:<paid before>``, ``refund:<run>``,
``settle:<contract>:<round>``), so a restart cannot move money twice.

Fair exchange (:func:`pay_delivered`): update blobs are content-addressed and readable by
anyone who knows their CID, the owner included, as soon as they are accepted. So an accepted
update is paid whatever its owner does next: when a run ends (stopped, failed, paused too
long, abandoned) with a round that never closed, each accepted update of that round is paid
the contract's full price for it, exactly once, before the escrow goes back.

Hiring checks the owner's money first (:func:`require_hire_funds`): a contract is made only
while the owner's wallet and the run's escrow cover every contract it holds at its price for
the run's rounds (the default plan's until ``distribute`` names them), less what the owner's
other runs' hires already count on. That money stays in the wallet until the run
distributes (it moves into escrow, signed by ``max_cost``): no debit may take it
(:func:`require_unheld`: a transfer, another run's escrow). Both are judged under the
ledger's write lock. Hires of a run that never distributes expire (:func:`expire_hires`),
their bonds go back and the hold with them.

An owner-driven (manual) run's owner pays its providers (``POST .../payments``), but can
never take back what their scores earned: the escrow goes back to the owner only after
every contract has been paid at least its settled ``due`` (price x quality per round),
topped up from escrow (:func:`pay_owed`) when the owner paid less.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from aitbc import run_defaults
from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import ApiError, conflict, unprocessable
from aitbc.coordinator.money import onchain
from aitbc.coordinator.store.models import Contract, Job, Offer, RoundRecord, Run, Settlement, Update
from aitbc.coordinator.store.repository import lock_run, row
from aitbc.coordinator.store.states import ENDED, ENGAGED
from aitbc.json_value import JSONObject
from aitbc.ledger.book import LedgerError, RequestAuth, check_network
from aitbc.ledger.chain import bond_account, escrow_account, wallet_account
from aitbc.states import ContractStatus, Control, RunStatus, UpdateStatus
from aitbc.units import format_price

log = logging.getLogger("aitbc.coordinator")


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
    """Move ``amount`` from the owner's wallet into the run's escrow (caller commits); not
    the money the owner's other runs' hires hold (:func:`require_unheld`)."""
    require_unheld(ctx, s, run.owner, amount, what=f"run {run.id}'s escrow for {why}", besides=run.id)
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
    """Whether this provider allowed and can afford a bond of ``bond`` (on an EVM
    coordinator: with its AIT on chain, where it posts the bond itself)."""
    if ctx.chain is not None:
        return onchain.can_bond(ctx, offer, bond)
    if bond == 0:
        return True
    return (
        offer.max_bond >= bond
        and offer.registration is not None
        and ctx.ledger.balance(s, wallet_account(offer.id)) >= bond
    )


def post_bond(ctx: Context, s: Session, run: Run, contract: Contract, offer: Offer) -> None:
    """The provider's bond, authorised by its signed offer (``max_bond``). On an EVM
    coordinator nothing is posted here: the provider bonds on chain from the account its
    offer names, and the books mirror it when they see it (:func:`.onchain.sync_bond`)."""
    contract.evm_address = offer.evm_address
    if run.bond == 0 or ctx.chain is not None:
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


def distribution_cost(rounds: int, contracts: Iterable[Contract]) -> int:
    """Agreed price x rounds, summed over the workers that will train."""
    return sum(c.price for c in contracts) * rounds


# --- hiring: the owner's money first ------------------------------------------------------


def planned_rounds(run: Run) -> int:
    """The rounds a run's contracts are counted for: before ``distribute`` names them, the
    default plan's; after, the rounds still to train (the open one included), since the
    escrow left has paid for those before them."""
    if not run.configured:
        return run_defaults.ROUNDS
    return max(1, run.cfg.rounds - max(run.round, 1) + 1)


def hire_commitment(ctx: Context, s: Session, run: Run, extra: int = 0) -> int:
    """What ``run``'s engaged contracts (and ``extra`` micro-AIT of price per round more)
    may still cost its owner beyond the run's escrow: (prices x planned rounds) less the
    escrow, at least 0. A distributed run's escrow was sized for its contracts."""
    prices = s.scalar(
        select(func.coalesce(func.sum(Contract.price), 0)).where(
            Contract.run_id == run.id, Contract.status.in_(ENGAGED)
        )
    )
    cost = (int(prices or 0) + extra) * planned_rounds(run)
    return max(0, cost - ctx.ledger.balance(s, escrow_account(run.id)))


def held_for_hires(ctx: Context, s: Session, owner: str, *, besides: str | None = None) -> int:
    """The money of ``owner``'s wallet its live, undistributed runs' hires count on (each
    run's :func:`hire_commitment`), ``besides`` one run left out: held in the wallet until
    those runs distribute (it moves into their escrow), end, or their hires expire."""
    q = select(Run).where(Run.owner == owner, Run.config.is_(None), Run.status.not_in(tuple(ENDED)))
    if besides is not None:
        q = q.where(Run.id != besides)
    return sum(hire_commitment(ctx, s, run) for run in s.scalars(q.order_by(Run.id)).all())


def require_unheld(ctx: Context, s: Session, owner: str, amount: int, *, what: str, besides: str | None = None) -> None:
    """409 ``insufficient_funds`` (nothing written) when moving ``amount`` out of
    ``owner``'s wallet would leave less than its runs' hires count on
    (:func:`held_for_hires`; ``besides``: the run this money goes to, whose hires it pays).
    Checked under the ledger's write lock, so no hire nor other debit slips between."""
    ctx.ledger.lock(s)
    held = held_for_hires(ctx, s, owner, besides=besides)
    if held == 0:
        return
    have = ctx.ledger.balance(s, wallet_account(owner))
    if have - amount >= held or amount > have:  # an overdraft: the ledger refuses it in its words
        return
    free = max(0, have - held)
    raise ApiError(
        409,
        "insufficient_funds",
        f"wallet {owner} holds {format_price(have)} AIT, of which the hires of its runs not yet distributed hold "
        f"{format_price(held)} AIT (until those runs distribute, stop, or their hires expire); {what} needs "
        f"{format_price(amount)} AIT, {format_price(free)} AIT is free; {_fund_hint(amount - free)}",
    )


def require_hire_funds(ctx: Context, s: Session, run: Run, prices: Iterable[int]) -> None:
    """409 ``insufficient_funds`` (nothing written) unless the owner can pay for hiring at
    ``prices`` (micro-AIT per round, one per new contract): the run's contracts with the new
    ones, for the planned rounds, covered by its escrow and the owner's wallet less what the
    owner's other live, undistributed runs' hires count on. An owner with nothing hires
    nobody, and one wallet cannot back the same money's hires on many runs."""
    new = list(prices)
    onchain.sync_deposit(ctx, s, run)  # a deposit already on chain counts as escrow
    need = hire_commitment(ctx, s, run, sum(new))
    if need == 0:
        return
    # The wallet and the other runs' hires are counted under the ledger's write lock, held to
    # this transaction's commit: a hire on another run of this owner (or a transfer out of
    # its wallet) waits for it, then counts this one, so two cannot both pass on one balance.
    ctx.ledger.lock(s)
    others = held_for_hires(ctx, s, run.owner, besides=run.id)
    on_chain = ctx.chain is not None
    # on an EVM chain the owner's money is its account's AIT there (need counts the mirrored escrow)
    have = onchain.owner_balance(ctx, run) if on_chain else ctx.ledger.balance(s, wallet_account(run.owner))
    if need + others <= have:
        return
    rounds = planned_rounds(run)
    held_by = f"; the hires of the owner's other runs count on {format_price(others)} AIT of it" if others else ""
    holder = f"EVM account {run.owner_evm} holds" if on_chain else f"wallet {run.owner} holds"
    hint = onchain.hire_shortfall_hint(ctx) or _fund_hint(need + others - have)
    raise ApiError(
        409,
        "insufficient_funds",
        f"hiring {len(new)} worker{'s' if len(new) != 1 else ''} at {format_price(sum(new))} AIT per round "
        f"for {rounds} round{'s' if rounds != 1 else ''}"
        f"{' left' if run.configured else ' (the default plan until distribute names the rounds)'} "
        f"needs {format_price(need)} AIT beyond run {run.id}'s escrow; {holder} "
        f"{format_price(have)} AIT{held_by}; short by {format_price(need + others - have)} AIT; "
        f"{hint}; no contract was made",
    )


def release_contract(ctx: Context, s: Session, run: Run, contract: Contract, *, why: str) -> None:
    """Release an engaged contract and return its bond now (``bond-return:<contract>``;
    the caller commits)."""
    contract.status = ContractStatus.RELEASED
    held = ctx.ledger.balance(s, bond_account(contract.id))
    if held > 0:
        ctx.ledger.post(
            s,
            kind="bond_return",
            debit=bond_account(contract.id),
            credit=wallet_account(contract.worker_id),
            amount=held,
            memo={"run": run.id, "contract": contract.id, "why": why},
            key=f"bond-return:{contract.id}",
        )


def expire_hires(ctx: Context, s: Session, *, now: float) -> bool:
    """Contracts of runs that never distributed (``initializing``, or paused there), older
    than ``hire_seconds``: released, their bonds returned, so a provider is never held by
    a run that does not start. The run stays; its owner may hire again. The caller commits.
    Returns whether any expired."""
    limit = now - ctx.settings.hire_seconds
    rows = s.execute(
        select(Contract.id, Run.id)
        .join(Run, Run.id == Contract.run_id)
        .where(
            Contract.status.in_(ENGAGED),
            Contract.created_at < limit,
            Run.config.is_(None),
            Run.status.in_((RunStatus.INITIALIZING, RunStatus.PAUSED)),
        )
        .order_by(Contract.id)
    ).all()
    changed = False
    for contract_id, run_id in rows:
        run = lock_run(s, row(s, Run, run_id))
        contract = row(s, Contract, contract_id)
        if run.configured or run.status in ENDED or contract.status not in ENGAGED:
            continue  # distributed or ended meanwhile
        why = f"hired {now - contract.created_at:.0f} s ago by run {run.id}, which never distributed"
        release_contract(ctx, s, run, contract, why=why)
        log.info("contract %s (worker %s) expired: %s", contract.id, contract.worker_id, why)
        changed = True
    return changed


# --- end of run ---------------------------------------------------------------------------


def driver_pays(run: Run, r: int) -> bool:
    """Whether round ``r`` is paid from escrow by the coordinator: every round of an
    automatic run, and the rounds a run's driver closed before its owner took it over."""
    return run.control == Control.AUTOMATIC or (run.manual_from_round is not None and r < run.manual_from_round)


def pay_delivered(ctx: Context, s: Session, run: Run) -> int:
    """An ended run's accepted updates of rounds that never closed (no round record: the
    owner stopped it, it failed, was paused too long or abandoned, before the round's
    close): each contract is due its full price for each such round it delivered an
    update for, recorded as that round's settlement (quality 1) and paid from escrow
    (``settle:<contract>:<round>``, the key a closed round's pay would have had: money
    moves once either way). A manual run's owner pays it, topped up from escrow when the
    escrow goes back (:func:`pay_owed`). Not paid: an update that failed its spot check,
    a slashed contract's, and gossip records (a gossip round's models are judged at its
    close). The caller holds the run's lock and commits. Returns the micro-AIT paid."""
    if run.status not in ENDED or not run.configured or not run.cfg.mode.pays_delivered:
        return 0
    closed = s.scalar(select(func.max(RoundRecord.round)).where(RoundRecord.run_id == run.id)) or 0
    delivered = s.execute(
        select(Update.round, Contract)
        .join(Job, Job.id == Update.job_id)
        .join(Contract, Contract.id == Job.contract_id)
        .where(
            Update.run_id == run.id,
            Update.round > closed,
            Update.status == UpdateStatus.ACCEPTED,
            Contract.status != ContractStatus.SLASHED,
            (Update.verification.is_(None)) | (Update.verification != "failed"),
        )
        .order_by(Update.round, Contract.id)
    ).all()
    total = 0
    for r, c in delivered:
        total += pay_as_delivered(ctx, s, run, c, r, why=f"round {r} never closed ({run.status})")
    return total


def pay_as_delivered(ctx: Context, s: Session, run: Run, c: Contract, r: int, *, why: str) -> int:
    """Contract ``c``'s accepted update of round ``r`` is paid as delivered: a settlement row
    (quality 1, due the full price) and, where the coordinator pays the round
    (:func:`driver_pays`), the price from escrow as far as it goes, keyed
    ``settle:<contract>:<round>``. Nothing if the contract has a settlement for ``r``
    already (a restart, or a second update of one contract's round). The caller commits.
    Returns the micro-AIT paid."""
    if s.scalar(select(Settlement.id).where(Settlement.contract_id == c.id, Settlement.round == r)):
        return 0
    paid = settle_round(ctx, s, run, c, r, quality=1.0, due=c.price, memo={"delivered": why})
    s.flush()
    log.info("run %s: %s paid %d micro-AIT for its round %d update as delivered: %s", run.id, c.worker_id, paid, r, why)
    return paid


def settle_round(
    ctx: Context, s: Session, run: Run, c: Contract, r: int, *, quality: float, due: int, memo: JSONObject
) -> int:
    """Contract ``c``'s settlement of round ``r``: a settlement row (``quality``, ``due``) and,
    where the coordinator pays the round (:func:`driver_pays`), ``due`` from escrow as far as
    it goes, keyed ``settle:<contract>:<round>`` (money moves once per contract and round,
    whichever path settles it: scoring, or an update paid as delivered). ``memo`` adds to
    the entry's memo. The caller commits. Returns the micro-AIT paid."""
    paid, seq = 0, None
    if due > 0 and driver_pays(run, r):  # a manual run's owner pays (process_payment); due is what is owed
        paid = min(due, ctx.ledger.balance(s, escrow_account(run.id)))
        if paid > 0:
            entry = ctx.ledger.post(
                s,
                kind="settle",
                debit=escrow_account(run.id),
                credit=wallet_account(c.worker_id),
                amount=paid,
                memo={"run": run.id, "contract": c.id, "round": r, **memo},
                key=f"settle:{c.id}:{r}",
            )
            seq = entry.seq
    s.add(
        Settlement(
            run_id=run.id,
            contract_id=c.id,
            worker_id=c.worker_id,
            round=r,
            quality=quality,
            due=due,
            paid=paid,
            entry_seq=seq,
            created_at=time.time(),
        )
    )
    return paid


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
        onchain.sync_run(ctx, s, run)  # EVM: money that reached the chain since it was last looked at
        pay_delivered(ctx, s, run)  # first: what the owner received is paid before anything goes back
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
