"""The owner's use-cases for a run: create it, attach its data, hire workers, distribute,
stop, pause and resume; pay a contract and refund the escrow by hand.

Every function here takes a session and commits at most once, so each request is one
transaction (or none, when it is refused). Checks come before writes.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import conflict, not_found, unprocessable
from aitbc.coordinator.live.model_size import require_within_limit, run_params
from aitbc.coordinator.live.runtime import build_run_config, data_spec, drop_runtime, store_weights
from aitbc.coordinator.money import onchain
from aitbc.coordinator.money.escrow import (
    can_bond,
    distribution_cost,
    escrow,
    finalize,
    ledger_error,
    post_bond,
    require_hire_funds,
    require_network,
)
from aitbc.coordinator.runs.pretrained import check_pretrained
from aitbc.coordinator.runs.views import contract_view, payments_view, ranked_view
from aitbc.coordinator.schemas import ContractCreate, DataAttach, Discover, Distribute, RunCreate
from aitbc.coordinator.store.models import Contract, Job, Offer, RoundRecord, Run, new_id
from aitbc.coordinator.store.repository import row
from aitbc.coordinator.store.run_config import RunConfig
from aitbc.coordinator.store.states import ENDED, LIVE, require_status, transition
from aitbc.coordinator.workforce.hiring import busy_workers, end_run, hire_offer, market_offers, new_job
from aitbc.core.options import parse_spec
from aitbc.errors import AitbcError
from aitbc.ledger.book import LedgerError, RequestAuth
from aitbc.ledger.chain import escrow_account, wallet_account
from aitbc.market.capacity import too_small
from aitbc.market.gpus import check_gpu_class
from aitbc.market.ranking import rank_offers
from aitbc.replies.money import ManualPayment, Payments
from aitbc.replies.runs import ContractView, Discovery
from aitbc.run_mode import RunMode
from aitbc.states import ContractStatus, Control, RunStatus
from aitbc.storage.cid import is_cid
from aitbc.training.models import check_model
from aitbc.units import MICRO, ait, format_price, parse_amount, parse_price, parse_size

MANIFEST_FORMAT = "aitbc.manifest/1"
MAX_MANIFEST_BYTES = 4 << 20


# --- create --------------------------------------------------------------------------


def create_run(ctx: Context, s: Session, body: RunCreate, *, owner: str, owner_key: str, request: RequestAuth) -> Run:
    """A new run; with a budget, the budget moves into the run's escrow in the same
    transaction (a short balance refuses both)."""
    size = parse_size(body.dataset_size)
    require_network(ctx, body.network)
    budget = parse_price(body.budget, field="budget") if body.budget is not None else None
    if budget == 0:
        raise unprocessable(
            "bad_price", "budget must be more than 0 AIT (or leave it out: distribute escrows the contracts' cost)"
        )
    bond = parse_price(body.bond, field="bond")
    onchain.require_settleable(ctx, body.target_workers)
    owner_evm = onchain.evm_account(ctx, body.evm_address, body.evm_proof, wallet=owner, whose="the run's owner")
    if Control(body.control) == Control.MANUAL:
        onchain.refuse_on_chain(ctx, "manual control", "create the run with control automatic")
    if budget is not None:
        onchain.refuse_on_chain(
            ctx, "a budget escrowed from a wallet here", "leave budget out and deposit on chain (aitbc chain deposit)"
        )
    try:
        # code not allowed here, unknown model, bad or out-of-range option -> 422 now, nothing imported;
        # over this coordinator's --max-params, counted from the options: a lower bound (the data may
        # make it larger: counted again when it is attached)
        check_model(
            body.model_type, body.model_options, allow_code=ctx.settings.allow_code, max_params=ctx.settings.max_params
        )
    except AitbcError as e:
        raise unprocessable("bad_model", str(e)) from None
    check_pretrained(ctx, body.model_type, body.model_options)
    now = time.time()
    run = Run(
        id=new_id("training"),
        owner=owner,
        owner_key=owner_key,
        status=RunStatus.INITIALIZING,
        model_type=body.model_type,
        model_options=body.model_options,
        dataset_size=body.dataset_size,
        dataset_size_bytes=size,
        target_workers=body.target_workers,
        seed=body.seed,
        network=body.network,
        owner_evm=owner_evm,
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
    is present; the real data size is measured from the stored blobs.

    While ``initializing``; or while an owner-driven run is ``distributing`` and has no job
    yet (the documented flow cuts the shards after that phase move), if the data is of the
    same kind (the manifest's ``spec``), so the checked config still holds."""
    recut = run.status == RunStatus.DISTRIBUTING and run.control == Control.MANUAL
    if not recut:
        require_status(run, RunStatus.INITIALIZING, action="upload data")
    manifest = load_manifest(ctx, body.manifest_cid)
    if recut:
        if s.scalar(select(Job.id).where(Job.run_id == run.id).limit(1)) is not None:
            raise conflict("jobs_sent", f"run {run.id} has jobs on its shards already; its data can no longer change")
        if run.manifest is not None and manifest["spec"] != run.data_manifest["spec"]:
            raise unprocessable(
                "bad_manifest",
                f"run {run.id} was configured for data {run.data_manifest['spec']}; this manifest is "
                f"{manifest['spec']}",
            )
    try:
        spec = data_spec(manifest)
    except (ValueError, TypeError) as e:
        raise unprocessable("bad_manifest", f"manifest {body.manifest_cid}'s spec is not a data spec: {e}") from None
    # the exact count, now that the data's shape and classes (or vocabulary) are known
    require_within_limit(run.model_type, run.model_options, spec, ctx.settings.max_params)
    total = 0
    for entry in [*manifest["shards"], manifest["val"], *([manifest["tokenizer"]] if "tokenizer" in manifest else [])]:
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
    if recut:
        drop_runtime(ctx, run.id)  # its validation data is rebuilt from the new manifest
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
            and _newer_keys_ok(m)
        )
    except (ValueError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise unprocessable(
            "bad_manifest",
            f"blob {cid} is not an {MANIFEST_FORMAT} manifest (JSON with format, spec, shards[{{cid, samples}}], "
            f"val{{cid}}; optional tokenizer{{cid, vocab_size}} for language data, measured{{bytes, ...}})",
        )
    return m


MEASURED_KEYS = ("bytes", "documents", "tokens", "samples", "val_samples")


def _newer_keys_ok(m: dict[str, Any]) -> bool:
    """``tokenizer`` (language data only; its vocabulary is the data's classes) and
    ``measured`` (64-bit non-negative integers or null, ``bytes`` set; the owner's
    measurement of their own data) are optional: older manifests have neither."""
    t = m.get("tokenizer")
    if t is not None and not (
        isinstance(t, dict)
        and is_cid(str(t.get("cid")))
        and m["spec"]["task"] == "language"
        and type(t.get("vocab_size")) is int
        and t["vocab_size"] == m["spec"]["num_classes"]
    ):
        return False
    ms = m.get("measured")
    if ms is None:
        return True
    return (
        isinstance(ms, dict)
        and set(ms) <= set(MEASURED_KEYS)
        and type(ms.get("bytes")) is int
        and all(ms.get(k) is None or (type(ms[k]) is int and 0 <= ms[k] < 2**63) for k in MEASURED_KEYS)
    )


# --- hiring --------------------------------------------------------------------------


def discover(ctx: Context, s: Session, run: Run, body: Discover) -> Discovery:
    """Rank the free live offers and hire the top ``required_workers``; too few, or an owner
    who cannot pay for them (:func:`.escrow.require_hire_funds`): 409, no contracts, no bonds."""
    require_status(run, RunStatus.INITIALIZING, action="hire workers")
    min_gpu = None
    if body.min_gpu:
        try:
            min_gpu = check_gpu_class(body.min_gpu)
        except AitbcError as e:
            raise unprocessable("bad_gpu", str(e)) from None
    max_price = parse_price(body.max_price, field="max price") / MICRO if body.max_price is not None else None
    now = time.time()
    taken = busy_workers(s)
    # a provider this run hired before (its hire expired) is not hired twice: one contract per run and worker
    taken |= set(s.scalars(select(Contract.worker_id).where(Contract.run_id == run.id)).all())
    pool = [o for o in market_offers(ctx, s) if o.worker_id not in taken]
    unbonded = [o for o in pool if not can_bond(ctx, s, row(s, Offer, o.worker_id), run.bond)]
    pool = [o for o in pool if o not in unbonded]
    params = run_params(run)
    small = [o for o in pool if too_small(o.max_params, params)]
    fitting = [o for o in pool if o not in small]
    ranked = rank_offers(fitting, min_gpu=min_gpu, max_price=max_price, now=now, max_age=ctx.settings.lease_seconds)
    accounts = onchain.accounts_in_run(ctx, s, run)  # EVM: one contract of a run per account, the best offer's
    shared = [r for r in ranked if not onchain.account_free(ctx, row(s, Offer, r.offer.worker_id), accounts)]
    ranked = [r for r in ranked if r not in shared]
    if len(ranked) < body.required_workers:
        asked = f" with GPU at least {min_gpu}" if min_gpu else ""
        asked += f" at most {format_price(parse_price(body.max_price))} AIT/round" if body.max_price is not None else ""
        asked += f" able to bond {format_price(run.bond)} AIT ({len(unbonded)} cannot)" if run.bond else ""
        if small:
            asked += f" able to train the run's {params:,} parameters ({len(small)} too small)"
        if shared:
            asked += f" paid at an EVM account of their own ({len(shared)} share one)"
        raise conflict(
            "not_enough_workers",
            f"found {len(ranked)} free live offer{'s' if len(ranked) != 1 else ''}{asked} "
            f"(of {len(pool)} free, {len(taken)} busy); {body.required_workers} required; no contracts made",
        )
    chosen = ranked[: body.required_workers]
    prices = {r.offer.worker_id: row(s, Offer, r.offer.worker_id).price for r in chosen}  # exact integers
    require_hire_funds(ctx, s, run, prices.values())  # the owner's money first: nothing written if short
    contracts = []
    for r in chosen:
        price = prices[r.offer.worker_id]
        c = Contract(
            id=new_id("contract"),
            run_id=run.id,
            worker_id=r.offer.worker_id,
            price=price,
            score=r.score,
            status=ContractStatus.HIRED,
            created_at=now,
        )
        s.add(c)
        s.flush()
        post_bond(ctx, s, run, c, row(s, Offer, c.worker_id))
        contracts.append(c)
    run.updated_at = now
    s.commit()
    hired = {c.worker_id for c in contracts}
    return Discovery(
        training_id=run.id,
        ranked=[ranked_view(r, hired=r.offer.worker_id in hired) for r in ranked],
        contracts=[contract_view(c) for c in contracts],
        count=len(contracts),
    )


def hire(ctx: Context, s: Session, run: Run, body: ContractCreate) -> ContractView:
    """Hire one named provider at the owner's offered price per round (the SDK's
    ``negotiate_worker_contract``): accepted if it is at least the provider's asking price
    and the provider is live, free, and able to post the run's bond."""
    require_status(run, *LIVE, action="hire workers")
    price = parse_price(body.price)
    onchain.require_price(ctx, run, price)  # a settlement on chain pays at most the deposit's price
    c = hire_offer(ctx, s, run, body.worker_id, price)
    s.commit()
    return contract_view(c)


# --- distribute ----------------------------------------------------------------------


def distribute(ctx: Context, s: Session, run: Run, body: Distribute, request: RequestAuth) -> Run:
    """Check the training config against the run, assign shards to hired workers and move
    to ``distributing``; the round driver then writes the initial model and opens round 1.
    (A manual run moves there with ``POST /runs/{id}/phase``, and the owner makes the jobs.)"""
    if run.control == Control.MANUAL:
        raise conflict(
            "manual_control",
            f"run {run.id} is under manual control: set its phase (POST /v1/runs/{run.id}/phase "
            f"with phase distributing and the config) and send its jobs yourself",
        )
    hired = configure(ctx, s, run, body, request)
    n_shards = len(run.data_manifest["shards"])
    now = time.time()
    for i, c in enumerate(hired[:n_shards]):
        new_job(s, run, c, i, now=now)
    transition(run, RunStatus.DISTRIBUTING, now=now)
    s.commit()
    ctx.notifier.poke_driver()
    return run


def _check_verifiable(cfg: RunConfig, max_blob_bytes: int) -> None:
    """A spot check asks workers to upload committed states (float32 params and the inner
    optimizer's moments) and re-encodes the update with a fresh codec: refuse (422) a run
    where neither can work."""
    moments = {"adam": 2, "adamw": 2, "sgd": 1}.get(cfg.inner_opt, 2)
    state = 4 * cfg.d * (1 + moments) + (64 << 10)  # + the safetensors header
    if state > max_blob_bytes:
        raise unprocessable(
            "bad_config",
            f"verify_rate {cfg.verify_rate:g}: a committed state of this model is ~{state} bytes, past this "
            f"coordinator's max_blob_bytes ({max_blob_bytes}); workers could not reveal it",
        )
    name, opts = parse_spec(cfg.compression, what="codec")
    if name == "powersgd" and str(opts.get("warm_start", "true")).lower() not in ("false", "0", "no"):
        raise unprocessable(
            "bad_config",
            f"verify_rate {cfg.verify_rate:g}: compression {cfg.compression!r} warm-starts from the worker's "
            f"previous round, which a spot check cannot re-create; use powersgd:warm_start=false",
        )


def configure(
    ctx: Context, s: Session, run: Run, body: Distribute, request: RequestAuth, *, cost_field: str = "max_cost"
) -> list[Contract]:
    """Check the training config against the run and store it; a run without a budget
    escrows the hired contracts' cost (at most ``max_cost``). Returns the hired contracts,
    best first. The caller commits."""
    require_status(run, RunStatus.INITIALIZING, action="distribute")
    if run.manifest is None:
        raise conflict(
            "no_data",
            f"run {run.id} has no data yet; run: aitbc distributed-training upload-data --training-id {run.id} --data-path PATH",
        )
    hired = s.scalars(
        select(Contract)
        .where(Contract.run_id == run.id, Contract.status == ContractStatus.HIRED)
        .order_by(Contract.score.desc(), Contract.id)
    ).all()
    if not hired:
        raise conflict(
            "no_workers",
            f"run {run.id} has hired no workers; run: aitbc distributed-training discover-workers --training-id {run.id}",
        )
    mode = RunMode(body.mode)
    if mode.needs_driver and run.control == Control.MANUAL:
        # the driver fills and applies the buffers (async) or keeps the record (gossip); an
        # owner closing rounds by hand has neither
        raise unprocessable("bad_config", f"run {run.id} is owner-driven (manual): mode {mode} needs automatic control")
    n_shards = len(run.data_manifest["shards"])
    cfg = build_run_config(
        run,
        body,
        workers=min(len(hired), n_shards),
        allow_code=ctx.settings.allow_code,
        weights=store_weights(ctx.store),
    )
    if cfg.verify_rate > 0:
        _check_verifiable(cfg, ctx.settings.max_blob_bytes)
    if run.budget is None:  # no budget at init: escrow what the contracts will cost
        # An owner-driven run may put every hired worker on a shard (and cut the data again
        # before its jobs): its escrow covers them all; the driver uses one per shard.
        paid = list(hired) if run.control == Control.MANUAL else list(hired[:n_shards])
        cost = distribution_cost(cfg.rounds, paid)
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
                f"the contracts cost {format_price(cost)} AIT over {cfg.rounds} rounds; "
                f"max_cost allows {format_price(limit)}",
            )
        if ctx.chain is not None:  # the owner deposited on chain: mirrored, and checked against the contracts
            onchain.require_distributable(ctx, s, run, cost, cfg.round_deadline)
        else:
            escrow(
                ctx,
                s,
                run,
                cost,
                dataclasses.replace(request, field=cost_field),
                why=f"{len(paid)} workers x {cfg.rounds} rounds at their agreed prices",
            )
    run.config = cfg.model_dump(mode="json")
    return list(hired)


