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
- **Closing a round** and **pay**: :mod:`.gossip_close`.

Shape letters: ``n`` models in the round, ``d`` parameters.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TypedDict, cast

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import conflict, forbidden, not_found, unprocessable
from aitbc.coordinator.money import onchain
from aitbc.coordinator.store.models import (
    Contract,
    Flag,
    Job,
    Offer,
    RoundRecord,
    Run,
    Score,
    Settlement,
    SignedModelRecord,
    Update,
    Witness,
)
from aitbc.coordinator.store.repository import job_settings, lock_run, row
from aitbc.coordinator.transfer.peers import stream_from_peer
from aitbc.coordinator.verification.settlement import slash
from aitbc.core.gossip import PACE_MIN_STEPS, model_bytes
from aitbc.errors import AitbcError
from aitbc.json_value import JSONObject
from aitbc.ledger.records import record_problem
from aitbc.replies.gossip import RecordAccepted, SignedRecord, Verdict, Witnessed
from aitbc.states import ContractStatus, JobStatus, RunStatus, ScoreStatus, UpdateStatus
from aitbc.storage.cid import is_cid
from aitbc.storage.peer_fetch import TooLong

log = logging.getLogger("aitbc.coordinator")


class RosterEntry(TypedDict):
    """One of a gossip run's active jobs, as its workers find their neighbours."""

    worker: str
    job_id: str
    public_key: str
    url: str | None
    samples: int


def roster(ctx: Context, s: Session, run: Run) -> list[RosterEntry]:
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


def publish(ctx: Context, s: Session, job: Job, run: Run, signed: JSONObject) -> RecordAccepted:
    """Record a worker's signed model record (see the module's docstring for what is refused)."""
    if not run.cfg.mode.peer_to_peer:
        raise conflict("not_gossip", f"run {run.id} is a {run.cfg.mode} run: its workers send updates, not records")
    if run.status not in (RunStatus.TRAINING, RunStatus.AGGREGATING):
        raise conflict("not_accepting", f"run {run.id} is {run.status}: it records no models now")
    onchain.require_bond(ctx, s, run, job)  # EVM: only a contract bonded on chain can be paid for its models
    checked = _checked_record(s, job, run, signed)
    rec = checked["record"]
    r, loss = rec["round"], rec["train_loss"]
    lock_run(s, run)
    onchain.mirror_bond(ctx, s, run, job)
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
        return RecordAccepted(status="recorded", round=r, cid=rec["cid"], duplicate=True)
    proved = equivocated(s, run).get(job.worker_id)
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
    s.add(_published(run, job, r, checked, seen=seen, at=signed_at))
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
        why = f"round {r} model {rec['cid']} was signed first by job {other} (its round {other_round})"
        judge(s, up, r, now, "gossip_copy", why)
    if loss is not None:
        job.loss = float(loss)
    job.progress, job.worker_status, job.progress_round, job.updated_at = 100.0, f"published round {r}", r, now
    s.commit()
    ctx.notifier.poke_driver()
    return RecordAccepted(status="recorded", round=r, cid=rec["cid"], duplicate=False)


def _checked_record(s: Session, job: Job, run: Run, signed: JSONObject) -> SignedModelRecord:
    """The record ``signed`` holds, checked (a 422 naming what is wrong): signed by job
    ``job``'s worker, for this run and job, a round of the run, a CID, a finite loss or none
    (so ``signed`` is then a :class:`SignedModelRecord`)."""
    offer = row(s, Offer, job.worker_id)
    problem = record_problem(signed, offer.public_key)
    if problem is not None:
        raise unprocessable("bad_record", problem)
    checked = cast(SignedModelRecord, signed)  # record_problem checked its fields and signature
    rec = checked["record"]
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
    return checked


def _published(run: Run, job: Job, r: int, signed: SignedModelRecord, *, seen: str | None, at: float) -> Update:
    """Job ``job``'s record of round ``r`` as the round's update row: rejected when a
    neighbour received another record of the round signed by it (``seen``)."""
    rec = signed["record"]
    loss = rec["train_loss"]
    samples = int(run.data_manifest["shards"][job.shard_index]["samples"])  # the coordinator's count, not the claim
    return Update(
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
        created_at=at,
    )


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


