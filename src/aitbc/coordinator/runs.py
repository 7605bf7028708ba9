"""Runs as the owner sees them: create, attach data, hire workers, distribute, stop.

Every function here takes a session and commits at most once, so each request is one
transaction (or none, when it is refused). Checks come before writes.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from aitbc.coordinator import states
from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import conflict, forbidden, not_found, unprocessable
from aitbc.coordinator.models import Contract, Flag, Job, Offer, RoundRecord, Run, Score, Update, new_id
from aitbc.coordinator.schemas import ContractCreate, DataAttach, Discover, Distribute, RunCreate
from aitbc.errors import AitbcError
from aitbc.ledger.book import RequestAuth
from aitbc.market.gpus import check_gpu_class
from aitbc.market.ranking import Offer as MarketOffer
from aitbc.market.ranking import rank_offers
from aitbc.storage.cid import is_cid
from aitbc.training.models import model_config
from aitbc.units import format_price, parse_price, parse_size

MANIFEST_FORMAT = "aitbc.manifest/1"
MAX_MANIFEST_BYTES = 4 << 20


def lock_run(s: Session, run: Run) -> Run:
    """Take the run's row for writing and re-read it, so what is checked next still holds
    at commit: SQLite's write lock (or a row lock on other databases) keeps the round
    driver and other requests out until this transaction ends. Check state after this."""
    s.execute(update(Run).where(Run.id == run.id).values(updated_at=time.time()))
    s.refresh(run)
    return run


def get_run(s: Session, run_id: str) -> Run:
    run = s.get(Run, run_id)
    if run is None:
        raise not_found("unknown_run", f"no training run {run_id!r}; list runs with: aitbc distributed-training list")
    return run


def owned_run(s: Session, run_id: str, signer: str) -> Run:
    """The run, locked for this request (see :func:`lock_run`), if ``signer`` (an
    address) owns it; 403 otherwise."""
    run = get_run(s, run_id)
    if run.owner != signer:
        raise forbidden(f"run {run_id} belongs to {run.owner}; {signer} may not control it")
    return lock_run(s, run)


# --- create --------------------------------------------------------------------------


def create_run(ctx: Context, s: Session, body: RunCreate, *, owner: str, owner_key: str, request: RequestAuth) -> Run:
    """A new run; with a budget, the budget moves into the run's escrow in the same
    transaction (a short balance refuses both)."""
    from aitbc.coordinator.payments import escrow, require_network

    size = parse_size(body.dataset_size)
    require_network(ctx, body.network)
    budget = parse_price(body.budget, field="budget") if body.budget is not None else None
    if budget == 0:
        raise unprocessable(
            "bad_price", "budget must be more than 0 AIT (or leave it out: distribute escrows the contracts' cost)"
        )
    bond = parse_price(body.bond, field="bond")
    try:
        model_config(body.model_type, body.model_options)  # unknown model or option -> error now
    except AitbcError as e:
        raise unprocessable("bad_model", str(e)) from None
    now = time.time()
    run = Run(
        id=new_id("training"),
        owner=owner,
        owner_key=owner_key,
        status=states.INITIALIZING,
        model_type=body.model_type,
        model_options=body.model_options,
        dataset_size=body.dataset_size,
        dataset_size_bytes=size,
        target_workers=body.target_workers,
        seed=body.seed,
        network=body.network,
        budget=budget,
        bond=bond,
        escrowed=0,
        created_at=now,
        updated_at=now,
        control=body.control,
    )
    s.add(run)
    s.flush()
    if budget:
        escrow(ctx, s, run, budget, dataclasses.replace(request, field="budget"), why="the budget")
    s.commit()
    return run


# --- data ----------------------------------------------------------------------------


def attach_data(ctx: Context, s: Session, run: Run, body: DataAttach) -> Run:
    """Record the dataset manifest (a blob already uploaded), checking every shard it names
    is present; the real data size is measured from the stored blobs."""
    states.require_status(run, states.INITIALIZING, action="upload data")
    manifest = load_manifest(ctx, body.manifest_cid)
    total = 0
    for entry in [*manifest["shards"], manifest["val"]]:
        if not ctx.store.has(entry["cid"]):
            raise unprocessable(
                "missing_blob",
                f"manifest names blob {entry['cid']} which was not uploaded; PUT /v1/blobs/{entry['cid']} first",
            )
        total += (ctx.store.dir / entry["cid"]).stat().st_size
    run.manifest_cid, run.manifest, run.data_bytes = body.manifest_cid, manifest, total
    run.data_source = body.source
    run.updated_at = time.time()
    s.commit()
    return run


def load_manifest(ctx: Context, cid: str) -> dict[str, Any]:
    if not is_cid(cid):
        raise unprocessable("bad_cid", f"{cid!r} is not a CID")
    if not ctx.store.has(cid):
        raise unprocessable("missing_blob", f"manifest blob {cid} was not uploaded; PUT /v1/blobs/{cid} first")
    raw = ctx.store.get_bytes(cid)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise unprocessable("bad_manifest", f"manifest is {len(raw)} bytes; at most {MAX_MANIFEST_BYTES}")
    try:
        m = json.loads(raw)
        ok = (
            m.get("format") == MANIFEST_FORMAT
            and isinstance(m.get("shards"), list)
            and m["shards"]
            and all(
                isinstance(e, dict) and is_cid(str(e.get("cid"))) and int(e.get("samples", 0)) > 0 for e in m["shards"]
            )
            and isinstance(m.get("val"), dict)
            and is_cid(str(m["val"].get("cid")))
            and isinstance(m.get("spec"), dict)
            and m["spec"].get("task") in ("classification", "language")
            and isinstance(m["spec"].get("input_shape"), list)
            and int(m["spec"].get("num_classes", 0)) > 0
        )
    except (ValueError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise unprocessable(
            "bad_manifest",
            f"blob {cid} is not an {MANIFEST_FORMAT} manifest (JSON with format, spec, shards[{{cid, samples}}], val{{cid}})",
        )
    return m


# --- hiring --------------------------------------------------------------------------


def busy_workers(s: Session) -> set[str]:
    """Workers hired by or working for a run that has not ended."""
    rows = s.execute(
        select(Contract.worker_id)
        .join(Run, Run.id == Contract.run_id)
        .where(Contract.status.in_(("hired", "working")), Run.status.not_in(tuple(states.ENDED)))
    )
    return {r[0] for r in rows}


def market_offers(ctx: Context, s: Session) -> list[MarketOffer]:
    offers = s.scalars(select(Offer).where(Offer.status == "online")).all()
    return [
        MarketOffer(
            worker_id=o.id,
            gpu=o.gpu,
            price=o.price / 1_000_000,
            reputation=o.reputation,
            availability=o.availability,
            last_heartbeat=ctx.liveness.last_seen(o.id) or o.last_heartbeat,
        )
        for o in offers
    ]


def discover(ctx: Context, s: Session, run: Run, body: Discover) -> dict[str, Any]:
    """Rank the free live offers and hire the top ``required_workers``; too few: 409, no contracts."""
    states.require_status(run, states.INITIALIZING, action="hire workers")
    min_gpu = None
    if body.min_gpu:
        try:
            min_gpu = check_gpu_class(body.min_gpu)
        except AitbcError as e:
            raise unprocessable("bad_gpu", str(e)) from None
    max_price = parse_price(body.max_price, field="max price") / 1_000_000 if body.max_price is not None else None
    now = time.time()
    from aitbc.coordinator.payments import can_bond, post_bond

    taken = busy_workers(s)
    pool = [o for o in market_offers(ctx, s) if o.worker_id not in taken]
    unbonded = [o for o in pool if not can_bond(ctx, s, s.get(Offer, o.worker_id), run.bond)]
    pool = [o for o in pool if o not in unbonded]
    ranked = rank_offers(pool, min_gpu=min_gpu, max_price=max_price, now=now, max_age=ctx.settings.lease_seconds)
    if len(ranked) < body.required_workers:
        asked = f" with GPU at least {min_gpu}" if min_gpu else ""
        asked += f" at most {format_price(parse_price(body.max_price))} AIT/round" if body.max_price is not None else ""
        asked += f" able to bond {format_price(run.bond)} AIT ({len(unbonded)} cannot)" if run.bond else ""
        raise conflict(
            "not_enough_workers",
            f"found {len(ranked)} free live offer{'s' if len(ranked) != 1 else ''}{asked} "
            f"(of {len(pool)} free, {len(taken)} busy); {body.required_workers} required; no contracts made",
        )
    contracts = []
    for r in ranked[: body.required_workers]:
        price = s.get(Offer, r.offer.worker_id).price  # the exact integer, not the float view
        c = Contract(
            id=new_id("contract"),
            run_id=run.id,
            worker_id=r.offer.worker_id,
            price=price,
            score=r.score,
            status="hired",
            created_at=now,
        )
        s.add(c)
        s.flush()
        post_bond(ctx, s, run, c, s.get(Offer, c.worker_id))
        contracts.append(c)
    run.updated_at = now
    s.commit()
    hired = {c.worker_id for c in contracts}
    return {
        "training_id": run.id,
        "ranked": [ranked_view(r, hired=r.offer.worker_id in hired) for r in ranked],
        "contracts": [contract_view(c) for c in contracts],
        "count": len(contracts),
    }


def hire(ctx: Context, s: Session, run: Run, body: ContractCreate) -> dict[str, Any]:
    """Hire one named provider at the owner's offered price per round (the SDK's
    ``negotiate_worker_contract``): accepted if it is at least the provider's asking price
    and the provider is live, free, and able to post the run's bond."""
    states.require_status(run, *LIVE, action="hire workers")
    c = hire_offer(ctx, s, run, body.worker_id, parse_price(body.price))
    s.commit()
    return contract_view(c)


