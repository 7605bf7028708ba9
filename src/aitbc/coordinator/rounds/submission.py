"""A provider's update submitted (:func:`submit_update`): decoded, shape- and
finite-checked, admitted by the run's mode (its base, its round gate, the round it joins),
spot-check commitments checked; a rejected one is recorded and flagged.
"""

from __future__ import annotations

import base64
import math
import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import ApiError, conflict, unprocessable
from aitbc.coordinator.money import onchain
from aitbc.coordinator.rounds.admission import update_prior
from aitbc.coordinator.rounds.jobs import CHECKING, flag_job, own_job, reached, trained_shard, update_problem
from aitbc.coordinator.rounds.modes import mode_of
from aitbc.coordinator.rounds.workers import flag_blob
from aitbc.coordinator.schemas import UpdateSubmit
from aitbc.coordinator.store.models import Job, Run, Update
from aitbc.coordinator.store.repository import job_settings, lock_run
from aitbc.coordinator.store.states import ENDED
from aitbc.coordinator.verification import spot_checks as verification
from aitbc.replies.jobs import UpdateAccepted
from aitbc.states import JobStatus, UpdateStatus
from aitbc.storage.cid import cid_of_bytes, is_cid
from aitbc.training.proof import Commitment


def submit_update(ctx: Context, s: Session, job_id: str, signer: str, body: UpdateSubmit) -> UpdateAccepted:
    """Accept or reject one update. Refusals that say nothing about the worker's honesty
    (unknown job, run ended, round already closed, a duplicate) are errors with no write;
    a bad update (undecodable, wrong shape, NaN/Inf) is recorded as rejected, the worker is
    flagged, and the reply is a 422 naming the reason.

    The checks are made twice: once cheaply, then again after taking the run's row lock,
    so the round cannot close between the check and the commit (an accepted update is
    always in its round's aggregation)."""
    job, run = own_job(s, job_id, signer)
    _round_gate(s, job, run, body)
    onchain.require_bond(ctx, s, run, job)  # EVM: only a contract bonded on chain can be paid for it
    if not is_cid(body.cid):
        raise unprocessable("bad_cid", f"{body.cid!r} is not a CID")
    inline = None if body.blob is None else _inline_blob(ctx, signer, body.cid, body.blob)
    if inline is None and not ctx.store.has(body.cid):
        raise unprocessable("missing_blob", f"update blob {body.cid} was not uploaded; PUT /v1/blobs/{body.cid} first")
    mode = mode_of(run)
    # 422 before anything is written; async: any recent version (its staleness is checked under the lock)
    base = mode.base(s, run, body)
    priors = update_prior(s, run, job, body, base.round)
    commitment, reason, size = _check_blob(ctx, s, run, job, body, inline)
    if inline is not None:  # stored (fsynced) before the update naming it can commit
        _store_inline(ctx, body.cid, inline)
        del inline
    if body.train_loss is not None and not math.isfinite(body.train_loss):
        reason = reason or f"reported training loss is {body.train_loss}"
    lock_run(s, run)
    s.refresh(job)
    if job.status != JobStatus.ACTIVE:
        s.rollback()
        raise conflict("job_not_active", f"job {job_id} is {job.status}: {job.end_reason}")
    _round_gate(s, job, run, body)
    onchain.mirror_bond(ctx, s, run, job)
    now = time.time()
    round = mode.admit(s, job, run, body, base, now=now)
    trained = trained_shard(run, job, body.shard_cid)
    checks: dict[str, Any] = {}
    if commitment is not None and reason is None:
        checks, failed = verification.on_submit(ctx, run, job, commitment, trained, start_cid=base.cid, priors=priors)
        reason = failed
    upd = Update(
        run_id=run.id,
        job_id=job.id,
        worker_id=job.worker_id,
        round=round,
        cid=body.cid,
        size=size,
        shard_index=trained,
        samples=int(run.data_manifest["shards"][trained]["samples"]),
        train_loss=body.train_loss if reason is None else None,
        train_accuracy=body.train_accuracy if reason is None else None,
        compute_seconds=body.compute_seconds,
        # sent ahead (overlap 2): named, since the round's own model is not made yet
        base_cid=base.cid if mode.keeps_base(run, round, base) else None,
        prior_cid=priors[0] if priors else None,
        status=UpdateStatus.ACCEPTED if reason is None else UpdateStatus.REJECTED,
        reason=reason,
        created_at=now,
        **checks,
    )
    s.add(upd)
    _delivered(s, run, job, body, upd, verified=bool(checks), now=now)
    s.commit()
    ctx.notifier.poke_driver()
    if reason is not None:
        raise ApiError(422, "update_rejected", f"update for round {body.round} rejected: {reason}")
    return UpdateAccepted(
        status="accepted",
        round=round,
        cid=body.cid,
        size=size,
        verification=upd.verification,
        challenge=verification.challenge_view(upd),
    )


