"""The provider's use-cases: register an offer, heartbeat, poll for a job, report
progress, submit an update (decoded, shape- and finite-checked; a rejected one is recorded
and flagged).
"""

from __future__ import annotations

import base64
import contextlib
import math
import time

from sqlalchemy import case, or_, select, update
from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import conflict, forbidden, not_found, unprocessable
from aitbc.coordinator.money import onchain
from aitbc.coordinator.rounds.jobs import own_job
from aitbc.coordinator.rounds.lifecycle import sends_ahead
from aitbc.coordinator.rounds.modes import mode_of
from aitbc.coordinator.rounds.modes.base import Turn
from aitbc.coordinator.schemas import Holdings, Progress, WorkerRegister
from aitbc.coordinator.store.models import Flag, Job, Offer, Run, Update
from aitbc.coordinator.store.repository import job_settings
from aitbc.coordinator.verification import spot_checks as verification
from aitbc.errors import AitbcError, IntegrityError, NotFoundError
from aitbc.ledger.book import RequestAuth
from aitbc.market.gpus import normalize_gpu
from aitbc.market.ranking import NEUTRAL_REPUTATION, check_offer_fields
from aitbc.replies.blobs import PeerRef
from aitbc.replies.jobs import Action, JobOrder, JobPoll
from aitbc.states import JobStatus, OfferStatus, RunStatus
from aitbc.storage.cid import is_cid
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
    evm_address = onchain.evm_account(
        ctx, body.evm_address, body.evm_proof, wallet=worker_id, whose="a provider's offer"
    )
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
    offer.max_bond, offer.max_params, offer.evm_address = max_bond, body.max_params, evm_address
    offer.registration = request.as_dict() if request is not None and max_bond > 0 else None
    s.commit()
    ctx.liveness.touch(worker_id, now)
    ctx.peers.advertise(worker_id, None if _serves_no_peers(ctx, s, worker_id) else body.advertise)
    ctx.notifier.poke_driver()  # a joiner may take an orphaned shard
    return offer


# The largest global model a job poll may carry inside its reply (GET /workers/{id}/job?inline=).
MAX_INLINE_MODEL = 4 << 20


def job_for(ctx: Context, s: Session, worker_id: str, *, inline: int = 0) -> JobPoll:
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
        return JobPoll(job=None, version=ctx.notifier.version)
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
        action: Action = "train" if sent_ahead is None else "wait"
    else:
        action = "train" if run.status == RunStatus.TRAINING and done is None else "wait"
    view = mode_of(run).job_view(ctx, s, run, job, Turn(action, done))
    action, done = view.turn.action, view.turn.answered
    bond = onchain.bond_required(ctx, s, run, job)  # EVM: no training before the bond is on chain
    if bond is not None:
        action = "wait"
    # while unanswered, whatever the run's phase (a manual run aggregating, a pause): if its reply was lost
    challenge = None if done is None else verification.challenge_view(done)
    if challenge is None and sent_ahead is not None:
        challenge = verification.challenge_view(sent_ahead)
    deadline = view.deadline
    serve = action == "train" and bool(run.global_cid) and view.serves_global_model
    peers = _model_peers(ctx, s, run, worker_id) if serve else []  # who else holds the model it is about to fetch
    # not when peers are named (they spare our egress), nor to gossip workers (they train their own)
    model = _inline_model(ctx, run, inline) if serve and inline > 0 and not peers else None
    order = JobOrder(
        job_id=job.id,
        training_id=run.id,
        action=action,
        run_status=RunStatus(run.status),
        round=run.round,
        send_round=send,  # the round its next update is for (overlap 2: may be the next one)
        rounds=cfg.rounds,
        global_model_cid=run.global_cid,
        shard_cid=job.shard_cid,
        shard_index=job.shard_index,
        seed=verification.job_seed(run, job),
        model_type=run.model_type,
        model_options=run.model_options,
        data_spec=(run.manifest or {}).get("spec"),
        **job_settings(run, job),  # local_steps, batch_size, lr, epochs (None: local_steps as given)
        inner_opt=cfg.inner_opt,
        compression=cfg.compression,
        error_feedback=cfg.error_feedback,
        d=cfg.d,
        deadline_at=(run.round_started_at + deadline) if deadline and run.round_started_at else None,
        verify_rate=cfg.verify_rate,
        overlap=cfg.overlap,
        mode=cfg.mode,  # async: the update names its base (global_model_cid) and joins the open buffer
        precision=cfg.precision,
        challenge=challenge,
        model_peers=peers,
        global_model=model,
        bond_required=bond,
        **view.fields,
    )
    return JobPoll(job=order, version=ctx.notifier.version)


def _model_peers(ctx: Context, s: Session, run: Run, worker_id: str) -> list[PeerRef]:
    """Peers other than ``worker_id`` holding the run's global model, to fetch it from."""
    assert run.global_cid is not None
    run_id = run.id

    def fetchers() -> list[str]:  # the run's workers: each fetches this model too
        return list(s.scalars(select(Job.worker_id).where(Job.run_id == run_id, Job.status == JobStatus.ACTIVE)).all())

    found = ctx.peers.holders_for(run.global_cid, worker_id, lambda w: _alive(ctx, w), fetchers=fetchers)
    return [PeerRef(**p) for p in found]


def _inline_model(ctx: Context, run: Run, inline: int) -> str | None:
    """The run's global model in base64 when it is at most ``inline`` bytes (None: larger,
    gone or corrupt: the worker fetches it by CID)."""
    assert run.global_cid is not None
    with contextlib.suppress(NotFoundError, IntegrityError):
        if ctx.store.size(run.global_cid) <= inline:
            return base64.b64encode(ctx.store.get_bytes(run.global_cid)).decode("ascii")  # re-hashed
    return None


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


def holders(ctx: Context, cid: str, asker: str) -> list[PeerRef]:
    """Peers other than ``asker`` that hold ``cid`` (none: fetch it from the coordinator)."""
    return [PeerRef(**p) for p in ctx.peers.holders_for(cid, asker, lambda w: _alive(ctx, w))]


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
    now = time.time()
    poke = mode_of(run).progress(run, job, body, now=now)
    if body.round is not None:
        job.progress_round = body.round
    job.progress, job.epoch, job.worker_status = body.progress, body.epoch, body.status
    if body.loss is not None:
        job.loss = body.loss
    job.updated_at = now
    s.commit()
    if poke:
        ctx.notifier.poke_driver()


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
