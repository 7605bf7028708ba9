"""The rounds of a live run: open, close, aggregate, recover.

The round driver (:mod:`.driver`) calls these. The torch work of a round (decode the
updates, robust aggregation, outer step, evaluation, checkpoint) runs outside any
transaction; the results are then committed in one transaction together with the state
change. A coordinator killed at any point redoes the round from what is persisted: the
accepted updates (rows + blobs) and the previous round's checkpoint and optimizer state.
Same inputs, same bytes, same CIDs: redoing is harmless.

Shape letters: ``n`` updates, ``d`` parameters.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from typing import Any

import torch
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from torch import Tensor

from aitbc.coordinator import states
from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import unprocessable
from aitbc.coordinator.models import Contract, Flag, Job, Offer, RoundRecord, Run, Update, new_id
from aitbc.coordinator.runs import busy_workers, lock_run, market_offers
from aitbc.core.aggregation import parse_aggregator
from aitbc.core.compression import build_codec
from aitbc.core.compression import decode as decode_update
from aitbc.core.options import parse_spec
from aitbc.core.outer import build_outer
from aitbc.errors import AitbcError
from aitbc.market.ranking import rank_offers
from aitbc.training.checkpoint import (
    bytes_to_tensors,
    checkpoint_bytes,
    flat_params,
    load_shard,
    set_flat_params,
    tensors_to_bytes,
)
from aitbc.training.data_spec import DataSpec
from aitbc.training.local import LocalConfig, evaluate
from aitbc.training.models import build_model, model_config

OUTER_FORMAT = "aitbc.outer-state/1"


def data_spec(manifest: dict[str, Any]) -> DataSpec:
    s = manifest["spec"]
    return DataSpec(s["task"], tuple(int(v) for v in s["input_shape"]), int(s["num_classes"]))


def build_initial_model(run: Run) -> torch.nn.Module:
    torch.manual_seed(run.seed)  # the initial weights are a function of the run's seed
    return build_model(run.model_type, data_spec(run.manifest), run.model_options)


def default_f(workers: int) -> int:
    """Attackers a rule that takes ``f`` tolerates when the owner gave none: the most
    Bulyan allows (n >= 4f + 3), so every rule's condition holds with all workers in."""
    return max(0, (workers - 3) // 4)


def check_training_config(run: Run, cfg: dict[str, Any], *, workers: int) -> dict[str, Any]:
    """Build everything the config names once, so a bad name or option is a 422 now, not a
    failure at round 1. Returns derived values stored with the config."""
    try:
        LocalConfig(steps=cfg["local_steps"], batch_size=cfg["batch_size"], optimizer=cfg["inner_opt"], lr=cfg["lr"])
        model = build_initial_model(run)
        layout = [tuple(p.shape) for p in model.parameters()]
        f = default_f(workers)
        agg = parse_aggregator(cfg["aggregator"], default_f=f)
        agg.check(min(workers, cfg["quorum"]) if cfg.get("deadline") else workers)
        name, opts = parse_spec(cfg["compression"], what="codec")
        build_codec(name, opts, layout=layout, error_feedback=cfg["error_feedback"])
        build_outer(cfg["outer"], cfg["outer_options"])
    except (AitbcError, ValueError) as e:
        raise unprocessable("bad_config", str(e)) from None
    mcfg = model_config(run.model_type, run.model_options)
    return {
        "d": sum(p.numel() for p in model.parameters()),
        "f": f,
        "model_options_full": {} if mcfg is None else asdict(mcfg),
    }


class RunRuntime:
    """What the driver keeps in memory for one run: the model (for evaluation and
    checkpoints), validation data, the aggregation pipeline and the outer optimizer with
    the state that produced ``params``. Rebuilt from the database after a restart."""

    def __init__(self, ctx: Context, run: Run) -> None:
        cfg = run.config
        self.model = build_initial_model(run)
        self.aggregator = parse_aggregator(cfg["aggregator"], default_f=cfg["f"])
        self.outer_name, self.outer_options = cfg["outer"], cfg["outer_options"]
        val = load_shard(ctx.store.get_bytes(run.manifest["val"]["cid"]))
        k = ctx.settings.eval_samples
        self.val_x, self.val_y = val[0][:k], val[1][:k]
        self.d = cfg["d"]
        self.params_cid: str | None = None
        self.params: Tensor | None = None  # (d,)
        self.outer_cid: str | None = None
        self.outer_state: dict[str, Tensor] = {}
        self.lock = threading.Lock()

    def load(self, ctx: Context, run: Run) -> None:
        """Bring params and outer state to those the run's database row names."""
        if self.params_cid != run.global_cid:
            from aitbc.training.checkpoint import load_checkpoint

            load_checkpoint(self.model, ctx.store.get_bytes(run.global_cid))
            self.params, self.params_cid = flat_params(self.model), run.global_cid
        if self.outer_cid != run.outer_state_cid:
            self.outer_state = bytes_to_tensors(ctx.store.get_bytes(run.outer_state_cid)) if run.outer_state_cid else {}
            self.outer_cid = run.outer_state_cid

    def checkpoint(self, ctx: Context, run: Run, params: Tensor, round: int) -> tuple[str, int]:
        set_flat_params(self.model, params)
        blob = checkpoint_bytes(
            self.model, model_name=run.model_type, model_options=run.config["model_options_full"], round=round
        )
        return ctx.store.put_bytes(blob), len(blob)

    def evaluate(self, params: Tensor) -> tuple[float, float | None]:
        set_flat_params(self.model, params)
        return evaluate(self.model, self.val_x, self.val_y)


def runtime(ctx: Context, run: Run) -> RunRuntime:
    rt = ctx.runtimes.get(run.id)
    if rt is None:
        rt = ctx.runtimes[run.id] = RunRuntime(ctx, run)
    return rt


def drop_runtime(ctx: Context, run_id: str) -> None:
    ctx.runtimes.pop(run_id, None)


# --- opening the first round ----------------------------------------------------------


def start_training(ctx: Context, run_id: str) -> None:
    """``distributing`` -> ``training``: write the initial model (round 0) and open round 1."""
    with ctx.session() as s:
        run = s.get(Run, run_id)
        if run is None or run.status != states.DISTRIBUTING:
            return
        rt = runtime(ctx, run)
        with rt.lock:
            params = flat_params(rt.model) if rt.params is None else rt.params
            cid, _ = rt.checkpoint(ctx, run, params, 0)
            loss, acc = rt.evaluate(params)
            rt.params, rt.params_cid = params, cid
        lock_run(s, run)
        if run.status != states.DISTRIBUTING:  # stopped meanwhile
            s.rollback()
            return
        now = time.time()
        s.merge(
            RoundRecord(
                run_id=run.id,
                round=0,
                checkpoint_cid=cid,
                val_loss=loss,
                val_accuracy=acc,
                started_at=now,
                closed_at=now,
            )
        )
        run.global_cid, run.initial_val_loss, run.val_loss, run.val_accuracy = cid, loss, loss, acc
        run.round, run.round_started_at = 1, now
        states.transition(run, states.TRAINING, now=now)
        s.commit()
    ctx.notifier.bump()


# --- closing a round -------------------------------------------------------------------


def round_due(ctx: Context, s: Session, run: Run, *, now: float) -> bool:
    """A round closes when every active job has answered it, or at its deadline once the
    quorum of accepted updates is met (the rest are stragglers)."""
    active = s.scalars(select(Job.id).where(Job.run_id == run.id, Job.status == "active")).all()
    answers = s.execute(
        select(Update.job_id, Update.status).where(Update.run_id == run.id, Update.round == run.round)
    ).all()
    answered = {j for j, _ in answers}
    accepted = sum(st == "accepted" for _, st in answers)
    if active and all(j in answered for j in active):
        return True  # nobody left to wait for (if none was accepted, the round is skipped)
    deadline = run.config.get("deadline")
    if deadline and run.round_started_at and now >= run.round_started_at + deadline:
        return accepted >= run.config["quorum"]
    return False


def close_round(ctx: Context, run_id: str) -> None:
    """``training`` -> ``aggregating`` -> ``training`` (next round) or ``complete``."""
    with ctx.session() as s:
        run = s.get(Run, run_id)
        if run is None:
            return
        if run.status == states.TRAINING:
            lock_run(s, run)  # no update commits between this check and the transition
            if run.status == states.TRAINING:
                states.transition(run, states.AGGREGATING)
            s.commit()
            ctx.notifier.bump()
        if run.status != states.AGGREGATING:
            return
        r = run.round
        ups = s.execute(
            select(Update, Job.shard_index)
            .join(Job, Job.id == Update.job_id)
            .where(Update.run_id == run.id, Update.round == r)
            .order_by(Job.shard_index, Update.id)
        ).all()
        accepted = [(u, shard) for u, shard in ups if u.status == "accepted"]
        final = r >= run.config["rounds"]
        rt = runtime(ctx, run)
        with rt.lock:
            rt.load(ctx, run)
            # The last round is evaluated before the run completes; the others after the
            # next round is open, so workers do not wait for an evaluation.
            result = _aggregate_round(ctx, run, rt, accepted, r, evaluate_now=final)
        _commit_round(ctx, s, run, rt, result, ups, accepted, round=r)
        if run.status in states.ENDED:
            drop_runtime(ctx, run.id)
    ctx.notifier.bump()
    if not final and eval_due(run.config, r):
        evaluate_round(ctx, run_id, r, result["params"])


def eval_due(cfg: dict[str, Any], r: int) -> bool:
    return r % cfg["eval_every"] == 0 or r >= cfg["rounds"]


def evaluate_round(ctx: Context, run_id: str, r: int, params: Tensor | None = None) -> None:
    """Score round ``r``'s global model on the validation split and record it (also how a
    restarted coordinator fills in an evaluation it did not get to)."""
    with ctx.session() as s:
        run = s.get(Run, run_id)
        rec = s.get(RoundRecord, (run_id, r))
        if run is None or rec is None or rec.val_loss is not None:
            return
        rt = runtime(ctx, run)
        with rt.lock:
            if params is None:
                from aitbc.training.checkpoint import load_checkpoint

                load_checkpoint(rt.model, ctx.store.get_bytes(rec.checkpoint_cid))
                params = flat_params(rt.model)
                rt.params_cid = None  # the model now holds round r, not the run's current params
            loss, acc = rt.evaluate(params)
        lock_run(s, run)
        s.refresh(rec)
        rec.val_loss, rec.val_accuracy = loss, acc
        later = s.scalar(
            select(RoundRecord.round)
            .where(RoundRecord.run_id == run_id, RoundRecord.round > r, RoundRecord.val_loss.is_not(None))
            .limit(1)
        )
        if later is None:
            run.val_loss, run.val_accuracy = loss, acc
        s.commit()
        if run.status in states.ENDED:
            drop_runtime(ctx, run_id)


def pending_evaluations(s: Session) -> list[tuple[str, int]]:
    """Rounds whose evaluation is due but missing (the coordinator died before it)."""
    rows = s.execute(
        select(RoundRecord.run_id, RoundRecord.round, Run.config)
        .join(Run, Run.id == RoundRecord.run_id)
        .where(RoundRecord.round > 0, RoundRecord.val_loss.is_(None))
    ).all()
    return [(run_id, r) for run_id, r, cfg in rows if cfg and eval_due(cfg, r)]


def _aggregate_round(
    ctx: Context,
    run: Run,
    rt: RunRuntime,
    accepted: list,
    r: int,
    *,
    evaluate_now: bool,
    weights: list[float] | None = None,
) -> dict[str, Any]:
    """``weights``: one per accepted update (default: its shard's sample count)."""
    params = rt.params
    outer_cid = run.outer_state_cid
    skipped = False
    if accepted:
        U = torch.stack(
            [decode_update(ctx.store.get_bytes(u.cid), max_numel=rt.d).to(torch.float32) for u, _ in accepted]
        )  # (n, d)
        if weights is None:  # the samples each update was trained on (a shard split since does not change them)
            weights = [float(u.samples) for u, _ in accepted]
        w = torch.tensor(weights, dtype=torch.float32)  # (n,)
        try:
            rt.aggregator.check(U.shape[0])
        except AitbcError:
            skipped = True
        if not skipped:
            delta = rt.aggregator(U, w, round_index=r)  # (n, d) -> (d,)
            outer = build_outer(rt.outer_name, rt.outer_options)
            if rt.outer_state:
                outer.load_state_dict({k: v.clone() for k, v in rt.outer_state.items()})
            params = outer.step(params, delta)
            state = outer.state_dict()
            if state:
                outer_cid = ctx.store.put_bytes(tensors_to_bytes(state, {"format": OUTER_FORMAT, "round": str(r)}))
    else:
        skipped = True
    loss = acc = None
    if evaluate_now:
        loss, acc = rt.evaluate(params)
    cid, size = rt.checkpoint(ctx, run, params, r)
    return {
        "params": params,
        "cid": cid,
        "size": size,
        "outer_cid": outer_cid,
        "val_loss": loss,
        "val_accuracy": acc,
        "skipped": skipped,
    }


def _commit_round(
    ctx: Context,
    s: Session,
    run: Run,
    rt: RunRuntime,
    res: dict,
    ups: list,
    accepted: list,
    *,
    round: int,
    advance: bool = True,
) -> bool:
    """Record ``res`` as round ``round``'s result; ``advance``: also open the next round
    or complete the run (a manual run stays ``aggregating`` until its owner moves it).
    Returns False, recording nothing, if the run moved meanwhile (stopped, or that round
    recorded by a concurrent request, or another round now closed)."""
    lock_run(s, run)
    if run.status != states.AGGREGATING or run.round != round or s.get(RoundRecord, (run.id, round)) is not None:
        s.rollback()
        return False
    now = time.time()
    r = run.round
    active = s.scalars(select(Job).where(Job.run_id == run.id, Job.status == "active")).all()
    answered = {u.job_id for u, _ in ups}
    stragglers = sorted(j.worker_id for j in active if j.id not in answered and j.joined_round <= r)
    for wid in stragglers:
        s.add(
            Flag(
                worker_id=wid,
                run_id=run.id,
                round=r,
                kind="straggler",
                reason=f"no update for round {r} by its close",
                created_at=now,
            )
        )
    train_losses = [u.train_loss for u, _ in accepted if u.train_loss is not None]
    prev_size = len(ctx.store.get_bytes(run.global_cid)) if run.global_cid else 0
    s.merge(
        RoundRecord(
            run_id=run.id,
            round=r,
            checkpoint_cid=res["cid"],
            outer_state_cid=res["outer_cid"],
            val_loss=res["val_loss"],
            val_accuracy=res["val_accuracy"],
            train_loss=sum(train_losses) / len(train_losses) if train_losses else None,
            accepted=len(accepted),
            rejected=sum(u.status == "rejected" for u, _ in ups),
            stragglers=stragglers,
            skipped=res["skipped"],
            started_at=run.round_started_at or now,
            closed_at=now,
        )
    )
    jobs_by_id = {j.id: j for j in active}
    for u, _ in accepted:
        if u.job_id in jobs_by_id:
            jobs_by_id[u.job_id].rounds_done += 1
    run.global_cid, run.outer_state_cid = res["cid"], res["outer_cid"]
    run.bytes_down += prev_size * len(ups)  # each answer began with a download of the model
    if res["val_loss"] is not None:
        run.val_loss, run.val_accuracy = res["val_loss"], res["val_accuracy"]
    if not advance:
        run.updated_at = now
    elif r >= run.config["rounds"]:
        end_run(s, run, states.COMPLETE, reason=None, now=now)
    else:
        _drop_slowest(s, run, active, ups, now=now)
        run.round, run.round_started_at = r + 1, now
        states.transition(run, states.TRAINING, now=now)
    s.commit()
    rt.params, rt.params_cid = res["params"], res["cid"]
    if res["outer_cid"] != rt.outer_cid:
        rt.outer_state = bytes_to_tensors(ctx.store.get_bytes(res["outer_cid"])) if res["outer_cid"] else {}
        rt.outer_cid = res["outer_cid"]
    return True


def _drop_slowest(s: Session, run: Run, active: list[Job], ups: list, *, now: float) -> None:
    """Over the run's target (workers joined mid-run): release the slowest worker of the
    round, by the time from when it could start (the round's opening, or its joining)
    to its answer; no answer at all is slowest. No shard is left without a worker: if the
    slowest trains a shard alone, the fastest worker of a shard trained twice moves to it
    (from the next round); if no shard is trained twice, nobody is released."""
    if len(active) <= run.target_workers:
        return
    per_shard: dict[int, int] = {}
    for j in active:
        per_shard[j.shard_index] = per_shard.get(j.shard_index, 0) + 1
    start = run.round_started_at or now
    arrived = {u.job_id: u.created_at for u, _ in ups}

    def took(j: Job) -> float:
        return arrived[j.id] - max(start, j.created_at) if j.id in arrived else float("inf")

    slowest = max(active, key=lambda j: (took(j), j.id))
    if per_shard[slowest.shard_index] == 1:
        doubled = [j for j in active if per_shard[j.shard_index] > 1]
        if not doubled:
            return
        donor = min(doubled, key=lambda j: (took(j), j.id))
        donor.moved_from, donor.shard_index = donor.shard_index, slowest.shard_index
        donor.shard_cid, donor.updated_at = slowest.shard_cid, now
    end_job(
        s,
        slowest,
        "released",
        f"slowest in round {run.round} while over the target of {run.target_workers} workers",
        now=now,
    )


def end_run(s: Session, run: Run, status: str, *, reason: str | None, now: float | None = None) -> None:
    """End a run: every job and contract is released (in the same transaction)."""
    now = time.time() if now is None else now
    states.transition(run, status, now=now)
    if reason:
        run.error = reason
    for j in s.scalars(select(Job).where(Job.run_id == run.id, Job.status == "active")):
        end_job(s, j, "released", f"run {status}", now=now)
    for c in s.scalars(select(Contract).where(Contract.run_id == run.id, Contract.status.in_(("hired", "working")))):
        c.status = "released"


def end_job(s: Session, job: Job, status: str, reason: str, *, now: float) -> None:
    job.status, job.end_reason, job.updated_at = status, reason, now
    c = s.get(Contract, job.contract_id)
    if c is not None and c.status in ("hired", "working"):
        c.status = "failed" if status == "failed" else "released"


# --- failures, replacements and joiners -------------------------------------------------


def expire_leases(ctx: Context, s: Session, *, now: float) -> bool:
    """Fail every active job whose worker missed heartbeats past its lease and give its
    shard to a spare or another live offer. Returns whether anything changed."""
    lease = ctx.settings.lease_seconds
    live_runs = (states.DISTRIBUTING, states.TRAINING, states.AGGREGATING, states.PAUSED)
    jobs = s.execute(
        select(Job, Run)
        .join(Run, Run.id == Job.run_id)
        .where(Job.status == "active", Run.status.in_(live_runs), Run.control == "automatic")
    ).all()
    changed = False
    for job, run in jobs:
        if now - max(ctx.liveness.last_seen(job.worker_id) or 0.0, ctx.started_at) <= lease:
            continue  # the lease counts from our start at the earliest: nobody could reach us before
        lock_run(s, run)
        s.refresh(job)
        if job.status != "active":
            continue
        silent = now - max(ctx.liveness.last_seen(job.worker_id) or 0.0, ctx.started_at)
        reason = f"missed heartbeats for {silent:.1f} s (lease {lease:g} s)"
        end_job(s, job, "failed", reason, now=now)
        offer = s.get(Offer, job.worker_id)
        if offer is not None:
            offer.status, offer.failed_at = "failed", now
        s.add(
            Flag(
                worker_id=job.worker_id,
                run_id=run.id,
                round=run.round,
                kind="lease_expired",
                reason=reason,
                created_at=now,
            )
        )
        s.flush()
        assign_worker(ctx, s, run, job.shard_index, now=now, replaces=job.id)
        changed = True
    return changed


def assign_worker(
    ctx: Context, s: Session, run: Run, shard_index: int, *, now: float, replaces: str | None = None
) -> Job | None:
    """A job on ``shard_index`` for the best free worker: a spare this run already hired,
    else the best-ranked free live offer (hired now, at its price). None if nobody is free."""
    from aitbc.coordinator.payments import can_bond, post_bond

    lease = ctx.settings.lease_seconds
    taken = busy_workers(s)
    spares = s.scalars(
        select(Contract)
        .where(Contract.run_id == run.id, Contract.status == "hired")
        .order_by(Contract.score.desc(), Contract.id)
    ).all()
    contract = next((c for c in spares if ctx.liveness.alive(c.worker_id, now, lease)), None)
    if contract is None:
        in_run = set(s.scalars(select(Contract.worker_id).where(Contract.run_id == run.id)).all())
        free = [
            o
            for o in market_offers(ctx, s)
            if o.worker_id not in taken
            and o.worker_id not in in_run
            and can_bond(ctx, s, s.get(Offer, o.worker_id), run.bond)
        ]
        ranked = rank_offers(free, now=now, max_age=lease)
        if not ranked:
            return None
        best = s.get(Offer, ranked[0].offer.worker_id)
        contract = Contract(
            id=new_id("contract"),
            run_id=run.id,
            worker_id=best.id,
            price=best.price,
            score=ranked[0].score,
            status="hired",
            created_at=now,
        )
        s.add(contract)
        s.flush()
        post_bond(ctx, s, run, contract, best)
    return new_job(s, run, contract, shard_index, now=now, replaces=replaces)


def new_job(
    s: Session,
    run: Run,
    contract: Contract,
    shard_index: int,
    *,
    now: float,
    replaces: str | None = None,
    config: dict[str, Any] | None = None,
) -> Job:
    """The contract's worker trains ``shard_index`` from the open round (the caller commits)."""
    contract.status = "working"
    joined = run.round + 1 if run.status == states.AGGREGATING else max(run.round, 1)  # the first round it can train
    # A second job on a shard (a replacement, a joiner, a helper) gets its own batch order:
    # two workers on one shard from one seed would send the same update (and be flagged as copies).
    earlier = (
        s.scalar(select(func.count()).select_from(Job).where(Job.run_id == run.id, Job.shard_index == shard_index)) or 0
    )
    job = Job(
        id=new_id("job"),
        run_id=run.id,
        contract_id=contract.id,
        worker_id=contract.worker_id,
        shard_index=shard_index,
        shard_cid=run.manifest["shards"][shard_index]["cid"],
        status="active",
        joined_round=joined,
        replaces=replaces,
        seed=run.seed * 100_003 + shard_index + 1_000_033 * earlier,
        config=dict(config or {}),
        created_at=now,
        updated_at=now,
    )
    s.add(job)
    s.flush()
    return job


def fill_shards(ctx: Context, s: Session, run: Run, *, now: float) -> bool:
    """Give orphaned shards (their worker failed, nobody was free) to workers that became
    free or joined since; then grow towards ``max_workers`` with joiners on the shards
    that have the fewest workers."""
    active = s.scalars(select(Job).where(Job.run_id == run.id, Job.status == "active")).all()
    counts = [0] * len(run.manifest["shards"])
    for j in active:
        counts[j.shard_index] += 1
    open_shards = [
        i for i, e in enumerate(run.manifest["shards"]) if "split_into" not in e
    ]  # a split shard lives on in its halves
    changed = False
    n_active = len(active)
    while n_active < run.config["max_workers"]:
        shard = min(open_shards, key=lambda i: (counts[i], i))
        job = assign_worker(ctx, s, run, shard, now=now)
        if job is None:
            break
        counts[shard] += 1
        n_active += 1
        changed = True
    return changed