# --- owner controls ------------------------------------------------------------------


def stop(ctx: Context, s: Session, run: Run) -> Run:
    """The owner ends the run now: ``stopped`` (not a failure). Its jobs and contracts are
    released; the driver then settles its closed rounds, pays the accepted updates of a
    round that never closed in full (:func:`.escrow.pay_delivered`: the owner could read
    them), returns honest bonds and refunds the rest of the escrow, as for every other end."""
    if run.status in ENDED:
        raise conflict("run_ended", f"run {run.id} has already ended ({run.status})")
    end_run(s, run, RunStatus.STOPPED, reason="stopped by the owner")
    s.commit()
    drop_runtime(ctx, run.id)
    ctx.notifier.bump()
    ctx.notifier.poke_driver()  # settle, return bonds, refund
    return run


def pause(ctx: Context, s: Session, run: Run) -> Run:
    _require_pausable(run)
    transition(run, RunStatus.PAUSED)
    s.commit()
    ctx.notifier.bump()
    return run


def _require_pausable(run: Run) -> None:
    """409 in the user's words (what they can do instead) where a run cannot pause now."""
    rid, manual = run.id, run.control == Control.MANUAL
    if run.status in ENDED:
        raise conflict("run_ended", f"run {rid} has ended ({run.status}); there is nothing to pause")
    if run.status == RunStatus.PAUSED:
        raise conflict(
            "already_paused",
            f"run {rid} is already paused; resume it with `aitbc distributed-training resume --training-id {rid}`",
        )
    if run.status == RunStatus.AGGREGATING:
        then = (
            "once you have aggregated it and opened the next round (phase training)"
            if manual
            else "once the round is committed (a few seconds)"
        )
        raise conflict("round_aggregating", f"run {rid} is aggregating round {run.round}; pause it {then}")
    if run.status == RunStatus.DISTRIBUTING:
        if manual:
            raise conflict(
                "distributing",
                f"run {rid} is distributing: send its jobs and set phase training; pause it once training has started",
            )
        raise conflict(
            "distributing", f"run {rid} is writing its initial model; pause it once round 1 is open (a few seconds)"
        )