def record_of(s: Session, job_id: str, r: int | None) -> SignedRecord:
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
    return SignedRecord(record=dict(up.record["record"]), signature=up.record["signature"])


MAX_WITNESSED = 64  # records in one report


def witness(ctx: Context, s: Session, reporter: str, records: list[JSONObject]) -> list[Witnessed]:
    """Records of other workers that ``reporter`` received (its neighbours', from their
    servers): each is checked as :func:`publish` checks one (the signature against the
    signer's own key: a report cannot frame anyone), all or none (a 422 names the first
    bad one, nothing written). Each is then compared with what the coordinator holds for
    its job and round: a different CID (published, or witnessed before) flags the signer
    ``equivocation``; the same one is ``consistent``; none yet: ``kept`` until its job
    publishes the round (a different CID then is caught by :func:`publish`), or, the round
    closed without its record (none can come now), ``unmatched``, and not stored."""
    run, checked = _checked_reports(s, records)
    if not run.cfg.mode.peer_to_peer:
        raise conflict("not_gossip", f"run {run.id} is a {run.cfg.mode} run: its workers sign no records")
    if s.scalar(select(Job.id).where(Job.run_id == run.id, Job.worker_id == reporter).limit(1)) is None:
        raise forbidden(f"{reporter} has no job in run {run.id}: only its workers report its records")
    lock_run(s, run)
    now = time.time()
    out = [_compare(ctx, s, run, job, signed, reporter, now) for job, signed in checked]
    s.commit()
    return out


def _checked_reports(s: Session, records: list[JSONObject]) -> tuple[Run, list[tuple[Job, SignedModelRecord]]]:
    """The run a report's ``records`` are of, and each (job, signed record), all
    checked as :func:`publish` checks one (a 422 names the first bad one)."""
    checked: list[tuple[Job, SignedModelRecord]] = []
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
        checked.append((job, cast(SignedModelRecord, signed)))  # checked as _checked_record checks one
    assert run is not None  # the schema asks for at least one
    return run, checked


def _compare(
    ctx: Context,
    s: Session,
    run: Run,
    job: Job,
    signed: SignedModelRecord,
    reporter: str,
    now: float,
) -> Witnessed:
    """One reported record against what the coordinator holds of its job and round: its
    verdict (:func:`witness`), kept or flagged as it says."""
    r, cid = signed["record"]["round"], signed["record"]["cid"]
    published = s.scalar(select(Update.cid).where(Update.job_id == job.id, Update.round == r))
    other = published if published is not None and published != cid else None
    if other is None:
        other = s.scalar(
            select(Witness.cid).where(Witness.job_id == job.id, Witness.round == r, Witness.cid != cid).limit(1)
        )
    held = (
        published == cid
        or s.scalar(select(Witness.id).where(Witness.job_id == job.id, Witness.round == r, Witness.cid == cid).limit(1))
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
        verdict: Verdict = "equivocation"
    else:
        verdict = "consistent" if held else "kept" if _open(run, r) else "unmatched"
    return Witnessed(worker=job.worker_id, job_id=job.id, round=r, cid=cid, verdict=verdict)


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


def equivocated(s: Session, run: Run) -> dict[str, int]:
    """The run's workers flagged ``equivocation``, each with the first round proved."""
    rows = s.execute(
        select(Flag.worker_id, func.min(Flag.round))
        .where(Flag.run_id == run.id, Flag.kind == "equivocation")
        .group_by(Flag.worker_id)
    ).all()
    return {w: int(r or 0) for w, r in rows}


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


def judge(s: Session, u: Update, r: int, now: float, kind: str, reason: str) -> None:
    u.status, u.reason = UpdateStatus.REJECTED, reason
    s.add(Flag(worker_id=u.worker_id, run_id=u.run_id, round=r, kind=kind, reason=reason, created_at=now))
    offer = s.get(Offer, u.worker_id)
    if offer is not None:
        offer.flags += 1
