"""The provider's use-cases: register an offer, heartbeat, poll for a job, report
progress, submit an update (decoded, shape- and finite-checked; a rejected one is recorded
and flagged).
"""

from __future__ import annotations

import base64
import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from sqlalchemy import case, func, or_, select, update
from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import ApiError, conflict, forbidden, not_found, unprocessable
from aitbc.coordinator.rounds import gossip
from aitbc.coordinator.rounds.lifecycle import sends_ahead
from aitbc.coordinator.schemas import Holdings, Progress, UpdateSubmit, WorkerRegister
from aitbc.coordinator.store.models import Flag, Job, Offer, RoundRecord, Run, Update
from aitbc.coordinator.store.repository import base_round, job_settings, lock_run, prior_chain, provably_bad, row
from aitbc.coordinator.store.states import ENDED
from aitbc.coordinator.verification import spot_checks as verification
from aitbc.core.compression import decode_pieces, split_blob
from aitbc.core.staleness import async_weight
from aitbc.errors import AitbcError, IntegrityError, NotFoundError
from aitbc.ledger.book import RequestAuth
from aitbc.market.gpus import normalize_gpu
from aitbc.market.ranking import NEUTRAL_REPUTATION, check_offer_fields
from aitbc.states import JobStatus, OfferStatus, RunStatus, UpdateStatus
from aitbc.storage.cid import cid_of_bytes, is_cid
from aitbc.units import MICRO, parse_price


def register(
    ctx: Context,
    s: Session,
    body: WorkerRegister,
    *,
    worker_id: str,
    public_key: str,
    request: RequestAuth | None = None,
) -> Offer:
    """A provider's offer. Re-registering is how a restarted worker comes back; a second
    process registering while the first is still heartbeating is refused."""
    price = parse_price(body.price)
    max_bond = parse_price(body.max_bond, field="max_bond")
    try:
        check_offer_fields(body.gpu, price / MICRO, body.availability)
    except AitbcError as e:
        raise unprocessable("bad_offer", str(e)) from None
    now = time.time()
    offer = s.get(Offer, worker_id)
    if (
        offer is not None
        and offer.status == OfferStatus.ONLINE
        and ctx.liveness.alive(worker_id, now, ctx.settings.lease_seconds)
    ):
        last = ctx.liveness.last_seen(worker_id) or now
        raise conflict(
            "duplicate_registration",
            f"worker {worker_id} is already registered and alive (last heartbeat {now - last:.1f} s ago); "
            f"stop the other process, or register again after its {ctx.settings.lease_seconds:g} s lease",
        )
    if offer is None:
        offer = Offer(id=worker_id, public_key=public_key, reputation=NEUTRAL_REPUTATION, flags=0, registered_at=now)
        s.add(offer)
    offer.gpu, offer.price, offer.availability = normalize_gpu(body.gpu), price, body.availability
    offer.device, offer.status, offer.last_heartbeat = body.device, OfferStatus.ONLINE, now
    offer.max_bond = max_bond
    offer.registration = request.as_dict() if request is not None and max_bond > 0 else None
    s.commit()
    ctx.liveness.touch(worker_id, now)
    ctx.peers.advertise(worker_id, None if _serves_no_peers(ctx, s, worker_id) else body.advertise)
    ctx.notifier.poke_driver()  # a joiner may take an orphaned shard
    return offer


# The largest global model a job poll may carry inside its reply (GET /workers/{id}/job?inline=).
MAX_INLINE_MODEL = 4 << 20


