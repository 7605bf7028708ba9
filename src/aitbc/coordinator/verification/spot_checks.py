"""Verification of work: spot checks of the updates of runs that ask for them.

A run with ``verify_rate`` r > 0 requires each update to carry the worker's commitment
(:class:`aitbc.training.proof.Commitment`: digests of its training state every k steps).
On arrival (:func:`on_submit`) the first committed state is checked against the round's
model (free; with ``overlap`` 1, the model the update names, the round's or the one before), and intervals to re-run are drawn with the OS's randomness, *after* the
update is in: ``r x intervals`` of them in expectation. A challenged update also gets the
check that its blob is the codec's encoding of the committed work. The worker reveals the
states at the ends of each challenged interval (:func:`reveal`: blobs it uploads, named by
CID); the round driver re-runs each interval (:func:`verify_pending`,
:func:`aitbc.training.checks.check_interval`) from its first state on the update's own shard
with the settings the worker stated (checked against the job's when the update arrived),
on the thread count the worker stated. A failed interval is the evidence: one interval anyone
can re-run.

Verdicts (:class:`aitbc.training.checks.Verdict`; a failed replay accuses only with proof):

- **passed**: every checked interval re-ran bit-exact or within the tolerance: the update is
  paid in full (quality 1) whatever its held-out gain (:mod:`.scoring`). The replay runs on
  the torch thread count the commitment states, so on like hardware it is bit-exact;
- **drift** (``replay_drift``): an interval missed the tolerance by no more than its drift
  bound, measured on that interval (:func:`aitbc.training.checks.probe_drift`): honest drift
  of other kernels or thread counts could explain it. The update is rejected (not
  aggregated, unpaid) and flagged; the bond is untouched and the job goes on;
- **failed** (a fault drift cannot make: a state that is not the committed one, an interval
  off by far more than its drift bound or whose optimizer state holds other tensors or
  step counts, an update that is not the committed work, a first state that is not the
  round's model): provable; the update is rejected and not aggregated, and settlement
  slashes the bond and ejects the worker;
- **unanswered** (no reveal within ``verify_timeout``): the update is rejected and unpaid,
  the job ends failed and its shard goes to another worker; no slash (a crash is not proof);
- **error** (the check could not run for a reason that proves nothing against the worker: a
  revealed blob this coordinator lost, a fault of ours): the update keeps the heuristic
  score, as one not drawn.

A round does not close while one of its updates waits for its check, so a failed update is
never aggregated. What the checks cost is recorded per update (local steps re-run and
seconds) and summed in the run's view (:func:`summary`).
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from torch import Tensor

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import conflict, forbidden, not_found, unprocessable
from aitbc.coordinator.live.runtime import build_initial_model, data_spec, store_weights
from aitbc.coordinator.schemas import ProofReveal
from aitbc.coordinator.store.models import Flag, Job, Offer, RevealedStates, RoundRecord, Run, Update
from aitbc.coordinator.store.repository import job_settings, lock_run, row
from aitbc.coordinator.workforce.hiring import end_job
from aitbc.core.compression import build_codec
from aitbc.core.options import parse_spec
from aitbc.errors import AitbcError, IntegrityError, NotFoundError, UsageError
from aitbc.replies.jobs import Challenge, Revealed
from aitbc.replies.runs import VerificationSummary
from aitbc.states import JobStatus, UpdateStatus
from aitbc.storage.cid import is_cid
from aitbc.training.batches import data_seed
from aitbc.training.checkpoint import bytes_to_tensors, flat_params, load_checkpoint, load_shard
from aitbc.training.checks import (
    DRIFT,
    FAULT,
    Replay,
    Verdict,
    check_interval,
    check_start,
    check_update,
    choose_intervals,
    fault,
    null_intervals,
)
from aitbc.training.local import LocalConfig, eager_start
from aitbc.training.proof import Commitment, TrainState, tensor_digest, tensors_digest

log = logging.getLogger("aitbc.coordinator")

PENDING = ("challenged", "revealed")  # a round waits for these
_digests: dict[tuple[str, tuple[str, ...]], str] = {}  # (checkpoint CID, prior CIDs) -> digest of the start
_digests_lock = threading.Lock()


def start_params(ctx: Context, run: Run, cid: str, priors: Sequence[str] = ()) -> Tensor:
    """(d,) the parameters an update started from: the checkpoint ``cid``, less its
    worker's own previous updates ``priors`` when it names them (overlap, eager start:
    :func:`aitbc.coordinator.rounds.admission.update_prior`), computed as the worker does."""
    model = build_initial_model(run, ctx.settings.allow_code, store_weights(ctx.store))
    load_checkpoint(model, ctx.store.get_bytes(cid))
    start = flat_params(model)
    return eager_start(start, [ctx.store.get_bytes(p) for p in priors]) if priors else start


def challenge_priors(ch: dict[str, Any]) -> list[str]:
    """The priors a stored challenge names: ``prior_cids`` (newest first), or the single
    ``prior_cid`` of a challenge stored before overlap 2 (before 0011: none)."""
    if ch.get("prior_cids") is not None:
        return [str(c) for c in ch["prior_cids"]]
    return [ch["prior_cid"]] if ch.get("prior_cid") else []


def _start_digest(ctx: Context, run: Run, cid: str, priors: Sequence[str] = ()) -> str:
    """The digest of the start an update names (see :func:`start_params`), computed once."""
    key = (cid, tuple(priors))
    with _digests_lock:
        if key in _digests:
            return _digests[key]
    digest = tensor_digest(start_params(ctx, run, cid, priors))
    with _digests_lock:
        if len(_digests) > 256:
            _digests.clear()
        _digests[key] = digest
    return digest


def failed_reason(detail: str) -> str:
    """A rejected update's reason when its spot check failed (metrics count it by this start)."""
    return f"verification failed: {detail}"


