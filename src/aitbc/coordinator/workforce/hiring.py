"""Who trains a run: hiring from the market, jobs on shards, leases, replacements,
joiners, releases. A job is one worker on one shard of one run; its contract is the
worker's agreement with the run (price, bond). Every function here writes inside the
caller's transaction (the caller commits).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from aitbc import run_defaults
from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import conflict, not_found
from aitbc.coordinator.live.model_size import run_params
from aitbc.coordinator.money.escrow import can_bond, post_bond, require_hire_funds
from aitbc.coordinator.money.onchain import (
    account_free,
    accounts_in_run,
    pause_limit,
    price_on_chain,
    require_account_free,
)
from aitbc.coordinator.store.models import Contract, Flag, Job, JobOverrides, Offer, Run, Update, new_id
from aitbc.coordinator.store.repository import lock_run, row
from aitbc.coordinator.store.states import ENDED, ENGAGED, RUNNING, transition
from aitbc.market.capacity import too_small
from aitbc.market.ranking import Offer as MarketOffer
from aitbc.market.ranking import offer_score, rank_offers
from aitbc.states import ContractStatus, Control, JobStatus, OfferStatus, RunStatus
from aitbc.units import MICRO, format_price

log = logging.getLogger("aitbc.coordinator")

# --- the market ---------------------------------------------------------------------------


def busy_workers(s: Session) -> set[str]:
    """Workers hired by or working for a run that has not ended."""
    rows = s.execute(
        select(Contract.worker_id)
        .join(Run, Run.id == Contract.run_id)
        .where(Contract.status.in_(ENGAGED), Run.status.not_in(tuple(ENDED)))
    )
    return {r[0] for r in rows}


def market_offers(ctx: Context, s: Session) -> list[MarketOffer]:
    offers = s.scalars(select(Offer).where(Offer.status == OfferStatus.ONLINE)).all()
    return [
        MarketOffer(
            worker_id=o.id,
            gpu=o.gpu,
            price=o.price / MICRO,
            reputation=o.reputation,
            availability=o.availability,
            last_heartbeat=ctx.liveness.last_seen(o.id) or o.last_heartbeat,
            max_params=o.max_params,
        )
        for o in offers
    ]


def hire_offer(ctx: Context, s: Session, run: Run, worker_id: str, price: int | None) -> Contract:
    """A ``hired`` contract with a live, free provider at ``price`` (None: its asking
    price), bond posted. The caller commits."""
    offer = s.get(Offer, worker_id)
    if offer is None:
        raise not_found("unknown_worker", f"no offer from worker {worker_id!r}")
    price = offer.price if price is None else price
    now = time.time()
    if offer.status != OfferStatus.ONLINE or not ctx.liveness.alive(offer.id, now, ctx.settings.lease_seconds):
        raise conflict("worker_not_live", f"worker {offer.id} is not live (status {offer.status})")
    if s.scalar(select(Contract.id).where(Contract.run_id == run.id, Contract.worker_id == offer.id)):
        raise conflict("already_contracted", f"worker {offer.id} already has a contract with run {run.id}")
    require_account_free(ctx, s, run, offer)  # EVM: one contract of a run per account
    if offer.id in busy_workers(s):
        raise conflict("worker_busy", f"worker {offer.id} is hired by another run")
    params = run_params(run)
    if too_small(offer.max_params, params):
        raise conflict(
            "worker_too_small",
            f"worker {offer.id} trains models of at most {offer.max_params:,} parameters; "
            f"run {run.id}'s has {params:,}",
        )
    if price < offer.price:
        raise conflict(
            "price_rejected",
            f"worker {offer.id} asks {format_price(offer.price)} AIT per round; {format_price(price)} was offered",
        )
    if not can_bond(ctx, s, offer, run.bond):
        raise conflict("cannot_bond", f"worker {offer.id} cannot post this run's bond of {format_price(run.bond)} AIT")
    require_hire_funds(ctx, s, run, [price])  # the owner's money before the provider's bond
    c = Contract(
        id=new_id("contract"),
        run_id=run.id,
        worker_id=offer.id,
        price=price,
        status=ContractStatus.HIRED,
        created_at=now,
        score=offer_score(
            MarketOffer(
                worker_id=offer.id,
                gpu=offer.gpu,
                price=price / MICRO,
                reputation=offer.reputation,
                availability=offer.availability,
                last_heartbeat=now,
            )
        ),
    )
    s.add(c)
    s.flush()
    post_bond(ctx, s, run, c, offer)
    run.updated_at = now
    return c


# --- jobs -----------------------------------------------------------------------------------


def new_job(
    s: Session,
    run: Run,
    contract: Contract,
    shard_index: int,
    *,
    now: float,
    replaces: str | None = None,
    config: JobOverrides | None = None,
) -> Job:
    """The contract's worker trains ``shard_index`` from the open round (the caller commits)."""
    contract.status = ContractStatus.WORKING
    joined = run.round + 1 if run.status == RunStatus.AGGREGATING else max(run.round, 1)  # the first round it can train
    # A second job on a shard (a replacement, a joiner, a helper) gets its own batch order:
    # two workers on one shard from one seed would send the same update (and be flagged as copies).
    earlier = (
        s.scalar(select(func.count()).select_from(Job).where(Job.run_id == run.id, Job.shard_index == shard_index)) or 0
    )
    job = Job(
        id=new_id("job"),
        run_id=run.id,
        contract_id=contract.id,
        worker_id=contract.worker_id,
        shard_index=shard_index,
        shard_cid=run.data_manifest["shards"][shard_index]["cid"],
        status=JobStatus.ACTIVE,
        joined_round=joined,
        replaces=replaces,
        seed=run.seed * 100_003 + shard_index + 1_000_033 * earlier,
        config=(config or {}).copy(),
        created_at=now,
        updated_at=now,
    )
    s.add(job)
    s.flush()
    return job