def job_for(ctx: Context, s: Session, worker_id: str, *, inline: int = 0) -> dict[str, Any]:
    """What the worker should do now: ``train`` (round open, no update from it yet),
    ``wait`` (aggregating, paused, or already answered), or no job at all. ``inline``:
    a global model to train of at most this many bytes comes in the view (base64), so a
    small model's round does not wait for a second request (bench/live_utilization.py)."""
    row = s.execute(
        select(Job, Run)
        .join(Run, Run.id == Job.run_id)
        .where(Job.worker_id == worker_id, Job.status == JobStatus.ACTIVE)
        .order_by(Job.created_at.desc())
        .limit(1)
    ).first()
    if row is None:
        return {"job": None, "version": ctx.notifier.version}
    job, run = row
    cfg = run.cfg  # a job exists only once its run is configured
    done = s.scalar(select(Update).where(Update.job_id == job.id, Update.round == run.round))
    # overlap 2: once its update of the open round is in, a job's next is the next round's,
    # sent before that round opens (also while this one closes)
    send = run.round
    sent_ahead = None
    if done is not None and run.status in (RunStatus.TRAINING, RunStatus.AGGREGATING) and sends_ahead(run):
        send = run.round + 1
        sent_ahead = s.scalar(select(Update).where(Update.job_id == job.id, Update.round == send))
        action = "train" if sent_ahead is None else "wait"
    else:
        action = "train" if run.status == RunStatus.TRAINING and done is None else "wait"
    gossip_view: dict[str, Any] = {}
    if cfg.mode == "gossip":  # workers keep their own round clock; the record follows them
        nxt = gossip.next_round(s, job)
        live = run.status in (RunStatus.TRAINING, RunStatus.AGGREGATING)
        action, done = ("train" if live and nxt <= cfg.rounds else "wait"), None
        gossip_view = {
            "gossip": {
                "topology": cfg.topology,
                "seed": run.seed,
                "aggregator": cfg.aggregator,
                "f": cfg.f,
                "next_round": nxt,
                "roster": gossip.roster(ctx, s, run),
                "norm_clip": ctx.settings.norm_clip,
                "norm_reject": ctx.settings.norm_reject,
                "max_staleness": cfg.max_staleness,
                "staleness": cfg.staleness,  # a neighbour's older model counts this rule's weight
                "wait": cfg.deadline,
            }
        }
    # while unanswered, whatever the run's phase (a manual run aggregating, a pause): if its reply was lost
    challenge = None if done is None else verification.challenge_view(done)
    if challenge is None and sent_ahead is not None:
        challenge = verification.challenge_view(sent_ahead)
    deadline = cfg.round_deadline if cfg.mode != "gossip" else cfg.deadline
    peers: list[dict[str, str]] = []
    if action == "train" and run.global_cid and cfg.mode != "gossip":  # who else holds the model it is about to fetch
        run_id = run.id

        def fetchers() -> list[str]:  # the run's workers: each fetches this model too
            return list(
                s.scalars(select(Job.worker_id).where(Job.run_id == run_id, Job.status == JobStatus.ACTIVE)).all()
            )

        peers = ctx.peers.holders_for(run.global_cid, worker_id, lambda w: _alive(ctx, w), fetchers=fetchers)
    model = None
    # not when peers are named (they spare our egress), nor to gossip workers (they train their own)
    if action == "train" and run.global_cid and inline > 0 and not peers and cfg.mode != "gossip":
        with contextlib.suppress(NotFoundError, IntegrityError):  # gone or corrupt: the worker fetches it by CID
            if ctx.store.size(run.global_cid) <= inline:
                model = base64.b64encode(ctx.store.get_bytes(run.global_cid)).decode("ascii")  # re-hashed
    return {
        "job": {
            "job_id": job.id,
            "training_id": run.id,
            "action": action,
            "run_status": run.status,
            "round": run.round,
            "send_round": send,  # the round its next update is for (overlap 2: may be the next one)
            "rounds": cfg.rounds,
            "global_model_cid": run.global_cid,
            "shard_cid": job.shard_cid,
            "shard_index": job.shard_index,
            "seed": verification.job_seed(run, job),
            "model_type": run.model_type,
            "model_options": run.model_options,
            "data_spec": (run.manifest or {}).get("spec"),
            **job_settings(run, job),  # local_steps, batch_size, lr, epochs (None: local_steps as given)
            "inner_opt": cfg.inner_opt,
            "compression": cfg.compression,
            "error_feedback": cfg.error_feedback,
            "d": cfg.d,
            "deadline_at": (run.round_started_at + deadline) if deadline and run.round_started_at else None,
            "verify_rate": cfg.verify_rate,
            "overlap": cfg.overlap,
            "mode": cfg.mode,  # async: the update names its base (global_model_cid) and joins the open buffer
            "precision": cfg.precision,
            "challenge": challenge,
            "model_peers": peers,
            "global_model": model,
            **gossip_view,
        },
        "version": ctx.notifier.version,
    }


