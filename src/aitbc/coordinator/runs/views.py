"""Read-only views: what the API returns about runs, rounds, jobs, offers, money and
updates, as the reply models of :mod:`aitbc.replies`. Nothing here writes; money is shown
as AIT text (``format_price``; a ``Decimal`` in the SDK), with the same amount in integer
micro-AIT beside it where clients of earlier releases computed with it (``price_micro``).
"""

from __future__ import annotations

import time

from sqlalchemy import func, select
from sqlalchemy.orm import Session, object_session

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import not_found, unprocessable
from aitbc.coordinator.runs.chain_view import chain_final, chain_payments
from aitbc.coordinator.runs.data_size import measured_size, vocab_size
from aitbc.coordinator.runs.evaluations import latest_evaluated, rounds_view
from aitbc.coordinator.runs.language import detail_fields, result_fields
from aitbc.coordinator.store.models import Contract, Flag, Job, Offer, RoundRecord, Run, Score, Settlement, Update
from aitbc.coordinator.store.repository import job_settings, row
from aitbc.coordinator.store.states import ENDED
from aitbc.coordinator.verification.spot_checks import summary as verification_summary
from aitbc.coordinator.workforce.hiring import busy_workers
from aitbc.ledger.book import Entry
from aitbc.ledger.chain import escrow_account
from aitbc.market.ranking import RankedOffer
from aitbc.replies.gossip import GossipView
from aitbc.replies.jobs import JobDetail, JobView, ShardView, UpdateView, WorkerJob
from aitbc.replies.money import EntryView, Payments, WorkerPay
from aitbc.replies.results import Checkpoint, Results, ResultWorker, ScorePage, ScoreView
from aitbc.replies.runs import AsyncView, ContractView, RunDetail, RunSummary, RunWorker, WorkerScore
from aitbc.replies.runs import RankedOffer as RankedView
from aitbc.replies.workers import MarketOffer, OfferView
from aitbc.states import ContractStatus, Control, JobStatus, OfferStatus, RunStatus, ScoreStatus, UpdateStatus
from aitbc.units import MICRO, ait

# --- runs ---------------------------------------------------------------------------------


def run_summary(run: Run) -> RunSummary:
    return RunSummary(
        training_id=run.id,
        status=RunStatus(run.status),
        owner=run.owner,
        model_type=run.model_type,
        dataset_size=run.dataset_size,
        target_workers=run.target_workers,
        round=run.round,
        rounds=run.cfg.rounds if run.configured else None,
        val_loss=run.val_loss,
        control=Control(run.control),
        created_at=run.created_at,
        updated_at=run.updated_at,
    )


def _read_again_if_unconfigured(run: Run) -> None:
    """A run with a job has its config (distribute writes both in one transaction), but
    each SELECT sees the latest commit (SQLite, PostgreSQL's read committed): a run read
    before that commit and its jobs after it. Read the run again, so one view agrees."""
    session = object_session(run)
    if not run.configured and session is not None:
        session.refresh(run)