def require_free(s: Session, worker_id: str) -> None:
    busy = s.scalar(select(Job.id).where(Job.worker_id == worker_id, Job.status == JobStatus.ACTIVE).limit(1))
    if busy:
        raise conflict("worker_busy", f"worker {worker_id} already has active job {busy}")


def end_job(s: Session, job: Job, status: JobStatus, reason: str, *, now: float) -> None:
    job.status, job.end_reason, job.updated_at = status, reason, now
    c = s.get(Contract, job.contract_id)
    if c is not None and c.status in ENGAGED:
        c.status = ContractStatus.FAILED if status == JobStatus.FAILED else ContractStatus.RELEASED


def end_run(s: Session, run: Run, status: RunStatus, *, reason: str | None, now: float | None = None) -> None:
    """End a run: every job and contract is released (in the same transaction)."""
    now = time.time() if now is None else now
    transition(run, status, now=now)
    if reason:
        run.error = reason
    for j in s.scalars(select(Job).where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE)):
        end_job(s, j, JobStatus.RELEASED, f"run {status}", now=now)
    for c in s.scalars(select(Contract).where(Contract.run_id == run.id, Contract.status.in_(ENGAGED))):
        c.status = ContractStatus.RELEASED


# --- failures, replacements, joiners and the slowest ----------------------------------------


def missed_deadline(run: Run, job: Job, *, now: float) -> bool:
    """Whether ``job`` has had the open round's whole deadline (from the round's opening,
    or from its own start if it joined later) and sent nothing for it."""
    start = max(run.round_started_at or now, job.created_at)
    return job.joined_round <= run.round and now >= start + run.cfg.round_deadline


def drop_silent_job(s: Session, run: Run, job: Job, *, now: float) -> None:
    """``job`` sent no update for the open round within its deadline: it loses its place
    (ended ``failed``, its contract failed, its offer flagged; an automatic run gives the
    shard to a spare or a free offer, :func:`fill_shards`). Its bond is not slashed: a
    missed deadline is not provable misbehaviour (a slow link looks the same); it is
    returned when the run ends. The caller commits."""
    r, deadline = run.round, run.cfg.round_deadline
    reason = f"no update for round {r} within its deadline of {deadline:g} s: lost its place"
    end_job(s, job, JobStatus.FAILED, reason, now=now)
    s.add(Flag(worker_id=job.worker_id, run_id=run.id, round=r, kind="straggler", reason=reason, created_at=now))
    offer = s.get(Offer, job.worker_id)
    if offer is not None:
        offer.flags += 1


def drop_silent(s: Session, run: Run, *, now: float) -> bool:
    """An automatic sync run's round still open past its deadline (fewer accepted updates
    than its quorum): every job that sent nothing for it within its deadline loses its
    place (:func:`drop_silent_job`), so a silent hired provider cannot hold the round.
    (A round that closes at its deadline drops them at its close, ``commit_round``.)
    Returns whether any was dropped; the caller commits."""
    if run.status != RunStatus.TRAINING or run.control != Control.AUTOMATIC or not run.cfg.mode.has_barrier:
        return False
    answered = set(s.scalars(select(Update.job_id).where(Update.run_id == run.id, Update.round == run.round)).all())
    active = s.scalars(select(Job).where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE).order_by(Job.id)).all()
    silent = [j for j in active if j.id not in answered and missed_deadline(run, j, now=now)]
    if not silent:
        return False
    lock_run(s, run)
    if run.status != RunStatus.TRAINING:
        return False
    for job in silent:
        s.refresh(job)
        if job.status == JobStatus.ACTIVE:
            drop_silent_job(s, run, job, now=now)
    s.flush()
    return True