def _alive(ctx: Context, worker_id: str) -> bool:
    return ctx.liveness.alive(worker_id, time.time(), ctx.settings.lease_seconds)


def _serves_no_peers(ctx: Context, s: Session, worker_id: str) -> bool:
    """Caught serving bytes that did not hash to their CID (flag ``bad_peer_blob``): by this
    process (the book's ``banned``), or before its restart or by another replica (the flag
    in the database; the book learns it)."""
    if worker_id in ctx.peers.banned:
        return True
    flagged = select(Flag.id).where(Flag.worker_id == worker_id, Flag.kind == "bad_peer_blob").limit(1)
    if s.scalar(flagged) is None:
        return False
    ctx.peers.ban(worker_id)
    return True


def announce_holdings(ctx: Context, worker_id: str, body: Holdings) -> None:
    """A worker serves ``body.cids`` at ``body.advertise`` (peer transport; in memory)."""
    require_known(ctx, worker_id)
    with ctx.session() as s:
        banned = _serves_no_peers(ctx, s, worker_id)
    if banned:
        raise forbidden(f"worker {worker_id} served a blob that did not hash to its CID; it serves no peers")
    for cid in body.cids:
        if not is_cid(cid):
            raise unprocessable("bad_cid", f"{cid!r} is not a CIDv1 (base32, starts with 'b')")
    ctx.peers.announce(worker_id, body.advertise, list(dict.fromkeys(body.cids)))


def holders(ctx: Context, cid: str, asker: str) -> list[dict[str, str]]:
    """Peers other than ``asker`` that hold ``cid`` (none: fetch it from the coordinator)."""
    return ctx.peers.holders_for(cid, asker, lambda w: _alive(ctx, w))


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


def report_progress(ctx: Context, s: Session, job_id: str, signer: str, body: Progress) -> None:
    """The worker's report on its round. With ``round`` and ``step``, the job's speed
    (samples per second) is measured here, on the coordinator's clock: the samples of the
    steps done since its previous report of the same round over the seconds between the
    two reports, averaged with what was measured before (half and half). A report without
    a loss keeps the last one (a new round's first report has none yet).

    A gossip job reports on its own clock (any round of the run: no round waits for the
    record), with its own seconds into the round (its pace:
    :func:`aitbc.coordinator.rounds.gossip.note_pace`); a report of the record's open round may
    let that round close without it (:func:`aitbc.coordinator.rounds.gossip.cannot_make_it`):
    the driver looks again."""
    job, run = own_job(s, job_id, signer)
    if body.loss is not None and not math.isfinite(body.loss):
        raise unprocessable("bad_progress", f"loss must be a finite number, got {body.loss}")
    is_gossip = run.configured and run.cfg.mode == "gossip"
    if is_gossip and body.round is not None and body.round > run.cfg.rounds:
        raise conflict("wrong_round", f"progress for round {body.round}; run {run.id} has {run.cfg.rounds} rounds")
    ahead = run.cfg.overlap if run.configured else 0  # overlap 1: the next round may be under way already
    if not is_gossip and body.round is not None and body.round > run.round + ahead:
        raise conflict("wrong_round", f"progress for round {body.round}; the open round of {run.id} is {run.round}")
    now = time.time()
    if is_gossip and body.step is not None and body.round is not None:
        gossip.note_pace(run, job, body.round, body.step, body.seconds, now=now)
    elif body.round == run.round and body.step is not None:  # a late report of a closed round measures nothing
        _reached(run, job, body.round, body.step, now=now)
    if body.round is not None:
        job.progress_round = body.round
    job.progress, job.epoch, job.worker_status = body.progress, body.epoch, body.status
    if body.loss is not None:
        job.loss = body.loss
    job.updated_at = now
    s.commit()
    if is_gossip and body.round == run.round:
        ctx.notifier.poke_driver()