def resume(ctx: Context, s: Session, run: Run) -> Run:
    if run.status in ENDED:
        raise conflict("run_ended", f"run {run.id} has ended ({run.status}); it cannot resume")
    if run.status != RunStatus.PAUSED:
        raise conflict("bad_state", f"run {run.id} is {run.status}, not paused")
    transition(run, RunStatus(run.paused_from or RunStatus.TRAINING))
    if run.status == RunStatus.TRAINING:
        run.round_started_at = time.time()  # the deadline counts from the resume
    s.commit()
    ctx.notifier.bump()
    ctx.notifier.poke_driver()
    return run


# --- owner's manual payments (the SDK's process_payment / refund_payments) -----------


def manual_payment(ctx: Context, s: Session, run: Run, contract_id: str, amount_text: str | float) -> ManualPayment:
    onchain.refuse_on_chain(ctx, "paying a contract by hand", "the coordinator's settlements pay on chain")
    amount = parse_amount(amount_text)
    c = s.get(Contract, contract_id)
    if c is None or c.run_id != run.id:
        raise not_found("unknown_contract", f"run {run.id} has no contract {contract_id!r}")
    try:
        e = ctx.ledger.post(
            s,
            kind="payment",
            debit=escrow_account(run.id),
            credit=wallet_account(c.worker_id),
            amount=amount,
            memo={"run": run.id, "contract": c.id, "manual": True, "ordered_by": run.owner},
        )
    except LedgerError as err:
        raise ledger_error(err) from None
    c.paid_manual += amount
    s.commit()
    return ManualPayment(
        contract_id=c.id,
        worker_id=c.worker_id,
        amount=ait(amount),
        amount_micro=amount,
        entry=e.seq,
        escrow_left=ait(ctx.ledger.balance(s, escrow_account(run.id))),
    )


def refund(ctx: Context, s: Session, run: Run) -> Payments:
    """Return the unspent escrow to the owner now (the run must have ended)."""
    if run.status not in ENDED:
        raise conflict("bad_state", f"run {run.id} is {run.status}; stop it first (refunds follow the end of a run)")
    closed = s.scalar(select(func.max(RoundRecord.round)).where(RoundRecord.run_id == run.id)) or 0
    if run.settled_round < closed and not run.finalized:
        raise conflict(
            "unsettled",
            f"run {run.id}'s rounds are scored and settled up to {run.settled_round} of {closed}; "
            f"the refund waits for the rest (a few seconds)",
        )
    s.commit()
    finalize(ctx, run.id, refund_escrow=True)
    s.refresh(run)  # finalize wrote through its own session
    return payments_view(ctx, s, run)