def drift_reason(detail: str) -> str:
    """A rejected update's reason when its replay missed within drift (unpaid, not slashed)."""
    return f"replay drift: {detail}"


def unanswered_reason(timeout: float) -> str:
    return f"did not reveal the states its spot check asked for within {timeout:g} s"


def parse_commitment(
    s: Session, run: Run, job: Job, proof: dict[str, Any] | None, steps: int, shard: int, *, round: int | None = None
) -> Commitment | None:
    """The update's commitment, for a run that verifies (None otherwise). A missing or
    malformed one is a 422 (nothing recorded): the worker can send it again. ``round``:
    the update's (the open one by default; overlap 2: the next one, sent ahead): its data
    seed is that round's, and it starts where the job's update of an earlier round ended.

    The settings it states it trained with (steps, batch size, lr) must be the job's for
    the shard it trained (``shard``): its current ones, or, if the owner changed them
    while the round was under way, the ones before (the worker started the round with
    those). The replay then uses them.

    And the state it starts from must be one it was entitled to: a fresh optimizer (and a
    zero error-feedback residual), or exactly where its job's last recorded update ended.
    Otherwise a worker could start each round from moments of its choosing and steer an
    update that every interval's re-run would confirm."""
    if run.cfg.verify_rate <= 0:
        return None
    if proof is None:
        raise unprocessable(
            "proof_required",
            f"run {run.id} verifies work (verify_rate {run.cfg.verify_rate:g}): the update must carry its proof",
        )
    allowed = [job_settings(run, job, shard=shard)]
    # when the round opened (the previous round's record): round_started_at moves to a resume
    opened = s.scalar(
        select(RoundRecord.closed_at).where(RoundRecord.run_id == run.id, RoundRecord.round == run.round - 1)
    )
    started = min(run.round_started_at or 0.0, math.inf if opened is None else opened)
    if job.config_at is not None and job.previous_config is not None and job.config_at >= started:
        allowed.append(job_settings(run, job, config=job.previous_config, shard=shard))
    try:
        c = Commitment.from_json(proof, steps=steps)
    except UsageError as e:
        raise unprocessable("bad_proof", str(e)) from None
    r = run.round if round is None else round
    seed = data_seed(job_seed(run, job), r)
    if c.data_seed != seed:
        raise unprocessable("bad_proof", f"proof.data_seed must be this job's seed for round {r}: {seed}")
    claimed = (c.steps, c.batch_size, c.lr)
    if not any(claimed == (a["local_steps"], a["batch_size"], a["lr"]) for a in allowed):
        said = ", ".join(f"{a['local_steps']} steps of batch {a['batch_size']} at lr {a['lr']:g}" for a in allowed)
        raise unprocessable(
            "bad_proof",
            f"the proof states {c.steps} steps of batch {c.batch_size} at lr {c.lr}; this round's job trains {said}",
        )
    _check_chain(s, run, job, c, r)
    return c


