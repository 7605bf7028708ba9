"""The owner's hands on a run (the SDK's documented phase-driven and fault-tolerance
workflows).

Manual control (a run created with ``control: "manual"``): the owner's agent moves the
phases (:func:`set_phase`), sends jobs on named shards (:func:`create_job`), aggregates
the closed round's chosen updates with chosen weights (:func:`aggregate`, through the
same :func:`.rounds.aggregate_round` and :func:`.rounds.commit_round` the driver uses) and
keeps a result. Job controls work on any run the signer owns: end a job, reassign or split
its shard, change its config, ask for a resend.
"""

from __future__ import annotations

import logging
import math
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import conflict, forbidden, unprocessable
from aitbc.coordinator.live.runtime import check_replay_batch, drop_runtime, runtime
from aitbc.coordinator.money import onchain
from aitbc.coordinator.money.escrow import pay_as_delivered
from aitbc.coordinator.rounds.aggregation import aggregate_round
from aitbc.coordinator.rounds.commit import commit_round
from aitbc.coordinator.rounds.lifecycle import open_round, start_training
from aitbc.coordinator.runs.owner import configure
from aitbc.coordinator.runs.views import results
from aitbc.coordinator.schemas import (
    CONFIG_RANGES,
    Aggregate,
    Distribute,
    JobConfig,
    JobCreate,
    JobEnd,
    JobMove,
    PhaseSet,
    ResultSave,
)
from aitbc.coordinator.store.models import (
    Contract,
    Flag,
    Job,
    JobOverrides,
    Offer,
    RoundRecord,
    Run,
    Settlement,
    Update,
)
from aitbc.coordinator.store.repository import get_run, lock_run, owned_job, round_updates, shard_index
from aitbc.coordinator.store.states import ENDED, check_transition, require_status, transition
from aitbc.coordinator.verification.spot_checks import pending_in_round
from aitbc.coordinator.workforce import hiring as workforce
from aitbc.coordinator.workforce.hiring import assign_worker, end_run, hire_offer, new_job, require_free
from aitbc.errors import AitbcError
from aitbc.ledger.book import RequestAuth
from aitbc.replies.jobs import Aggregated, ResendRequested
from aitbc.replies.results import SavedResult
from aitbc.states import ContractStatus, Control, JobStatus, OfferStatus, RunStatus, UpdateStatus
from aitbc.storage.cid import cid_of_bytes, is_cid
from aitbc.training.checkpoint import load_shard, shard_bytes, tensor_shapes
from aitbc.training.local import epoch_steps

log = logging.getLogger("aitbc.coordinator")


def require_manual(run: Run, action: str) -> None:
    if run.control != Control.MANUAL:
        raise conflict(
            "automatic_control",
            f"cannot {action}: run {run.id} is under automatic control (the coordinator "
            f"moves its phases); take it over by setting its phase (POST /v1/runs/{run.id}/phase), "
            f'or create the run with control "manual"',
        )


def take_over(run: Run, *, now: float) -> None:
    """An automatic run's owner drives it from now on (its first phase move): one way,
    recorded (``manual_since``, and ``manual_from_round``: rounds before it were the
    driver's and are settled and paid as such). Refused (409) where the driver is in the
    middle of a step: writing the initial model, or aggregating a round. Called with the
    run locked, in the transaction of the phase move, so a refused move takes nothing over."""
    if run.control == Control.MANUAL:
        return
    if run.status in ENDED:
        raise conflict("run_ended", f"run {run.id} has ended ({run.status}); there is nothing to drive")
    if run.status == RunStatus.DISTRIBUTING:
        raise conflict(
            "driver_busy",
            f"run {run.id} is writing its initial model (the coordinator opens round 1 in a few "
            f"seconds); set its phase once it is training",
        )
    if run.status == RunStatus.AGGREGATING:
        raise conflict(
            "driver_busy",
            f"run {run.id} is aggregating round {run.round} under the coordinator; set its phase "
            f"once the round is committed and the next one open (a few seconds)",
        )
    run.control, run.manual_since, run.manual_from_round = Control.MANUAL, now, max(run.round, 1)
    log.info("run %s: its owner drives it from round %d on", run.id, run.manual_from_round)


