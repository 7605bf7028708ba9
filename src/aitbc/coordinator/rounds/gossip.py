"""Live gossip runs on the coordinator: the market, the ledger and the record, not the models.

Workers train from their own models and mix them with their neighbours' peer to peer
(:mod:`aitbc.worker.gossip`); no round waits for the coordinator, and training goes on
while it restarts. What the coordinator keeps:

- **The roster** (:func:`roster`, in each job view): every active job's worker, its place
  in the topology (the shard order), its public key (to check its records) and its
  advertised URL (None: it cannot be reached; its models go through the coordinator).
- **The record** (:func:`publish`): each round each worker publishes a signed record
  (:mod:`aitbc.ledger.records`) naming the CID of its model. A record is refused, nothing
  written, when it is not the signer's own job's, names another run, job or worker, is
  for a round already closed or past the run's last, names no CID, does not verify against
  the worker's key, or contradicts the record it published for that round before (that
  one is equivocation: flagged, below). Once its worker is flagged ``equivocation`` a job
  records no new round (409 ``ejection_pending``: it is slashed and ejected when that round
  is settled), and no round waits for it meanwhile: a worker proven dishonest adds nothing
  more to the consensus (its neighbours stop mixing it, so would not witness it again).
  Records of a later round are kept until their round closes; a worker that could not
  reach the coordinator publishes its backlog when it is back.
- **Equivocation** (:func:`witness`, ``POST /v1/records/witnessed``; :func:`publish`):
  workers report the neighbours' records they mixed; each is checked against its signer's
  own key, so a report cannot frame anyone. Two records of one job and round signed by its
  worker with different CIDs (published, or reported) are proof: the worker is flagged
  ``equivocation`` once a round and its model of a still-open round is rejected (unpaid).
  A reported CID the coordinator does not hold yet is kept (``gossip_witnesses``) until
  the job publishes the round.
- **Closing a round** (:func:`close_round`, the round driver, when every active job
  published the round or a later one; or ``quorum`` did and each of the others is two or
  more rounds behind or, by its own pace (its signed progress reports), cannot publish
  the round before twice the deadline (:func:`cannot_make_it`); or at the run's deadline with ``quorum`` records):
  the coordinator fetches every published model (its own blob store for workers that
  cannot be reached, else the worker's peer server; CID-checked as it arrives), and
  computes the **consensus**: the run's norm bound and robust rule over the round's models
  (:func:`aitbc.core.gossip.robust_combine`, the rule each worker mixes with). Each model
  is judged against it: a model farther from the consensus than ``OUTLIER`` x the round's
  median distance, or whose validation loss is over ``WORSE`` x the round's median, is an
  outlier (flag ``gossip_outlier``; a sign-flipped model is one or both). A worker whose server answers with bytes that do not hash to the CID it signed is
  flagged ``bad_peer_blob``; a model that cannot be fetched is left out (unpaid, not
  flagged: a crash is no proof). The consensus is the round's model (evaluated: the run's
  validation loss), and the round records the **spread**: the mean L2 distance of the kept
  models to their mean (``monitor`` shows it).
- **Pay** (:func:`score`, then :func:`aitbc.coordinator.verification.settlement.settle`): per round, a
  contract whose published model was fetched, checked and kept is paid its price (quality
  1); an outlier, a corrupt or unfetchable model, or no record is paid nothing. An outlier
  is not slashed: it is a statistical judgment, not a proof. Equivocation is a proof (two
  records under the worker's key): its round is unpaid and its contract slashed, also when
  the proof arrives after the round was paid.

Shape letters: ``n`` models in the round, ``d`` parameters.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import Any

import torch
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session
from torch import Tensor

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import conflict, forbidden, not_found, unprocessable
from aitbc.coordinator.live.runtime import drop_runtime, runtime
from aitbc.coordinator.rounds.lifecycle import RoundResult, commit_round
from aitbc.coordinator.store.models import (
    Contract,
    Flag,
    Job,
    Offer,
    RoundRecord,
    Run,
    Score,
    Settlement,
    Update,
    Witness,
)
from aitbc.coordinator.store.repository import job_settings, lock_run, round_updates, row
from aitbc.coordinator.store.states import transition
from aitbc.coordinator.transfer.peers import stream_from_peer, warm_peer_http
from aitbc.coordinator.verification.settlement import slash
from aitbc.core.compression import decode as decode_model
from aitbc.core.gossip import PACE_MIN_STEPS, model_bytes, near_copies, robust_combine
from aitbc.errors import AitbcError, IntegrityError
from aitbc.ledger.records import record_problem
from aitbc.states import ContractStatus, Control, JobStatus, RunStatus, ScoreStatus, UpdateStatus
from aitbc.storage.cid import is_cid
from aitbc.storage.peer_fetch import TooLong

log = logging.getLogger("aitbc.coordinator")

OUTLIER = 3.0  # a model this many times the round's median distance from the consensus is an outlier
WORSE = 1.5  # a model whose validation loss is this many times the round's median is an outlier


# --- the roster ------------------------------------------------------------------------


def roster(ctx: Context, s: Session, run: Run) -> list[dict[str, Any]]:
    """The run's active jobs in topology order (by shard): who mixes with whom."""
    rows = s.execute(
        select(Job, Offer.public_key)
        .join(Offer, Offer.id == Job.worker_id)
        .where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE)
        .order_by(Job.shard_index, Job.id)
    ).all()
    return [
        {
            "worker": job.worker_id,
            "job_id": job.id,
            "public_key": key,
            "url": ctx.peers.url(job.worker_id),
            "samples": int(run.data_manifest["shards"][job.shard_index]["samples"]),
        }
        for job, key in rows
    ]


