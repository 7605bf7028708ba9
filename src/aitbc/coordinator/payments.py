"""Money in a run: escrow, bonds, contribution scores, per-round settlement, slashing,
refunds and reputation. Every movement is a ledger entry (:mod:`aitbc.ledger`).

Exactly once: each settlement, slash, refund and bond return carries a ledger key
(``settle:<contract>:<round>``, ``slash:<contract>``, ...) that the ledger refuses to
write twice, and the settlement row is written in the same transaction as its entry. A
coordinator killed between two settlements redoes only the ones without a row.

Shape letters: ``n`` accepted updates, ``d`` parameters, ``B`` batch.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from aitbc.coordinator import states
from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import ApiError, conflict, not_found, unprocessable
from aitbc.coordinator.models import Contract, Flag, Job, Offer, RoundRecord, Run, Score, Settlement, Update
from aitbc.coordinator.runs import lock_run
from aitbc.core.compression import decode as decode_update
from aitbc.core.scoring import ScoringConfig, alignments, copies, relative_gain, reputation_update, score_round
from aitbc.ledger.book import LedgerError, RequestAuth, check_network
from aitbc.ledger.chain import bond_account, escrow_account, wallet_account
from aitbc.training.checkpoint import load_checkpoint, load_shard, set_flat_params
from aitbc.training.local import evaluate
from aitbc.units import format_price, parse_amount

log = logging.getLogger("aitbc.coordinator")
SCORING = ScoringConfig()


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
    ctx.ledger.post(
        s,
        kind="bond",
        debit=wallet_account(offer.id),
        credit=bond_account(contract.id),
        amount=run.bond,
        memo={"run": run.id, "contract": contract.id},
        key=f"bond:{contract.id}",
        request=RequestAuth.from_dict({**offer.registration, "field": "max_bond"}),
    )
    contract.bond = run.bond


def distribution_cost(rounds: int, contracts: list[Contract]) -> int:
    """Agreed price x rounds, summed over the workers that will train."""
    return sum(c.price for c in contracts) * rounds


# --- scoring ----------------------------------------------------------------------------


def score(ctx: Context, run_id: str, r: int) -> None:
    """Score round ``r``'s contributions (idempotent: a scored round is left alone)."""
    from aitbc.coordinator.rounds import runtime

    with ctx.session() as s:
        run = s.get(Run, run_id)
        if s.scalar(select(func.count()).select_from(Score).where(Score.run_id == run_id, Score.round == r)):
            return
        rec_before = s.get(RoundRecord, (run_id, r - 1))
        rec = s.get(RoundRecord, (run_id, r))
        ups = s.execute(
            select(Update, Job)
            .join(Job, Job.id == Update.job_id)
            .where(Update.run_id == run_id, Update.round == r)
            .order_by(Job.shard_index, Update.id)
        ).all()
        answered = {job.worker_id for _, job in ups}
        missing = s.execute(select(Job).where(Job.run_id == run_id, Job.worker_id.in_(rec.stragglers))).scalars().all()
        accepted = [(u, j) for u, j in ups if u.status == "accepted"]
        rows: list[Score] = []
        if accepted and not rec.skipped:
            rt = runtime(ctx, run)
            with rt.lock:
                judged = _judge(ctx, run, rt, rec_before.checkpoint_cid, accepted, r)
                rt.params_cid = None  # the model was used for scoring: reload the run's params next time
            for (u, j), sc in zip(accepted, judged):
                rows.append(
                    Score(
                        run_id=run_id,
                        round=r,
                        contract_id=j.contract_id,
                        worker_id=j.worker_id,
                        status="accepted",
                        gain=_finite(sc.gain),
                        own_gain=_finite(sc.own_gain),
                        other_gain=_finite(sc.other_gain),
                        kept=sc.kept,
                        flags=list(sc.flags),
                        provable=sc.provable,
                        quality=sc.quality,
                    )
                )
        else:  # a skipped round: nothing was applied, nothing earned
            for u, j in accepted:
                rows.append(
                    Score(
                        run_id=run_id,
                        round=r,
                        contract_id=j.contract_id,
                        worker_id=j.worker_id,
                        status="accepted",
                        flags=["round_skipped"],
                        quality=0.0,
                    )
                )
        for u, j in ups:
            if u.status == "rejected":  # malformed, wrong shape, NaN/Inf: provable from the blob itself
                rows.append(
                    Score(
                        run_id=run_id,
                        round=r,
                        contract_id=j.contract_id,
                        worker_id=j.worker_id,
                        status="rejected",
                        flags=["rejected"],
                        provable=True,
                        quality=0.0,
                    )
                )
        for j in missing:
            if j.worker_id not in answered:
                rows.append(
                    Score(
                        run_id=run_id,
                        round=r,
                        contract_id=j.contract_id,
                        worker_id=j.worker_id,
                        status="missing",
                        flags=["missing"],
                        quality=0.0,
                    )
                )
        seen: set[str] = set()
        for row in rows:
            if row.contract_id in seen:
                continue
            seen.add(row.contract_id)
            s.add(row)
        s.commit()