def set_phase(ctx: Context, s: Session, run: Run, body: PhaseSet, request: RequestAuth) -> Run:
    """Move an owner-driven run to ``body.phase``. The first call on an automatic run
    takes it over (:func:`take_over`) in the same transaction as the move."""
    onchain.refuse_on_chain(ctx, "setting a run's phase by hand (manual control)", "the coordinator drives the run")
    to = RunStatus(body.phase)
    if body.config is not None and to != RunStatus.DISTRIBUTING:
        raise unprocessable("bad_config", f"config goes with phase distributing only, not {to}")
    now = time.time()
    take_over(run, now=now)
    if to == RunStatus.DISTRIBUTING:
        configure(ctx, s, run, body.config or Distribute(), request, cost_field="config.max_cost")
        transition(run, RunStatus.DISTRIBUTING, now=now)
    elif to == RunStatus.TRAINING and run.status == RunStatus.DISTRIBUTING:
        _require_jobs(s, run)
        s.commit()
        start_training(ctx, run.id)  # the initial model (round 0), then round 1 opens
        s.refresh(run)
        return run
    elif to == RunStatus.TRAINING and run.status == RunStatus.AGGREGATING:
        _require_aggregated(s, run)
        if run.round >= run.cfg.rounds:
            raise conflict(
                "rounds_done", f"all {run.cfg.rounds} rounds of run {run.id} are aggregated; set phase complete"
            )
        _require_jobs(s, run)
        open_round(s, run, run.round + 1, now=now)
    elif to == RunStatus.AGGREGATING:
        require_status(run, RunStatus.TRAINING, action="close the round")
        transition(run, RunStatus.AGGREGATING, now=now)
    elif to == RunStatus.COMPLETE:
        require_status(run, RunStatus.AGGREGATING, action="complete the run")
        _require_aggregated(s, run)
        end_run(s, run, RunStatus.COMPLETE, reason=None, now=now)
    else:
        check_transition(run, to)  # the machine does not allow it from here: raises
        raise conflict(
            "bad_state",
            f"run {run.id} is {run.status}; resume it (POST /v1/runs/{run.id}/resume) rather than setting its phase",
        )
    s.commit()
    if run.status in ENDED:
        drop_runtime(ctx, run.id)
    ctx.notifier.bump()
    ctx.notifier.poke_driver()  # an ended run is settled and finalized
    return run


def _require_jobs(s: Session, run: Run) -> None:
    if not s.scalar(select(Job.id).where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE).limit(1)):
        raise conflict("no_jobs", f"run {run.id} has no active jobs; send some first (POST /v1/runs/{run.id}/jobs)")


def _require_aggregated(s: Session, run: Run) -> None:
    if s.get(RoundRecord, (run.id, run.round)) is None:
        raise conflict(
            "not_aggregated",
            f"round {run.round} of run {run.id} is closed but not aggregated; "
            f"aggregate its updates first (POST /v1/runs/{run.id}/aggregate)",
        )


def create_job(ctx: Context, s: Session, run: Run, body: JobCreate) -> Job:
    require_manual(run, "send jobs")
    require_status(run, RunStatus.DISTRIBUTING, RunStatus.TRAINING, RunStatus.AGGREGATING, action="send a job")
    shard = shard_index(run, body.shard_id)
    c = s.scalar(select(Contract).where(Contract.run_id == run.id, Contract.worker_id == body.worker_id))
    if c is None:
        raise conflict(
            "not_hired",
            f"worker {body.worker_id} has no contract with run {run.id}; hire it first "
            f"(POST /v1/runs/{run.id}/contracts)",
        )
    require_free(s, body.worker_id)
    if c.status != ContractStatus.HIRED:
        raise conflict("contract_ended", f"worker {body.worker_id}'s contract with run {run.id} is {c.status}")
    config = body.config.overrides()
    _check_job_config(run, shard, config)
    job = new_job(s, run, c, shard, now=time.time(), config=config)
    s.commit()
    ctx.notifier.bump()
    return job