def run_detail(ctx: Context, s: Session, run: Run) -> RunDetail:
    now = time.time()
    jobs = s.scalars(select(Job).where(Job.run_id == run.id).order_by(Job.shard_index, Job.created_at)).all()
    if jobs:
        _read_again_if_unconfigured(run)
    contracts = s.scalars(select(Contract).where(Contract.run_id == run.id).order_by(Contract.created_at)).all()
    submitted = {
        (u.job_id): u.status
        for u in s.scalars(select(Update).where(Update.run_id == run.id, Update.round == run.round)).all()
    }
    scores = contract_scores(s, run.id)
    rounds_closed = (
        s.scalar(
            select(func.count()).select_from(RoundRecord).where(RoundRecord.run_id == run.id, RoundRecord.round > 0)
        )
        or 0
    )
    flags = s.scalar(select(func.count()).select_from(Flag).where(Flag.run_id == run.id)) or 0
    deadline = run.cfg.deadline if run.configured else None
    deadline_at = run.round_started_at + deadline if deadline and run.round_started_at else None
    gpus = gpu_types(s, [j.worker_id for j in jobs])
    speed, target_speed = run_speeds(run, [j for j in jobs if j.status == JobStatus.ACTIVE], rounds_closed, now=now)
    lags: dict[str, int] = {}
    async_view = None
    if run.configured and run.cfg.mode.buffered:
        lags, async_view = _async_view(s, run, rounds_closed, now=now)
    return RunDetail(
        **dict(run_summary(run)),
        **detail_fields(s, run),
        model_options=run.model_options,
        seed=run.seed,
        dataset_size_bytes=run.dataset_size_bytes,
        data_source=run.data_source,
        manifest_cid=run.manifest_cid,
        data_bytes=run.data_bytes,
        measured=measured_size(run.manifest),
        vocab_size=vocab_size(run.manifest),
        shards=len(run.data_manifest["shards"]) if run.manifest else 0,
        config=run.cfg.model_dump(mode="json") if run.configured else {},
        global_model_cid=run.global_cid,
        network=run.network,
        budget=None if run.budget is None else ait(run.budget),
        bond=ait(run.bond),
        escrowed=ait(run.escrowed),
        initial_val_loss=run.initial_val_loss,
        val_accuracy=run.val_accuracy,
        val_round=latest_evaluated(s, run),
        rounds_completed=rounds_closed,
        bytes_up=run.bytes_up,
        bytes_down=run.bytes_down,
        error=run.error,
        flags=flags,
        verification=verification_summary(s, run) if run.configured else None,
        round_started_at=run.round_started_at,
        deadline_at=deadline_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        paused_from=None if run.paused_from is None else RunStatus(run.paused_from),
        manual_since=run.manual_since,
        manual_from_round=run.manual_from_round,
        speed=speed,
        target_speed=target_speed,
        contracts=[contract_view(c) for c in contracts],
        workers=[
            RunWorker(
                **dict(job_view(ctx, j, run, submitted.get(j.id), gpu=gpus.get(j.worker_id), now=now)),
                **dict(scores.get(j.contract_id, NO_SCORE)),
                staleness=lags.get(j.id),
            )
            for j in jobs
        ],
        asynchronous=async_view,
        gossip=_gossip_view(s, run) if run.configured and run.cfg.mode.peer_to_peer else None,
        time=now,
    )


def _gossip_view(s: Session, run: Run) -> GossipView:
    """A gossip run: how far apart the workers' models were at the last recorded round
    (the consensus spread), and how far the record is behind the workers."""
    last = s.execute(
        select(RoundRecord.round, RoundRecord.spread)
        .where(RoundRecord.run_id == run.id, RoundRecord.round > 0)
        .order_by(RoundRecord.round.desc())
        .limit(1)
    ).first()
    records = s.execute(select(func.count(Update.id), func.max(Update.round)).where(Update.run_id == run.id)).one()
    outliers = s.scalar(
        select(func.count(Update.id)).where(Update.run_id == run.id, Update.status == UpdateStatus.REJECTED)
    )
    return GossipView(
        topology=run.cfg.topology,
        recorded_round=last[0] if last else 0,
        spread=last[1] if last else None,
        newest_round=records[1] or 0,
        records=records[0] or 0,
        outliers=outliers or 0,
    )


def _async_view(s: Session, run: Run, version: int, *, now: float) -> tuple[dict[str, int], AsyncView]:
    """An async run: each job's staleness (versions between the base of its latest
    accepted update and the model it was applied to), and the run's version, applied
    updates per second since training started and updates refused as too stale."""
    ckpt = dict(
        s.execute(select(RoundRecord.round, RoundRecord.checkpoint_cid).where(RoundRecord.run_id == run.id)).all()
    )
    newest: dict[str, tuple[int, str | None]] = {}
    applied = 0
    for job_id, r, base in s.execute(
        select(Update.job_id, Update.round, Update.base_cid)
        .where(Update.run_id == run.id, Update.status == UpdateStatus.ACCEPTED)
        .order_by(Update.round)
    ).all():
        newest[job_id] = (r, base)
        applied += r in ckpt
    lags = {}
    for job_id, (r, base) in newest.items():
        b = max((k for k, cid in ckpt.items() if cid == base and k < r), default=r - 1)
        lags[job_id] = r - 1 - b
    refused = s.scalar(select(func.count()).select_from(Flag).where(Flag.run_id == run.id, Flag.kind == "stale_update"))
    end = run.finished_at or now
    started = run.started_at
    rate = applied / (end - started) if started and end > started else 0.0
    return lags, AsyncView(version=version, updates_per_second=rate, applied=applied, refused_stale=refused or 0)