def next_round(s: Session, job: Job) -> int:
    """The round the job's worker trains next: one past the last it published (its own
    clock; a worker restarted mid-run picks up there)."""
    last = s.scalar(select(func.max(Update.round)).where(Update.job_id == job.id)) or 0
    return max(last + 1, job.joined_round)


# --- publishing a record ------------------------------------------------------------------


def publish(ctx: Context, s: Session, job: Job, run: Run, signed: dict[str, Any]) -> dict[str, Any]:
    """Record a worker's signed model record (see the module's docstring for what is refused)."""
    if run.cfg.mode != "gossip":
        raise conflict("not_gossip", f"run {run.id} is a {run.cfg.mode} run: its workers send updates, not records")
    if run.status not in (RunStatus.TRAINING, RunStatus.AGGREGATING):
        raise conflict("not_accepting", f"run {run.id} is {run.status}: it records no models now")
    offer = row(s, Offer, job.worker_id)
    problem = record_problem(signed, offer.public_key)
    if problem is not None:
        raise unprocessable("bad_record", problem)
    rec = signed["record"]
    if rec["training_id"] != run.id or rec["job_id"] != job.id:
        raise unprocessable(
            "wrong_record",
            f"the record is for run {rec['training_id']!r}, job {rec['job_id']!r}; this is job {job.id} of run {run.id}",
        )
    r = rec["round"]
    if not isinstance(r, int) or isinstance(r, bool) or not 1 <= r <= run.cfg.rounds:
        raise unprocessable("bad_record", f"round must be an integer in [1, {run.cfg.rounds}], got {r!r}")
    if not isinstance(rec["cid"], str) or not is_cid(rec["cid"]):
        raise unprocessable("bad_cid", f"{rec['cid']!r} is not a CIDv1 (base32, starts with 'b')")
    loss = rec["train_loss"]
    if loss is not None and (not isinstance(loss, int | float) or isinstance(loss, bool) or not math.isfinite(loss)):
        raise unprocessable("bad_record", f"train_loss must be a finite number or null, got {loss!r}")
    lock_run(s, run)
    now = time.time()
    before = s.scalar(select(Update).where(Update.job_id == job.id, Update.round == r))
    if before is not None and before.cid != rec["cid"]:  # two records of one round, both signed by it
        _equivocation(ctx, s, run, job, r, before.cid, rec["cid"], now)
        s.commit()
        raise conflict(
            "conflicting_record",
            f"job {job.id} already published round {r} as {before.cid}; two signed records of one round "
            "are equivocation: flagged",
        )
    if r < run.round or s.get(RoundRecord, (run.id, r)) is not None:
        s.rollback()
        raise conflict("round_closed", f"round {r} of {run.id} is closed; the record is at round {run.round}")
    if before is not None:
        s.rollback()
        return {"status": "recorded", "round": r, "cid": rec["cid"], "duplicate": True}
    proved = _equivocated(s, run).get(job.worker_id)
    if proved is not None:
        s.rollback()
        raise conflict(
            "ejection_pending",
            f"job {job.id}'s worker signed two records of round {proved} (equivocation); it records no more "
            "rounds (slashed and ejected when that round is settled)",
        )
    seen = s.scalar(
        select(Witness.cid).where(Witness.job_id == job.id, Witness.round == r, Witness.cid != rec["cid"]).limit(1)
    )
    # when the coordinator first held a record of this CID signed by this job's worker: its own
    # claim (a worker with a server reports its record before it serves it), else now
    claimed = s.scalar(select(func.min(Witness.created_at)).where(Witness.job_id == job.id, Witness.cid == rec["cid"]))
    signed_at = min(claimed or now, now)
    copied = None if seen is not None else _signed_before(s, run, job, rec["cid"], signed_at)
    samples = int(run.data_manifest["shards"][job.shard_index]["samples"])  # the coordinator's count, not the claim
    s.add(
        Update(
            run_id=run.id,
            job_id=job.id,
            worker_id=job.worker_id,
            round=r,
            cid=rec["cid"],
            size=0,  # known once the coordinator fetches it (close_round)
            shard_index=job.shard_index,
            samples=samples,
            train_loss=float(loss) if loss is not None else None,
            status=UpdateStatus.ACCEPTED if seen is None else UpdateStatus.REJECTED,
            reason=None if seen is None else f"a peer received another record of round {r} signed by it: {seen}",
            record=signed,
            created_at=signed_at,
        )
    )
    s.execute(delete(Witness).where(Witness.job_id == job.id, Witness.round == r, Witness.cid == rec["cid"]))
    if seen is not None:  # a neighbour received another record of this round signed by it
        s.flush()
        _equivocation(ctx, s, run, job, r, seen, rec["cid"], now)
        s.commit()
        ctx.notifier.poke_driver()  # the round has its record (rejected): it may be due
        raise conflict(
            "conflicting_record",
            f"a peer received job {job.id}'s record of round {r} naming {seen}; two signed records of one "
            "round are equivocation: flagged, this one kept as the proof",
        )
    if copied is not None:  # another job signed this CID first: not this worker's work
        s.flush()
        up = s.scalar(select(Update).where(Update.job_id == job.id, Update.round == r))
        assert up is not None
        other, other_round = copied
        _judge(
            s,
            up,
            r,
            now,
            "gossip_copy",
            f"round {r} model {rec['cid']} was signed first by job {other} (its round {other_round})",
        )
    if loss is not None:
        job.loss = float(loss)
    job.progress, job.worker_status, job.progress_round, job.updated_at = 100.0, f"published round {r}", r, now
    s.commit()
    ctx.notifier.poke_driver()
    return {"status": "recorded", "round": r, "cid": rec["cid"], "duplicate": False}