LIVE = (states.INITIALIZING, states.DISTRIBUTING, states.TRAINING, states.AGGREGATING, states.PAUSED)


def hire_offer(ctx: Context, s: Session, run: Run, worker_id: str, price: int | None) -> Contract:
    """A ``hired`` contract with a live, free provider at ``price`` (None: its asking
    price), bond posted. The caller commits."""
    from aitbc.coordinator.payments import can_bond, post_bond

    offer = s.get(Offer, worker_id)
    if offer is None:
        raise not_found("unknown_worker", f"no offer from worker {worker_id!r}")
    price = offer.price if price is None else price
    now = time.time()
    if offer.status != "online" or not ctx.liveness.alive(offer.id, now, ctx.settings.lease_seconds):
        raise conflict("worker_not_live", f"worker {offer.id} is not live (status {offer.status})")
    if s.scalar(select(Contract.id).where(Contract.run_id == run.id, Contract.worker_id == offer.id)):
        raise conflict("already_contracted", f"worker {offer.id} already has a contract with run {run.id}")
    if offer.id in busy_workers(s):
        raise conflict("worker_busy", f"worker {offer.id} is hired by another run")
    if price < offer.price:
        raise conflict(
            "price_rejected",
            f"worker {offer.id} asks {format_price(offer.price)} AIT per round; {format_price(price)} was offered",
        )
    if not can_bond(ctx, s, offer, run.bond):
        raise conflict("cannot_bond", f"worker {offer.id} cannot post this run's bond of {format_price(run.bond)} AIT")
    from aitbc.market.ranking import offer_score

    c = Contract(
        id=new_id("contract"),
        run_id=run.id,
        worker_id=offer.id,
        price=price,
        status="hired",
        created_at=now,
        score=offer_score(
            MarketOffer(
                worker_id=offer.id,
                gpu=offer.gpu,
                price=price / 1_000_000,
                reputation=offer.reputation,
                availability=offer.availability,
                last_heartbeat=now,
            )
        ),
    )
    s.add(c)
    s.flush()
    post_bond(ctx, s, run, c, offer)
    run.updated_at = now
    return c


