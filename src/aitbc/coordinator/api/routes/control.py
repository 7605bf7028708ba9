"""The owner's hands on a run: manual control (phases, jobs, aggregation on demand, the
result) and job controls (mark failed, release, reassign, split, per-job config, resend).
See :mod:`aitbc.coordinator.runs.control`."""

from __future__ import annotations

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from aitbc.coordinator.api.deps import CtxDep, SessionDep, SignerDep
from aitbc.coordinator.api.responses import OWNED, errors
from aitbc.coordinator.context import Context
from aitbc.coordinator.runs import control, views
from aitbc.coordinator.schemas import Aggregate, JobConfig, JobCreate, JobEnd, JobMove, PhaseSet, ResultSave
from aitbc.coordinator.store import repository
from aitbc.coordinator.store.models import Job
from aitbc.replies.base import Page
from aitbc.replies.jobs import Aggregated, JobDetail, ResendRequested, ShardView, SplitJobs, UpdateView
from aitbc.replies.results import SavedResult
from aitbc.replies.runs import RunDetail

router = APIRouter(tags=["control"])


def _job(ctx: Context, s: Session, job: Job) -> JobDetail:
    return views.job_detail(ctx, s, job.id)


@router.post("/runs/{run_id}/phase", response_model=RunDetail, responses=OWNED)
def set_phase(run_id: str, body: PhaseSet, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> RunDetail:
    """Move the run to ``distributing`` (with the training config; none: the defaults),
    ``training`` (open round 1, or the next round once this one is aggregated),
    ``aggregating`` (close the open round to updates) or ``complete``. The first call on
    an automatic run takes it over: its owner drives it from then on (409 while the
    coordinator is writing its initial model or aggregating a round)."""
    run = control.set_phase(ctx, s, repository.owned_run(s, run_id, signer.address), body, signer.auth())
    return views.run_detail(ctx, s, run)


@router.get("/runs/{run_id}/shards", response_model=Page[ShardView], responses=errors(404))
def shards(run_id: str, s: SessionDep) -> Page[ShardView]:
    data = views.shards_view(s, repository.get_run(s, run_id))
    return Page[ShardView](data=data, count=len(data))


@router.post("/runs/{run_id}/jobs", status_code=201, response_model=JobDetail, responses=OWNED)
def create_job(run_id: str, body: JobCreate, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> JobDetail:
    """Manual runs: a hired worker trains the named shard from the open round on."""
    return _job(ctx, s, control.create_job(ctx, s, repository.owned_run(s, run_id, signer.address), body))


@router.post("/runs/{run_id}/aggregate", response_model=Aggregated, responses=OWNED)
def aggregate(run_id: str, body: Aggregate, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> Aggregated:
    """Manual runs, while aggregating: combine the chosen updates of the closed round."""
    return control.aggregate(ctx, s, run_id, signer.address, body)


@router.post("/runs/{run_id}/result", response_model=SavedResult, responses=OWNED)
def save_result(run_id: str, body: ResultSave, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> SavedResult:
    """Owner-driven runs: the run's model (an aggregated checkpoint, or a model blob the
    owner uploaded) and the owner's metrics, kept as its result."""
    return control.save_result(ctx, s, repository.owned_run(s, run_id, signer.address), body)


@router.get("/runs/{run_id}/updates", response_model=Page[UpdateView], responses=errors(404, 422))
def run_updates(
    run_id: str,
    s: SessionDep,
    round: int | None = Query(None, ge=1, le=10_000_000, description="only this round's"),
    latest: bool = Query(False, description="only each job's most recent update"),
) -> Page[UpdateView]:
    """The workers' updates (checkpoints) of the run, newest round first."""
    data = views.run_updates(s, repository.get_run(s, run_id), round=round, latest=latest)
    return Page[UpdateView](data=data, count=len(data))


@router.get("/jobs/{job_id}/updates", response_model=Page[UpdateView], responses=errors(404))
def job_updates(job_id: str, s: SessionDep) -> Page[UpdateView]:
    data = views.updates_of(s, job_id)
    return Page[UpdateView](data=data, count=len(data))


@router.post("/jobs/{job_id}/end", response_model=JobDetail, responses=OWNED)
def end_job(job_id: str, body: JobEnd, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> JobDetail:
    """``failed`` marks the worker failed; ``released`` lets it go."""
    return _job(ctx, s, control.end_job(ctx, s, job_id, signer.address, body))


@router.post("/jobs/{job_id}/reassign", status_code=201, response_model=JobDetail, responses=OWNED)
def reassign(job_id: str, body: JobMove, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> JobDetail:
    """The job's shard to ``worker_id`` (or the best free worker); returns the new job."""
    return _job(ctx, s, control.reassign(ctx, s, job_id, signer.address, body))


@router.post("/jobs/{job_id}/split", status_code=201, response_model=SplitJobs, responses=OWNED)
def split(job_id: str, body: JobMove, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> SplitJobs:
    """Half of the job's shard to ``worker_id`` (or the best free worker)."""
    kept, new = control.split(ctx, s, job_id, signer.address, body)
    return SplitJobs(job=_job(ctx, s, kept), new_job=_job(ctx, s, new))


@router.post("/jobs/{job_id}/config", response_model=JobDetail, responses=OWNED)
def job_config(job_id: str, body: JobConfig, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> JobDetail:
    """The job's own local_steps / batch_size / lr, from the next round it starts."""
    return _job(ctx, s, control.set_config(ctx, s, job_id, signer.address, body))


@router.post("/jobs/{job_id}/resend", response_model=ResendRequested, responses=OWNED)
def resend(job_id: str, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> ResendRequested:
    """Drop the job's update of the open round; the worker sends that round again."""
    return control.resend(ctx, s, job_id, signer.address)
