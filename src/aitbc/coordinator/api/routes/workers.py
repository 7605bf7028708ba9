"""Providers: offers in the marketplace, heartbeats, jobs, progress and updates."""

from __future__ import annotations

import time

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from aitbc.coordinator.api.deps import CtxDep, SessionDep, SignerDep
from aitbc.coordinator.api.responses import OWNED, errors
from aitbc.coordinator.errors import forbidden
from aitbc.coordinator.rounds import gossip, jobs, submission, workers
from aitbc.coordinator.runs import views
from aitbc.coordinator.schemas import (
    Holdings,
    Progress,
    ProofReveal,
    RecordPublish,
    UpdateSubmit,
    WitnessReport,
    WorkerRegister,
)
from aitbc.coordinator.verification import spot_checks as verification
from aitbc.replies.base import Ok, Page
from aitbc.replies.gossip import RecordAccepted, SignedRecord, Witnessed
from aitbc.replies.jobs import JobDetail, JobPoll, Revealed, UpdateAccepted, WorkerJob
from aitbc.replies.workers import Heartbeat, MarketOffer, OfferView

router = APIRouter(tags=["workers"])


@router.get("/market/offers", response_model=Page[MarketOffer], responses=errors(422))
def offers(ctx: CtxDep, s: SessionDep, all: bool = False) -> Page[MarketOffer]:
    """Live offers (``all=true``: every offer ever registered, with its status)."""
    data = views.market(ctx, s, live_only=not all)
    return Page[MarketOffer](data=data, count=len(data))