def _finite(x: float) -> float | None:
    return x if x == x and abs(x) != float("inf") else None


def _judge(ctx: Context, run: Run, rt, before_cid: str, accepted: list, r: int):
    """The three signals for each accepted update, then :func:`score_round`."""
    B = ctx.settings.score_samples
    load_checkpoint(rt.model, ctx.store.get_bytes(before_cid))
    from aitbc.training.checkpoint import flat_params

    before = flat_params(rt.model)  # (d,)
    U = torch.stack(
        [decode_update(ctx.store.get_bytes(u.cid), max_numel=rt.d).to(torch.float32) for u, _ in accepted]
    )  # (n, d)
    trained = [
        u.shard_index if u.shard_index is not None else j.shard_index for u, j in accepted
    ]  # the shard each trained on
    shards = {k: load_shard(ctx.store.get_bytes(run.manifest["shards"][k]["cid"])) for k in set(trained)}
    all_shards = [load_shard(ctx.store.get_bytes(e["cid"])) for e in run.manifest["shards"]]
    split = [("split_into" in e) for e in run.manifest["shards"]]  # its samples live on in its halves
    vx, vy = rt.val_x[:B], rt.val_y[:B]
    g = torch.Generator().manual_seed(run.seed * 1_000_003 + r)

    def loss(params, x, y) -> float:
        set_flat_params(rt.model, params)
        return evaluate(rt.model, x, y)[0]

    w = torch.tensor([float(u.samples) for u, _ in accepted])  # (n,)
    try:
        _, info = rt.aggregator.with_info(U, w, round_index=r)
        if info.kept_fraction is not None:
            kept = [float(k) for k in info.kept_fraction]
        elif info.selected is not None:
            chosen = {int(i) for i in info.selected}
            kept = [1.0 if i in chosen else 0.0 for i in range(U.shape[0])]
        else:
            kept = [1.0] * U.shape[0]
    except Exception:  # noqa: BLE001 - too few updates for the rule: no verdict, not an outlier
        kept = [1.0] * U.shape[0]
    base_val = loss(before, vx, vy)
    gains, own, other = [], [], []
    for i, k in enumerate(trained):
        after = before - U[i]  # (d,) this update alone applied
        gains.append(relative_gain(base_val, loss(after, vx, vy)))
        ox, oy = shards[k]
        pick = torch.randperm(ox.shape[0], generator=g)[:B]
        own.append(relative_gain(loss(before, ox[pick], oy[pick]), loss(after, ox[pick], oy[pick])))
        rest = [sh for m, sh in enumerate(all_shards) if m != k and not split[m]] or [all_shards[k]]
        rx = torch.cat([sh[0] for sh in rest])
        ry = torch.cat([sh[1] for sh in rest])
        pick = torch.randperm(rx.shape[0], generator=g)[:B]
        other.append(relative_gain(loss(before, rx[pick], ry[pick]), loss(after, rx[pick], ry[pick])))
    return score_round(gains, own, other, kept, copies(U, cosine=SCORING.copy_cosine), SCORING, alignments(U))


# --- settlement -------------------------------------------------------------------------


def settle(ctx: Context, run_id: str, r: int) -> None:
    """Pay each contract of round ``r`` price x quality from escrow, exactly once; slash
    provable misbehaviour; update reputations. Each contract in its own transaction."""
    with ctx.session() as s:
        scores = s.scalars(
            select(Score).where(Score.run_id == run_id, Score.round == r).order_by(Score.contract_id)
        ).all()
        ids = [(sc.id, sc.contract_id) for sc in scores]
    for score_id, contract_id in ids:
        with ctx.session() as s:
            if s.scalar(select(Settlement.id).where(Settlement.contract_id == contract_id, Settlement.round == r)):
                continue  # settled before a restart
            _settle_one(ctx, s, s.get(Score, score_id), r)
            s.commit()
        if ctx.settings.settle_delay:
            time.sleep(ctx.settings.settle_delay)
    with ctx.session() as s:
        run = lock_run(s, s.get(Run, run_id))
        run.settled_round = max(run.settled_round, r)
        s.commit()