def ranked_view(r, *, hired: bool) -> dict[str, Any]:
    o = r.offer
    return {
        "worker_id": o.worker_id,
        "gpu_type": o.gpu,
        "price": o.price,
        "reputation": o.reputation,
        "availability": o.availability,
        "score": round(r.score, 6),
        "hired": hired,
    }


def contract_view(c: Contract) -> dict[str, Any]:
    return {
        "contract_id": c.id,
        "worker_id": c.worker_id,
        "training_id": c.run_id,
        "price": format_price(c.price),
        "price_micro": c.price,
        "status": c.status,
        "score": round(c.score, 6),
    }


# --- distribute ----------------------------------------------------------------------


def distribute(ctx: Context, s: Session, run: Run, body: Distribute, request: RequestAuth) -> Run:
    """Check the training config against the run, assign shards to hired workers and move
    to ``distributing``; the round driver then writes the initial model and opens round 1.
    (A manual run moves there with ``POST /runs/{id}/phase``, and the owner makes the jobs.)"""
    if run.control == "manual":
        raise conflict(
            "manual_control",
            f"run {run.id} is under manual control: set its phase (POST /v1/runs/{run.id}/phase "
            f"with phase distributing and the config) and send its jobs yourself",
        )
    hired = configure(ctx, s, run, body, request)
    n_shards = len(run.manifest["shards"])
    now = time.time()
    from aitbc.coordinator.rounds import new_job

    for i, c in enumerate(hired[:n_shards]):
        new_job(s, run, c, i, now=now)
    states.transition(run, states.DISTRIBUTING, now=now)
    s.commit()
    ctx.notifier.poke_driver()
    return run


