"""The dashboard's read-only views: what anyone may see of the runs, as the models of
:mod:`aitbc.replies.dashboard`. Nothing here writes.

The public/owner-only rule: every field here is named one by one (an allow-list), never
copied from a row or from another view wholesale, and the dashboard's models forbid any
other key. The page is public, like a chain explorer: a run's progress, its curves,
each worker's standing and pay, the bytes it moved and the ledger's head. Never here:

- a CID of any kind (the data manifest, shards, validation data, checkpoints, updates, the
  model or result): blobs are served to whoever names them, so a CID is a capability to
  fetch the owner's data or model;
- where the data came from (``data_source``: a path on the owner's machine) and the model's
  options beyond its type and parameter count;
- keys, signed requests and job settings (the owner's overrides, job and contract ids,
  which the owner's control routes take).

Free text that reaches the page (a run's error, a job's end reason, which its owner may
write) is data: the page renders it as text, never as markup."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.money import outbox
from aitbc.coordinator.runs import views
from aitbc.coordinator.runs.data_size import measured_size
from aitbc.coordinator.runs.language import detail_fields, perplexity
from aitbc.coordinator.store.models import Contract, Flag, Job, RoundRecord, Run, Score, Settlement
from aitbc.ledger.book import Head
from aitbc.ledger.chain import escrow_account
from aitbc.replies.dashboard import (
    DashboardChainTx,
    DashboardLedger,
    DashboardPayments,
    DashboardRound,
    DashboardRun,
    DashboardRunDetail,
    DashboardRuns,
    DashboardWorker,
)
from aitbc.replies.jobs import JobView
from aitbc.states import ContractStatus, Control, RunStatus, ScoreStatus
from aitbc.units import AIT, ait

MAX_RUNS = 200  # the list shows the newest runs
MAX_CURVE_POINTS = 1000  # a longer run's curves hold every n-th round (and the newest): one poll stays small


def run_row(run: Run) -> DashboardRun:
    """What the runs list shows of one run."""
    return DashboardRun(
        training_id=run.id,
        status=RunStatus(run.status),
        owner=run.owner,
        model_type=run.model_type,
        parameters=run.cfg.d if run.configured else None,
        dataset_size=run.dataset_size,
        target_workers=run.target_workers,
        round=run.round,
        rounds=run.cfg.rounds if run.configured else None,
        control=Control(run.control),
        val_loss=run.val_loss,
        val_accuracy=run.val_accuracy,
        created_at=run.created_at,
        updated_at=run.updated_at,
    )


def runs_list(s: Session) -> DashboardRuns:
    """The newest ``MAX_RUNS`` runs, newest first."""
    newest = s.scalars(select(Run).order_by(Run.created_at.desc()).limit(MAX_RUNS)).all()
    rows = [run_row(r) for r in newest]
    return DashboardRuns(data=rows, count=len(rows))


def run_page(ctx: Context, s: Session, run: Run) -> DashboardRunDetail:
    """One run as the dashboard shows it: the summary, curves by round, the workers,
    bytes, payments and the ledger's head."""
    now = time.time()
    closed, last = s.execute(
        select(func.count(), func.max(RoundRecord.round)).where(RoundRecord.run_id == run.id, RoundRecord.round > 0)
    ).one()
    every = max(1, math.ceil((closed + 1) / MAX_CURVE_POINTS))
    picked = select(RoundRecord).where(RoundRecord.run_id == run.id)
    if every > 1:  # a long run: every n-th round and the newest, in SQL (the record is not read whole)
        picked = picked.where(or_(RoundRecord.round % every == 0, RoundRecord.round == last))
    rounds = [
        DashboardRound(
            round=r.round,
            val_loss=r.val_loss,
            val_accuracy=r.val_accuracy,
            val_perplexity=perplexity(run, r.val_loss),
            train_loss=r.train_loss,
            train_accuracy=r.train_accuracy,
            accepted=r.accepted,
            rejected=r.rejected,
            skipped=r.skipped,
            bytes_up=r.bytes_up,
            bytes_down=r.bytes_down,
            closed_at=r.closed_at,
        )
        for r in s.scalars(picked.order_by(RoundRecord.round))
    ]
    pay = _pay(ctx, s, run)
    measured = measured_size(run.manifest)
    return DashboardRunDetail(
        **dict(run_row(run)),
        data_bytes=measured.bytes if measured else run.data_bytes,
        data_documents=measured.documents if measured else None,
        data_tokens=measured.tokens if measured else None,
        aggregator=run.cfg.aggregator if run.configured else None,
        initial_val_loss=run.initial_val_loss,
        rounds_completed=closed,
        error=run.error,
        started_at=run.started_at,
        finished_at=run.finished_at,
        bytes_up=run.bytes_up,
        bytes_down=run.bytes_down,
        curves=rounds,
        curve_every=every,
        workers=_workers(ctx, s, run, pay.rows, now=now),
        payments=DashboardPayments(
            network=run.network,
            escrowed=pay.escrowed,
            escrow_balance=pay.escrow_balance,
            paid=ait(sum(w.paid_micro for w in pay.rows)),
            paid_micro=sum(w.paid_micro for w in pay.rows),
            slashed=ait(sum(w.slashed_micro for w in pay.rows)),
            slashed_micro=sum(w.slashed_micro for w in pay.rows),
            settled_round=pay.settled_round,
            finalized=pay.finalized,
            chain_txs=[
                DashboardChainTx(
                    kind=t.kind, round=t.round, tx_hash=t.tx_hash, status=t.status, confirmations=t.confirmations
                )
                for t in outbox.run_txs(s, run.id)
            ],
        ),
        ledger=ledger_head(ctx, s),
        **detail_fields(s, run),
        time=now,
    )