_FRESH_OPTIM = tensors_digest({})  # an optimizer that has taken no step keeps no state
_zeros: dict[int, str] = {}


def _zero_digest(d: int) -> str:
    if d not in _zeros:
        _zeros[d] = tensor_digest(torch.zeros(d))
    return _zeros[d]


def _check_chain(s: Session, run: Run, job: Job, c: Commitment, round: int) -> None:
    prev = s.scalars(
        select(Update.proof)
        .where(Update.job_id == job.id, Update.round < round, Update.proof.is_not(None))
        .order_by(Update.round.desc())
        .limit(1)
    ).first()
    optim = {_FRESH_OPTIM} | ({prev["optim"][-1]} if prev else set())
    if c.optim[0] not in optim:
        where = " or the one its update of an earlier round ended with" if prev else ""
        raise unprocessable("bad_proof", f"proof.optim[0] must be a fresh optimizer's state{where}")
    if c.residual_in is not None:
        residual = {_zero_digest(run.cfg.d)} | ({prev["residual_out"]} if prev and prev.get("residual_out") else set())
        if c.residual_in not in residual:
            where = " or the one its update of an earlier round left" if prev else ""
            raise unprocessable("bad_proof", f"proof.residual_in must be a zero residual's{where}")


def on_submit(
    ctx: Context, run: Run, job: Job, c: Commitment, shard_index: int, *, start_cid: str, priors: Sequence[str] = ()
) -> tuple[dict[str, Any], str | None]:
    """The update's spot check, drawn now: ``(fields for the Update row, reason)`` where
    ``reason`` is set when the free check already failed (the update is then rejected).
    ``start_cid``: the model it says it trained from (the round's, or with overlap the one
    before: :func:`aitbc.coordinator.rounds.admission.update_base`), less ``priors``, the
    worker's own previous updates, when it names them (an eager start)."""
    try:
        digest = _start_digest(ctx, run, start_cid, priors)
    except IntegrityError as e:  # its own previous update does not decode to this model's size
        digest, why = "", f"the previous updates it names do not give a start: {e}"
    else:
        why = "its first committed state is not the round's model (trained from another model)"
    if not check_start(c, digest).ok:
        detail = why
        return {
            "proof": c.to_json(),
            "verification": "failed",
            "verify_detail": detail,
        }, failed_reason(detail)
    gen = torch.Generator().manual_seed(secrets.randbits(63))  # drawn after the update is in
    # and every interval whose committed end is its start (free to find: a skipped one)
    intervals = sorted(set(choose_intervals(c.intervals, run.cfg.verify_rate, gen)) | set(null_intervals(c)))
    if not intervals:
        return {"proof": c.to_json(), "verification": "unchecked"}, None
    last = c.intervals
    wanted = sorted({b for i in intervals for b in (i, i + 1)} | {last})
    challenge = {
        "intervals": intervals,
        "boundaries": wanted,
        "residual": run.cfg.error_feedback,
        "at": time.time(),
        # what the replay needs, as it was for this round (the owner may change the job later)
        "steps": c.steps,
        "batch_size": c.batch_size,
        "lr": c.lr,
        "optimizer": run.cfg.inner_opt,
        "precision": run.cfg.precision,
        "seed": job_seed(run, job),
        "shard_index": shard_index,
        "start_cid": start_cid,
        "prior_cid": priors[0] if priors else None,
        "prior_cids": list(priors),
    }
    return {"proof": c.to_json(), "challenge": challenge, "verification": "challenged"}, None


def job_seed(run: Run, job: Job) -> int:
    """The seed the job's worker was given (``GET /workers/{id}/job``)."""
    return job.seed if job.seed is not None else run.seed * 100_003 + job.shard_index


