"""Every public method of the agents, written once as a sans-IO generator.

Each operation takes the agent (``self``: config, wallet) and its arguments, yields
:mod:`~aitbc_agent_sdk.protocol` requests and returns a typed model: the coordinator's
reply (:mod:`aitbc.replies`, parsed with :func:`~aitbc_agent_sdk.protocol.ask`) or one the
SDK puts together (:mod:`aitbc_agent_sdk.results`); or a list of them, or a str.
:func:`operation` records it in :data:`OPERATIONS`; ``Agent`` and ``AsyncAgent`` get one
method per entry, with the operation's name, docstring and signature.

This module holds the table, the agent's lifecycle, its current run and a run's own
operations (create, start, stop, wait); the others register from the modules of their
topic: :mod:`~aitbc_agent_sdk.data` (datasets and blobs), :mod:`~aitbc_agent_sdk.workers`
(the market and a run's workers), :mod:`~aitbc_agent_sdk.checkpoints` (checkpoints and
models), :mod:`~aitbc_agent_sdk.money` (wallet, ledger, payments) and
:mod:`~aitbc_agent_sdk.control` (manual control)."""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, TypeVar

from aitbc import run_defaults
from aitbc.replies.base import JsonObject, Page, money_text
from aitbc.replies.results import Results
from aitbc.replies.runs import RunDetail, RunSummary
from aitbc.run_mode import RunMode
from aitbc.units import format_price
from aitbc_agent_sdk.chain import deposit_for_distribute, owner_evm
from aitbc_agent_sdk.errors import (
    AmbiguousRun,
    InvalidArgument,
    TrainingFailed,
    WaitTimeout,
)
from aitbc_agent_sdk.protocol import AgentState, Close, Http, Offload, Op, Progress, Sleep, ask
from aitbc_agent_sdk.results import NewRun, Started, Stopped, TrainingProgress, TrainingStatus

OPERATIONS: dict[str, Callable[..., Op[Any]]] = {}

ENDED = ("complete", "failed", "stopped")

F = TypeVar("F", bound=Callable[..., Any])


def operation(fn: F) -> F:
    OPERATIONS[fn.__name__] = fn
    return fn


def _amount(value: Any, what: str) -> str:
    """Money goes to the API as a decimal string of AIT (the server keeps integer micro-AIT):
    an int, a str, a :class:`~decimal.Decimal` (what the replies carry, so an amount read
    off one can be passed back), or a float as written (its shortest repr: 0.1 is "0.1").
    More than 6 decimals is the coordinator's ``bad_price``/``bad_amount``, never rounded."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise InvalidArgument(
            "bad_amount", f'{what} must be AIT as an int, str or Decimal (e.g. 100 or "1.5"), got {value!r}'
        )
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise InvalidArgument("bad_amount", f"{what} must be a finite amount of AIT, got {value!r}")
        return money_text(value)
    return value if isinstance(value, str) else (str(value) if isinstance(value, int) else repr(value))


def _max_cost(run: RunDetail, rounds: int, max_cost: int | float | str | Decimal | None) -> str | None:
    """The most ``distribute`` may escrow, signed by the owner: ``max_cost`` if given, else
    for a run without a budget the hired contracts' price x ``rounds`` (what the
    coordinator will escrow for them); None for a run with a budget (it is escrowed)."""
    if max_cost is not None:
        return _amount(max_cost, "max_cost")
    if run.budget is not None:
        return None
    hired = sum(c.price_micro for c in run.contracts if c.status == "hired")
    return format_price(hired * rounds)


# --- lifecycle (the wallet and the ledger: money.py) --------------------------------------


@operation
def start(self: AgentState) -> Op[Started]:
    """Check the coordinator answers (``GET /v1/health``), load the agent's wallet
    (created under ``HOME/wallets`` if missing; a read-only agent has none) and return
    ``{status, name, address, coordinator, network, coordinator_version}``."""
    from aitbc.ledger.wallet import ensure_wallet
    from aitbc.replies.health import Health

    if self.config.wallet_name is not None:
        self._wallet = yield Offload(ensure_wallet, (self.config.resolved_home, self.config.wallet_name))
    health = yield from ask(Health, Http("GET", "/health"))
    return Started(
        status="started",
        name=self.config.name,
        address=self.address,
        coordinator=self.config.resolved_coordinator_url,
        network=self.config.blockchain_network,
        coordinator_version=health.version,
    )


@operation
def stop(self: AgentState) -> Op[Stopped]:
    """Release the agent's connections (runs keep going on the coordinator)."""
    yield Close()
    return Stopped(status="stopped", name=self.config.name)