@dataclass(frozen=True, slots=True)
class _PayRow:
    """One contract's standing and pay, as the page shows them."""

    worker_id: str
    contract_id: str
    price: AIT  # AIT per round
    score: float | None
    rounds_accepted: int
    rounds_scored: int
    flags: list[str]
    paid: AIT
    paid_micro: int
    slashed: AIT
    slashed_micro: int


@dataclass(frozen=True, slots=True)
class _Pay:
    escrowed: AIT
    escrow_balance: AIT
    settled_round: int
    finalized: bool
    rows: list[_PayRow]


def _pay(ctx: Context, s: Session, run: Run) -> _Pay:
    """What the page shows of ``views.payments_view``, read in a fixed number of queries
    through the run's indexes (that view reads each contract's scores and settlements in
    queries of their own, by ``contract_id``, which no index covers: every poll of every
    open page scanned the whole scores table once per worker, slower as the record grows).
    The numbers are the view's: each score the mean of the contract's qualities summed in
    the same order."""
    contracts = s.scalars(select(Contract).where(Contract.run_id == run.id).order_by(Contract.created_at)).all()
    scores: dict[str, list[tuple[str, float, list[str]]]] = {}
    for contract_id, status, quality, flags in s.execute(
        select(Score.contract_id, Score.status, Score.quality, Score.flags)
        .where(Score.run_id == run.id)
        .order_by(Score.id)
    ):
        scores.setdefault(contract_id, []).append((status, quality, flags or []))
    settled = dict(
        s.execute(
            select(Settlement.contract_id, func.coalesce(func.sum(Settlement.paid), 0))
            .where(Settlement.run_id == run.id)
            .group_by(Settlement.contract_id)
        ).all()
    )
    rows = []
    for c in contracts:
        sc = scores.get(c.id, [])
        paid = int(settled.get(c.id, 0)) + c.paid_manual
        rows.append(
            _PayRow(
                worker_id=c.worker_id,
                contract_id=c.id,
                price=ait(c.price),
                score=(sum(q for _, q, _ in sc) / len(sc)) if sc else None,
                rounds_accepted=sum(st == ScoreStatus.ACCEPTED for st, _, _ in sc),
                rounds_scored=len(sc),
                flags=sorted({f for _, _, fl in sc for f in fl}),
                paid=ait(paid),
                paid_micro=paid,
                slashed=ait(c.slashed),
                slashed_micro=c.slashed,
            )
        )
    return _Pay(
        escrowed=ait(run.escrowed),
        escrow_balance=ait(ctx.ledger.balance(s, escrow_account(run.id))),
        settled_round=run.settled_round,
        finalized=run.finalized,
        rows=rows,
    )


def _workers(ctx: Context, s: Session, run: Run, pay_rows: list[_PayRow], *, now: float) -> list[DashboardWorker]:
    """One row per hired worker (its contract), with its latest job's progress and every
    flag it earned in this run: its scores' and the coordinator's records' (rejected
    updates, missed leases)."""
    jobs = s.scalars(select(Job).where(Job.run_id == run.id).order_by(Job.created_at)).all()
    answered: dict[str, str] = {u.job_id: u.status for u in views.run_updates(s, run, round=run.round)}
    latest: dict[str, Job] = {}
    for j in jobs:  # the newest job of each worker (a worker may be given its shard again)
        latest[j.worker_id] = j
    recorded: dict[str, set[str]] = {}
    for worker_id, kind in s.execute(select(Flag.worker_id, Flag.kind).where(Flag.run_id == run.id)).all():
        recorded.setdefault(worker_id, set()).add(kind)
    gpus = views.gpu_types(s, [p.worker_id for p in pay_rows])
    contracts = {c.id: c for c in s.scalars(select(Contract).where(Contract.run_id == run.id)).all()}
    rows = []
    for p in pay_rows:
        job = latest.get(p.worker_id)
        jv: JobView | None = views.job_view(ctx, job, run, answered.get(job.id), gpu=None, now=now) if job else None
        rows.append(
            DashboardWorker(
                worker_id=p.worker_id,
                gpu_type=gpus.get(p.worker_id),
                contract_status=ContractStatus(contracts[p.contract_id].status),
                status=jv.status if jv else None,
                progress=jv.progress if jv else None,
                loss=jv.loss if jv else None,
                speed=jv.speed if jv else None,
                rounds_done=jv.rounds_done if jv else 0,
                end_reason=jv.end_reason if jv else None,
                last_heartbeat_age=jv.last_heartbeat_age if jv else None,
                score=p.score,
                rounds_accepted=p.rounds_accepted,
                rounds_scored=p.rounds_scored,
                price=p.price,
                paid=p.paid,
                paid_micro=p.paid_micro,
                slashed=p.slashed,
                slashed_micro=p.slashed_micro,
                flags=sorted(set(p.flags) | recorded.get(p.worker_id, set())),
            )
        )
    return rows


def ledger_head(ctx: Context, s: Session) -> DashboardLedger:
    """The ledger's head as the ledger records it (what ``GET /v1/ledger`` shows)."""
    head = s.get(Head, 1)
    return DashboardLedger(
        network=ctx.ledger.network,
        entries=head.seq if head else 0,
        head=head.hash if head and head.seq else None,
    )