def expire_leases(ctx: Context, s: Session, *, now: float) -> bool:
    """Fail every active job whose worker missed heartbeats past its lease and give its
    shard to a spare or another live offer. Returns whether anything changed."""
    lease = ctx.settings.lease_seconds
    jobs = s.execute(
        select(Job, Run)
        .join(Run, Run.id == Job.run_id)
        .where(Job.status == JobStatus.ACTIVE, Run.status.in_(RUNNING), Run.control == Control.AUTOMATIC)
    ).all()
    changed = False
    for job, run in jobs:
        if now - max(ctx.liveness.last_seen(job.worker_id) or 0.0, ctx.judging_since) <= lease:
            continue  # the lease counts from our start at the earliest: nobody could reach us before
        lock_run(s, run)
        s.refresh(job)
        if job.status != JobStatus.ACTIVE:
            continue
        silent = now - max(ctx.liveness.last_seen(job.worker_id) or 0.0, ctx.judging_since)
        reason = f"missed heartbeats for {silent:.1f} s (lease {lease:g} s)"
        end_job(s, job, JobStatus.FAILED, reason, now=now)
        offer = s.get(Offer, job.worker_id)
        if offer is not None:
            offer.status, offer.failed_at = OfferStatus.FAILED, now
        s.add(
            Flag(
                worker_id=job.worker_id,
                run_id=run.id,
                round=run.round,
                kind="lease_expired",
                reason=reason,
                created_at=now,
            )
        )
        s.flush()
        assign_worker(ctx, s, run, job.shard_index, now=now, replaces=job.id)
        changed = True
    return changed


def assign_worker(
    ctx: Context, s: Session, run: Run, shard_index: int, *, now: float, replaces: str | None = None
) -> Job | None:
    """A job on ``shard_index`` for the best free worker: a spare this run already hired,
    else the best-ranked free live offer (hired now, at its price). None if nobody is free."""
    lease = ctx.settings.lease_seconds
    taken = busy_workers(s)
    spares = s.scalars(
        select(Contract)
        .where(Contract.run_id == run.id, Contract.status == ContractStatus.HIRED)
        .order_by(Contract.score.desc(), Contract.id)
    ).all()
    contract = next((c for c in spares if ctx.liveness.alive(c.worker_id, now, lease)), None)
    if contract is None:
        in_run = set(s.scalars(select(Contract.worker_id).where(Contract.run_id == run.id)).all())
        params = run_params(run)
        top = price_on_chain(ctx, run)  # EVM: a settlement pays at most the deposit's price
        accounts = accounts_in_run(ctx, s, run)  # EVM: one contract of a run per account
        free = [
            o
            for o in market_offers(ctx, s)
            if o.worker_id not in taken
            and o.worker_id not in in_run
            and not too_small(o.max_params, params)
            and (top is None or row(s, Offer, o.worker_id).price <= top)
            and can_bond(ctx, s, row(s, Offer, o.worker_id), run.bond)
            and account_free(ctx, row(s, Offer, o.worker_id), accounts)
        ]
        ranked = rank_offers(free, now=now, max_age=lease)
        if not ranked:
            return None
        best = row(s, Offer, ranked[0].offer.worker_id)
        contract = Contract(
            id=new_id("contract"),
            run_id=run.id,
            worker_id=best.id,
            price=best.price,
            score=ranked[0].score,
            status=ContractStatus.HIRED,
            created_at=now,
        )
        s.add(contract)
        s.flush()
        post_bond(ctx, s, run, contract, best)
    return new_job(s, run, contract, shard_index, now=now, replaces=replaces)


def fill_shards(ctx: Context, s: Session, run: Run, *, now: float) -> bool:
    """Give orphaned shards (their worker failed or missed the round's deadline,
    :func:`drop_silent`; nobody was free) to workers that became free or joined since; then
    grow towards ``max_workers`` with joiners on the shards that have the fewest workers."""
    changed = drop_silent(s, run, now=now)
    active = s.scalars(select(Job).where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE)).all()
    counts = [0] * len(run.data_manifest["shards"])
    for j in active:
        counts[j.shard_index] += 1
    open_shards = [
        i for i, e in enumerate(run.data_manifest["shards"]) if "split_into" not in e
    ]  # a split shard lives on in its halves
    n_active = len(active)
    while n_active < run.cfg.max_workers:
        shard = min(open_shards, key=lambda i: (counts[i], i))
        job = assign_worker(ctx, s, run, shard, now=now)
        if job is None:
            break
        counts[shard] += 1
        n_active += 1
        changed = True
    return changed


