"""Operations that take the coordinator's place: manual control of a run's phases, jobs
and aggregation (a run created with ``control="manual"``), and the fault-tolerance
controls (mark failed, replace, reassign, split, slow down, resend, scale) that work on
any run the agent owns. Registered in :data:`~aitbc_agent_sdk.operations.OPERATIONS`
like the rest, so ``Agent`` and ``AsyncAgent`` both get them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from aitbc import run_defaults
from aitbc.replies.base import JsonObject, Page
from aitbc.replies.jobs import Aggregated, JobDetail, ResendRequested, ShardView, SplitJobs, UpdateView, WorkerJob
from aitbc.replies.results import SavedResult
from aitbc.replies.runs import RunDetail
from aitbc_agent_sdk.checkpoints import _download
from aitbc_agent_sdk.errors import Conflict, InvalidArgument, NotFound
from aitbc_agent_sdk.operations import _max_cost, operation, resolve_run, run_detail
from aitbc_agent_sdk.protocol import AgentState, Http, Offload, Op, ask
from aitbc_agent_sdk.results import (
    AveragedModel,
    FailedJob,
    FreeOffer,
    TrainingStatus,
    WorkerAdded,
    WorkloadReduced,
    WorkSplit,
)
from aitbc_agent_sdk.workers import _asking_price, hire, jobs_of, market_offers, rank_free

PHASES = ("distributing", "training", "aggregating", "complete")


# --- phases and jobs (manual control) --------------------------------------------------------


@operation
def update_training_phase(
    self: AgentState, training_id: str | None = None, phase: str | None = None, **config: Any
) -> Op[TrainingStatus]:
    """Move the run (default: the agent's current run) to ``phase`` (``POST
    /v1/runs/{id}/phase``). A run is automatic until its owner first calls this; from
    then on the owner drives its phases (a run created with ``control="manual"`` is
    owner-driven from the start):

    * ``distributing``: from initializing (data attached, workers hired), with the
      training ``config`` (rounds, local_steps, batch_size, lr, aggregator, compression,
      ...; ``max_cost`` for a run without a budget, default the hired contracts' price x
      rounds);
    * ``training``: from distributing (initial model written, round 1 opens: send jobs
      first), or from aggregating once the round is aggregated (the next round opens);
    * ``aggregating``: the open round stops taking updates;
    * ``complete``: from aggregating, once the round is aggregated.

    Returns the run's detail with ``phase``. A move the run cannot make: :class:`Conflict`."""
    training_id = yield from resolve_run(self, training_id)
    if phase not in PHASES:
        raise InvalidArgument("bad_phase", f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    body: dict[str, Any] = {"phase": phase}
    if phase == "distributing":
        cfg = dict(config)
        run = yield from run_detail(training_id)
        max_cost = _max_cost(run, int(cfg.get("rounds", run_defaults.ROUNDS)), cfg.pop("max_cost", None))
        if max_cost is not None:
            cfg["max_cost"] = max_cost
        body["config"] = cfg
    elif config:
        raise InvalidArgument("bad_config", f"config ({', '.join(sorted(config))}) goes with phase distributing only")
    moved = yield from ask(RunDetail, Http("POST", f"/runs/{training_id}/phase", body))
    return TrainingStatus.of(moved)


@operation
def send_training_job(
    self: AgentState,
    worker_id: str,
    training_id: str | None = None,
    shard_id: str | None = None,
    config: JsonObject | None = None,
) -> Op[JobDetail]:
    """A hired worker trains shard ``shard_id`` (a CID from :meth:`create_data_shards`)
    of an owner-driven run (default: the agent's current run) from the open round on.
    ``config``: the job's own ``batch_size``, ``learning_rate`` (or ``lr``), ``epochs``
    (passes over the shard per round) or ``local_steps`` (default: the run's). Returns
    the job with ``job_id``."""
    training_id = yield from resolve_run(self, training_id)
    if not shard_id:
        raise InvalidArgument("bad_argument", "send_training_job needs shard_id= (from create_data_shards)")
    body = {"worker_id": worker_id, "shard_id": shard_id, "config": dict(config or {})}
    return (yield from ask(JobDetail, Http("POST", f"/runs/{training_id}/jobs", body)))


@operation
def collect_checkpoint(self: AgentState, worker_id: str, job_id: str) -> Op[UpdateView]:
    """The worker's result: its update for the run's open (or just closed) round,
    ``{checkpoint_id, cid, training_id, job_id, worker_id, round, samples, train_loss,
    size, status}``, to hand to :meth:`federated_average`. Not sent yet:
    :class:`NotFound` (``no_checkpoint``)."""
    job = yield from ask(JobDetail, Http("GET", f"/jobs/{job_id}"))
    if job.worker_id != worker_id:
        raise InvalidArgument("bad_argument", f"job {job_id} is worker {job.worker_id}'s, not {worker_id}'s")
    for u in (yield from updates_of(job_id)):
        if u.round == job.round:
            return u
    raise NotFound("no_checkpoint", f"worker {worker_id} has not sent its update for round {job.round} (job {job_id})")


@operation
def federated_average(
    self: AgentState,
    checkpoints: Sequence[UpdateView | Mapping[str, Any]],
    weights: list[float] | None = None,
    training_id: str | None = None,
) -> Op[AveragedModel]:
    """Aggregate the closed round's ``checkpoints`` (from :meth:`collect_checkpoint`, all
    of one manual run in phase aggregating) with the run's aggregation rule (``mean`` is
    FedAvg) and outer optimizer, weighted by ``weights`` (default: the shards' sample
    counts). The new global model is stored as the round's checkpoint and evaluated:
    returns ``{model_id (its CID), model, loss (validation), accuracy, round,
    training_id, updates, weights, skipped}``; ``model`` is the model's state dict
    (tensors by name, read back from the checkpoint and checked against its CID), which
    :meth:`upload_to_ipfs` (``data=``) stores. Updates not listed are recorded as
    excluded. No checkpoints (with ``training_id``): the round is recorded as skipped,
    the model unchanged (the way on when no update of the round was accepted)."""
    if not isinstance(checkpoints, list) or not all(
        isinstance(c, (UpdateView, Mapping)) and c.get("cid") and c.get("training_id") for c in checkpoints
    ):
        raise InvalidArgument("bad_argument", "checkpoints must be a list of dicts from collect_checkpoint")
    if not checkpoints and training_id is None:
        raise InvalidArgument("bad_argument", "no checkpoints: give training_id= to record the round as skipped")
    runs = {c["training_id"] for c in checkpoints} or {training_id}
    if training_id is not None and runs != {training_id}:
        raise InvalidArgument("bad_argument", f"checkpoints are of {', '.join(sorted(runs))}, not {training_id}")
    if len(runs) != 1:
        raise InvalidArgument(
            "bad_argument", f"checkpoints come from {len(runs)} runs ({', '.join(sorted(runs))}); give one run's"
        )
    body: dict[str, Any] = {"updates": [c["cid"] for c in checkpoints]}
    if weights is not None:
        body["weights"] = [float(w) for w in weights]
    res = yield from ask(Aggregated, Http("POST", f"/runs/{runs.pop()}/aggregate", body))
    from aitbc.training.checkpoint import bytes_to_tensors  # torch: imported on use

    blob = yield from _download(res.model_cid)
    model = yield Offload(bytes_to_tensors, (blob,))
    return AveragedModel(**res.__dict__, model=model)


@operation
def save_training_results(
    self: AgentState,
    training_id: str | None = None,
    model_cid: str | Aggregated | Mapping[str, Any] | None = None,
    metrics: JsonObject | None = None,
) -> Op[SavedResult]:
    """Keep ``model_cid`` as the owner-driven run's model (default run: the agent's
    current run), with the owner's ``metrics`` (flat names to numbers or text, e.g.
    ``{"final_loss": 0.9, "workers": 10}``): a CID from :meth:`upload_to_ipfs`, a
    checkpoint CID of one of the run's rounds, or what :meth:`federated_average`
    returned. Returns the run's results."""
    training_id = yield from resolve_run(self, training_id)
    model = model_cid
    cid = (model.get("model_id") or model.get("model_cid")) if isinstance(model, (Aggregated, Mapping)) else model
    if not isinstance(cid, str) or not cid:
        raise InvalidArgument(
            "bad_argument", f"model_cid must be a CID (from upload_to_ipfs or federated_average), got {model!r}"
        )
    body: dict[str, Any] = {"model_cid": cid}
    if metrics:
        body["metrics"] = dict(metrics)
    return (yield from ask(SavedResult, Http("POST", f"/runs/{training_id}/result", body)))


# --- fault tolerance (any run the agent owns) ---------------------------------------------------


def _active_job(worker_id: str, training_id: str | None = None) -> Op[WorkerJob]:
    for j in (yield from jobs_of(worker_id, training_id)):
        if j.job_status == "active":
            return j
    where = f" in run {training_id}" if training_id else ""
    raise NotFound("no_active_job", f"worker {worker_id} has no active job{where}")


def _run_hint(self: AgentState, training_id: str | None) -> str | None:
    """The run a worker's job is looked up in: ``training_id``, else the agent's current
    run if it has one, else any (a worker holds one active job at a time)."""
    return training_id if training_id is not None else self._training_id


@operation
def mark_worker_failed(
    self: AgentState, worker_id: str, reason: str | None = None, training_id: str | None = None
) -> Op[FailedJob]:
    """End the worker's active job (in ``training_id``, default: the agent's current run)
    as ``failed``: the worker is flagged and leaves the market until it heartbeats again.
    An owner-driven run's agent then reassigns the shard (:meth:`reassign_job`); an
    automatic run's coordinator does at its next tick. Returns the ended job. A job that
    already failed (the coordinator saw the lease expire) is returned as it is, with
    ``already_failed: True``; a worker with neither: :class:`NotFound`."""
    hint = _run_hint(self, training_id)
    jobs = yield from jobs_of(worker_id, hint)
    active = [j for j in jobs if j.job_status == "active"]
    if not active:
        if jobs and jobs[0].job_status == "failed":
            return FailedJob(**jobs[0].__dict__, already_failed=True)
        where = f" in run {hint}" if hint else ""
        raise NotFound("no_active_job", f"worker {worker_id} has no active job{where}")
    body: dict[str, Any] = {"status": "failed", "reason": reason or "marked failed by the owner"}
    job = yield from ask(JobDetail, Http("POST", f"/jobs/{active[0].job_id}/end", body))
    return FailedJob(**job.__dict__, already_failed=False)


@operation
def find_replacement_worker(
    self: AgentState, gpu_type: str | None = None, exclude: list[str] | None = None
) -> Op[FreeOffer | None]:
    """The best live, free offer (by the marketplace score), preferring ``gpu_type``;
    None when nobody is free. ``exclude``: worker ids not to pick. Prices as numbers
    (``price``, with the exact ``price_micro``)."""
    from aitbc.market.gpus import normalize_gpu

    offers = yield from market_offers()
    ranked = rank_free(offers, exclude=set(exclude or ()))
    want = normalize_gpu(gpu_type) if gpu_type else None
    return next((o for o in ranked if o.gpu_type == want), ranked[0] if ranked else None)


@operation
def reassign_job(self: AgentState, job_id: str, new_worker_id: str | None = None) -> Op[JobDetail]:
    """Give the job's shard to ``new_worker_id`` (a spare of the run, or a free live offer
    hired now at its asking price), or to the best free worker if None. The old job may
    have failed already; an active one is released. Returns the new job (whose
    ``replaces`` is ``job_id``)."""
    body = {} if new_worker_id is None else {"worker_id": new_worker_id}
    return (yield from ask(JobDetail, Http("POST", f"/jobs/{job_id}/reassign", body)))


@operation
def request_checkpoint_resend(self: AgentState, worker_id: str, training_id: str | None = None) -> Op[ResendRequested]:
    """Drop the worker's update of the open round (e.g. it failed verification) so the
    worker trains and sends that round again. Returns ``{job_id, round, dropped}``."""
    job = yield from _active_job(worker_id, _run_hint(self, training_id))
    return (yield from ask(ResendRequested, Http("POST", f"/jobs/{job.job_id}/resend")))


@operation
def add_worker(
    self: AgentState,
    worker_id: str | None = None,
    training_id: str | None = None,
    price: int | float | str | Decimal | None = None,
) -> Op[WorkerAdded]:
    """Hire one more worker for the run (default: the agent's current run): ``worker_id``
    (e.g. from :meth:`get_available_workers`), or the best free one, at ``price``
    (default: its asking price). In an owner-driven run that is training, it also gets a
    job on the shard with the fewest workers. An automatic run keeps it as a spare the
    coordinator uses for replacements and joins up to ``max_workers``. Returns
    ``{contract, job, worker_id}``."""
    training_id = yield from resolve_run(self, training_id)
    if worker_id is None:
        best = yield from find_replacement_worker(self)
        if best is None:
            raise NotFound("no_free_worker", "no live, free offer on the market")
        worker_id = best.worker_id
    if price is None:
        price = yield from _asking_price(worker_id)
    contract = yield from hire(training_id, worker_id, price)
    run = yield from run_detail(training_id)
    job = None
    if run.control == "manual" and run.status in ("distributing", "training", "aggregating"):
        shards = yield from shards_of(training_id)
        open_shards = [sh for sh in shards if not sh.split_into]
        target = min(open_shards, key=lambda sh: (len(sh.jobs), sh.shard_index))
        body = {"worker_id": worker_id, "shard_id": target.shard_id}
        job = yield from ask(JobDetail, Http("POST", f"/runs/{training_id}/jobs", body))
    return WorkerAdded(contract=contract, job=job, worker_id=worker_id)


@operation
def remove_worker(self: AgentState, worker_id: str, training_id: str | None = None) -> Op[JobDetail]:
    """Release the worker's job in the run (default: the agent's current run; its
    contract ends; it is not flagged). An owner-driven run's shard then waits for a job
    the agent sends; an automatic run's coordinator refills up to ``max_workers`` from
    spares and the market. Returns the ended job."""
    training_id = yield from resolve_run(self, training_id)
    job = yield from _active_job(worker_id, training_id)
    body = {"status": "released", "reason": "removed by the owner"}
    return (yield from ask(JobDetail, Http("POST", f"/jobs/{job.job_id}/end", body)))


@operation
def reduce_worker_workload(
    self: AgentState,
    worker_id: str,
    factor: float = 0.5,
    local_steps: int | None = None,
    training_id: str | None = None,
) -> Op[WorkloadReduced]:
    """Fewer local steps for a slow worker from its next round: ``local_steps`` if given,
    else its current steps x ``factor`` (at least 1). An
    :class:`~aitbc_agent_sdk.results.Outcome`, truthy when it was ``done``: ``{done,
    worker_id, job_id, local_steps, job, detail}``; a worker with no active job (it
    failed meanwhile) is ``done: False`` with the reason, not an error."""
    if local_steps is None and not (isinstance(factor, (int, float)) and 0 < factor <= 1):
        raise InvalidArgument("bad_argument", f"factor must be in (0, 1], got {factor!r}")
    try:
        job = yield from _active_job(worker_id, _run_hint(self, training_id))
    except NotFound as e:
        return WorkloadReduced(
            done=False, worker_id=worker_id, job_id=None, local_steps=None, job=None, detail=e.detail
        )
    if local_steps is None:
        run = yield from run_detail(job.training_id)
        current = job.config.get("local_steps") or run.config.get("local_steps") or 1
        local_steps = max(1, int(current * factor))
    new = yield from ask(JobDetail, Http("POST", f"/jobs/{job.job_id}/config", {"local_steps": local_steps}))
    return WorkloadReduced(
        done=True,
        worker_id=worker_id,
        job_id=job.job_id,
        local_steps=local_steps,
        job=new,
        detail=f"{local_steps} local steps per round from the next round",
    )


#: Why a split may find nothing to do: not an error of the caller's.
_NO_SPLIT = ("no_free_worker", "shard_too_small", "shard_split")


@operation
def reassign_partial_work(
    self: AgentState, worker_id: str, to_worker_id: str | None = None, training_id: str | None = None
) -> Op[WorkSplit]:
    """Split a slow worker's shard in two: it keeps the first half (from its next round)
    and ``to_worker_id`` (a spare or free offer, or the best free worker if None) gets a
    job on the second. An :class:`~aitbc_agent_sdk.results.Outcome`, truthy when it was
    ``done``: ``{done, worker_id, job, new_job, detail}``. Nothing to do (nobody free,
    a shard too small to split, the worker has no active job) is ``done: False`` with
    the reason, not an error."""
    try:
        job = yield from _active_job(worker_id, _run_hint(self, training_id))
    except NotFound as e:
        return WorkSplit(done=False, worker_id=worker_id, job=None, new_job=None, detail=e.detail)
    body = {} if to_worker_id is None else {"worker_id": to_worker_id}
    try:
        res = yield from ask(SplitJobs, Http("POST", f"/jobs/{job.job_id}/split", body))
    except Conflict as e:
        if e.code not in _NO_SPLIT:
            raise
        return WorkSplit(done=False, worker_id=worker_id, job=job, new_job=None, detail=e.detail)
    return WorkSplit(
        done=True,
        worker_id=worker_id,
        job=res.job,
        new_job=res.new_job,
        detail=f"half of the shard went to {res['new_job']['worker_id']}",
    )


@operation
def get_shards(self: AgentState, training_id: str | None = None) -> Op[list[ShardView]]:
    """The run's shards: ``[{shard_index, shard_id, samples, split_from, split_into, jobs}]``."""
    training_id = yield from resolve_run(self, training_id)
    return (yield from shards_of(training_id))


def shards_of(training_id: str) -> Op[list[ShardView]]:
    return (yield from ask(Page[ShardView], Http("GET", f"/runs/{training_id}/shards"))).data


@operation
def get_worker_checkpoints(self: AgentState, job_id: str) -> Op[list[UpdateView]]:
    """Every update a job sent (newest round first), as :meth:`collect_checkpoint` returns them."""
    return (yield from updates_of(job_id))


def updates_of(job_id: str) -> Op[list[UpdateView]]:
    """Every update job ``job_id`` sent, newest round first."""
    return (yield from ask(Page[UpdateView], Http("GET", f"/jobs/{job_id}/updates"))).data