def run_speeds(run: Run, active: list[Job], rounds_closed: int, *, now: float) -> tuple[float, float]:
    """``(speed, target_speed)`` in rounds per second.

    speed: rounds closed since training started over the seconds since (to the end, once
    ended); 0.0 before. target_speed: with a round deadline, ``1 / deadline``; without,
    what the run's plan allows at the workers' measured speeds: a round is every active
    job's steps (``local_steps``, or ``epochs`` over its shard) of ``batch_size`` samples,
    so it takes ``max over jobs of steps x batch / speed`` seconds (the slowest job), and
    target_speed is one over that. Before any worker's speed is measured it equals speed
    (neither ahead nor behind)."""
    started = run.started_at
    end = run.finished_at or now
    speed = rounds_closed / (end - started) if started and end > started else 0.0
    if not run.configured:
        return speed, speed
    if run.cfg.deadline:
        return speed, 1.0 / run.cfg.deadline
    round_seconds = []
    for j in active:
        if j.speed:
            own = job_settings(run, j)
            samples = int(run.data_manifest["shards"][j.shard_index]["samples"])
            round_seconds.append(own["local_steps"] * min(own["batch_size"], samples) / j.speed)
    return speed, (1.0 / max(round_seconds)) if round_seconds else speed


def gpu_types(s: Session, worker_ids: list[str]) -> dict[str, str]:
    """The advertised GPU class of each worker (its offer's)."""
    if not worker_ids:
        return {}
    rows = s.execute(select(Offer.id, Offer.gpu).where(Offer.id.in_(set(worker_ids)))).all()
    return {r.id: r.gpu for r in rows}


NO_SCORE = WorkerScore(score=None, last_quality=None, score_flags=[])  # a contract not scored yet


def contract_scores(s: Session, run_id: str) -> dict[str, WorkerScore]:
    """Per contract: mean quality over its scored rounds, the latest one, and every flag."""
    qualities: dict[str, list[float]] = {}
    flags: dict[str, set[str]] = {}
    for sc in s.scalars(select(Score).where(Score.run_id == run_id).order_by(Score.round)).all():
        qualities.setdefault(sc.contract_id, []).append(sc.quality)
        flags.setdefault(sc.contract_id, set()).update(sc.flags)
    return {
        c: WorkerScore(score=sum(q) / len(q), last_quality=q[-1], score_flags=sorted(flags[c]))
        for c, q in qualities.items()
    }