def configure(
    ctx: Context, s: Session, run: Run, body: Distribute, request: RequestAuth, *, cost_field: str = "max_cost"
) -> list[Contract]:
    """Check the training config against the run and store it; a run without a budget
    escrows the hired contracts' cost (at most ``max_cost``). Returns the hired contracts,
    best first. The caller commits."""
    from aitbc.coordinator.rounds import check_training_config  # torch: imported on use

    states.require_status(run, states.INITIALIZING, action="distribute")
    if run.manifest is None:
        raise conflict(
            "no_data",
            f"run {run.id} has no data yet; run: aitbc distributed-training upload-data --training-id {run.id} --data-path PATH",
        )
    hired = s.scalars(
        select(Contract)
        .where(Contract.run_id == run.id, Contract.status == "hired")
        .order_by(Contract.score.desc(), Contract.id)
    ).all()
    if not hired:
        raise conflict(
            "no_workers",
            f"run {run.id} has hired no workers; run: aitbc distributed-training discover-workers --training-id {run.id}",
        )
    n_shards = len(run.manifest["shards"])
    cfg = body.model_dump(exclude={"max_cost"})
    cfg["min_workers"] = body.min_workers or 1
    cfg["max_workers"] = body.max_workers or max(run.target_workers, cfg["min_workers"])
    cfg["quorum"] = body.quorum or cfg["min_workers"]
    if cfg["min_workers"] > cfg["max_workers"]:
        raise unprocessable(
            "bad_config", f"min_workers ({cfg['min_workers']}) exceeds max_workers ({cfg['max_workers']})"
        )
    cfg.update(check_training_config(run, cfg, workers=min(len(hired), n_shards)))
    if run.budget is None:  # no budget at init: escrow what the contracts will cost
        from aitbc.coordinator.payments import distribution_cost, escrow

        cost = distribution_cost(cfg["rounds"], list(hired[:n_shards]))
        if body.max_cost is None:
            raise unprocessable(
                "no_budget",
                f"run {run.id} has no budget: distribute escrows the contracts' cost "
                f"({format_price(cost)} AIT) and needs max_cost signed in the request",
            )
        limit = parse_price(body.max_cost, field="max_cost")
        if cost > limit:
            raise conflict(
                "over_max_cost",
                f"the contracts cost {format_price(cost)} AIT over {cfg['rounds']} rounds; "
                f"max_cost allows {format_price(limit)}",
            )
        escrow(
            ctx,
            s,
            run,
            cost,
            dataclasses.replace(request, field=cost_field),
            why=f"{min(len(hired), n_shards)} workers x {cfg['rounds']} rounds at their agreed prices",
        )
    run.config = cfg
    return list(hired)