def _check_job_config(run: Run, shard: int, config: JobOverrides) -> None:
    """A job's own config, checked as ``distribute`` checks the run's: its ``batch_size``
    within a spot check's replay bound (:func:`.runtime.check_replay_batch`), and
    ``epochs`` over this shard not asking for more steps a round than ``local_steps`` may
    (the worker would compute them). 422 naming the field and what is allowed."""
    if config.get("batch_size"):
        check_replay_batch(run, run.cfg.verify_rate, int(config["batch_size"]))
    epochs = config.get("epochs")
    if not epochs:
        return
    samples = int(run.data_manifest["shards"][shard]["samples"])
    batch = int(config.get("batch_size") or run.cfg.batch_size)
    steps, most = epoch_steps(int(epochs), samples, batch), int(CONFIG_RANGES["local_steps"][1])
    if steps > most:
        raise unprocessable(
            "bad_config",
            f"epochs {epochs} over a shard of {samples} samples at batch_size {batch} is {steps} steps a round; "
            f"at most {most}: lower epochs or raise batch_size",
        )


# --- aggregation and the result ----------------------------------------------------------------


def aggregate(ctx: Context, s: Session, run_id: str, signer: str, body: Aggregate) -> Aggregated:
    """The closed round's chosen updates, aggregated and recorded as the round's model
    (none chosen: the round is recorded as skipped, the model unchanged, e.g. when no
    update was accepted). The torch work runs without the run's write lock."""
    run = get_run(s, run_id)
    if run.owner != signer:
        raise forbidden(f"run {run_id} belongs to {run.owner}; {signer} may not control it")
    require_manual(run, "aggregate on demand")
    require_status(run, RunStatus.AGGREGATING, action="aggregate (set phase aggregating first)")
    r = run.round
    if s.get(RoundRecord, (run.id, r)) is not None:
        raise conflict(
            "already_aggregated",
            f"round {r} of run {run.id} is already aggregated; set phase training for round {r + 1}, or complete",
        )
    waiting = pending_in_round(s, run.id, r)
    if waiting:
        raise conflict(
            "verification_pending",
            f"{waiting} update(s) of round {r} are being spot-checked; aggregate once they are judged",
        )
    ups = round_updates(s, run.id, r)
    by_cid = {u.cid: (u, shard) for u, shard in ups if u.status == UpdateStatus.ACCEPTED}
    if len(set(body.updates)) != len(body.updates):
        raise unprocessable("bad_updates", "an update is listed twice")
    unknown = [c for c in body.updates if c not in by_cid]
    if unknown:
        raise unprocessable(
            "unknown_update",
            f"{unknown[0]} is not an accepted update of round {r} of run {run.id} ({len(by_cid)} accepted)",
        )
    weights = body.weights
    if weights is not None:
        if len(weights) != len(body.updates):
            raise unprocessable(
                "bad_weights", f"{len(weights)} weights for {len(body.updates)} updates; give one per update"
            )
        if not all(math.isfinite(w) and w > 0 for w in weights):
            raise unprocessable("bad_weights", f"weights must be finite numbers > 0, got {weights}")
    chosen = [by_cid[c] for c in body.updates]
    rt = runtime(ctx, run)
    t0 = time.perf_counter()
    with rt.lock:
        rt.load(ctx, run)
        res = aggregate_round(ctx, run, rt, chosen, r, evaluate_now=True, weights=weights)
    for u, _ in ups:
        if u.status == UpdateStatus.ACCEPTED and u.cid not in body.updates:
            u.status, u.reason = UpdateStatus.EXCLUDED, f"left out of round {r}'s aggregation by the owner"
    if not commit_round(ctx, s, run, rt, res, ups, chosen, round=r, advance=False):
        raise conflict(
            "run_changed",
            f"run {run.id} changed while round {r} was aggregated (stopped, or aggregated by "
            f"another request); nothing was recorded",
        )
    ctx.metrics.round_close.observe(time.perf_counter() - t0)  # aggregate (with its evaluation) + commit
    ctx.notifier.bump()
    ctx.notifier.poke_driver()  # scoring of the round
    if res.diverged is not None:  # recorded: the run failed, nobody is blamed for it
        raise conflict("diverged", f"run {run.id} failed: {res.diverged}; nothing of round {r} was committed")
    return Aggregated(
        training_id=run.id,
        round=r,
        model_id=res.cid,
        model_cid=res.cid,
        loss=res.val_loss,
        accuracy=res.val_accuracy,
        updates=len(chosen),
        skipped=res.skipped,
        weights=weights if weights is not None else [float(u.samples) for u, _ in chosen],
    )