def _signed_before(s: Session, run: Run, job: Job, cid: str, at: float) -> tuple[str, int] | None:
    """Another job of the run whose worker the coordinator knew to have signed ``cid`` at or
    before ``at`` (its published record of any round, or a record of it reported to the
    coordinator: its own claim or a neighbour's report), with that record's round; None:
    ``job`` signed it first."""
    for kept in (Update, Witness):
        first = s.execute(
            select(kept.job_id, kept.round)
            .where(kept.run_id == run.id, kept.cid == cid, kept.job_id != job.id, kept.created_at <= at)
            .order_by(kept.created_at)
            .limit(1)
        ).first()
        if first is not None:
            return first[0], int(first[1])
    return None


def record_of(s: Session, job_id: str, r: int | None) -> dict[str, Any]:
    """Job ``job_id``'s signed record of round ``r`` if published, else its latest one."""
    job = s.get(Job, job_id)
    if job is None:
        raise not_found("unknown_job", f"no job {job_id!r}")
    up = None
    if r is not None:
        up = s.scalar(select(Update).where(Update.job_id == job_id, Update.round == r, Update.record.is_not(None)))
    if up is None:
        up = s.scalar(
            select(Update)
            .where(Update.job_id == job_id, Update.record.is_not(None))
            .order_by(Update.round.desc())
            .limit(1)
        )
    if up is None or up.record is None:
        raise not_found("no_record", f"job {job_id} has published no model record yet")
    return up.record


MAX_WITNESSED = 64  # records in one report