def job_view(ctx: Context, j: Job, run: Run, this_round: str | None, *, gpu: str | None, now: float) -> JobView:
    """A job as its owner sees it. ``progress`` is the percentage of this job's work in
    the run's current round (its steps: ``local_steps``, or ``epochs`` over its shard);
    ``status`` is ``complete`` (progress 100) once its update for that round is in and
    accepted (``rejected`` if refused), else the worker's last report (``training``, ...)
    or, before one for this round, ``waiting``; an ended job shows ``failed``/``released``
    (and progress 100 if its update for the run's last round is in).
    ``loss``: the worker's last reported training loss (mean over its steps so far);
    before its first report, the validation loss of the model it starts from (the run's);
    None only before training has started. ``speed``: samples per second, measured by the
    coordinator between the worker's progress reports and its update (0.0 until measured)."""
    _read_again_if_unconfigured(run)
    seen = ctx.liveness.last_seen(j.worker_id)
    progress, status = j.progress, j.worker_status
    if this_round is not None:  # its update for the round is in: its work there is done, ended or not
        progress = 100.0
    if j.status != JobStatus.ACTIVE:
        status = j.status
    elif this_round is not None:
        status = "rejected" if this_round == UpdateStatus.REJECTED else "complete"
    elif j.progress_round is not None and j.progress_round != run.round:
        progress, status = 0.0, "waiting"  # its last report was of an earlier round
    return JobView(
        job_id=j.id,
        worker_id=j.worker_id,
        contract_id=j.contract_id,
        gpu_type=gpu,
        shard_index=j.shard_index,
        shard_cid=j.shard_cid,
        job_status=JobStatus(j.status),
        status=status,
        progress=progress,
        loss=j.loss if j.loss is not None else run.val_loss,
        epoch=j.epoch,
        steps=job_settings(run, j)["local_steps"],
        speed=j.speed or 0.0,
        rounds_done=j.rounds_done,
        this_round=None if this_round is None else UpdateStatus(this_round),
        joined_round=j.joined_round,
        replaces=j.replaces,
        moved_from=j.moved_from,
        end_reason=j.end_reason,
        compute_seconds=j.compute_seconds,
        config=dict(j.config or {}),
        last_heartbeat_age=None if seen is None else round(now - seen, 3),
    )


def scores_view(s: Session, run: Run, *, after: int = 0, limit: int | None = None) -> ScorePage:
    """The run's scored (contract, round) rows in the order they were written (round by
    round), those after row ``after``, at most ``limit``: the quality the round paid on and
    the signals behind it (``core.scoring``); ``next``: the ``after`` of the next page."""
    query = select(Score).where(Score.run_id == run.id, Score.id > after).order_by(Score.id)
    rows = s.scalars(query if limit is None else query.limit(limit)).all()
    data = [
        ScoreView(
            round=sc.round,
            worker_id=sc.worker_id,
            contract_id=sc.contract_id,
            status=ScoreStatus(sc.status),
            quality=sc.quality,
            gain=sc.gain,
            own_gain=sc.own_gain,
            other_gain=sc.other_gain,
            kept=sc.kept,
            flags=list(sc.flags),
            provable=sc.provable,
        )
        for sc in rows
    ]
    full = limit is not None and len(rows) == limit
    return ScorePage(data=data, count=len(data), next=rows[-1].id if full else None)


def results(ctx: Context, s: Session, run: Run) -> Results:
    rounds = rounds_view(s, run)
    scores = contract_scores(s, run.id)
    done = [r for r in rounds if r.round > 0]
    updates = s.scalars(select(Update).where(Update.run_id == run.id)).all()
    contracts = s.scalars(select(Contract).where(Contract.run_id == run.id).order_by(Contract.created_at)).all()
    return Results(
        training_id=run.id,
        status=RunStatus(run.status),
        error=run.error,
        model_cid=run.result_cid or run.global_cid,
        metrics=run.result_metrics or {},
        rounds_completed=len(done),
        rounds=run.cfg.rounds if run.configured else None,
        initial_val_loss=run.initial_val_loss,
        final_val_loss=run.val_loss,
        final_val_accuracy=run.val_accuracy,
        final_val_round=latest_evaluated(s, run),
        bytes_up=run.bytes_up,
        bytes_down=run.bytes_down,
        updates_accepted=sum(u.status == UpdateStatus.ACCEPTED for u in updates),
        updates_rejected=sum(u.status == UpdateStatus.REJECTED for u in updates),
        wall_seconds=(run.finished_at or time.time()) - run.started_at if run.started_at else None,
        settled_round=run.settled_round,
        checkpoints=[Checkpoint(round=r.round, cid=r.checkpoint_cid) for r in rounds],
        workers=[
            ResultWorker(
                worker_id=c.worker_id,
                contract_id=c.id,
                status=ContractStatus(c.status),
                **dict(scores.get(c.id, NO_SCORE)),
            )
            for c in contracts
        ],
        **result_fields(s, run),
    )