def challenge_view(upd: Update) -> Challenge | None:
    """What the worker must reveal (in the update's reply and its job's view)."""
    if upd.verification != "challenged" or not upd.challenge:
        return None
    ch = upd.challenge
    return Challenge(round=upd.round, boundaries=ch["boundaries"], residual=bool(ch["residual"]), at=ch["at"])


def reveal(ctx: Context, s: Session, job_id: str, signer: str, body: ProofReveal) -> Revealed:
    """The worker's answer to its spot check: the CIDs of the challenged states (uploaded
    first). Checked for shape here; judged by the driver."""
    job = s.get(Job, job_id)
    if job is None:
        raise not_found("unknown_job", f"no job {job_id!r}")
    if job.worker_id != signer:
        raise forbidden(f"job {job_id} belongs to worker {job.worker_id}; {signer} may not answer for it")
    upd = s.scalar(select(Update).where(Update.job_id == job.id, Update.round == body.round))
    if upd is None:
        raise not_found("unknown_update", f"job {job_id} sent no update for round {body.round}")
    if upd.verification != "challenged":
        state = upd.verification or "not verified"
        raise conflict("not_challenged", f"the update of round {body.round} is {state}; nothing to reveal")
    ch = upd.challenge or {}
    want = [str(b) for b in ch["boundaries"]]
    if sorted(body.states, key=_int_or_str) != want:
        raise unprocessable(
            "bad_reveal", f"reveal exactly the challenged boundaries {', '.join(want)}; got {', '.join(body.states)}"
        )
    cids = [*body.states.values(), *([body.residual] if body.residual else [])]
    if ch["residual"] and body.residual is None:
        raise unprocessable("bad_reveal", "the run uses error feedback: reveal the residual the round began with")
    if not ch["residual"] and body.residual is not None:
        raise unprocessable("bad_reveal", "the run uses no error feedback: there is no residual to reveal")
    for cid in cids:
        if not is_cid(cid):
            raise unprocessable("bad_cid", f"{cid[:100]!r} is not a CID")
        if not ctx.store.has(cid):
            raise unprocessable("missing_blob", f"state blob {cid} was not uploaded; PUT /v1/blobs/{cid} first")
    run = row(s, Run, job.run_id)
    lock_run(s, run)
    s.refresh(upd)
    if upd.verification != "challenged":
        s.rollback()
        raise conflict("not_challenged", f"the update of round {body.round} is {upd.verification}; nothing to reveal")
    upd.revealed = {"states": dict(body.states), "residual": body.residual}
    upd.verification = "revealed"
    s.commit()
    ctx.notifier.poke_driver()
    return Revealed(round=upd.round, verification=upd.verification)


def _int_or_str(k: str) -> tuple[int, str]:
    return (int(k), "") if k.isascii() and k.isdigit() else (1 << 30, k)  # "²".isdigit(), yet int("²") raises


# --- the driver's side -------------------------------------------------------------------------


def verify_pending(ctx: Context, *, limit: int = 8) -> bool:
    """Judge revealed updates (oldest first, ``limit`` per tick). Returns whether any was."""
    with ctx.session() as s:
        ids = s.scalars(
            select(Update.id).where(Update.verification == "revealed").order_by(Update.id).limit(limit)
        ).all()
    for uid in ids:
        t0 = time.perf_counter()
        with ctx.session() as s:
            upd = row(s, Update, uid)
            run = row(s, Run, upd.run_id)
            try:
                verdicts = _judge(ctx, run, upd)
            except NotFoundError as e:  # a blob this coordinator lost: its loss, not the worker's fault
                _record_error(ctx, s, upd, run, f"a revealed state is gone from the store: {e}")
                continue
            except AitbcError as e:  # a blob that is not a state: the worker revealed junk
                verdicts = [fault("reveal", None, f"a revealed blob is not a state: {e}")]
            except Exception as e:  # a fault of ours (or an input no check foresaw): unchecked, never a stall
                log.exception("run %s: update %d's revealed states could not be re-run", run.id, uid)
                why = (str(e).splitlines() or [type(e).__name__])[0][:200]
                _record_error(ctx, s, upd, run, f"the check could not run ({type(e).__name__}: {why})")
                continue
            _record(ctx, s, upd, run, verdicts, time.perf_counter() - t0)
    return bool(ids)