def _reached(run: Run, job: Job, round: int, step: int, *, now: float) -> None:
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


def submit_update(ctx: Context, s: Session, job_id: str, signer: str, body: UpdateSubmit) -> dict[str, Any]:
    """Accept or reject one update. Refusals that say nothing about the worker's honesty
    (unknown job, run ended, round already closed, a duplicate) are errors with no write;
    a bad update (undecodable, wrong shape, NaN/Inf) is recorded as rejected, the worker is
    flagged, and the reply is a 422 naming the reason.

    The checks are made twice: once cheaply, then again after taking the run's row lock,
    so the round cannot close between the check and the commit (an accepted update is
    always in its round's aggregation)."""
    job, run = own_job(s, job_id, signer)
    _round_gate(s, job, run, body)
    if not is_cid(body.cid):
        raise unprocessable("bad_cid", f"{body.cid!r} is not a CID")
    inline = None if body.blob is None else _inline_blob(ctx, signer, body.cid, body.blob)
    if inline is None and not ctx.store.has(body.cid):
        raise unprocessable("missing_blob", f"update blob {body.cid} was not uploaded; PUT /v1/blobs/{body.cid} first")
    is_async = run.cfg.mode == "async"
    # 422 before anything is written; async: any recent version (its staleness is checked under the lock)
    if is_async:
        base, base_r = async_base(s, run, body.base_cid), run.round - 1
    else:
        base, base_r = update_base(s, run, body.round, body.base_cid)
    priors = update_prior(s, run, job, body, base_r)
    with _CHECKING:  # at most UPDATE_CHECKS update blobs in memory at once, whatever the workers
        # re-hashed: a blob swapped on disk is refused too (an inline blob was hashed above)
        blob = inline if inline is not None else ctx.store.get_bytes(body.cid)
        commitment = verification.parse_commitment(  # 422 before anything is written
            s, run, job, body.proof, body.steps, trained_shard(run, job, body.shard_cid), round=body.round
        )
        reason = _check_update(blob, run.cfg.d)  # the costly decode, outside the lock
        size = len(blob)
        del blob  # not held through the commit: the next check may take its place
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
    now = time.time()
    round = body.round
    if is_async:  # applied with the open buffer (version run.round - 1 is the newest model)
        round = run.round
        _check_staleness(s, job, run, base, now=now)
    trained = trained_shard(run, job, body.shard_cid)
    checks: dict[str, Any] = {}
    if commitment is not None and reason is None:
        checks, failed = verification.on_submit(ctx, run, job, commitment, trained, start_cid=base, priors=priors)
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
        base_cid=base if is_async or round > run.round or base != run.global_cid else None,
        prior_cid=priors[0] if priors else None,
        status=UpdateStatus.ACCEPTED if reason is None else UpdateStatus.REJECTED,
        reason=reason,
        created_at=now,
        **checks,
    )
    s.add(upd)
    run.bytes_up += size
    job.compute_seconds += body.compute_seconds
    # The update is the round's last progress report too (the worker sends no other after it):
    # its steps as claimed, at most the job's own (a claim is not a measurement).
    if round == run.round:  # one sent ahead (overlap 2) measures no speed: its round is not open
        _reached(run, job, round, min(body.steps, job_settings(run, job)["local_steps"]), now=now)
    job.progress, job.worker_status = 100.0, "uploaded"
    if body.epoch is not None:
        job.epoch = body.epoch
    if reason is None and body.train_loss is not None:
        job.loss = body.train_loss
    job.updated_at = now
    if reason is not None:
        _flag(s, job, run, "verification_failed" if checks else "rejected_update", reason, now=now)
    s.commit()
    ctx.notifier.poke_driver()
    if reason is not None:
        raise ApiError(422, "update_rejected", f"update for round {body.round} rejected: {reason}")
    return {
        "status": UpdateStatus.ACCEPTED.value,
        "round": round,
        "cid": body.cid,
        "size": size,
        "verification": upd.verification,
        "challenge": verification.challenge_view(upd),
    }


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