def save_result(ctx: Context, s: Session, run: Run, body: ResultSave) -> SavedResult:
    """Keep ``model_cid`` as the run's model, with the owner's ``metrics``: a checkpoint of
    one of the run's aggregated rounds, or a blob the owner uploaded (the SDK's
    ``save_training_results`` stores the aggregated model it holds). The blob must be on
    this coordinator; it is touched, so blob retention keeps it while this commits."""
    require_manual(run, "choose the result")
    if not is_cid(body.model_cid):
        raise unprocessable("bad_cid", f"{body.model_cid!r} is not a CID")
    rec = s.scalar(
        select(RoundRecord)
        .where(RoundRecord.run_id == run.id, RoundRecord.round > 0, RoundRecord.checkpoint_cid == body.model_cid)
        .limit(1)
    )
    if not ctx.store.touch(body.model_cid):
        if rec is not None:
            raise unprocessable("pruned_model", f"{body.model_cid} (round {rec.round}) was pruned by blob retention")
        raise unprocessable(
            "unknown_model",
            f"{body.model_cid} is neither an aggregated checkpoint of run {run.id} (GET /v1/runs/{run.id}/rounds) "
            f"nor a blob on this coordinator; upload it first (PUT /v1/blobs/{body.model_cid})",
        )
    if rec is None:
        initial = s.get(RoundRecord, (run.id, 0))
        if initial is not None and initial.checkpoint_cid == body.model_cid:
            raise unprocessable(
                "unknown_model", f"{body.model_cid} is run {run.id}'s initial model (round 0), untrained"
            )
        _require_model_of(ctx, run, body.model_cid)
    run.result_cid, run.result_metrics, run.updated_at = body.model_cid, dict(body.metrics), time.time()
    s.commit()
    return SavedResult(**dict(results(ctx, s, run)), round=None if rec is None else rec.round)


def _require_model_of(ctx: Context, run: Run, cid: str) -> None:
    """422 unless the blob is a safetensors checkpoint of the run's model: the same tensor
    names and shapes (read from its header; nothing is loaded)."""
    if not run.configured:
        raise conflict("not_configured", f"run {run.id} has no training config yet; it has no model to keep")
    try:
        shapes = tensor_shapes(ctx.store.get_bytes(cid))
    except AitbcError as e:
        raise unprocessable("not_a_model", f"{cid} is not a checkpoint of run {run.id}'s model: {e}") from None
    if run.global_cid is not None and ctx.store.has(run.global_cid):
        # the current checkpoint's header: no wait for rt.lock, which scoring holds for long
        want = tensor_shapes(ctx.store.get_bytes(run.global_cid))
    else:
        rt = runtime(ctx, run)
        with rt.lock:
            want = {k: tuple(v.shape) for k, v in rt.model.state_dict().items()}
    if shapes != want:
        diff = sorted(set(shapes) ^ set(want)) or [k for k in want if shapes[k] != want[k]]
        raise unprocessable(
            "not_a_model",
            f"{cid} is not a checkpoint of run {run.id}'s model ({run.model_type}): "
            f"{len(shapes)} tensors, {len(want)} expected; first difference: {diff[0]}",
        )


# --- job controls (any run the signer owns) --------------------------------------------------------


def end_job(ctx: Context, s: Session, job_id: str, signer: str, body: JobEnd) -> Job:
    """``failed``: the worker is marked failed (flagged; its offer leaves the market until
    it heartbeats again); ``released``: the worker is let go. An automatic run gives the
    shard to someone else at its next tick; a manual run's owner reassigns it."""
    job, run = owned_job(s, job_id, signer, action="end the job")
    now = time.time()
    status = JobStatus(body.status)
    reason = body.reason or ("marked failed by the owner" if status == JobStatus.FAILED else "released by the owner")
    workforce.end_job(s, job, status, reason, now=now)
    if status == JobStatus.FAILED:
        offer = s.get(Offer, job.worker_id)
        if offer is not None:
            offer.status, offer.failed_at = OfferStatus.FAILED, now
            offer.flags += 1
        s.add(
            Flag(
                worker_id=job.worker_id,
                run_id=run.id,
                round=run.round,
                kind="marked_failed",
                reason=reason,
                created_at=now,
            )
        )
    s.commit()
    ctx.notifier.bump()
    ctx.notifier.poke_driver()
    return job


