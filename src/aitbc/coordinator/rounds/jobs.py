"""A provider's job as the round use-cases see it: whose it is (:func:`own_job`), where it
is in its round (:func:`reached`: its speed, measured here), the shard an update was
trained on, whether its update blob can be aggregated at all (:func:`update_problem`), and
the flags it earns (:func:`flag_job`, :func:`refuse_ejected`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from sqlalchemy import select
from sqlalchemy.orm import Session

from aitbc.coordinator.errors import conflict, forbidden, not_found
from aitbc.coordinator.store.models import Flag, Job, Offer, Run, Update
from aitbc.coordinator.store.repository import job_settings, provably_bad, row
from aitbc.coordinator.store.states import ENDED
from aitbc.core.compression import decode_pieces, split_blob
from aitbc.errors import AitbcError
from aitbc.states import JobStatus


def own_job(s: Session, job_id: str, signer: str) -> tuple[Job, Run]:
    job = s.get(Job, job_id)
    if job is None:
        raise not_found("unknown_job", f"no job {job_id!r}")
    if job.worker_id != signer:
        raise forbidden(f"job {job_id} belongs to worker {job.worker_id}; {signer} may not report for it")
    run = row(s, Run, job.run_id)
    if run.status in ENDED:
        raise conflict("run_ended", f"run {run.id} has ended ({run.status}); job {job_id} is released")
    if job.status != JobStatus.ACTIVE:
        raise conflict("job_not_active", f"job {job_id} is {job.status}: {job.end_reason}")
    return job, run


def reached(run: Run, job: Job, round: int, step: int, *, now: float) -> None:
    """Job ``job`` is at ``step`` of the open round ``round`` (a progress report, or its
    update: the round's last step). Its speed is the samples of the steps done since its
    previous report of the same round over the seconds between the two, on this clock."""
    last_step, last_at = job.step, job.progress_at
    if (
        job.progress_round == round
        and last_step is not None
        and last_at is not None
        and step > last_step
        and now > last_at
    ):
        batch = job_settings(run, job)["batch_size"]
        samples = int(run.data_manifest["shards"][job.shard_index]["samples"])
        measured = (step - last_step) * min(batch, samples) / (now - last_at)
        job.speed = measured if job.speed is None else (job.speed + measured) / 2
    job.step, job.progress_at, job.progress_round = step, now, round


def trained_shard(run: Run, job: Job, shard_cid: str | None) -> int:
    """The shard an update was trained on: the job's, or the one it held before a split
    or a move (a round that began before the change), if the worker names that one."""
    shards = run.data_manifest["shards"]
    if shard_cid is not None and job.moved_from is not None and shards[job.moved_from]["cid"] == shard_cid:
        return job.moved_from
    return job.shard_index


def refuse_ejected(s: Session, job: Job, refuse: Callable[..., None]) -> None:
    # A job with a provably bad update (rejected: malformed, NaN, past the norm bound, failed its
    # spot check) is slashed and ejected when that round is settled, after the round closes:
    # until then it sends nothing more (its next round's update could otherwise arrive first).
    bad = s.execute(
        select(Update.round, Update.reason)
        .where(
            Update.job_id == job.id,
            provably_bad(),
        )
        .limit(1)
    ).first()
    if bad is not None:
        refuse(
            conflict(
                "ejection_pending",
                f"job {job.id}'s update for round {bad.round} was rejected ({bad.reason}); it takes no more "
                "updates (slashed and ejected when that round is settled)",
            )
        )


# Update checks decoding at once: each holds its blob (an update's size: 100 MB for a 25M
# model sent dense) and one decoded piece of it; more submissions wait for a turn, so the
# coordinator's memory does not grow with the number of workers uploading together.
UPDATE_CHECKS = 2


CHECKING = threading.BoundedSemaphore(UPDATE_CHECKS)


def update_problem(blob: bytes, d: int) -> str | None:
    """Why the update ``blob`` cannot be aggregated into a model of ``d`` parameters (None:
    it can): malformed, the wrong shape, or not finite. Decoded piece by piece: the whole
    update is never in float32 beside its blob."""
    finite = True
    try:
        header, _ = split_blob(blob)
        for piece in decode_pieces(blob, max_numel=d):
            finite = finite and bool(torch.isfinite(piece).all())  # every piece still decodes: corruption wins
            del piece  # not held while the next piece decodes
    except AitbcError as e:
        return f"malformed update blob: {e}"
    if tuple(header.shape) != (d,):
        return f"update has shape {tuple(header.shape)}; the model has ({d},) parameters"
    if not finite:
        return "update contains NaN or Inf"
    return None


def flag_job(s: Session, job: Job, run: Run, kind: str, reason: str, *, now: float) -> None:
    s.add(Flag(worker_id=job.worker_id, run_id=run.id, round=run.round, kind=kind, reason=reason, created_at=now))
    offer = s.get(Offer, job.worker_id)
    if offer is not None:
        offer.flags += 1