def _judge(ctx: Context, run: Run, upd: Update) -> list[Verdict]:
    ch = upd.challenge or {}
    rev: RevealedStates = upd.revealed or {"states": {}, "residual": None}
    c = Commitment.from_json(upd.proof, steps=int(ch["steps"]))
    model = build_initial_model(run, ctx.settings.allow_code, store_weights(ctx.store))
    d = sum(p.numel() for p in model.parameters())
    states = {int(b): TrainState.from_bytes(ctx.store.get_bytes(cid), numel=d) for b, cid in rev["states"].items()}
    x, y = load_shard(
        ctx.store.get_bytes(run.data_manifest["shards"][int(ch["shard_index"])]["cid"]), data_spec(run.data_manifest)
    )
    cfg = LocalConfig(
        steps=int(ch["steps"]),
        batch_size=int(ch["batch_size"]),
        optimizer=ch["optimizer"],
        lr=ch["lr"],
        precision=ch.get("precision", "fp32"),  # a challenge stored before bf16: fp32
    )
    replay = Replay(model, x, y, cfg, data_seed(int(ch["seed"]), upd.round))
    verdicts = []
    for i in ch["intervals"]:  # one by one: drift across hardware grows with the steps re-run in one go
        v = check_interval(c, i, states[i], states[i + 1], replay, max_threads=ctx.settings.verify_threads)
        verdicts.append(v)
        if v.provable:  # a drift miss goes on: a fault in another interval is still proof
            return verdicts
    start = start_params(ctx, run, ch["start_cid"], challenge_priors(ch))
    residual = None
    if ch["residual"]:
        assert rev["residual"] is not None, "reveal takes a residual wherever the challenge asks for one"
        residual = bytes_to_tensors(ctx.store.get_bytes(rev["residual"])).get("residual")
        if residual is None or residual.shape != (d,) or residual.dtype != torch.float32:
            return [*verdicts, fault("update", None, f"the revealed residual is not float32 ({d},)")]
    name, opts = parse_spec(run.cfg.compression, what="codec")
    codec = build_codec(name, opts, layout=[tuple(p.shape) for p in model.parameters()], error_feedback=ch["residual"])
    verdicts.append(check_update(c, ctx.store.get_bytes(upd.cid), start, states[c.intervals], residual, codec))
    return verdicts


def _record_error(ctx: Context, s: Session, upd: Update, run: Run, detail: str) -> None:
    """A check that could not run for a reason that proves nothing against the worker: the
    update keeps the heuristic score (as one not drawn), nobody is slashed, the round goes on."""
    lock_run(s, run)
    s.refresh(upd)
    if upd.verification != "revealed":
        s.rollback()
        return
    upd.verification, upd.verify_detail = "error", detail
    s.commit()
    ctx.notifier.bump()
    ctx.notifier.poke_driver()
    log.warning("run %s round %d: %s's check not run: %s", run.id, upd.round, upd.worker_id, detail)


def _record(ctx: Context, s: Session, upd: Update, run: Run, verdicts: list[Verdict], seconds: float) -> None:
    lock_run(s, run)
    s.refresh(upd)
    if upd.verification != "revealed":  # judged meanwhile (another coordinator process)
        s.rollback()
        return
    failed = next((v for v in verdicts if v.outcome == FAULT), None)
    drift = next((v for v in verdicts if v.outcome == DRIFT), None)
    upd.verify_steps = sum(v.steps_replayed for v in verdicts)
    upd.verify_seconds = seconds
    if failed is not None:  # proof: rejected, and its round's settlement slashes the bond
        upd.verification, upd.verify_detail = "failed", failed.detail
        if upd.status == UpdateStatus.ACCEPTED:
            upd.status, upd.reason = UpdateStatus.REJECTED, failed_reason(failed.detail)
        _flag(s, upd, "verification_failed", f"round {upd.round}: {failed.detail}")
    elif drift is not None:  # could be honest drift: not aggregated, unpaid; never the bond
        upd.verification, upd.verify_detail = "drift", drift.detail
        if upd.status == UpdateStatus.ACCEPTED:
            upd.status, upd.reason = UpdateStatus.REJECTED, drift_reason(drift.detail)
        _flag(s, upd, "replay_drift", f"round {upd.round}: {drift.detail}")
    else:
        upd.verification = "passed"
        upd.verify_detail = "; ".join(v.detail for v in verdicts)
    s.commit()
    ctx.notifier.bump()
    ctx.notifier.poke_driver()
    log.info(
        "run %s round %d: %s's update %s (%s)", run.id, upd.round, upd.worker_id, upd.verification, upd.verify_detail
    )