def _wallet(self: AgentState) -> Op[Any]:
    """The agent's wallet (loaded on first use)."""
    if self.config.wallet_name is None:
        raise InvalidArgument("no_wallet", "this agent is read-only (AgentConfig(wallet_name=None)); name a wallet")
    if self._wallet is None:
        from aitbc.ledger.wallet import load_wallet

        self._wallet = yield Offload(load_wallet, (self.config.resolved_home, self.config.wallet_name))
    return self._wallet


# --- the agent's current run --------------------------------------------------------------


def resolve_run(self: AgentState, training_id: str | None) -> Op[str]:
    """The run a method acts on: ``training_id`` if given (it becomes the agent's current
    run), else the current run (the one the agent initialized or last named), else the
    only active run (not complete, failed or stopped) its wallet owns, which becomes
    current. None or several: :class:`AmbiguousRun`, naming the candidates."""
    if training_id is not None:
        if not isinstance(training_id, str) or not training_id:
            raise InvalidArgument("bad_argument", f"training_id must be a run id (training_...), got {training_id!r}")
        self._training_id = training_id
        return training_id
    if self._training_id is not None:
        return self._training_id
    if self.config.wallet_name is None:
        raise AmbiguousRun(
            "no_current_run", "this read-only agent has no current run and no wallet to find one; pass training_id=", []
        )
    candidates = yield from _active_runs(self)
    if len(candidates) == 1:
        self._training_id = candidates[0]
        return candidates[0]
    wallet = yield from _wallet(self)
    who = f"wallet {self.config.wallet_name!r} ({wallet.address})"
    if not candidates:
        raise AmbiguousRun(
            "no_current_run",
            f"this agent has no current run and {who} owns no active run; create one "
            f"(initialize_distributed_training) or pass training_id=",
            [],
        )
    raise AmbiguousRun(
        "ambiguous_run",
        f"this agent has no current run and {who} owns {len(candidates)} active runs "
        f"({', '.join(candidates)}); pass training_id= to choose one",
        candidates,
    )


def _active_runs(self: AgentState) -> Op[list[str]]:
    wallet = yield from _wallet(self)
    res = yield from ask(Page[RunSummary], Http("GET", "/runs", params={"owner": wallet.address}))
    return [r.training_id for r in res.data if r.status not in ENDED]


def _soft_run(self: AgentState, training_id: str | None) -> Op[str | None]:
    """:func:`resolve_run`, or None where it would raise (for methods that work without a run)."""
    try:
        return (yield from resolve_run(self, training_id))
    except AmbiguousRun:
        return None


# --- a run --------------------------------------------------------------------------------