def _settle_one(ctx: Context, s: Session, sc: Score, r: int) -> None:
    run = lock_run(s, s.get(Run, sc.run_id))
    contract = s.get(Contract, sc.contract_id)
    quality_ppm = round(sc.quality * 1_000_000)
    due = contract.price * quality_ppm // 1_000_000  # integer micro-AIT, rounded down
    paid, seq = 0, None
    if (
        due > 0 and run.control == "automatic"
    ):  # a manual run's owner pays (process_payment); due is what the scores say
        paid = min(due, ctx.ledger.balance(s, escrow_account(run.id)))
        if paid > 0:
            entry = ctx.ledger.post(
                s,
                kind="settle",
                debit=escrow_account(run.id),
                credit=wallet_account(contract.worker_id),
                amount=paid,
                memo={"run": run.id, "contract": contract.id, "round": r, "quality_ppm": quality_ppm},
                key=f"settle:{contract.id}:{r}",
            )
            seq = entry.seq
    s.add(
        Settlement(
            run_id=run.id,
            contract_id=contract.id,
            worker_id=contract.worker_id,
            round=r,
            quality=sc.quality,
            due=due,
            paid=paid,
            entry_seq=seq,
            created_at=time.time(),
        )
    )
    offer = s.get(Offer, contract.worker_id)
    if offer is not None:
        offer.reputation = reputation_update(offer.reputation, sc.quality)
    if sc.provable and contract.status != "slashed":
        slash(ctx, s, run, contract, reason=f"round {r}: {', '.join(sc.flags)}")


def slash(ctx: Context, s: Session, run: Run, contract: Contract, *, reason: str) -> None:
    """Provable misbehaviour: the bond goes to the run's escrow, and the worker is ejected
    (its job ends; its shard goes to someone else)."""
    from aitbc.coordinator.rounds import assign_worker, end_job

    held = ctx.ledger.balance(s, bond_account(contract.id))
    if held > 0:
        ctx.ledger.post(
            s,
            kind="slash",
            debit=bond_account(contract.id),
            credit=escrow_account(run.id),
            amount=held,
            memo={"run": run.id, "contract": contract.id, "reason": reason},
            key=f"slash:{contract.id}",
        )
    contract.slashed += held
    now = time.time()
    s.add(
        Flag(
            worker_id=contract.worker_id, run_id=run.id, round=run.round, kind="slashed", reason=reason, created_at=now
        )
    )
    job = s.scalar(select(Job).where(Job.contract_id == contract.id, Job.status == "active"))
    contract.status = "slashed"
    if job is not None:
        end_job(s, job, "failed", f"ejected for provable misbehaviour ({reason})", now=now)
        contract.status = "slashed"
        if run.status not in states.ENDED and run.control == "automatic":  # a manual run's owner reassigns
            s.flush()
            assign_worker(ctx, s, run, job.shard_index, now=now, replaces=job.id)
    log.info("run %s: slashed %s (%d micro-AIT): %s", run.id, contract.worker_id, held, reason)


# --- end of run ---------------------------------------------------------------------------


def finalize(ctx: Context, run_id: str, *, refund_escrow: bool | None = None) -> None:
    """After an ended run's last closed round is settled: return honest providers' bonds
    and the unspent escrow to the owner. Exactly once (ledger keys). ``refund_escrow``
    None: automatic runs yes; a manual run's escrow waits for its owner (``refund``),
    but its providers' bonds never wait for anyone."""
    with ctx.session() as s:
        run = lock_run(s, s.get(Run, run_id))
        if run.finalized or run.status not in states.ENDED:
            return
        if refund_escrow is None:
            refund_escrow = run.control == "automatic"
        for c in s.scalars(select(Contract).where(Contract.run_id == run_id).order_by(Contract.id)).all():
            held = ctx.ledger.balance(s, bond_account(c.id))
            if held > 0 and c.status != "slashed":
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


