"""Operations on the market and a run's workers: rank and hire offers, contracts at a
price, each worker's job and progress, whether a worker answers. Registered in
:data:`~aitbc_agent_sdk.operations.OPERATIONS` like the rest."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from aitbc.market.ranking import Offer, rank_offers
from aitbc.replies.base import Page
from aitbc.replies.jobs import JobDetail, WorkerJob
from aitbc.replies.runs import ContractView, Discovery, RunDetail, RunWorker
from aitbc.replies.workers import MarketOffer
from aitbc.units import format_price, parse_price
from aitbc_agent_sdk.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
)
from aitbc_agent_sdk.operations import ENDED, _amount, _soft_run, operation, resolve_run, run_detail
from aitbc_agent_sdk.protocol import AgentState, Http, Op, ask
from aitbc_agent_sdk.results import FreeOffer, HiredOffer, Liveness, WorkerProgress

# --- the market ---------------------------------------------------------------------------


@operation
def discover_gpu_workers(
    self: AgentState,
    min_gpu: str | None = None,
    required_workers: int = 1,
    max_price: int | float | str | Decimal | None = None,
    training_id: str | None = None,
) -> Op[list[FreeOffer] | list[HiredOffer]]:
    """The best ``required_workers`` live, free offers, ranked by the marketplace score:
    ``[{worker_id, gpu_type, price, reputation, availability, score, ...}]`` (the market's
    view of each offer, plus its score), best first
    (``min_gpu``: the lowest GPU class, ``max_price``: AIT per round). Hire them with
    :meth:`negotiate_worker_contract`. Fewer than ``required_workers``: :class:`Conflict`
    (``not_enough_workers``).

    With ``training_id``, ranking and hiring are one step on the coordinator
    (:meth:`hire_workers`): the best are hired at their asking price and every ranked
    offer is returned with ``hired`` (the hired ones carry ``contract_id``)."""
    if training_id is not None:
        res = yield from hire_workers(self, training_id, required_workers, min_gpu=min_gpu, max_price=max_price)
        contracts = {c.worker_id: c.contract_id for c in res.contracts}
        return [HiredOffer(**r.__dict__, contract_id=contracts.get(r.worker_id)) for r in res.ranked]
    _check_workers(required_workers)
    limit = None if max_price is None else parse_price(_amount(max_price, "max_price"), field="max_price") / 1_000_000
    offers = yield from market_offers()
    ranked = rank_free(offers, min_gpu=min_gpu, max_price=limit)
    if len(ranked) < required_workers:
        raise Conflict(
            "not_enough_workers",
            f"{required_workers} workers required; {len(ranked)} live, free offer(s) "
            f"match (min_gpu={min_gpu}, max_price={max_price}) of {len(offers)} live",
        )
    return ranked[:required_workers]


def _check_workers(required_workers: int) -> None:
    if isinstance(required_workers, bool) or not isinstance(required_workers, int) or required_workers < 1:
        raise InvalidArgument("bad_workers", f"required_workers must be an integer >= 1, got {required_workers!r}")


@operation
def hire_workers(
    self: AgentState,
    training_id: str | None = None,
    required_workers: int = 1,
    min_gpu: str | None = None,
    max_price: int | float | str | Decimal | None = None,
) -> Op[Discovery]:
    """Rank the live, free offers on the coordinator (``POST /v1/runs/{id}/discover``) and
    hire the best ``required_workers`` for the run at their asking price, in one step.
    Returns ``{ranked: [{worker_id, gpu_type, price, reputation, availability, score,
    hired}], contracts: [{contract_id, worker_id, price, ...}], count (hired)}``. Too few
    match: :class:`Conflict` (``not_enough_workers``) and nobody is hired. The owner's money
    comes first: an owner whose wallet and run escrow cannot pay every contract of the run
    at its price for the run's rounds (the default plan's until distribute) gets
    :class:`Conflict` (``insufficient_funds``, naming the shortfall) and nobody is hired."""
    _check_workers(required_workers)
    training_id = yield from resolve_run(self, training_id)
    body: dict[str, Any] = {"required_workers": required_workers, "min_gpu": min_gpu}
    if max_price is not None:
        body["max_price"] = _amount(max_price, "max_price")
    return (yield from ask(Discovery, Http("POST", f"/runs/{training_id}/discover", body)))


def market_offers(include_offline: bool = False) -> Op[list[MarketOffer]]:
    """``GET /v1/market/offers``: the live offers (``include_offline``: every offer)."""
    params = {"all": "true" if include_offline else None}
    return (yield from ask(Page[MarketOffer], Http("GET", "/market/offers", params=params))).data


def market_offer(o: MarketOffer) -> Offer:
    """An offer of ``GET /v1/market/offers`` as the marketplace's :class:`Offer` (to score
    or rank it here; the price from its exact micro-AIT)."""
    return Offer(
        worker_id=o.worker_id,
        gpu=o.gpu_type,
        price=o.price_micro / 1_000_000,
        reputation=o.reputation,
        availability=o.availability,
        last_heartbeat=o.last_heartbeat,
    )


def rank_free(
    offers: list[MarketOffer],
    *,
    min_gpu: str | None = None,
    max_price: float | None = None,
    exclude: set[str] | frozenset[str] = frozenset(),
) -> list[FreeOffer]:
    """The live offers (``GET /v1/market/offers``) no run holds, best first by the
    marketplace's ranking, each with its ``score`` added. (The coordinator judged them
    live; no clock is read here.)"""
    free = {o.worker_id: o for o in offers if not o.busy and o.worker_id not in exclude}
    ranked = rank_offers(
        [market_offer(o) for o in free.values()],
        min_gpu=min_gpu,
        max_price=max_price,
        now=0.0,
        max_age=float("inf"),
    )
    return [FreeOffer(**free[r.offer.worker_id].__dict__, score=r.score) for r in ranked]


@operation
def negotiate_worker_contract(
    self: AgentState, worker_id: str, training_id: str | None = None, price: int | float | str | Decimal | None = None
) -> Op[ContractView]:
    """Hire one provider for the run (default: the agent's current run) at ``price`` AIT
    per round (default: its asking price): accepted when it is at least the provider's
    asking price (else ``Conflict`` with code ``price_rejected``), and the owner can pay
    for it (else ``Conflict`` ``insufficient_funds``, as :meth:`hire_workers`). Returns
    ``{contract_id, price (a number of AIT), price_micro (exact), worker_id,
    training_id, status, score}``: pay it with :meth:`process_payment` (``amount=contract["price"]``)."""
    training_id = yield from resolve_run(self, training_id)
    if price is None:
        price = yield from _asking_price(worker_id)
    return (yield from hire(training_id, worker_id, price))


def hire(training_id: str, worker_id: str, price: int | float | str | Decimal) -> Op[ContractView]:
    """``POST /v1/runs/{id}/contracts``: the worker hired for the run at ``price`` AIT a round."""
    body = {"worker_id": worker_id, "price": _amount(price, "price")}
    return (yield from ask(ContractView, Http("POST", f"/runs/{training_id}/contracts", json=body)))


def _asking_price(worker_id: str) -> Op[str]:
    offers = yield from market_offers(include_offline=True)
    mine = [o for o in offers if o.worker_id == worker_id]
    if not mine:
        raise NotFound("unknown_worker", f"worker {worker_id} has no offer on this coordinator")
    return format_price(mine[0].price_micro)


@operation
def get_market_offers(self: AgentState, include_offline: bool = False) -> Op[list[MarketOffer]]:
    """Every live offer on the market, busy or free (``GET /v1/market/offers``):
    ``[{worker_id, gpu_type, device, price, price_micro, reputation, availability,
    status, live, busy, last_heartbeat, last_heartbeat_age}]``. ``include_offline``:
    also offers that are not live (failed, silent), with their status."""
    return (yield from market_offers(include_offline))


@operation
def get_available_workers(
    self: AgentState, training_id: str | None = None, min_gpu: str | None = None
) -> Op[list[FreeOffer]]:
    """The workers the run (default: the agent's current run, if any) could add now: live
    offers no run holds and the run has no contract with, best first by the marketplace
    score (``min_gpu``: the weakest GPU class accepted). Each is the market's view of the
    offer (``worker_id, gpu_type, price, price_micro, reputation, availability, ...``)
    plus ``score``. Hire one with :meth:`add_worker` (``worker_id=``)."""
    training_id = yield from _soft_run(self, training_id)
    offers = yield from market_offers()
    taken: set[str] = set()
    if training_id is not None:
        run = yield from run_detail(training_id)
        taken = {c.worker_id for c in run.contracts}
    return rank_free(offers, min_gpu=min_gpu, exclude=taken)


@operation
def ping_worker(self: AgentState, worker_id: str, max_age: float | None = None) -> Op[Liveness]:
    """Whether the worker answers: truthy exactly when it is ``alive`` (online and heard
    from within ``max_age`` seconds; default: the coordinator's lease, within which
    workers heartbeat several times), so ``if not agent.ping_worker(w)`` reads as said.
    A :class:`~aitbc_agent_sdk.results.Liveness`: ``{worker_id, alive,
    last_heartbeat_age, status, gpu_type, busy}``. An unknown worker: :class:`NotFound`."""
    for o in (yield from market_offers(include_offline=True)):
        if o.worker_id == worker_id:
            fresh = o.live if max_age is None else o.last_heartbeat_age <= max_age
            return Liveness(
                worker_id=worker_id,
                alive=bool(fresh and o.status == "online"),
                last_heartbeat_age=o.last_heartbeat_age,
                status=o.status,
                gpu_type=o.gpu_type,
                busy=o.busy,
            )
    raise NotFound("unknown_worker", f"worker {worker_id} has no offer on this coordinator")


# --- a run's workers ----------------------------------------------------------------------


def current_jobs(run: RunDetail) -> list[RunWorker]:
    """The run's workers as its detail lists them (one job each), less the failed jobs
    whose shard went to another job (named ``replaces``, or any later job on that shard)
    and, while the run is live, the jobs that ended otherwise (released): the working
    ones and the failed ones nobody replaced yet. Once the run ended, each job as it ended."""
    replaced = {w.replaces for w in run.workers if w.replaces}
    taken = {w.shard_index for w in run.workers if w.job_status != "failed"}
    jobs = [
        w for w in run.workers if w.job_id not in replaced and not (w.job_status == "failed" and w.shard_index in taken)
    ]
    if run.status in ENDED:
        return jobs
    return [w for w in jobs if w.job_status in ("active", "failed")]


@operation
def get_all_workers(self: AgentState, training_id: str | None = None) -> Op[list[RunWorker]]:
    """The run's workers (default: the agent's current run), one job each: the working
    ones and any failed one not replaced yet (once the run ended, each job as it ended).
    Each has ``worker_id, job_id, job_status, status, progress, loss, epoch, speed,
    gpu_type, score, last_heartbeat_age, ...``; :meth:`get_worker_progress` tells more."""
    training_id = yield from resolve_run(self, training_id)
    run = yield from run_detail(training_id)
    return current_jobs(run)


@operation
def get_active_workers(self: AgentState, training_id: str | None = None) -> Op[list[RunWorker]]:
    """The run's jobs still working (not failed, released or replaced), as in
    :meth:`get_all_workers`."""
    training_id = yield from resolve_run(self, training_id)
    run = yield from run_detail(training_id)
    return [w for w in run.workers if w.job_status == "active"]


@operation
def get_worker_progress(self: AgentState, job_id: str) -> Op[WorkerProgress]:
    """``{progress, loss, epoch, status}`` of one job (``GET /v1/jobs/{job_id}``):
    ``progress`` is the percentage (0-100) of the job's work in the open round;
    ``status`` is ``complete`` once its update for the round is in and accepted
    (``rejected`` if refused), before that the worker's last report (``waiting``,
    ``training``, ...), and ``failed``/``released`` once the job ended; ``loss`` is its
    latest training loss, a number (before its first step, the validation loss of the
    model it starts from); ``epoch``: passes over its shard so far.
    Plus ``job_id, worker_id, training_id, gpu_type, speed, rounds_done, job_status``
    (active, failed, released), ``round`` (the run's open round) and ``round_update``
    (``accepted`` or ``rejected`` once the worker sent that round's update, else None)."""
    j = yield from ask(JobDetail, Http("GET", f"/jobs/{job_id}"))
    loss = j.loss
    if loss is None:  # not started yet: the loss of the model it starts from
        run = yield from run_detail(j.training_id)
        loss = next((v for v in (run.val_loss, run.initial_val_loss) if v is not None), float("nan"))
    return WorkerProgress(
        job_id=j.job_id,
        worker_id=j.worker_id,
        training_id=j.training_id,
        gpu_type=j.gpu_type,
        progress=j.progress,
        loss=loss,
        epoch=j.epoch,
        status=j.status,
        speed=j.speed,
        rounds_done=j.rounds_done,
        round=j.round,
        round_update=j.this_round,
        job_status=j.job_status,
    )


@operation
def get_worker_job(self: AgentState, worker_id: str, training_id: str | None = None) -> Op[WorkerJob | None]:
    """The worker's current (active) job, else its most recent one (in ``training_id``
    if given), or None if it never had one: ``{job_id, worker_id, training_id, gpu_type,
    shard_index, job_status, progress, ...}``."""
    jobs = yield from jobs_of(worker_id, training_id)
    active = [j for j in jobs if j.job_status == "active"]
    job = active[0] if active else (jobs[0] if jobs else None)
    if job is not None and job.gpu_type is None:  # the GPU class the worker offers
        offers = yield from market_offers(include_offline=True)
        gpu = next((o.gpu_type for o in offers if o.worker_id == worker_id), None)
        job = job.model_copy(update={"gpu_type": gpu})
    return job


def jobs_of(worker_id: str, training_id: str | None) -> Op[list[WorkerJob]]:
    """The worker's jobs (in ``training_id`` if given), newest first."""
    res = yield from ask(Page[WorkerJob], Http("GET", f"/workers/{worker_id}/jobs"))
    return [j for j in res.data if training_id in (None, j.training_id)]