def witness(ctx: Context, s: Session, reporter: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records of other workers that ``reporter`` received (its neighbours', from their
    servers): each is checked as :func:`publish` checks one (the signature against the
    signer's own key: a report cannot frame anyone), all or none (a 422 names the first
    bad one, nothing written). Each is then compared with what the coordinator holds for
    its job and round: a different CID (published, or witnessed before) flags the signer
    ``equivocation``; the same one is ``consistent``; none yet: ``kept`` until its job
    publishes the round (a different CID then is caught by :func:`publish`), or, the round
    closed without its record (none can come now), ``unmatched``, and not stored."""
    checked: list[tuple[Job, dict[str, Any], dict[str, Any]]] = []
    run: Run | None = None
    for k, signed in enumerate(records):
        rec = signed.get("record")
        job_id = rec.get("job_id") if isinstance(rec, dict) else None
        job = s.get(Job, job_id) if isinstance(job_id, str) else None
        if job is None:
            raise unprocessable("bad_record", f"records[{k}] names no job of this coordinator: {job_id!r}")
        problem = record_problem(signed, row(s, Offer, job.worker_id).public_key)
        if problem is not None:
            raise unprocessable("bad_record", f"records[{k}]: {problem}")
        assert isinstance(rec, dict)  # record_problem checked it
        if rec["training_id"] != job.run_id:
            raise unprocessable(
                "wrong_record", f"records[{k}] is for run {rec['training_id']!r}; its job {job.id} is of {job.run_id}"
            )
        if run is None:
            run = row(s, Run, job.run_id)
        elif job.run_id != run.id:
            raise unprocessable(
                "wrong_record", f"records[{k}] is of run {job.run_id}; a report is of one run ({run.id})"
            )
        r = rec["round"]
        if not isinstance(r, int) or isinstance(r, bool) or not 1 <= r <= run.cfg.rounds:
            raise unprocessable(
                "bad_record", f"records[{k}]: round must be an integer in [1, {run.cfg.rounds}], got {r!r}"
            )
        if not isinstance(rec["cid"], str) or not is_cid(rec["cid"]):
            raise unprocessable("bad_cid", f"records[{k}]: {rec['cid']!r} is not a CIDv1 (base32, starts with 'b')")
        checked.append((job, rec, signed))
    assert run is not None  # the schema asks for at least one
    if run.cfg.mode != "gossip":
        raise conflict("not_gossip", f"run {run.id} is a {run.cfg.mode} run: its workers sign no records")
    if s.scalar(select(Job.id).where(Job.run_id == run.id, Job.worker_id == reporter).limit(1)) is None:
        raise forbidden(f"{reporter} has no job in run {run.id}: only its workers report its records")
    lock_run(s, run)
    now = time.time()
    out = []
    for job, rec, signed in checked:
        r, cid = rec["round"], rec["cid"]
        published = s.scalar(select(Update.cid).where(Update.job_id == job.id, Update.round == r))
        other = published if published is not None and published != cid else None
        if other is None:
            other = s.scalar(
                select(Witness.cid).where(Witness.job_id == job.id, Witness.round == r, Witness.cid != cid).limit(1)
            )
        held = (
            published == cid
            or s.scalar(
                select(Witness.id).where(Witness.job_id == job.id, Witness.round == r, Witness.cid == cid).limit(1)
            )
            is not None
        )
        # kept to compare with the job's own record, which can come only while the round is
        # open (a record of a closed round is refused); a proof is kept whenever it comes
        if not held and not _flagged(s, run.id, job.worker_id, r) and (other is not None or _open(run, r)):
            s.add(
                Witness(
                    run_id=run.id,
                    job_id=job.id,
                    worker_id=job.worker_id,
                    round=r,
                    cid=cid,
                    record=signed,
                    reporter=reporter,
                    created_at=now,
                )
            )
            s.flush()
        if other is not None:
            _equivocation(ctx, s, run, job, r, other, cid, now)
            verdict = "equivocation"
        else:
            verdict = "consistent" if held else "kept" if _open(run, r) else "unmatched"
        out.append({"worker": job.worker_id, "job_id": job.id, "round": r, "cid": cid, "verdict": verdict})
    s.commit()
    return out


def _flagged(s: Session, run_id: str, worker: str, r: int) -> bool:
    return (
        s.scalar(
            select(Flag.id)
            .where(Flag.run_id == run_id, Flag.worker_id == worker, Flag.round == r, Flag.kind == "equivocation")
            .limit(1)
        )
        is not None
    )


def _open(run: Run, r: int) -> bool:
    """Round ``r`` still takes records: a later round than the record's (the record's may be
    aggregating meanwhile), or the record's round before its aggregation starts."""
    return r > run.round or (r == run.round and run.status == RunStatus.TRAINING)


def _equivocation(ctx: Context, s: Session, run: Run, job: Job, r: int, one: str, other: str, now: float) -> None:
    """Job ``job``'s worker signed records of round ``r`` naming ``one`` and ``other``: flag
    it ``equivocation`` (once a round); its published model of the round, while the round
    is still open, is rejected. Two records under one key are proof anyone can check, so
    the contract is slashed (bond burned, worker ejected: :func:`aitbc.coordinator.
    settlement.slash`): by the round's settlement (:func:`score` marks it provable, unpaid),
    or at once when the proof comes after the round was settled (what it was paid stays
    paid; the bond answers for it)."""
    if _flagged(s, run.id, job.worker_id, r):
        return
    reason = f"signed two different records of round {r} of job {job.id}: {one} and {other}"
    s.add(Flag(worker_id=job.worker_id, run_id=run.id, round=r, kind="equivocation", reason=reason, created_at=now))
    offer = s.get(Offer, job.worker_id)
    if offer is not None:
        offer.flags += 1
    up = s.scalar(select(Update).where(Update.job_id == job.id, Update.round == r))
    if up is not None and up.status == UpdateStatus.ACCEPTED and _open(run, r):
        up.status, up.reason = UpdateStatus.REJECTED, reason
    scored = s.scalar(
        select(Score).where(Score.run_id == run.id, Score.round == r, Score.contract_id == job.contract_id)
    )
    if scored is None:
        return  # score() sees the flag
    settled = s.scalar(
        select(Settlement.id).where(Settlement.contract_id == job.contract_id, Settlement.round == r).limit(1)
    )
    if settled is None:  # scored, not yet paid: its settlement slashes it, and pays nothing
        scored.status, scored.flags, scored.quality, scored.provable = ScoreStatus.REJECTED, ["equivocation"], 0.0, True
        return
    contract = row(s, Contract, job.contract_id)
    if contract.status != ContractStatus.SLASHED:
        slash(ctx, s, run, contract, reason=f"round {r}: equivocation")