def pending(s: Session) -> tuple[list[tuple[str, int]], list[str]]:
    """Rounds closed but not yet scored and settled (oldest first), and ended runs to finalize."""
    todo, ready = [], []
    started_or_ended = or_(
        Run.config.is_not(None), Run.status.in_(tuple(states.ENDED))
    )  # a run stopped before distribute has bonds too
    for run in s.scalars(select(Run).where(Run.finalized.is_(False), started_or_ended)).all():
        closed = s.scalar(select(func.max(RoundRecord.round)).where(RoundRecord.run_id == run.id)) or 0
        if run.settled_round < closed:
            todo.append((run.id, run.settled_round + 1))
        elif run.status in states.ENDED and not run.bonds_returned:  # a manual run's escrow waits for its owner
            ready.append(run.id)
    return todo, ready


# --- owner's manual operations (the SDK's process_payment / refund_payments) -----------


def manual_payment(ctx: Context, s: Session, run: Run, contract_id: str, amount_text: str | float) -> dict[str, Any]:
    amount = parse_amount(amount_text)
    c = s.get(Contract, contract_id)
    if c is None or c.run_id != run.id:
        raise not_found("unknown_contract", f"run {run.id} has no contract {contract_id!r}")
    try:
        e = ctx.ledger.post(
            s,
            kind="payment",
            debit=escrow_account(run.id),
            credit=wallet_account(c.worker_id),
            amount=amount,
            memo={"run": run.id, "contract": c.id, "manual": True, "ordered_by": run.owner},
        )
    except LedgerError as err:
        raise ledger_error(err) from None
    c.paid_manual += amount
    s.commit()
    return {
        "contract_id": c.id,
        "worker_id": c.worker_id,
        "amount": format_price(amount),
        "amount_micro": amount,
        "entry": e.seq,
        "escrow_left": format_price(ctx.ledger.balance(s, escrow_account(run.id))),
    }


def refund(ctx: Context, s: Session, run: Run) -> dict[str, Any]:
    """Return the unspent escrow to the owner now (the run must have ended)."""
    if run.status not in states.ENDED:
        raise conflict("bad_state", f"run {run.id} is {run.status}; stop it first (refunds follow the end of a run)")
    closed = s.scalar(select(func.max(RoundRecord.round)).where(RoundRecord.run_id == run.id)) or 0
    if run.settled_round < closed and not run.finalized:
        raise conflict(
            "unsettled",
            f"run {run.id}'s rounds are scored and settled up to {run.settled_round} of {closed}; "
            f"the refund waits for the rest (a few seconds)",
        )
    s.commit()
    finalize(ctx, run.id, refund_escrow=True)
    s.refresh(run)  # finalize wrote through its own session
    return payments_view(ctx, s, run)


# --- views ----------------------------------------------------------------------------------


def payments_view(ctx: Context, s: Session, run: Run) -> dict[str, Any]:
    contracts = s.scalars(select(Contract).where(Contract.run_id == run.id).order_by(Contract.created_at)).all()
    rows = []
    for c in contracts:
        sc = s.scalars(select(Score).where(Score.contract_id == c.id)).all()
        settled, due = s.execute(
            select(func.coalesce(func.sum(Settlement.paid), 0), func.coalesce(func.sum(Settlement.due), 0)).where(
                Settlement.contract_id == c.id
            )
        ).one()
        paid = int(settled) + c.paid_manual
        offer = s.get(Offer, c.worker_id)
        rows.append(
            {
                "worker_id": c.worker_id,
                "contract_id": c.id,
                "price": format_price(c.price),
                "status": c.status,
                "rounds_accepted": sum(x.status == "accepted" for x in sc),
                "rounds_scored": len(sc),
                "score": (sum(x.quality for x in sc) / len(sc)) if sc else None,
                "flags": sorted({f for x in sc for f in x.flags}),
                "paid": format_price(paid),
                "paid_micro": paid,
                "due": format_price(int(due)),
                "due_micro": int(due),
                "bond": format_price(c.bond),
                "slashed": format_price(c.slashed),
                "slashed_micro": c.slashed,
                "reputation": offer.reputation if offer else None,
            }
        )
    return {
        "training_id": run.id,
        "network": run.network,
        "control": run.control,
        "escrowed": format_price(run.escrowed),
        "escrow_balance": format_price(ctx.ledger.balance(s, escrow_account(run.id))),
        "settled_round": run.settled_round,
        "rounds_closed": s.scalar(
            select(func.count()).select_from(RoundRecord).where(RoundRecord.run_id == run.id, RoundRecord.round > 0)
        )
        or 0,
        "finalized": run.finalized,
        "data": rows,
        "count": len(rows),
    }