def update_base(s: Session, run: Run, round: int, base_cid: str | None) -> tuple[str, int]:
    """The global model an update of ``round`` was trained from, and that model's round:
    the round's own (``run.global_cid``, also when ``base_cid`` is not given), or, in a
    run with ``overlap`` k, one of the k checkpoints before it (rounds ``round - 1 - k`` to
    ``round - 2``: the worker began the round before the last ones closed). An update sent
    ahead of its round (overlap 2) names its base, the newest model there is at most.
    Anything else is a 422 naming the models it may be. The update is applied to the
    newest model either way; a spot check re-runs it from this one."""
    cid = run.global_cid or ""
    newest = run.round - 1  # the round whose checkpoint run.global_cid is
    ahead = round > run.round
    if not ahead and (base_cid is None or base_cid == cid):
        return cid, newest
    k = run.cfg.overlap
    oldest = max(0, round - 1 - k) if k else newest
    found = None
    if base_cid == cid and ahead:
        found = newest
    elif base_cid is not None and k:
        found = s.scalar(
            select(RoundRecord.round)
            .where(
                RoundRecord.run_id == run.id,
                RoundRecord.checkpoint_cid == base_cid,
                RoundRecord.round >= oldest,
                RoundRecord.round < newest,
            )
            .order_by(RoundRecord.round.desc())
            .limit(1)
        )
    if found is None:
        allowed = list(
            s.scalars(
                select(RoundRecord.checkpoint_cid)
                .where(RoundRecord.run_id == run.id, RoundRecord.round >= oldest, RoundRecord.round <= newest)
                .order_by(RoundRecord.round.desc())
            ).all()
        )
        if not k:
            allowed = [cid]
        names = " or ".join(dict.fromkeys(allowed)) or cid
        if base_cid is None:
            detail = f"an update sent ahead of its round (round {round}; {run.round} is open) names its base_cid"
        else:
            detail = f"base_cid {base_cid!r} is not a model round {round} may train from" + (
                f" (overlap {k})" if k else ""
            )
        raise unprocessable("wrong_base", f"{detail}: {names}")
    return base_cid or cid, found


def update_prior(s: Session, run: Run, job: Job, body: UpdateSubmit, base_round: int) -> list[str]:
    """The worker's own previous updates that an update trained ahead (overlap) started
    from, on top of its base, newest first (``base - decode(p1) - decode(p2) ...``: where
    its own last round ended, moved by what the global model gained since; an eager start,
    which keeps overlap's loss at the synchronous one: bench/overlap_loss.py), or [].
    ``prior_cid`` must name this job's own update of the round before (stored, whatever
    its verdict); while that one's round is still past the base's, its own ``prior_cid``
    is the next of the chain, down to the round after the base's (overlap 2: two). Only an
    update trained from a model before its round's may name one; anything else is a 422
    that records nothing. The spot check replays such an update from that start."""
    if body.prior_cid is None:
        return []
    if run.cfg.mode != "sync" or run.cfg.overlap < 1 or base_round >= body.round - 1:
        raise unprocessable(
            "wrong_prior",
            "prior_cid is only for an update trained ahead in a sync run with overlap 1 or 2 "
            "(its base_cid a model before the round's)",
        )
    return prior_chain(s, job.id, body.round, body.prior_cid, base_round)


def async_base(s: Session, run: Run, base_cid: str | None) -> str:
    """Async: the version an update was trained from: the newest model (also when
    ``base_cid`` is not given) or any earlier version of this run; else a 422."""
    cid = run.global_cid or ""
    if base_cid is None or base_cid == cid:
        return cid
    if base_round(s, run.id, base_cid, before=run.round) is None:
        raise unprocessable(
            "wrong_base", f"base_cid {base_cid!r} is not a version of run {run.id} (its newest model is {cid})"
        )
    return base_cid