# --- owner controls ------------------------------------------------------------------


def stop(ctx: Context, s: Session, run: Run) -> Run:
    if run.status in states.ENDED:
        raise conflict("run_ended", f"run {run.id} has already ended ({run.status})")
    from aitbc.coordinator.rounds import drop_runtime, end_run

    end_run(s, run, states.FAILED, reason="stopped by the owner")
    s.commit()
    drop_runtime(ctx, run.id)
    ctx.notifier.bump()
    return run


def pause(ctx: Context, s: Session, run: Run) -> Run:
    states.transition(run, states.PAUSED)
    s.commit()
    ctx.notifier.bump()
    return run


def resume(ctx: Context, s: Session, run: Run) -> Run:
    if run.status in states.ENDED:
        raise conflict("run_ended", f"run {run.id} has ended ({run.status}); it cannot resume")
    if run.status != states.PAUSED:
        raise conflict("bad_state", f"run {run.id} is {run.status}, not paused")
    states.transition(run, run.paused_from or states.TRAINING)
    if run.status == states.TRAINING:
        run.round_started_at = time.time()  # the deadline counts from the resume
    s.commit()
    ctx.notifier.bump()
    ctx.notifier.poke_driver()
    return run


# --- views ---------------------------------------------------------------------------


def run_summary(run: Run) -> dict[str, Any]:
    cfg = run.config or {}
    return {
        "training_id": run.id,
        "status": run.status,
        "owner": run.owner,
        "model_type": run.model_type,
        "dataset_size": run.dataset_size,
        "target_workers": run.target_workers,
        "round": run.round,
        "rounds": cfg.get("rounds"),
        "val_loss": run.val_loss,
        "control": run.control,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
    }


def run_detail(ctx: Context, s: Session, run: Run) -> dict[str, Any]:
    now = time.time()
    jobs = s.scalars(select(Job).where(Job.run_id == run.id).order_by(Job.shard_index, Job.created_at)).all()
    contracts = s.scalars(select(Contract).where(Contract.run_id == run.id).order_by(Contract.created_at)).all()
    submitted = {
        (u.job_id): u.status
        for u in s.scalars(select(Update).where(Update.run_id == run.id, Update.round == run.round)).all()
    }
    scores = contract_scores(s, run.id)
    rounds_closed = (
        s.scalar(
            select(func.count()).select_from(RoundRecord).where(RoundRecord.run_id == run.id, RoundRecord.round > 0)
        )
        or 0
    )
    flags = s.scalar(select(func.count()).select_from(Flag).where(Flag.run_id == run.id)) or 0
    cfg = run.config or {}
    deadline_at = (run.round_started_at + cfg["deadline"]) if cfg.get("deadline") and run.round_started_at else None
    return {
        **run_summary(run),
        "model_options": run.model_options,
        "seed": run.seed,
        "dataset_size_bytes": run.dataset_size_bytes,
        "data_source": run.data_source,
        "manifest_cid": run.manifest_cid,
        "data_bytes": run.data_bytes,
        "shards": len(run.manifest["shards"]) if run.manifest else 0,
        "config": cfg,
        "global_model_cid": run.global_cid,
        "network": run.network,
        "budget": None if run.budget is None else format_price(run.budget),
        "bond": format_price(run.bond),
        "escrowed": format_price(run.escrowed),
        "initial_val_loss": run.initial_val_loss,
        "val_accuracy": run.val_accuracy,
        "rounds_completed": rounds_closed,
        "bytes_up": run.bytes_up,
        "bytes_down": run.bytes_down,
        "error": run.error,
        "flags": flags,
        "round_started_at": run.round_started_at,
        "deadline_at": deadline_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "paused_from": run.paused_from,
        "contracts": [contract_view(c) for c in contracts],
        "workers": [
            {**job_view(ctx, j, submitted.get(j.id), now=now), **scores.get(j.contract_id, _NO_SCORE)} for j in jobs
        ],
        "time": now,
    }


_NO_SCORE = {"score": None, "last_quality": None, "score_flags": []}