def list_runs(s: Session, *, owner: str | None = None, status: str | None = None) -> list[Run]:
    q = select(Run).order_by(Run.created_at.desc())
    if owner:
        q = q.where(Run.owner == owner)
    if status:
        if status not in set(RunStatus):
            raise unprocessable("bad_status", f"unknown status {status!r}; one of: {', '.join(RunStatus)}")
        q = q.where(Run.status == status)
    return list(s.scalars(q).all())


def shards_view(s: Session, run: Run) -> list[ShardView]:
    """The run's shards with the active jobs on each (split shards point to their halves)."""
    if run.manifest is None:
        return []
    jobs = s.scalars(select(Job).where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE)).all()
    return [
        ShardView(
            shard_index=i,
            shard_id=e["cid"],
            samples=e["samples"],
            split_from=e.get("split_from"),
            split_into=e.get("split_into"),
            jobs=[j.id for j in jobs if j.shard_index == i],
        )
        for i, e in enumerate(run.data_manifest["shards"])
    ]


# --- the market and contracts -------------------------------------------------------------


def ranked_view(r: RankedOffer, *, hired: bool) -> RankedView:
    o = r.offer
    return RankedView(
        worker_id=o.worker_id,
        gpu_type=o.gpu,
        price=ait(round(o.price * MICRO)),
        price_micro=round(o.price * MICRO),
        reputation=o.reputation,
        availability=o.availability,
        score=round(r.score, 6),
        hired=hired,
        max_params=o.max_params,
    )


def contract_view(c: Contract) -> ContractView:
    return ContractView(
        contract_id=c.id,
        worker_id=c.worker_id,
        training_id=c.run_id,
        price=ait(c.price),
        price_micro=c.price,
        status=ContractStatus(c.status),
        score=round(c.score, 6),
    )


def offer_view(ctx: Context, o: Offer, *, now: float) -> OfferView:
    seen = ctx.liveness.last_seen(o.id) or o.last_heartbeat
    return OfferView(
        worker_id=o.id,
        gpu_type=o.gpu,
        price=ait(o.price),
        price_micro=o.price,
        reputation=o.reputation,
        availability=o.availability,
        status=OfferStatus(o.status),
        live=now - seen <= ctx.settings.lease_seconds,
        last_heartbeat=seen,
        max_bond=ait(o.max_bond or 0),
        max_params=o.max_params,
        last_heartbeat_age=round(now - seen, 3),
        device=o.device,
        flags=o.flags,
    )


def market(ctx: Context, s: Session, *, live_only: bool) -> list[MarketOffer]:
    now = time.time()
    offers = s.scalars(select(Offer).order_by(Offer.id)).all()
    busy = busy_workers(s)
    views = [MarketOffer(**dict(offer_view(ctx, o, now=now)), busy=o.id in busy) for o in offers]
    return [v for v in views if v.live and v.status == OfferStatus.ONLINE] if live_only else views


# --- jobs and updates -------------------------------------------------------------------


def job_detail(ctx: Context, s: Session, job_id: str) -> JobDetail:
    job = s.get(Job, job_id)
    if job is None:
        raise not_found("unknown_job", f"no job {job_id!r}")
    run = row(s, Run, job.run_id)
    this_round = s.scalar(select(Update.status).where(Update.job_id == job.id, Update.round == run.round))
    gpu = gpu_types(s, [job.worker_id]).get(job.worker_id)
    return JobDetail(
        **dict(job_view(ctx, job, run, this_round, gpu=gpu, now=time.time())),
        training_id=job.run_id,
        round=run.round,
        run_status=RunStatus(run.status),
    )


def jobs_of(ctx: Context, s: Session, worker_id: str) -> list[WorkerJob]:
    now = time.time()
    rows = s.execute(
        select(Job, Run)
        .join(Run, Run.id == Job.run_id)
        .where(Job.worker_id == worker_id)
        .order_by(Job.created_at.desc())
    ).all()
    answered = s.execute(
        select(Update.job_id, Update.status)
        .join(Run, Run.id == Update.run_id)
        .where(Update.worker_id == worker_id, Update.round == Run.round)
    ).all()
    done = {r.job_id: r.status for r in answered}
    gpu = gpu_types(s, [worker_id]).get(worker_id)
    return [
        WorkerJob(**dict(job_view(ctx, j, run, done.get(j.id), gpu=gpu, now=now)), training_id=j.run_id)
        for j, run in rows
    ]