def reassign(ctx: Context, s: Session, job_id: str, signer: str, body: JobMove) -> Job:
    """The job's shard to another worker (``worker_id``, or the best free one: a spare of
    the run, else the best-ranked free live offer, hired at its asking price). The job may
    already have ended (a failed worker's shard is moved once); an active one is released."""
    job, run = owned_job(s, job_id, signer, action="reassign the job", active=False)
    taken = s.scalar(select(Job.id).where(Job.replaces == job.id, Job.status == JobStatus.ACTIVE))
    if taken:
        raise conflict("already_replaced", f"job {job_id}'s shard is already with job {taken}")
    if "split_into" in run.data_manifest["shards"][job.shard_index]:
        raise conflict("shard_split", f"job {job_id}'s shard was split since; send jobs for its halves instead")
    if body.worker_id == job.worker_id:
        raise conflict("same_worker", f"job {job_id} is already worker {job.worker_id}'s")
    now = time.time()
    new = _take_on(ctx, s, run, job.shard_index, body.worker_id, now=now, replaces=job.id, config=job.config)
    if job.status == JobStatus.ACTIVE:
        workforce.end_job(s, job, JobStatus.RELEASED, f"reassigned to {new.worker_id} by the owner", now=now)
    s.commit()
    ctx.notifier.bump()
    return new


def split(ctx: Context, s: Session, job_id: str, signer: str, body: JobMove) -> tuple[Job, Job]:
    """Give half of a (slow) job's shard to another worker: the shard's samples are split
    in two new shard blobs (added to the run's copy of the manifest; the original entry
    records ``split_into``); the job keeps the first half from its next round, the new
    job (``worker_id`` or the best free worker) trains the second."""

    job, run = owned_job(s, job_id, signer, action="split the job's shard")
    shards = [dict(e) for e in run.data_manifest["shards"]]
    entry = shards[job.shard_index]
    if int(entry["samples"]) < 2:
        raise conflict("shard_too_small", f"job {job_id}'s shard has {entry['samples']} sample(s); it cannot be split")
    if body.worker_id == job.worker_id:
        raise conflict("same_worker", f"job {job_id} is already worker {job.worker_id}'s; name another worker")
    now = time.time()
    x, y = load_shard(ctx.store.get_bytes(job.shard_cid))  # (n, ...), (n, ...)
    n, half = x.shape[0], x.shape[0] // 2
    first, second = len(shards), len(shards) + 1
    blobs = [
        shard_bytes(
            x[lo:hi].clone(),
            y[lo:hi].clone(),
            dataset=str(run.data_manifest.get("dataset", "")),
            index=k,
            count=len(shards) + 2,
        )
        for k, (lo, hi) in zip((first, second), ((0, half), (half, n)))
    ]
    for blob, samples in zip(blobs, (half, n - half)):
        shards.append({"cid": cid_of_bytes(blob), "samples": samples, "split_from": job.shard_index})
    entry["split_into"] = [first, second]
    run.manifest = {**run.data_manifest, "shards": shards}
    new = _take_on(ctx, s, run, second, body.worker_id, now=now, replaces=None, config=job.config)
    for blob in blobs:  # stored only once a worker is found for the second half
        ctx.store.put_bytes(blob)
    job.moved_from, job.shard_index, job.shard_cid, job.updated_at = job.shard_index, first, shards[first]["cid"], now
    s.commit()
    ctx.notifier.bump()
    return job, new