def contract_scores(s: Session, run_id: str) -> dict[str, dict[str, Any]]:
    """Per contract: mean quality over its scored rounds, the latest one, and every flag."""
    out: dict[str, dict[str, Any]] = {}
    for sc in s.scalars(select(Score).where(Score.run_id == run_id).order_by(Score.round)).all():
        d = out.setdefault(sc.contract_id, {"qualities": [], "score_flags": set()})
        d["qualities"].append(sc.quality)
        d["score_flags"].update(sc.flags)
    return {
        c: {
            "score": sum(d["qualities"]) / len(d["qualities"]),
            "last_quality": d["qualities"][-1],
            "score_flags": sorted(d["score_flags"]),
        }
        for c, d in out.items()
    }


def job_view(ctx: Context, j: Job, this_round: str | None, *, now: float) -> dict[str, Any]:
    seen = ctx.liveness.last_seen(j.worker_id)
    return {
        "job_id": j.id,
        "worker_id": j.worker_id,
        "contract_id": j.contract_id,
        "shard_index": j.shard_index,
        "shard_cid": j.shard_cid,
        "job_status": j.status,
        "status": j.worker_status if j.status == "active" else j.status,
        "progress": j.progress,
        "loss": j.loss,
        "epoch": j.epoch,
        "rounds_done": j.rounds_done,
        "this_round": this_round,
        "joined_round": j.joined_round,
        "replaces": j.replaces,
        "end_reason": j.end_reason,
        "compute_seconds": j.compute_seconds,
        "config": j.config or {},
        "last_heartbeat_age": None if seen is None else round(now - seen, 3),
    }


def rounds_view(s: Session, run: Run) -> list[dict[str, Any]]:
    rows = s.scalars(select(RoundRecord).where(RoundRecord.run_id == run.id).order_by(RoundRecord.round)).all()
    return [
        {
            "round": r.round,
            "checkpoint_cid": r.checkpoint_cid,
            "val_loss": r.val_loss,
            "val_accuracy": r.val_accuracy,
            "train_loss": r.train_loss,
            "accepted": r.accepted,
            "rejected": r.rejected,
            "stragglers": r.stragglers,
            "skipped": r.skipped,
            "started_at": r.started_at,
            "closed_at": r.closed_at,
        }
        for r in rows
    ]


def results(ctx: Context, s: Session, run: Run) -> dict[str, Any]:
    rounds = rounds_view(s, run)
    scores = contract_scores(s, run.id)
    done = [r for r in rounds if r["round"] > 0]
    updates = s.scalars(select(Update).where(Update.run_id == run.id)).all()
    return {
        "training_id": run.id,
        "status": run.status,
        "error": run.error,
        "model_cid": run.result_cid or run.global_cid,
        "rounds_completed": len(done),
        "rounds": (run.config or {}).get("rounds"),
        "initial_val_loss": run.initial_val_loss,
        "final_val_loss": run.val_loss,
        "final_val_accuracy": run.val_accuracy,
        "bytes_up": run.bytes_up,
        "bytes_down": run.bytes_down,
        "updates_accepted": sum(u.status == "accepted" for u in updates),
        "updates_rejected": sum(u.status == "rejected" for u in updates),
        "wall_seconds": (run.finished_at or time.time()) - run.started_at if run.started_at else None,
        "checkpoints": [{"round": r["round"], "cid": r["checkpoint_cid"]} for r in rounds],
        "workers": [
            {"worker_id": c.worker_id, "contract_id": c.id, "status": c.status, **scores.get(c.id, _NO_SCORE)}
            for c in s.scalars(select(Contract).where(Contract.run_id == run.id).order_by(Contract.created_at)).all()
        ],
    }


def list_runs(s: Session, *, owner: str | None = None, status: str | None = None) -> list[Run]:
    q = select(Run).order_by(Run.created_at.desc())
    if owner:
        q = q.where(Run.owner == owner)
    if status:
        if status not in states.STATES:
            raise unprocessable("bad_status", f"unknown status {status!r}; one of: {', '.join(states.STATES)}")
        q = q.where(Run.status == status)
    return list(s.scalars(q).all())