def named_by_record(ctx: Context, worker: str, cid: str) -> bool:
    """Whether ``worker`` signed a gossip record naming ``cid`` (a bad-peer report can be checked)."""
    with ctx.session() as s:
        return s.scalar(select(Update.id).where(Update.worker_id == worker, Update.cid == cid).limit(1)) is not None


# --- closing a round --------------------------------------------------------------------


def round_due(ctx: Context, s: Session, run: Run, *, now: float) -> bool:
    """Every active job published this round or a later one, or ``quorum`` did and each
    of the rest is two or more rounds behind or, by its own pace, cannot publish the round
    in time (:func:`cannot_make_it`), or the deadline passed with
    ``quorum`` records of it; and every published model can be fetched: a worker that
    serves blobs announces where (in memory) after each record, so a restarted coordinator
    waits for that, up to ``2 x lease_seconds`` from its start, before it closes a round
    without a model it could have had."""
    warm_peer_http()
    _fetched(ctx, s, run, later=True)  # records ahead of their round: their models are fetched meanwhile
    if not _due(s, run, now=now):
        return False
    if now - max(ctx.started_at, run.round_started_at or 0.0) < 2 * ctx.settings.lease_seconds:
        cids = s.execute(select(Update.worker_id, Update.cid).where(Update.run_id == run.id, Update.round == run.round))
        if not all(ctx.peers.url(w) is not None or ctx.store.has(cid) for w, cid in cids):
            return False
    return _fetched(ctx, s, run) is not None


def _fetched(ctx: Context, s: Session, run: Run, *, later: bool = False) -> dict[tuple[str, str], str] | None:
    """The verdict (:func:`fetch_model`) on each accepted model of the run's round (with
    ``later``: of the rounds ahead of it too), or None while any is being fetched. The
    fetches run on threads of their own (:class:`~aitbc.coordinator.transfer.peers.PeerFetches`),
    never the round driver's: a round whose model comes slowly waits for it, up to the
    fetch's deadline, while the driver moves every other run; the driver is poked when a
    fetch ends."""
    where = Update.round >= run.round if later else Update.round == run.round
    wanted = [
        (w, cid)
        for w, cid in s.execute(
            select(Update.worker_id, Update.cid).where(
                Update.run_id == run.id, where, Update.status == UpdateStatus.ACCEPTED
            )
        ).all()
    ]
    size = model_bytes(run.cfg.compression, run.cfg.d)
    return ctx.peers.fetches.verdicts(
        wanted, lambda w, cid: fetch_model(ctx, w, cid, max_bytes=size), ctx.notifier.poke_driver
    )


def _equivocated(s: Session, run: Run) -> dict[str, int]:
    """The run's workers flagged ``equivocation``, each with the first round proved."""
    rows = s.execute(
        select(Flag.worker_id, func.min(Flag.round))
        .where(Flag.run_id == run.id, Flag.kind == "equivocation")
        .group_by(Flag.worker_id)
    ).all()
    return {w: int(r or 0) for w, r in rows}


def _due(s: Session, run: Run, *, now: float) -> bool:
    # a proven equivocator publishes nothing more (publish): not waited for until it is ejected
    proved = _equivocated(s, run)
    active = [
        j
        for j in s.scalars(select(Job).where(Job.run_id == run.id, Job.status == JobStatus.ACTIVE)).all()
        if j.worker_id not in proved
    ]
    last = dict(
        s.execute(
            select(Update.job_id, func.max(Update.round)).where(Update.run_id == run.id).group_by(Update.job_id)
        ).all()
    )
    if active and all((last.get(j.id) or 0) >= run.round for j in active):
        return True
    # A worker two or more rounds behind the record is slow, not late: with the quorum in,
    # the record does not wait for it (its own record of this round, if it ever trains it,
    # comes after the close: refused, unpaid, as a straggler's update). One round behind
    # (or none yet: round 1) is waited for up to the deadline unless its own pace says it
    # cannot publish the round before it (with slack): closing at the deadline would leave
    # it out all the same.
    behind = [j for j in active if (last.get(j.id) or 0) < run.round]
    published = len(active) - len(behind)
    if (
        published >= run.cfg.quorum
        and behind
        and all((last.get(j.id) or 0) <= run.round - 2 or cannot_make_it(run, j, last.get(j.id) or 0) for j in behind)
    ):
        return True
    deadline = run.cfg.deadline
    if deadline and run.round_started_at and now >= run.round_started_at + deadline:
        n = s.scalar(select(func.count(Update.id)).where(Update.run_id == run.id, Update.round == run.round)) or 0
        return n >= run.cfg.quorum
    return False