def _check_blob(
    ctx: Context, s: Session, run: Run, job: Job, body: UpdateSubmit, inline: bytes | None
) -> tuple[Commitment | None, str | None, int]:
    """The update's spot-check commitment (parsed: a 422 before anything is written), why
    its blob cannot be aggregated (None: it can), and its size. At most ``UPDATE_CHECKS``
    update blobs are in memory at once, whatever the workers."""
    with CHECKING:
        # re-hashed: a blob swapped on disk is refused too (an inline blob was hashed already)
        blob = inline if inline is not None else ctx.store.get_bytes(body.cid)
        commitment = verification.parse_commitment(
            s, run, job, body.proof, body.steps, trained_shard(run, job, body.shard_cid), round=body.round
        )
        reason = update_problem(blob, run.cfg.d)  # the costly decode, outside the run's lock
        size = len(blob)
        del blob  # not held past the turn: the next check may take its place
    return commitment, reason, size


def _delivered(s: Session, run: Run, job: Job, body: UpdateSubmit, upd: Update, *, verified: bool, now: float) -> None:
    """The run's and the job's books on job ``job``'s update ``upd``: its bytes and compute,
    its progress, its flag if rejected (``verified``: by its spot check's commitments)."""
    run.bytes_up += upd.size
    job.compute_seconds += body.compute_seconds
    # The update is the round's last progress report too (the worker sends no other after it):
    # its steps as claimed, at most the job's own (a claim is not a measurement).
    if upd.round == run.round:  # one sent ahead (overlap 2) measures no speed: its round is not open
        reached(run, job, upd.round, min(body.steps, job_settings(run, job)["local_steps"]), now=now)
    job.progress, job.worker_status = 100.0, "uploaded"
    if body.epoch is not None:
        job.epoch = body.epoch
    if upd.reason is None and body.train_loss is not None:
        job.loss = body.train_loss
    job.updated_at = now
    if upd.reason is not None:
        flag_job(s, job, run, "verification_failed" if verified else "rejected_update", upd.reason, now=now)


def _inline_blob(ctx: Context, signer: str, cid: str, blob: str) -> bytes:
    """The bytes of an update sent inside its message (``UpdateSubmit.blob``), checked
    as a ``PUT /v1/blobs/{cid}`` checks them: base64 (422 ``bad_blob``), within the
    coordinator's blob size limit (413), hashing to ``cid`` (400 ``cid_mismatch``, the
    uploader flagged ``bad_blob``). Nothing is stored here."""
    try:
        data = base64.b64decode(blob, validate=True)
    except ValueError:
        raise unprocessable("bad_blob", "blob is not base64 (standard alphabet, padded)") from None
    limit = ctx.settings.max_blob_bytes
    if len(data) > limit:
        raise ApiError(413, "blob_too_large", f"blob is {len(data)} bytes; this coordinator takes at most {limit}")
    if cid_of_bytes(data) != cid:
        detail = f"uploaded bytes do not hash to {cid}; nothing stored"
        flag_blob(ctx, signer, detail)
        raise ApiError(400, "cid_mismatch", detail)
    return data


def _store_inline(ctx: Context, cid: str, data: bytes) -> None:
    """Store an inline update blob (checked by :func:`_inline_blob`) durably, as a PUT
    would; one held already is touched (retention's grace period starts again)."""
    if not ctx.store.touch(cid):
        ctx.store.put_bytes(data)


def _round_gate(s: Session, job: Job, run: Run, body: UpdateSubmit) -> None:
    """Refuse an update the run cannot take now (rolling back any lock held)."""

    def refuse(e: ApiError, flag: str | None = None) -> None:
        s.rollback()
        if flag:
            flag_job(s, job, run, "wrong_round", flag, now=time.time())
            s.commit()
        raise e

    # first: a retry of a recorded update (its reply was lost) must read "recorded", whatever the phase now;
    # a worker told round_closed / not_accepting rolls its optimizer back as if it never trained
    if s.scalar(select(Update.id).where(Update.job_id == job.id, Update.round == body.round)) is not None:
        refuse(conflict("duplicate_update", f"job {job.id} already sent its update for round {body.round}"))
    if run.status in ENDED:
        refuse(conflict("run_ended", f"run {run.id} has ended ({run.status})"))
    mode_of(run).gate(s, job, run, body, refuse)