def updates_of(s: Session, job_id: str) -> list[UpdateView]:
    """The job's updates (its "checkpoints"), newest round first."""
    job = s.get(Job, job_id)
    if job is None:
        raise not_found("unknown_job", f"no job {job_id!r}")
    rows = s.scalars(select(Update).where(Update.job_id == job_id).order_by(Update.round.desc())).all()
    return [update_view(u) for u in rows]


def run_updates(s: Session, run: Run, *, round: int | None = None, latest: bool = False) -> list[UpdateView]:
    """The run's updates (the workers' checkpoints), newest round first: of one ``round``,
    or with ``latest`` each job's most recent one."""
    q = select(Update).where(Update.run_id == run.id)
    if round is not None:
        q = q.where(Update.round == round)
    rows = s.scalars(q.order_by(Update.round.desc(), Update.id)).all()
    if latest:
        newest: dict[str, Update] = {}
        for u in rows:
            newest.setdefault(u.job_id, u)
        rows = list(newest.values())
    return [update_view(u) for u in rows]


def update_view(u: Update) -> UpdateView:
    return UpdateView(
        checkpoint_id=u.cid,
        cid=u.cid,
        training_id=u.run_id,
        job_id=u.job_id,
        worker_id=u.worker_id,
        round=u.round,
        samples=u.samples,
        shard_index=u.shard_index,
        train_loss=u.train_loss,
        size=u.size,
        status=UpdateStatus(u.status),
        reason=u.reason,
        created_at=u.created_at,
        verification=u.verification,
        verify_detail=u.verify_detail,
        verify_steps=u.verify_steps or 0,
    )


# --- money ------------------------------------------------------------------------------


def payments_view(ctx: Context, s: Session, run: Run) -> Payments:
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
            WorkerPay(
                worker_id=c.worker_id,
                contract_id=c.id,
                price=ait(c.price),
                price_micro=c.price,
                status=ContractStatus(c.status),
                rounds_accepted=sum(x.status == ScoreStatus.ACCEPTED for x in sc),
                rounds_scored=len(sc),
                score=(sum(x.quality for x in sc) / len(sc)) if sc else None,
                flags=sorted({f for x in sc for f in x.flags}),
                paid=ait(paid),
                paid_micro=paid,
                due=ait(int(due)),
                due_micro=int(due),
                bond=ait(c.bond),
                slashed=ait(c.slashed),
                slashed_micro=c.slashed,
                reputation=offer.reputation if offer else None,
                evm_address=c.evm_address,
            )
        )
    rounds_closed = s.scalar(
        select(func.count()).select_from(RoundRecord).where(RoundRecord.run_id == run.id, RoundRecord.round > 0)
    )
    return Payments(
        training_id=run.id,
        network=run.network,
        control=Control(run.control),
        escrowed=ait(run.escrowed),
        escrow_balance=ait(ctx.ledger.balance(s, escrow_account(run.id))),
        settled_round=run.settled_round,
        rounds_closed=rounds_closed or 0,
        finalized=run.finalized,
        status=RunStatus(run.status),
        settled=books_closed(s, run) and chain_final(ctx, s, run),
        data=rows,
        count=len(rows),
        chain=chain_payments(ctx, s, run),
    )


def books_closed(s: Session, run: Run) -> bool:
    """Whether the coordinator has paid all it pays for ``run`` by itself: the run ended, its
    closed rounds are settled (the test the refund makes) and its end was booked (updates of a
    round that never closed paid as delivered, bonds returned: the driver's finalize)."""
    if run.finalized:
        return True
    closed = s.scalar(select(func.max(RoundRecord.round)).where(RoundRecord.run_id == run.id)) or 0
    return run.status in ENDED and run.settled_round >= closed and run.bonds_returned


def entry_view(e: Entry) -> EntryView:
    return EntryView(**e.as_dict(), amount_ait=ait(e.amount))