PACE_SLACK = 2.0  # a worker is left out early when its own pace puts it past this many deadlines


def note_pace(run: Run, job: Job, r: int, step: int, seconds: float | None, *, now: float) -> None:
    """Job ``job``'s worker reports it is at ``step`` of its round ``r``, ``seconds`` into
    the round on its own clock (a signed progress report): kept for :func:`cannot_make_it`.
    Its speed (samples a second) is its own: ``step`` steps' samples over ``seconds``, from
    :data:`~aitbc.core.gossip.PACE_MIN_STEPS` steps into the round (the first is slower)."""
    job.step, job.progress_at, job.progress_round = step, now, r
    own = job_settings(run, job)
    if seconds and step >= min(PACE_MIN_STEPS, int(own["local_steps"])):
        samples = int(run.data_manifest["shards"][job.shard_index]["samples"])
        job.speed = step * min(int(own["batch_size"]), samples) / seconds


def cannot_make_it(run: Run, job: Job, published: int) -> bool:
    """Whether job ``job`` (its last record: round ``published``), by its own pace
    (:func:`note_pace`), cannot publish the record's round in time: at its speed, the steps
    left of the round it reports and of every round up to the record's end after
    ``round_started_at + PACE_SLACK x deadline`` (the slack: a worker that would only
    just miss the deadline, or whose first steps were slow, is waited for up to it). False
    when there is no deadline, no pace yet, or its report is of a round it published
    already (it says nothing of the rounds since) or of a later round than the record's
    (its record of this one may be on its way: a report is sent beside the record, and can
    overtake it).

    Only a job's own reports judge it, so nothing in them needs trusting: a worker that
    claims to be slow leaves itself out (unpaid for the round), one that claims to be fast
    is waited for up to the deadline, as without reports; nobody can report for another's
    job (403), and the quorum is still needed."""
    deadline = run.cfg.deadline
    r, at, step, speed = job.progress_round, job.progress_at, job.step, job.speed
    if not deadline or not run.round_started_at or r is None or at is None or step is None or not speed:
        return False
    if not published < r <= run.round:
        return False
    own = job_settings(run, job)
    steps = int(own["local_steps"])
    samples = int(run.data_manifest["shards"][job.shard_index]["samples"])
    per_step = min(int(own["batch_size"]), samples) / speed  # its seconds a step
    left = (run.round - r) * steps + max(0, steps - step)
    return at + left * per_step > run.round_started_at + PACE_SLACK * deadline


def fetch_model(ctx: Context, worker: str, cid: str, *, max_bytes: int | None = None) -> str:
    """Make sure the coordinator holds ``cid``: ``ok`` (held, or fetched from the worker's
    peer server and CID-checked), ``bad`` (the worker served bytes that do not hash to the
    CID it signed, or more than ``max_bytes``, the run's model size, looked up from the
    worker's record of ``cid`` when not given: refused at the byte past it), ``gone`` (not
    reachable, not held, no record of it, or not served within
    :data:`~aitbc.coordinator.transfer.peers.FETCH_SECONDS` however slowly it sent)."""
    if ctx.store.has(cid):
        return "ok"
    url = ctx.peers.url(worker)
    if url is None:
        return "gone"
    if max_bytes is None:
        with ctx.session() as s:
            run_id = s.scalar(select(Update.run_id).where(Update.worker_id == worker, Update.cid == cid).limit(1))
            run = s.get(Run, run_id) if run_id is not None else None
            if run is None:
                return "gone"
            max_bytes = model_bytes(run.cfg.compression, run.cfg.d)
    try:
        with ctx.store.writer(cid) as w:
            if not stream_from_peer(url, cid, w.write, max_bytes=max_bytes):
                return "gone"
            w.commit()
    except (AitbcError, TooLong):  # bytes that do not hash to the CID it signed (IntegrityError), or too many
        return "bad"
    return "ok"