def expire_challenges(ctx: Context, s: Session, *, now: float) -> bool:
    """Challenged updates whose worker did not reveal within ``verify_timeout`` (counted from
    the challenge, or from this coordinator's start if it was down meanwhile): rejected
    (unpaid) and the job ended failed; not slashed (a crash is not proof). The caller commits."""
    timeout = ctx.settings.verify_timeout
    changed = False
    for upd in s.scalars(select(Update).where(Update.verification == "challenged")).all():
        # counted from this coordinator's start at the earliest: nobody could reveal while it was down
        since = max(float((upd.challenge or {}).get("at", now)), ctx.judging_since)
        if now - since < timeout:
            continue
        reason = unanswered_reason(timeout)
        upd.verification, upd.verify_detail = "unanswered", reason
        if upd.status == UpdateStatus.ACCEPTED:
            upd.status, upd.reason = UpdateStatus.REJECTED, reason
        _flag(s, upd, "challenge_unanswered", f"round {upd.round}: {reason}")
        job = s.get(Job, upd.job_id)
        if job is not None and job.status == JobStatus.ACTIVE:
            end_job(s, job, JobStatus.FAILED, f"did not answer its spot check of round {upd.round}", now=now)
        changed = True
    return changed


def pending_in_round(s: Session, run_id: str, r: int) -> int:
    """Updates of round ``r`` still waiting for their check (the round waits for them)."""
    q = select(func.count()).select_from(Update)
    return s.scalar(q.where(Update.run_id == run_id, Update.round == r, Update.verification.in_(PENDING))) or 0


def _flag(s: Session, upd: Update, kind: str, reason: str) -> None:
    s.add(
        Flag(
            worker_id=upd.worker_id,
            run_id=upd.run_id,
            round=upd.round,
            kind=kind,
            reason=reason,
            created_at=time.time(),
        )
    )
    offer = s.get(Offer, upd.worker_id)
    if offer is not None:
        offer.flags += 1


def summary(s: Session, run: Run) -> VerificationSummary | None:
    """The run's verification so far: how many updates were checked and how, and what the
    checks cost (local steps re-run against steps trained, and seconds)."""
    rate = run.cfg.verify_rate if run.config else 0.0
    if not rate:
        return None
    rows = s.execute(
        select(Update.verification, func.count(), func.sum(Update.verify_steps), func.sum(Update.verify_seconds))
        .where(Update.run_id == run.id, Update.verification.is_not(None))
        .group_by(Update.verification)
    ).all()
    counts = {v: int(n) for v, n, _, _ in rows}
    replayed = sum(int(st or 0) for _, _, st, _ in rows)
    seconds = sum(float(sec or 0.0) for _, _, _, sec in rows)
    trained = 0
    for proof in s.scalars(select(Update.proof).where(Update.run_id == run.id, Update.proof.is_not(None))).all():
        trained += int(proof.get("steps", 0))
    compute = s.scalar(select(func.sum(Update.compute_seconds)).where(Update.run_id == run.id)) or 0.0
    return VerificationSummary(
        rate=rate,
        updates=sum(counts.values()),
        checked=sum(
            counts.get(k, 0) for k in ("passed", "drift", "failed", "revealed", "challenged", "unanswered", "error")
        ),
        passed=counts.get("passed", 0),
        drift=counts.get("drift", 0),  # missed within drift: unpaid, not slashed
        failed=counts.get("failed", 0),
        unanswered=counts.get("unanswered", 0),
        errors=counts.get("error", 0),
        pending=sum(counts.get(k, 0) for k in PENDING),
        steps_replayed=replayed,
        steps_trained=trained,
        extra_compute=replayed / trained if trained else 0.0,
        verify_seconds=seconds,
        extra_seconds=seconds / compute if compute else None,
    )