@operation
def initialize_distributed_training(
    self: AgentState,
    model_type: str | None,
    dataset_size: int | float | str,
    target_workers: int,
    *,
    model_options: JsonObject | None = None,
    seed: int = 0,
    budget: int | float | str | Decimal | None = None,
    bond: int | float | str | Decimal | None = None,
    control: Literal["automatic", "manual"] = "automatic",
    from_pretrained: str | Path | None = None,
    lora: str | JsonObject | None = None,
) -> Op[NewRun]:
    """Create a run (``POST /v1/runs``); returns its summary with ``training_id``.

    ``dataset_size``: a number means GB (``100`` -> ``"100GB"``), or a string such as
    ``"500MB"``; the real size is measured when the data is uploaded. ``model_options``:
    the model's options (e.g. ``{"context": 64}``); ``seed``: of the data split and the
    initial model; ``budget``: AIT escrowed now (without it ``start_training`` escrows the
    contracts' cost); ``bond``: AIT each hired provider locks (default 0); ``control``:
    ``"automatic"`` (the coordinator drives the phases) or ``"manual"`` (the agent does,
    with :meth:`update_training_phase`, :meth:`send_training_job` and
    :meth:`federated_average`; the coordinator waits).

    ``from_pretrained``: a fine-tune of a local Hugging Face model directory (config.json,
    ``*.safetensors``, tokenizer.json; a pickled ``.bin`` is refused): its weights and
    tokenizer are stored on the coordinator for the run, and ``model_type`` (None, or the
    config's family such as ``"hf:llama"``) and the options come from its config
    (``model_options`` given here override them, e.g. ``context``). ``lora``: train a LoRA
    adapter instead of every weight, ``"r=16,alpha=32,dropout=0.05,targets=q_proj,v_proj"``
    or that as a dict."""
    if control not in ("automatic", "manual"):
        raise InvalidArgument("bad_control", f"control must be 'automatic' or 'manual', got {control!r}")
    if isinstance(dataset_size, bool) or not isinstance(dataset_size, (int, float, str)):
        raise InvalidArgument(
            "bad_size", f"dataset_size must be a number of GB or a size like '500MB', got {dataset_size!r}"
        )
    size = dataset_size if isinstance(dataset_size, str) else f"{dataset_size:g}GB"
    if isinstance(target_workers, bool) or not isinstance(target_workers, int) or target_workers < 1:
        raise InvalidArgument("bad_workers", f"target_workers must be an integer >= 1, got {target_workers!r}")
    money = {k: _amount(v, k) for k, v in (("budget", budget), ("bond", bond)) if v is not None}
    if from_pretrained is not None:
        from aitbc_agent_sdk.pretrained import upload_pretrained

        model = yield from upload_pretrained(self, from_pretrained, model_type, model_options, lora)
        model_type, model_options = model.model_type, model.model_options
    elif lora is not None:
        raise InvalidArgument("bad_lora", "lora adapts pretrained weights: give from_pretrained=DIR too")
    if not isinstance(model_type, str) or not model_type:
        raise InvalidArgument("bad_model", "model_type is needed (or from_pretrained=DIR, which names it)")
    body: dict[str, Any] = {
        "model_type": model_type,
        "dataset_size": size,
        "target_workers": target_workers,
        "network": self.config.blockchain_network,
        "model_options": dict(model_options or {}),
        "seed": int(seed),
        "control": control,
    }
    body |= money
    owner_on_chain = yield from owner_evm(self)
    if owner_on_chain is not None:  # an EVM coordinator: the run's owner on chain, and its proof
        body |= owner_on_chain
    run = yield from ask(RunSummary, Http("POST", "/runs", body))
    self._training_id = run.training_id
    return NewRun.of(run)


@operation
def get_training_status(self: AgentState, training_id: str | None = None) -> Op[TrainingStatus]:
    """The run's detail (``GET /v1/runs/{id}``; default: the agent's current run) plus
    ``phase`` (its status: initializing, distributing, training, aggregating, paused,
    complete, failed, stopped)."""
    training_id = yield from resolve_run(self, training_id)
    run = yield from run_detail(training_id)
    return TrainingStatus.of(run)


def run_detail(training_id: str) -> Op[RunDetail]:
    """The run's detail (``GET /v1/runs/{id}``)."""
    return (yield from ask(RunDetail, Http("GET", f"/runs/{training_id}")))


@operation
def list_trainings(self: AgentState, status: str | None = None, owner: str | None = None) -> Op[list[RunSummary]]:
    """Every run on the coordinator, newest first (``status``: only runs in that state;
    ``owner``: only runs of that wallet address): ``[{training_id, status, model_type,
    round, rounds, val_loss, target_workers, owner, created_at, ...}]``."""
    res = yield from ask(Page[RunSummary], Http("GET", "/runs", params={"status": status, "owner": owner}))
    return res.data