def close_round(ctx: Context, run_id: str) -> None:
    """Record round ``run.round``'s consensus and judge its models (the module's docstring)."""
    with ctx.session() as s:
        run = s.get(Run, run_id)
        if run is None:
            return
        if run.control != Control.AUTOMATIC:  # its owner's to move (gossip is refused for owner-driven runs)
            return
        if run.status not in (RunStatus.TRAINING, RunStatus.AGGREGATING) or _fetched(ctx, s, run) is None:
            return  # its models are still coming: the driver goes on with other runs meanwhile
        if run.status == RunStatus.TRAINING:
            lock_run(s, run)
            if not ctx.lease.fence(s):
                s.rollback()
                return
            if run.status == RunStatus.TRAINING:
                transition(run, RunStatus.AGGREGATING)
            s.commit()
        if run.status != RunStatus.AGGREGATING:
            return
        verdicts = _fetched(ctx, s, run)  # a record may have come before the round stopped taking them
        if verdicts is None:
            return
        r = run.round
        ups = round_updates(s, run.id, r)
        rt = runtime(ctx, run)
        now = time.time()
        models: list[tuple[Update, int, Tensor]] = []
        for u, shard in ups:
            if u.status != UpdateStatus.ACCEPTED:
                continue
            verdict = verdicts[(u.worker_id, u.cid)]
            if verdict == "bad":
                _judge(
                    s,
                    u,
                    r,
                    now,
                    "bad_peer_blob",
                    f"served bytes for its round {r} model {u.cid} that do not hash to it",
                )
                ctx.peers.judge(u.worker_id, u.cid, "bad")
                continue
            if verdict == "gone":
                u.status, u.reason = UpdateStatus.EXCLUDED, "its model could not be fetched (worker unreachable)"
                continue
            blob = ctx.store.get_bytes(u.cid)
            u.size = len(blob)
            model = _decode(blob, rt.d)
            if model is None:
                _judge(
                    s, u, r, now, "rejected_update", f"round {r} model {u.cid} is not a finite model of {rt.d} values"
                )
                continue
            models.append((u, shard, model))
        with rt.lock:
            rt.load(ctx, run)
            before = rt.params
            assert before is not None
            consensus, spread = before, None
            models = _copies(ctx, s, run, r, models, before, now)
            if models:
                combined = robust_combine(
                    [m for *_, m in models],
                    [float(u.samples) for u, _, _ in models],
                    aggregator=rt.aggregator,
                    norm_bound=rt.norm_bound,
                    round_index=r,
                )
                if combined.result is not None:
                    consensus = combined.result.to(before.dtype)
                for u, _, m in models:
                    u.val_loss = rt.evaluate(m)[0]
                kept = _outliers(s, models, consensus, r, now)
                if kept:
                    stack = torch.stack([m for *_, m in kept])  # (n, d)
                    spread = float((stack - stack.mean(dim=0)).norm(dim=1).mean())
            loss, acc = rt.evaluate(consensus)
            cid, size = rt.checkpoint(ctx, run, consensus, r)
        accepted = [(u, shard) for u, shard in ups if u.status == UpdateStatus.ACCEPTED]
        res = RoundResult(
            params=consensus,
            cid=cid,
            size=size,
            outer_cid=run.outer_state_cid,
            val_loss=loss,
            val_accuracy=acc,
            skipped=consensus is before,
            spread=spread,
        )
        # reported records of this round or older kept to compare with records that can no
        # longer come: gone with the close; a proof of equivocation stays (the signed record)
        proof = (
            select(Flag.id)
            .where(
                Flag.run_id == Witness.run_id,
                Flag.worker_id == Witness.worker_id,
                Flag.round == Witness.round,
                Flag.kind == "equivocation",
            )
            .exists()
        )
        s.execute(delete(Witness).where(Witness.run_id == run.id, Witness.round <= r, ~proof))
        commit_round(ctx, s, run, rt, res, ups, accepted, round=r, fenced=True)
        if run.status not in (RunStatus.TRAINING, RunStatus.AGGREGATING):
            drop_runtime(ctx, run.id)
    ctx.peers.fetches.forget(list(verdicts))
    ctx.notifier.bump()


def _copies(
    ctx: Context, s: Session, run: Run, r: int, models: list[tuple[Update, int, Tensor]], before: Tensor, now: float
) -> list[tuple[Update, int, Tensor]]:
    """Flag ``gossip_copy`` (rejected, unpaid) each of the round's models that is another
    worker's with small noise (:func:`aitbc.core.gossip.near_copies`: far nearer another's
    model of this round or the last, or the last consensus ``before``, than honest training
    ever puts two models); of two of this round too near each other, the one signed later
    (a worker with a server claims its record before it serves it). The models kept."""
    prev: list[Tensor] = []
    prev_owners: list[str] = []
    if r > 1:
        for worker, cid in s.execute(
            select(Update.worker_id, Update.cid).where(Update.run_id == run.id, Update.round == r - 1)
        ).all():
            blob = ctx.store.get_bytes(cid) if ctx.store.has(cid) else None
            m = _decode(blob, run.cfg.d) if blob is not None else None
            if m is not None:
                prev.append(m)
                prev_owners.append(worker)
    found = near_copies(
        [m for *_, m in models],
        [u.worker_id for u, _, _ in models],
        before=prev,
        before_owners=prev_owners,
        reference=before.to(torch.float32),
    )
    copiers: dict[int, str] = {}
    for near in found:
        kind, j = near.other
        i = near.i
        if kind == "now":  # the later of the two signed records copied the earlier
            a, b = models[i][0], models[j][0]
            i, j = (i, j) if a.created_at > b.created_at else (j, i)
            what = f"job {models[j][0].job_id}'s round {r} model {models[j][0].cid}"
        elif kind == "before":
            what = f"{prev_owners[j]}'s round {r - 1} model"
        else:
            what = f"the round {r - 1} consensus"
        copiers.setdefault(i, f"round {r} model is {near.ratio:.3g}x the round's median distance from {what}")
    for i, why in copiers.items():
        _judge(s, models[i][0], r, now, "gossip_copy", why)
    return [m for i, m in enumerate(models) if i not in copiers]