@router.post("/workers", status_code=201, response_model=OfferView, responses=errors(409, 422))
def register(body: WorkerRegister, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> OfferView:
    offer = workers.register(
        ctx, s, body, worker_id=signer.address, public_key=signer.public_key, request=signer.request
    )
    return views.offer_view(ctx, offer, now=time.time())


@router.post("/workers/heartbeat", response_model=Heartbeat, responses=errors(404))
async def heartbeat(ctx: CtxDep, signer: SignerDep) -> Heartbeat:
    """Cheap by design: a signature check and a dict write; no database commit (a worker
    this replica has not heard of yet is looked up once, off the event loop)."""
    if not ctx.liveness.knows(signer.address):
        await run_in_threadpool(workers.require_known, ctx, signer.address)
    now = time.time()
    ctx.liveness.touch(signer.address, now)
    ctx.metrics.heartbeats.inc()
    return Heartbeat(ok=True, time=now, version=ctx.notifier.version)


@router.post("/workers/holdings", response_model=Ok, responses=errors(404, 422))
def holdings(body: Holdings, ctx: CtxDep, signer: SignerDep) -> Ok:
    """Peer transport: the signer serves these blobs at ``advertise`` (``GET
    {advertise}/v1/blobs/{cid}``); it replaces the signer's last announcement. Kept in
    memory; the coordinator hands these workers out to others fetching the same CIDs."""
    workers.announce_holdings(ctx, signer.address, body)
    return Ok(ok=True)


@router.get("/workers/{worker_id}/job", response_model=JobPoll, responses=errors(403, 404, 422))
async def job(
    worker_id: str,
    ctx: CtxDep,
    signer: SignerDep,
    wait: float = Query(0.0, ge=0, le=60, description="seconds to hold the request until there is something to train"),
    after: int | None = Query(
        None,
        ge=0,
        description="with wait: hold until there is something to train in a round past this one "
        "(overlap 2: a worker whose updates are still being sent waits for the next model, not for them)",
    ),
    known: str | None = Query(
        None,
        max_length=64,
        description="with wait: the job the worker already holds (empty: none); a job other than this one "
        "answers at once, even one still waiting for its first round, so its shard and model are ready when it opens",
    ),
    inline: int = Query(
        0,
        ge=0,
        le=workers.MAX_INLINE_MODEL,
        description="bytes: a global model to train that is at most this large comes inside the reply "
        "(job.global_model, base64), saving its download; 0: never",
    ),
) -> JobPoll:
    """The worker's current job and what to do (``train`` or ``wait``). With ``wait``, a
    long poll: answered as soon as there is something to train, or after ``wait`` seconds.
    With ``after``, only a round past that one is something to train. With ``known``, a
    job other than that one is news too. With ``inline``, a small model to train comes
    with the answer."""
    if signer.address != worker_id:
        raise forbidden(f"{signer.address} may not read the job of worker {worker_id}")
    if not ctx.liveness.knows(worker_id):  # registered with another replica: looked up once
        await run_in_threadpool(workers.require_known, ctx, worker_id)
    deadline = time.monotonic() + wait

    def look() -> JobPoll:
        with ctx.session() as s:
            return workers.job_for(ctx, s, worker_id, inline=inline)

    while True:
        seen = ctx.notifier.version
        view = await run_in_threadpool(look)
        job = view.job
        # a bond to post on chain is something to do now, as a round to train is
        ready = job is not None and (job.action == "train" or job.bond_required is not None)
        ready = ready and (after is None or job is None or job.round > after or job.bond_required is not None)
        new = job is not None and known is not None and job.job_id != known
        if ready or new or time.monotonic() >= deadline or ctx.notifier.closed:
            return view
        await ctx.notifier.changed(seen, max(0.0, deadline - time.monotonic()))


@router.get("/jobs/{job_id}", response_model=JobDetail, responses=errors(404))
def get_job(job_id: str, ctx: CtxDep, s: SessionDep) -> JobDetail:
    """One job: its run, worker, shard, and the worker's last progress report."""
    return views.job_detail(ctx, s, job_id)


@router.get("/workers/{worker_id}/jobs", response_model=Page[WorkerJob])
def worker_jobs(worker_id: str, ctx: CtxDep, s: SessionDep) -> Page[WorkerJob]:
    """Every job a worker has had, newest first (its active one, if any, is marked)."""
    data = views.jobs_of(ctx, s, worker_id)
    return Page[WorkerJob](data=data, count=len(data))


@router.post("/jobs/{job_id}/progress", response_model=Ok, responses=OWNED)
def progress(job_id: str, body: Progress, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> Ok:
    workers.report_progress(ctx, s, job_id, signer.address, body)
    return Ok(ok=True)


@router.post("/jobs/{job_id}/updates", status_code=201, response_model=UpdateAccepted, responses=OWNED)
def submit_update(job_id: str, body: UpdateSubmit, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> UpdateAccepted:
    return submission.submit_update(ctx, s, job_id, signer.address, body)


@router.post("/jobs/{job_id}/records", status_code=201, response_model=RecordAccepted, responses=OWNED)
def publish_record(job_id: str, body: RecordPublish, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> RecordAccepted:
    """Gossip runs: the signer's signed record of its model after a round (``aitbc.gossip/1``:
    run, job, worker, round, model CID, samples, training loss). Published once per round;
    the same record again is a duplicate (200-equivalent), another CID for it a 409."""
    job, run = jobs.own_job(s, job_id, signer.address)
    return gossip.publish(ctx, s, job, run, body.model_dump())


@router.get("/jobs/{job_id}/records", response_model=SignedRecord, responses=errors(404, 422))
def job_record(
    job_id: str,
    s: SessionDep,
    round: int | None = Query(None, ge=1, description="this round's record if published, else the latest"),
) -> SignedRecord:
    """A gossip job's signed model record (how a worker gets the record of a neighbour that
    cannot be reached; it checks the signature itself)."""
    return gossip.record_of(s, job_id, round)


@router.post("/records/witnessed", response_model=Page[Witnessed], responses=errors(403, 404, 409, 422))
def witnessed(body: WitnessReport, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> Page[Witnessed]:
    """Gossip runs: records of other workers of the signer's run, as it received them (its
    neighbours' servers). Each must verify against its signer's own key (a report cannot
    frame anyone; a bad one: 422, nothing written). A record whose job published, or
    another worker received, a different CID for the same round is proof of equivocation:
    the signer of both is flagged ``equivocation`` and its model of the round rejected."""
    workers.require_known(ctx, signer.address)
    data = gossip.witness(ctx, s, signer.address, [r.model_dump() for r in body.records])
    return Page[Witnessed](data=data, count=len(data))


@router.post("/jobs/{job_id}/proofs", response_model=Revealed, responses=OWNED)
def reveal_states(job_id: str, body: ProofReveal, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> Revealed:
    """Answer the spot check of the job's update: the CIDs of the challenged states
    (uploaded first with ``PUT /v1/blobs/{cid}``). The round driver re-runs them."""
    return verification.reveal(ctx, s, job_id, signer.address, body)