@operation
def start_training(
    self: AgentState,
    training_id: str | None = None,
    rounds: int = run_defaults.ROUNDS,
    local_steps: int = run_defaults.LOCAL_STEPS,
    *,
    batch_size: int = run_defaults.BATCH_SIZE,
    lr: float = run_defaults.LR,
    inner_opt: str = run_defaults.INNER_OPT,
    outer: str = run_defaults.OUTER,
    outer_options: JsonObject | None = None,
    aggregator: str | None = None,
    compression: str = run_defaults.COMPRESSION,
    error_feedback: bool = run_defaults.ERROR_FEEDBACK,
    deadline: float | None = None,
    quorum: int | None = None,
    min_workers: int | None = None,
    max_workers: int | None = None,
    eval_every: int = run_defaults.EVAL_EVERY,
    max_cost: int | float | str | Decimal | None = None,
    verify_rate: float = run_defaults.VERIFY_RATE,
    overlap: int = run_defaults.OVERLAP,
    precision: str = run_defaults.PRECISION,
    mode: str = "sync",
    buffer: int | None = None,
    max_staleness: int = 4,
    staleness: str = "polynomial",
    topology: str = "ring",
    chain_timeout: int | None = None,
    progress: Progress | None = None,
) -> Op[TrainingStatus]:
    """Assign the shards to the hired workers and start the rounds (``distribute``):
    ``rounds`` of ``local_steps`` inner steps (of ``batch_size`` samples, learning rate
    ``lr``, optimizer ``inner_opt``) per worker, aggregated by ``aggregator`` (e.g.
    ``trimmed-mean:beta=0.2``; default the codec's: ``sparse-robust`` for a sparse codec,
    else :data:`aitbc.run_defaults.AGGREGATOR`) and the ``outer`` optimizer (fedavg, diloco; its
    ``outer_options``), updates sent through ``compression`` (e.g. ``int8``,
    ``topk:ratio=0.01``; ``error_feedback`` keeps each worker's residual). ``deadline``:
    seconds a round waits at most (default :data:`aitbc.run_defaults.DEADLINE`), then
    closes with ``quorum`` accepted updates (default ``min_workers``, default 1); a worker
    that sent nothing by then loses its place; ``max_workers``: joiners included (default: target
    workers); the model is evaluated every ``eval_every`` rounds. A run without a budget
    escrows the contracts' cost now; unless ``max_cost`` is given it is the contracts'
    price x rounds. ``verify_rate`` in [0, 1]: spot checks, the expected share of each
    update's local steps the coordinator re-runs (a verified update is paid in full; one
    that fails is rejected and its worker slashed). ``overlap`` 1: a worker starts round
    r+1 from the newest published model as soon as it has sent round r, and its update is
    applied to the newer model (one-step delay); 2: two rounds ahead, the next round's
    update sent before that round opens (two-step delay); 0: synchronous rounds. ``precision``
    ``bf16``: the workers' inner steps run under bfloat16 autocast (``fp32``: none).
    ``mode`` ``async``: no round barrier; every ``buffer`` accepted updates (default half
    the workers; or ``deadline`` seconds with at least one) are applied as a new version,
    each down-weighted by ``staleness`` (a rule of :mod:`aitbc.core.staleness`) for the
    versions applied since the one it was trained from, and refused past ``max_staleness``.
    ``mode`` ``gossip``: workers train from their own models and mix them with their
    ``topology`` neighbours' (``ring``, ``random:K``) peer to peer, by the run's rule; the
    coordinator records each worker's signed model CID per round and scores them.
    On an EVM coordinator the wallet's EVM account deposits the escrow on chain first, once
    (:func:`aitbc_agent_sdk.chain.deposit_for_distribute`: ``chain_timeout``, ``progress``).
    Returns the run detail with ``phase``."""
    training_id = yield from resolve_run(self, training_id)
    run = yield from run_detail(training_id)
    # the plan as distribute's body, in the signature's order (topology and outer_options where they apply)
    body: dict[str, Any] = dict(rounds=rounds, local_steps=local_steps, batch_size=batch_size, lr=lr)
    body |= dict(inner_opt=inner_opt, outer=outer, aggregator=aggregator, compression=compression)
    body |= dict(error_feedback=error_feedback, deadline=deadline, quorum=quorum, min_workers=min_workers)
    body |= dict(max_workers=max_workers, eval_every=eval_every, max_cost=_max_cost(run, rounds, max_cost))
    body |= dict(verify_rate=verify_rate, overlap=overlap, precision=precision, mode=mode, buffer=buffer)
    body |= dict(max_staleness=max_staleness, staleness=staleness)
    run_mode = RunMode.parse(mode)
    if run_mode is not None and run_mode.peer_to_peer:
        body["topology"] = topology
    if outer_options is not None:
        body["outer_options"] = dict(outer_options)
    yield from deposit_for_distribute(self, run, body, rounds=rounds, chain_timeout=chain_timeout, progress=progress)
    run = yield from ask(RunDetail, Http("POST", f"/runs/{training_id}/distribute", body))
    return TrainingStatus.of(run)