def fail_stuck_runs(ctx: Context, s: Session, *, now: float) -> bool:
    """An automatic run in ``training`` with no active job (every worker failed, was
    slashed or left) and nobody to hire in its place (:func:`fill_shards` found no spare and
    no free live offer that can bond) cannot proceed: once that has lasted ``stuck_seconds``,
    counted from its last job ending (or its last change, or this coordinator's start), it
    fails with the reason; the driver then settles its closed rounds, returns the bonds of
    providers not slashed and refunds the escrow. Returns whether any failed; the caller
    commits. (Hires that expire and pauses that stop are the driver's other housekeeping:
    :func:`.escrow.expire_hires`, :func:`stop_long_pauses`.)"""
    changed = False
    wait = ctx.settings.stuck_seconds
    runs = s.scalars(
        select(Run).where(
            Run.control == Control.AUTOMATIC, Run.status == RunStatus.TRAINING, Run.updated_at < now - wait
        )
    ).all()
    for run in runs:
        if s.scalar(select(Job.id).where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE).limit(1)):
            continue
        last_job = s.scalar(select(func.max(Job.updated_at)).where(Job.run_id == run.id)) or 0.0
        if now - max(run.updated_at, last_job, ctx.judging_since) < wait:
            continue
        lock_run(s, run)
        if run.status != RunStatus.TRAINING:
            continue
        end_run(
            s,
            run,
            RunStatus.FAILED,
            now=now,
            reason=(
                f"stuck: no active worker and no offer to replace them for {wait:g} s "
                f"(round {run.round}; escrow refunded, bonds of providers not slashed returned)"
            ),
        )
        changed = True
    return changed


def stop_long_pauses(ctx: Context, s: Session, *, now: float) -> bool:
    """A run paused for ``pause_seconds`` is stopped: a pause must not hold its providers,
    their bonds and their delivered updates' pay for ever. The driver then pays the updates
    of the round that never closed (:func:`.escrow.pay_delivered`), returns bonds and
    refunds the escrow, as for any stop. Returns whether any stopped; the caller commits."""
    wait = ctx.settings.pause_seconds
    # on chain a pause ends sooner: before the deposit's timeout (pause_limit), at least 300 s
    soonest = wait if ctx.chain is None else min(wait, run_defaults.MIN_CHAIN_TIMEOUT / 2)
    runs = s.scalars(
        select(Run).where(Run.status == RunStatus.PAUSED, Run.updated_at < now - soonest).order_by(Run.id)
    ).all()
    changed = False
    for run in runs:
        paused_at = run.updated_at  # lock_run stamps it
        limit = pause_limit(ctx, run, wait)
        if now - paused_at < limit:
            continue
        lock_run(s, run)
        if run.status != RunStatus.PAUSED or now - paused_at < limit:
            continue
        end_run(s, run, RunStatus.STOPPED, now=now, reason=f"paused for over {limit:g} s")
        log.info("run %s stopped: paused for over %g s (--max-pause, or half its timeout on chain)", run.id, limit)
        changed = True
    return changed


def drop_slowest(s: Session, run: Run, active: Sequence[Job], ups: Sequence[tuple[Update, int]], *, now: float) -> None:
    """Over the run's target (workers joined mid-run): release the slowest worker of the
    round, by the time from when it could start (the round's opening, or its joining)
    to its answer; no answer at all is slowest. No shard is left without a worker: if the
    slowest trains a shard alone, the fastest worker of a shard trained twice moves to it
    (from the next round); if no shard is trained twice, nobody is released."""
    if len(active) <= run.target_workers:
        return
    per_shard: dict[int, int] = {}
    for j in active:
        per_shard[j.shard_index] = per_shard.get(j.shard_index, 0) + 1
    start = run.round_started_at or now
    arrived = {u.job_id: u.created_at for u, _ in ups}

    def took(j: Job) -> float:
        return arrived[j.id] - max(start, j.created_at) if j.id in arrived else float("inf")

    slowest = max(active, key=lambda j: (took(j), j.id))
    if per_shard[slowest.shard_index] == 1:
        doubled = [j for j in active if per_shard[j.shard_index] > 1]
        if not doubled:
            return
        donor = min(doubled, key=lambda j: (took(j), j.id))
        donor.moved_from, donor.shard_index = donor.shard_index, slowest.shard_index
        donor.shard_cid, donor.updated_at = slowest.shard_cid, now
    end_job(
        s,
        slowest,
        JobStatus.RELEASED,
        f"slowest in round {run.round} while over the target of {run.target_workers} workers",
        now=now,
    )