def _decode(blob: bytes, d: int) -> Tensor | None:
    try:
        m = decode_model(blob, max_numel=d)
    except (IntegrityError, ValueError):
        return None
    if m.shape != (d,) or not torch.isfinite(m).all():
        return None
    return m.to(torch.float32)


def _outliers(
    s: Session, models: list[tuple[Update, int, Tensor]], consensus: Tensor, r: int, now: float
) -> list[tuple[Update, int, Tensor]]:
    """Judge each model against the consensus and the round's other models (each
    ``u.val_loss`` evaluated); flag the outliers; the models kept. A direction test (the
    model's step against the consensus step) was tried and dropped: a worker's own drift
    from the consensus (the spread) dominates one round's step, so an honest worker cut off
    from its neighbours for a while (an outage) pointed "against" it."""
    dists = [float((m - consensus).norm()) for *_, m in models]
    median = statistics.median(dists)
    losses = [u.val_loss for u, _, _ in models if u.val_loss is not None and math.isfinite(u.val_loss)]
    typical = statistics.median(losses) if losses else None
    kept = []
    for (u, shard, m), dist in zip(models, dists):
        why = None
        if median > 0 and dist > OUTLIER * median:
            why = f"round {r} model is {dist / median:.1f}x the median distance from the consensus"
        elif typical is not None and (
            u.val_loss is None or not math.isfinite(u.val_loss) or u.val_loss > WORSE * typical
        ):
            why = f"round {r} model's validation loss {u.val_loss} is over {WORSE:g}x the round's median {typical:.4g}"
        if why is not None:
            _judge(s, u, r, now, "gossip_outlier", why)
        else:
            kept.append((u, shard, m))
    return kept


def _judge(s: Session, u: Update, r: int, now: float, kind: str, reason: str) -> None:
    u.status, u.reason = UpdateStatus.REJECTED, reason
    s.add(Flag(worker_id=u.worker_id, run_id=u.run_id, round=r, kind=kind, reason=reason, created_at=now))
    offer = s.get(Offer, u.worker_id)
    if offer is not None:
        offer.flags += 1


# --- pay --------------------------------------------------------------------------------


def score(ctx: Context, run_id: str, r: int) -> None:
    """Round ``r``'s Score rows: quality 1 for a kept model, 0 otherwise (idempotent)."""
    with ctx.session() as s:
        if s.scalar(select(func.count()).select_from(Score).where(Score.run_id == run_id, Score.round == r)):
            return
        jobs = s.scalars(select(Job).where(Job.run_id == run_id, Job.joined_round <= r)).all()
        ups = {u.job_id: u for u in s.scalars(select(Update).where(Update.run_id == run_id, Update.round == r))}
        equivocated = set(
            s.scalars(select(Flag.worker_id).where(Flag.run_id == run_id, Flag.round == r, Flag.kind == "equivocation"))
        )
        seen: set[str] = set()
        for j in jobs:
            if j.contract_id in seen:
                continue
            u = ups.get(j.id)
            if u is None and j.status != JobStatus.ACTIVE:
                continue  # a job that ended before publishing this round: nothing due
            seen.add(j.contract_id)
            provable = j.worker_id in equivocated  # two records of the round under its key: slashed
            if provable:
                status, flags, quality = ScoreStatus.REJECTED, ["equivocation"], 0.0
            elif u is None:
                status, flags, quality = ScoreStatus.MISSING, ["missing"], 0.0
            elif u.status == UpdateStatus.ACCEPTED:
                status, flags, quality = ScoreStatus.ACCEPTED, [], 1.0
            elif u.status == UpdateStatus.EXCLUDED:
                status, flags, quality = ScoreStatus.MISSING, ["unfetchable"], 0.0
            else:
                status, flags, quality = ScoreStatus.REJECTED, ["rejected"], 0.0
            s.add(
                Score(
                    run_id=run_id,
                    round=r,
                    contract_id=j.contract_id,
                    worker_id=j.worker_id,
                    status=status,
                    flags=flags,
                    provable=provable,
                    quality=quality,
                )
            )
        s.commit()
