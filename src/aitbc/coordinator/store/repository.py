"""Lookups and row locks every use-case shares: a run, a run its signer owns, a job its
signer owns, a shard of a run's manifest. Each raises the API error a caller would answer
(404 unknown, 403 not yours) before anything is written.

Locking: :func:`lock_run` takes the run's row for writing and re-reads it, so what a
use-case checks next still holds at its commit (SQLite's write lock, or a row lock on
other databases, keeps the round driver and other requests out until the transaction ends).
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from aitbc.coordinator.errors import conflict, forbidden, not_found, unprocessable
from aitbc.coordinator.store.models import Base, Job, JobOverrides, RoundRecord, Run, Update
from aitbc.coordinator.store.run_config import JobSettings
from aitbc.coordinator.store.states import RUNNING, require_status
from aitbc.states import JobStatus, UpdateStatus
from aitbc.training.local import epoch_steps

R = TypeVar("R", bound=Base)


def provably_bad() -> ColumnElement[bool]:
    """Updates that get their job slashed and ejected when their round is settled: rejected
    (malformed, NaN, past the norm bound, a failed spot check), but not a spot check left
    unanswered nor a replay that missed within its drift bound (no proof that the work was
    bad). Such a job sends nothing more meanwhile."""
    return (Update.status == UpdateStatus.REJECTED) & (
        Update.verification.is_(None) | Update.verification.not_in(("unanswered", "drift"))
    )


def lock_run(s: Session, run: Run) -> Run:
    """Take the run's row for writing and re-read it, so what is checked next still holds
    at commit: SQLite's write lock (or a row lock on other databases) keeps the round
    driver and other requests out until this transaction ends. Check state after this."""
    s.execute(update(Run).where(Run.id == run.id).values(updated_at=time.time()))
    s.refresh(run)
    return run


def get_run(s: Session, run_id: str) -> Run:
    run = s.get(Run, run_id)
    if run is None:
        raise not_found("unknown_run", f"no training run {run_id!r}; list runs with: aitbc distributed-training list")
    return run


def owned_run(s: Session, run_id: str, signer: str) -> Run:
    """The run, locked for this request (see :func:`lock_run`), if ``signer`` (an
    address) owns it; 403 otherwise."""
    run = get_run(s, run_id)
    if run.owner != signer:
        raise forbidden(f"run {run_id} belongs to {run.owner}; {signer} may not control it")
    return lock_run(s, run)


def owned_job(s: Session, job_id: str, signer: str, *, action: str, active: bool = True) -> tuple[Job, Run]:
    """The job and its run (locked), if ``signer`` owns the run (and the job is active)."""
    job = s.get(Job, job_id)
    if job is None:
        raise not_found("unknown_job", f"no job {job_id!r}")
    run = row(s, Run, job.run_id)
    if run.owner != signer:
        raise forbidden(f"job {job_id} is in run {run.id}, which belongs to {run.owner}; {signer} may not {action}")
    lock_run(s, run)
    s.refresh(job)
    require_status(run, *RUNNING, action=action)
    if active and job.status != JobStatus.ACTIVE:
        raise conflict("job_not_active", f"job {job_id} is {job.status}: {job.end_reason}")
    return job, run


def shard_index(run: Run, shard_id: str) -> int:
    if run.manifest is None:
        raise conflict("no_data", f"run {run.id} has no data yet; upload and attach it first")
    for i, e in enumerate(run.data_manifest["shards"]):
        if e["cid"] == shard_id:
            if "split_into" in e:
                raise conflict(
                    "shard_split",
                    f"shard {shard_id} of run {run.id} was split into shards "
                    f"{', '.join(run.data_manifest['shards'][k]['cid'] for k in e['split_into'])}",
                )
            return i
    raise unprocessable(
        "unknown_shard",
        f"{shard_id!r} is not a shard of run {run.id} "
        f"({len(run.data_manifest['shards'])} shards; GET /v1/runs/{run.id}/shards lists them)",
    )


def job_settings(run: Run, job: Job, *, config: JobOverrides | None = None, shard: int | None = None) -> JobSettings:
    """What a job trains with each round: the owner's overrides over the run's config.
    ``epochs`` (passes over its shard) sets ``local_steps`` from the shard's samples
    (:func:`~aitbc.training.local.epoch_steps`, the worker's own rule); None otherwise.
    ``config``/``shard``: another of its configs (the one before the owner's last change)
    or shard (the one it trained a round on before a split) than its current one."""
    cfg, own = run.cfg, (job.config if config is None else config) or {}
    index = job.shard_index if shard is None else shard
    batch = int(own.get("batch_size") or cfg.batch_size)
    epochs = own.get("epochs")
    if epochs:
        steps = epoch_steps(int(epochs), int(run.data_manifest["shards"][index]["samples"]), batch)
    else:
        steps = int(own.get("local_steps") or cfg.local_steps)
    return {"local_steps": steps, "batch_size": batch, "lr": float(own.get("lr") or cfg.lr), "epochs": epochs}


def row(s: Session, model: type[R], key: Any) -> R:
    """A row that must exist because another row names it (a job's run, a score's
    contract): its absence is a broken database, not a user's error."""
    found = s.get(model, key)
    if found is None:
        raise LookupError(f"{model.__tablename__} row {key!r} is missing")
    return found


def round_updates(s: Session, run_id: str, r: int) -> list[tuple[Update, int]]:
    """Every update of round ``r`` with its job's shard index, in shard order (then by
    id): the order a round's aggregation, consensus and manual aggregate read them in."""
    rows = s.execute(
        select(Update, Job.shard_index)
        .join(Job, Job.id == Update.job_id)
        .where(Update.run_id == run_id, Update.round == r)
        .order_by(Job.shard_index, Update.id)
    ).all()
    return [(u, shard) for u, shard in rows]


def prior_chain(s: Session, job_id: str, round: int, prior_cid: str | None, base_round: int) -> list[str]:
    """The chain of priors an update of ``round`` trained ahead (overlap, eager start) names:
    ``prior_cid``, this job's update of the round before, then that update's own
    ``prior_cid`` while its round is still past ``base_round`` (the round whose model the
    update started from), newest first. A link that is not this job's stored update, or a
    gap in the chain, is a 422 ``wrong_prior`` naming it (nothing is written)."""
    if prior_cid is None:
        return []
    chain: list[str] = []
    r, cid = round - 1, prior_cid
    while r > base_round:
        link = s.execute(
            select(Update.prior_cid).where(Update.job_id == job_id, Update.round == r, Update.cid == cid)
        ).first()
        if link is None:
            raise unprocessable(
                "wrong_prior",
                f"prior_cid {cid!r} is not this job's update of round {r}"
                + ("" if not chain else f" (named by its update of round {r + 1}, {chain[-1]})"),
            )
        chain.append(cid)
        r, found = r - 1, link.prior_cid
        if r > base_round and found is None:
            raise unprocessable(
                "wrong_prior",
                f"base_cid is round {base_round}'s model, but this job's update of round {r + 1} names no prior: "
                f"an eager start from it leaves out round {r}; name round {r + 1}'s model as the base",
            )
        cid = found or ""
    return chain


def base_round(s: Session, run_id: str, cid: str, *, before: int) -> int | None:
    """The newest version (round) before round ``before`` whose model is ``cid`` (a
    skipped round keeps its model: the newest such is the least stale), or None."""
    return s.scalar(
        select(RoundRecord.round)
        .where(RoundRecord.run_id == run_id, RoundRecord.checkpoint_cid == cid, RoundRecord.round < before)
        .order_by(RoundRecord.round.desc())
        .limit(1)
    )