def _take_on(
    ctx: Context,
    s: Session,
    run: Run,
    shard: int,
    worker_id: str | None,
    *,
    now: float,
    replaces: str | None,
    config: JobOverrides,
) -> Job:
    if worker_id is None:
        job = assign_worker(ctx, s, run, shard, now=now, replaces=replaces)
        if job is None:
            raise conflict("no_free_worker", f"no spare of run {run.id} and no free live offer to take the shard")
        job.config = (config or {}).copy()
        return job
    require_free(s, worker_id)
    c = s.scalar(select(Contract).where(Contract.run_id == run.id, Contract.worker_id == worker_id))
    if c is None:
        c = hire_offer(ctx, s, run, worker_id, None)  # at its asking price
    elif c.status != ContractStatus.HIRED:
        raise conflict("contract_ended", f"worker {worker_id}'s contract with run {run.id} is {c.status}")
    return new_job(s, run, c, shard, now=now, replaces=replaces, config=config)


def set_config(ctx: Context, s: Session, job_id: str, signer: str, body: JobConfig) -> Job:
    """The job's own local_steps / batch_size / lr, from the next round it starts."""
    job, run = owned_job(s, job_id, signer, action="change the job's config")
    changes = body.overrides()
    if not changes:
        raise unprocessable("bad_config", "give at least one of local_steps, epochs, batch_size, lr (learning_rate)")
    config: JobOverrides = {**(job.config or {}), **changes}
    if "local_steps" in changes:  # the one given wins over the other way of setting the steps
        config.pop("epochs", None)
    elif "epochs" in changes:
        config.pop("local_steps", None)
    _check_job_config(run, job.shard_index, config)
    now = time.time()
    job.previous_config, job.config_at = (job.config or {}).copy(), now
    job.config, job.updated_at = config, now
    s.commit()
    ctx.notifier.bump()
    return job


def resend(ctx: Context, s: Session, job_id: str, signer: str) -> ResendRequested:
    """Drop the job's update for the open round (its blob failed a check, or the owner
    wants it again): the worker is asked to train and send that round again. An accepted
    update is paid as delivered first (:func:`.escrow.pay_as_delivered`: the owner had it),
    so a round is resent at most once for free to the provider: a second resend of the same
    round is 409 ``already_resent``."""
    job, run = owned_job(s, job_id, signer, action="ask for a resend")
    require_status(run, RunStatus.TRAINING, action="ask for a resend (the round must be open)")
    upd = s.scalar(select(Update).where(Update.job_id == job.id, Update.round == run.round))
    if upd is None:
        raise conflict("nothing_to_resend", f"job {job_id} has not sent its update for round {run.round} yet")
    if upd.verification in ("challenged", "revealed", "failed"):  # the evidence of a check stays on record
        raise conflict(
            "verification_pending" if upd.verification != "failed" else "verification_failed",
            f"job {job_id}'s update of round {run.round} is {upd.verification} in its spot check; it cannot be dropped",
        )
    later = s.scalar(select(Update.round).where(Update.job_id == job.id, Update.prior_cid == upd.cid))
    if later is not None:  # overlap 2: its chain of priors would name an update no longer there
        raise conflict(
            "update_sent_ahead",
            f"job {job_id}'s update of round {later} was sent ahead from where its round {run.round} update ended "
            f"(its prior_cid); the round {run.round} update cannot be dropped alone",
        )
    contract = s.get(Contract, job.contract_id)
    if upd.status == UpdateStatus.ACCEPTED and contract is not None:
        # The owner received this update and could read it: it is paid as delivered before it is
        # dropped, once per round; the same round is not asked for a third time free.
        if s.scalar(select(Settlement.id).where(Settlement.contract_id == contract.id, Settlement.round == run.round)):
            raise conflict(
                "already_resent",
                f"job {job_id}'s round {run.round} update was already dropped once and paid as delivered; "
                f"ask again from round {run.round + 1}",
            )
        lock_run(s, run)
        pay_as_delivered(ctx, s, run, contract, run.round, why=f"dropped by the owner's resend of round {run.round}")
    now = time.time()
    reason = f"owner asked for round {run.round} again (was {upd.cid}, {upd.status})"
    s.add(
        Flag(
            worker_id=job.worker_id,
            run_id=run.id,
            round=run.round,
            kind="resend_requested",
            reason=reason,
            created_at=now,
        )
    )
    s.delete(upd)
    job.updated_at = now
    s.commit()
    ctx.notifier.bump()
    return ResendRequested(
        job_id=job.id, worker_id=job.worker_id, round=run.round, dropped=upd.cid, status="resend_requested"
    )