def _check_staleness(s: Session, job: Job, run: Run, base: str, *, now: float) -> None:
    """Async, under the run's lock: refuse (409, nothing recorded but a ``stale_update``
    flag, which costs no reputation: slowness is no fault) an update trained from a
    version more than ``max_staleness`` applications old."""
    b = base_round(s, run.id, base, before=run.round)
    lag = run.round - 1 - (b if b is not None else run.round - 1)
    if async_weight(lambda _: 1.0, lag, run.cfg.max_staleness) is not None:
        return
    reason = (
        f"update trained from version {b} is {lag} versions behind the newest ({run.round - 1}); "
        f"run {run.id} takes at most {run.cfg.max_staleness}"
    )
    s.rollback()
    s.add(
        Flag(
            worker_id=job.worker_id, run_id=run.id, round=run.round, kind="stale_update", reason=reason, created_at=now
        )
    )
    s.commit()
    raise conflict("too_stale", reason)


def trained_shard(run: Run, job: Job, shard_cid: str | None) -> int:
    """The shard an update was trained on: the job's, or the one it held before a split
    or a move (a round that began before the change), if the worker names that one."""
    shards = run.data_manifest["shards"]
    if shard_cid is not None and job.moved_from is not None and shards[job.moved_from]["cid"] == shard_cid:
        return job.moved_from
    return job.shard_index


def _round_gate(s: Session, job: Job, run: Run, body: UpdateSubmit) -> None:
    """Refuse an update the run cannot take now (rolling back any lock held)."""

    def refuse(e: ApiError, flag: str | None = None) -> None:
        s.rollback()
        if flag:
            _flag(s, job, run, "wrong_round", flag, now=time.time())
            s.commit()
        raise e

    # first: a retry of a recorded update (its reply was lost) must read "recorded", whatever the phase now;
    # a worker told round_closed / not_accepting rolls its optimizer back as if it never trained
    if s.scalar(select(Update.id).where(Update.job_id == job.id, Update.round == body.round)) is not None:
        refuse(conflict("duplicate_update", f"job {job.id} already sent its update for round {body.round}"))
    if run.status in ENDED:
        refuse(conflict("run_ended", f"run {run.id} has ended ({run.status})"))
    if run.configured and run.cfg.mode == "async":
        _async_gate(s, job, run, body, refuse)
        return
    if run.status == RunStatus.AGGREGATING and body.round == run.round:
        refuse(
            conflict("round_closed", f"round {run.round} of {run.id} closed before this update arrived (a straggler)")
        )
    # overlap 2: the next round's update may come while this one is open or closing
    ahead = body.round == run.round + 1 and sends_ahead(run)
    if run.status != RunStatus.TRAINING and not (ahead and run.status == RunStatus.AGGREGATING):
        refuse(conflict("not_accepting", f"run {run.id} is {run.status}; it accepts updates only while training"))
    if body.round < run.round:  # a straggler: the round closed before it arrived
        refuse(conflict("round_closed", f"round {body.round} of {run.id} has closed; the open round is {run.round}"))
    if body.round > run.round and not ahead:  # a round not yet opened: no honest worker can have trained it
        reason = f"update is for round {body.round}; the open round is {run.round}"
        refuse(conflict("wrong_round", reason), flag=reason)
    if ahead and s.scalar(select(Update.id).where(Update.job_id == job.id, Update.round == run.round)) is None:
        refuse(
            conflict(
                "wrong_round",
                f"update is for round {body.round}, sent ahead; job {job.id} sends round {run.round}'s first",
            )
        )
    _refuse_ejected(s, job, refuse)


def _refuse_ejected(s: Session, job: Job, refuse: Callable[..., None]) -> None:
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