@operation
def stop_training(self: AgentState, training_id: str | None = None) -> Op[RunSummary]:
    """End the run now (it ends as ``stopped``; its workers are released, closed rounds
    settled and the rest of the escrow refunded). Returns the run's summary."""
    training_id = yield from resolve_run(self, training_id)
    return (yield from ask(RunSummary, Http("POST", f"/runs/{training_id}/stop")))


@operation
def pause_training(self: AgentState, training_id: str | None = None) -> Op[RunSummary]:
    """Hold an automatic run after its current round's updates (``paused``); returns the
    run's summary. :meth:`resume_training` continues it."""
    training_id = yield from resolve_run(self, training_id)
    return (yield from ask(RunSummary, Http("POST", f"/runs/{training_id}/pause")))


@operation
def resume_training(self: AgentState, training_id: str | None = None) -> Op[RunSummary]:
    """Continue a paused run; returns the run's summary."""
    training_id = yield from resolve_run(self, training_id)
    return (yield from ask(RunSummary, Http("POST", f"/runs/{training_id}/resume")))


@operation
def get_training_progress(self: AgentState, training_id: str | None = None) -> Op[TrainingProgress]:
    """``{round, rounds, rounds_completed, speed, target_speed, val_loss, phase}`` of the
    run (default: the agent's current run): ``speed`` is rounds completed per second
    since training started; ``target_speed`` the rounds per second its plan asks for
    (1/deadline; without a deadline, as the coordinator derives it from the plan)."""
    training_id = yield from resolve_run(self, training_id)
    run = yield from run_detail(training_id)
    deadline = run.config.get("deadline")
    return TrainingProgress(
        round=run.round,
        rounds=run.rounds,
        rounds_completed=run.rounds_completed,
        speed=run.speed,
        target_speed=(1.0 / deadline) if deadline else run.target_speed,
        val_loss=run.val_loss,
        phase=run.status,
    )


@operation
def wait_for_completion(
    self: AgentState, training_id: str | None = None, timeout: float = 600.0, poll: float = 1.0
) -> Op[TrainingStatus]:
    """Poll the run until it ends; returns its detail when ``complete``. Raises
    :class:`TrainingFailed` if it fails or is stopped and :class:`WaitTimeout` after
    ``timeout`` s. Its last rounds may not be paid yet: :meth:`get_payments` waits for that."""
    training_id = yield from resolve_run(self, training_id)
    t0 = time.monotonic()
    while True:
        run = yield from run_detail(training_id)
        if run.status == "complete":
            return TrainingStatus.of(run)
        if run.status == "failed":
            raise TrainingFailed("run_failed", f"run {training_id} failed: {run.error or 'no reason recorded'}")
        if run.status == "stopped":
            raise TrainingFailed("run_stopped", f"run {training_id} was stopped by its owner")
        left = timeout - (time.monotonic() - t0)
        if left <= 0:
            raise WaitTimeout(
                "timeout",
                f"run {training_id} did not finish within {timeout:g} s "
                f"(status {run.status}, round {run.round}/{run.rounds})",
            )
        yield Sleep(min(poll, left))


@operation
def get_results(self: AgentState, training_id: str | None = None) -> Op[Results]:
    """Final metrics, the model's CID, every checkpoint and the workers' scores."""
    training_id = yield from resolve_run(self, training_id)
    return (yield from ask(Results, Http("GET", f"/runs/{training_id}/results")))