def _async_gate(s: Session, job: Job, run: Run, body: UpdateSubmit, refuse: Callable[..., None]) -> None:
    """Async: an update goes into the open buffer, whatever version it was trained from;
    one per job and buffer (the job view says ``wait`` until that buffer is applied)."""
    dup = select(Update.round).where(Update.job_id == job.id, (Update.cid == body.cid) | (Update.round == run.round))
    if (seen := s.scalar(dup.limit(1))) is not None:
        refuse(conflict("duplicate_update", f"job {job.id} already sent an update to version buffer {seen}"))
    full = run.status == RunStatus.TRAINING and (
        s.scalar(
            select(func.count()).where(
                Update.run_id == run.id, Update.round == run.round, Update.status == UpdateStatus.ACCEPTED
            )
        )
        or 0
    ) >= (run.cfg.buffer or 1)
    if run.status == RunStatus.AGGREGATING or full:  # a moment: the worker sends it again once the next buffer opens
        refuse(conflict("buffer_applying", f"run {run.id} is applying buffer {run.round}; send again in a moment"))
    if run.status != RunStatus.TRAINING:
        refuse(conflict("not_accepting", f"run {run.id} is {run.status}; it accepts updates only while training"))
    if body.round > run.round:  # a version not yet published: no honest worker trained from it
        reason = f"update is for round {body.round}; the open round is {run.round}"
        refuse(conflict("wrong_round", reason), flag=reason)
    _refuse_ejected(s, job, refuse)


# Update checks decoding at once: each holds its blob (an update's size: 100 MB for a 25M
# model sent dense) and one decoded piece of it; more submissions wait for a turn, so the
# coordinator's memory does not grow with the number of workers uploading together.
UPDATE_CHECKS = 2
_CHECKING = threading.BoundedSemaphore(UPDATE_CHECKS)


def _check_update(blob: bytes, d: int) -> str | None:
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


def _flag(s: Session, job: Job, run: Run, kind: str, reason: str, *, now: float) -> None:
    s.add(Flag(worker_id=job.worker_id, run_id=run.id, round=run.round, kind=kind, reason=reason, created_at=now))
    offer = s.get(Offer, job.worker_id)
    if offer is not None:
        offer.flags += 1


def flag_blob(ctx: Context, worker_id: str, reason: str) -> None:
    """A blob upload whose bytes did not match its CID: recorded against the uploader."""
    with ctx.session() as s:
        offer = s.get(Offer, worker_id)
        if offer is None:
            return  # not a worker (an owner's upload): the 400 is enough
        offer.flags += 1
        s.add(Flag(worker_id=worker_id, kind="bad_blob", reason=reason, created_at=time.time()))
        s.commit()


def flush_heartbeats(ctx: Context, s: Session) -> bool:
    """Write the in-memory heartbeats to the offers; a failed worker heard from again
    (after it was failed: not a beat still waiting to be flushed) is back online, as an
    idle offer; its old job stays with whoever took it. Each write keeps the later of the
    stored beat and ours (another replica may have flushed a newer one), in one UPDATE per
    offer, in id order (two replicas flushing at once lock rows in the same order)."""
    seen = ctx.liveness.take_dirty()
    if not seen:
        return False
    for worker_id in sorted(seen):
        t = seen[worker_id]
        s.execute(
            update(Offer)
            .where(Offer.id == worker_id)
            .values(last_heartbeat=case((Offer.last_heartbeat < t, t), else_=Offer.last_heartbeat))
        )
        s.execute(
            update(Offer)
            .where(
                Offer.id == worker_id,
                Offer.status != OfferStatus.ONLINE,
                or_(Offer.failed_at.is_(None), Offer.failed_at < t),
            )
            .values(status=OfferStatus.ONLINE)
        )
    return True


def require_known(ctx: Context, worker_id: str) -> None:
    """A worker this replica has heard of, or one that registered with another replica
    (found in the database, and known here from then on)."""
    if ctx.liveness.knows(worker_id):
        return
    with ctx.session() as s:
        last = s.scalar(select(Offer.last_heartbeat).where(Offer.id == worker_id))
    if last is not None:
        ctx.liveness.merge({worker_id: last})
    else:
        raise not_found("unknown_worker", f"worker {worker_id} is not registered; POST /v1/workers first")
