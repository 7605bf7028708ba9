"""Request bodies of the API (pydantic): the shape and ranges of what clients may send.
Cross-field and domain checks (a codec name, an aggregator's conditions) happen in the
service functions, which know the run."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from aitbc import run_defaults
from aitbc.coordinator.store.models import JobOverrides
from aitbc.coordinator.transfer.peers import MAX_HELD, MAX_URL, check_advertise
from aitbc.market.capacity import MAX_OFFER_PARAMS

Advertise = Annotated[str, Field(min_length=1, max_length=MAX_URL), AfterValidator(check_advertise)]


class Body(BaseModel):
    # strict: JSON types are taken as sent. Lax mode would read ``true`` as 1 (a price of
    # 1 AIT, one worker) and "3" or 3.0 as the integer 3. Integers are still floats.
    # allow_inf_nan=False: NaN and +-Infinity (which Python's JSON parser accepts) are refused
    # in every float field; _finite refuses them anywhere else too (free-form options).
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _finite(cls, data: Any) -> Any:
        where = _non_finite(data, ())
        if where is not None:
            raise ValueError(f"{where or 'body'}: must be a finite number (NaN and Infinity are refused)")
        return data


def _non_finite(v: Any, path: tuple[str, ...]) -> str | None:
    """The dotted path of the first non-finite float in a parsed JSON value, or None."""
    if isinstance(v, float):
        return None if math.isfinite(v) else ".".join(path)
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        where = _non_finite(x, (*path, str(k)))
        if where is not None:
            return where
    return None


class RunCreate(Body):
    model_type: str = Field(min_length=1, max_length=200)
    model_options: dict[str, Any] = Field(default_factory=dict)
    dataset_size: str = Field(min_length=1, max_length=32)
    target_workers: int = Field(ge=1, le=10_000)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    budget: str | float | None = None  # AIT escrowed now from the owner's wallet
    bond: str | float = "0"  # AIT each hired provider locks for the run
    network: str = "local"
    control: Literal["automatic", "manual"] = "automatic"  # manual: the owner's agent moves the phases
    # the owner's EVM account, on a coordinator that settles on an EVM chain (required there):
    # the run's escrow key on chain is derived from it, and the escrow left is refunded to it
    evm_address: str | None = Field(None, max_length=64)
    # that account's signature over aitbc.chain.evm.proof.proof_message (required with it there)
    evm_proof: str | None = Field(None, max_length=200)


class DataAttach(Body):
    manifest_cid: str = Field(min_length=1, max_length=100)
    source: str | None = Field(None, max_length=500)  # what the owner named (digits, a path)


class Discover(Body):
    min_gpu: str | None = Field(None, max_length=64)
    required_workers: int = Field(ge=1, le=10_000)
    max_price: str | float | None = None


# The bounds of a training config (documented in docs/trust-model.md): an owner cannot pick
# a config that makes honest providers' updates look like misbehaviour. (lo, hi), inclusive;
# each out-of-range value is a 422 naming the option and its range. The outer optimizer's
# options are bounded by its own config (aitbc.core.outer: lr in (0, 10], momentum in [0, 0.99]).
CONFIG_RANGES: dict[str, tuple[float, float]] = {
    "rounds": (1, 100_000),
    "local_steps": (1, 100_000),
    "batch_size": (1, 65_536),
    "lr": (1e-8, 1.0),  # the inner optimizer's learning rate
    "deadline": (0.1, 86_400),  # seconds a round waits at most
    "quorum": (1, 10_000),
    "min_workers": (1, 10_000),
    "max_workers": (1, 10_000),
    "eval_every": (1, 100_000),
    "learning_rate": (1e-8, 1.0),  # a job's lr, by its documented name
    "epochs": (1, 1_000),  # a job's passes over its shard per round (the worker computes the steps)
    "verify_rate": (0.0, 1.0),  # the expected share of each update's steps the coordinator re-runs
    "overlap": (0, 2),  # rounds a worker may train ahead of the newest model (1: one-step delay; 2: two)
    "buffer": (1, 10_000),  # async: accepted updates applied together (FedBuff's K)
    "max_staleness": (0, 1_000),  # async: aggregations an update may be behind; older ones are refused
}


def _in_range(name: str) -> Any:
    """A field's bounds: in the OpenAPI document (minimum/maximum) and checked with one
    message naming the option and its whole range."""
    lo, hi = CONFIG_RANGES[name]

    def check(v: Any) -> Any:
        if v is not None and not (lo <= v <= hi):
            raise ValueError(f"{name} must be in [{lo:g}, {hi:g}], got {v:g}")
        return v

    return AfterValidator(check), Field(json_schema_extra={"minimum": lo, "maximum": hi})


# A field left out takes its default from aitbc.run_defaults, as the CLI, the SDK and the
# simulator do. Not deadline: left out it stays None in the run's config (the owner gave
# none), and the round waits run_defaults.DEADLINE (RunConfig.round_deadline).
class Distribute(Body):
    strategy: Literal["data-parallel"] = "data-parallel"
    rounds: Annotated[int, *_in_range("rounds")] = run_defaults.ROUNDS
    local_steps: Annotated[int, *_in_range("local_steps")] = run_defaults.LOCAL_STEPS
    batch_size: Annotated[int, *_in_range("batch_size")] = run_defaults.BATCH_SIZE
    lr: Annotated[float, Field(allow_inf_nan=False), *_in_range("lr")] = run_defaults.LR
    inner_opt: str = run_defaults.INNER_OPT
    outer: str = run_defaults.OUTER
    outer_options: dict[str, Any] = Field(default_factory=dict)
    # None: the codec's (run_defaults.default_aggregator: sparse-robust for a sparse codec), as simulate
    aggregator: str | None = None
    compression: str = run_defaults.COMPRESSION
    error_feedback: bool = run_defaults.ERROR_FEEDBACK
    # sync: a round waits for every worker (or its deadline); async: every ``buffer`` accepted
    # updates (or ``deadline`` seconds with at least one) are applied, a new version each time
    # gossip: workers train from their own models and mix with their topology neighbours' peer to peer
    mode: Literal["sync", "async", "gossip"] = run_defaults.MODE
    # gossip: who mixes with whom: ring, or random:K (K neighbours drawn each round from the run's seed)
    topology: str | None = Field(None, min_length=1, max_length=32)
    # async: updates per application (default: half the workers, at least 1)
    buffer: Annotated[int | None, *_in_range("buffer")] = None
    # async: an update trained from a version more than this many applications old is refused
    max_staleness: Annotated[int, *_in_range("max_staleness")] = 4
    # async: how a stale update is down-weighted (aitbc.core.staleness): constant, polynomial[:a=..], hinge[:a=..,b=..]
    staleness: str = Field("polynomial", min_length=1, max_length=100)
    # seconds a round waits at most (async: the time bound of a buffer)
    deadline: Annotated[float | None, Field(allow_inf_nan=False), *_in_range("deadline")] = None
    # accepted updates a round needs to close at its deadline
    quorum: Annotated[int | None, *_in_range("quorum")] = None
    min_workers: Annotated[int | None, *_in_range("min_workers")] = None
    max_workers: Annotated[int | None, *_in_range("max_workers")] = None
    eval_every: Annotated[int, *_in_range("eval_every")] = run_defaults.EVAL_EVERY
    # spot checks: the expected share of each update's local steps the coordinator re-runs
    # (0: none; every update then keeps the heuristic score)
    verify_rate: Annotated[float, Field(allow_inf_nan=False), *_in_range("verify_rate")] = run_defaults.VERIFY_RATE
    # overlapping rounds (1): a worker trains round r+1 from the model round r started from while
    # round r closes; its update is applied to the newest model (one-step delay). 2: it trains
    # round r+2 while rounds r and r+1 close, and sends round r+1's update while round r is
    # still open (two-step delay: the close and the next model's way back get two rounds of
    # compute to hide in). 0: synchronous
    overlap: Annotated[int, *_in_range("overlap")] = run_defaults.OVERLAP
    # the inner steps' arithmetic on every worker: fp32, or bf16 (bfloat16 autocast, CPU and CUDA)
    precision: Literal["fp32", "bf16"] = run_defaults.PRECISION
    max_cost: str | float | None = None  # AIT the owner lets distribute escrow (runs without a budget)


class WorkerRegister(Body):
    gpu: str = Field(min_length=1, max_length=64)
    price: str | float = Field(description="AIT per round, up to 6 decimals")
    availability: float = Field(1.0, ge=0, le=1)
    device: dict[str, Any] = Field(default_factory=dict)
    max_bond: str | float = "0"  # AIT: the most a contract may lock from this wallet
    # the largest model it trains, in parameters (aitbc.market.capacity); none: no stated limit
    max_params: int | None = Field(None, ge=1, le=MAX_OFFER_PARAMS)
    # where this worker serves blobs to its peers (peer transport); none: it fetches only
    advertise: Advertise | None = None
    # the provider's EVM account, on a coordinator that settles on an EVM chain (required there):
    # it bonds from it and is paid at it
    evm_address: str | None = Field(None, max_length=64)
    # that account's signature over aitbc.chain.evm.proof.proof_message (required with it there)
    evm_proof: str | None = Field(None, max_length=200)


class Holdings(Body):
    """A worker's blobs that its peers may fetch from it (peer transport; the last one wins)."""

    advertise: Advertise
    cids: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(max_length=MAX_HELD)


class BadPeer(Body):
    """A peer served bytes for ``cid`` that did not hash to it."""

    peer: str = Field(min_length=1, max_length=64)  # the worker it was handed out as


class Progress(Body):
    progress: float = Field(ge=0, le=100)  # percent of the job's work in this round
    loss: float | None = None
    epoch: float = Field(0.0, ge=0, allow_inf_nan=False)  # stored and shown: finite
    status: str = Field(min_length=1, max_length=32)
    round: int | None = Field(None, ge=1, le=10_000_000)  # the round reported on (older workers: none)
    step: int | None = Field(None, ge=0, le=100_000)  # local steps done in it (at most local_steps' bound)
    # gossip: seconds from the start of the round's training to ``step``, on the worker's own clock
    seconds: float | None = Field(None, ge=0, le=1e7)


class UpdateSubmit(Body):
    round: int = Field(ge=1, le=10_000_000)  # bounded: a database integer, and no run has more rounds
    cid: str = Field(min_length=1, max_length=100)
    train_loss: float | None = None
    # the share of its round's training samples it predicted right, as it reports it (classifiers)
    train_accuracy: float | None = Field(None, ge=0, le=1)
    steps: int = Field(ge=1)
    compute_seconds: float = Field(0.0, ge=0, le=366 * 86_400, allow_inf_nan=False)  # summed per job: finite
    epoch: float | None = Field(None, ge=0, allow_inf_nan=False)  # passes over its shard so far (its last progress)
    shard_cid: str | None = Field(
        None, max_length=100
    )  # the shard trained on (its job's, or the one it was split from)
    # what the worker commits to (aitbc.training.proof.Commitment as JSON): required when the
    # run verifies work (verify_rate > 0), checked against the round's local steps
    proof: dict[str, Any] | None = None
    # the global model it trained from: the round's (the default), or, in a run with
    # overlap k, one of the k before it (the worker began the round before the last one
    # closed); an update sent ahead of its round (overlap 2) always names it
    base_cid: str | None = Field(None, max_length=100)
    # overlap, trained ahead: this job's own update of the round before, which the worker
    # took from base_cid, with that update's own priors back to the base's round, to start
    # where its last round ended (it started from ``base - decode(prior) - ...``; see
    # aitbc.coordinator.rounds.admission.update_prior)
    prior_cid: str | None = Field(None, max_length=100)
    # the update blob itself, base64 (standard alphabet, padded): stored under ``cid`` as a
    # ``PUT /v1/blobs/{cid}`` would, in the same request (a small model's update: one
    # request a round, not two). Bounded by the coordinator's JSON body limit.
    blob: str | None = Field(None, min_length=1)


class ProofReveal(Body):
    """The states a spot check asked for, as uploaded blobs: ``states`` maps each
    challenged boundary (its index, as a string) to the CID of that state's blob
    (:meth:`aitbc.training.proof.TrainState.to_bytes`); ``residual``: the CID of the
    error-feedback residual the round began with (safetensors ``residual``), when the
    challenge includes the update's own check under error feedback."""

    round: int = Field(ge=1, le=10_000_000)  # bounded: a database integer, and no run has more rounds
    states: dict[str, str] = Field(max_length=34)
    residual: str | None = Field(None, max_length=100)


class WalletFund(Body):
    amount: str | float
    network: str = "local"


class WalletSend(Body):
    to: str = Field(min_length=1, max_length=64)
    amount: str | float
    network: str = "local"


class ContractCreate(Body):
    worker_id: str = Field(min_length=1, max_length=64)
    price: str | float  # AIT per round the owner offers


class PaymentCreate(Body):
    contract_id: str = Field(min_length=1, max_length=64)
    amount: str | float


class JobConfig(Body):
    """The owner's per-job overrides of the run's training config. ``learning_rate`` is
    the documented name of ``lr``; ``epochs`` (passes over the job's shard per round)
    takes the place of ``local_steps``: the worker computes the steps from its shard's
    size (:func:`aitbc.training.local.epoch_steps`: ``epochs x (samples // batch_size)``),
    and the coordinator refuses a job whose steps would pass the ``local_steps`` bound."""

    local_steps: Annotated[int | None, *_in_range("local_steps")] = None
    batch_size: Annotated[int | None, *_in_range("batch_size")] = None
    lr: Annotated[float | None, Field(allow_inf_nan=False), *_in_range("lr")] = None
    learning_rate: Annotated[float | None, Field(allow_inf_nan=False), *_in_range("learning_rate")] = None
    epochs: Annotated[int | None, *_in_range("epochs")] = None

    @model_validator(mode="after")
    def _one_name_each(self) -> JobConfig:
        if self.lr is not None and self.learning_rate is not None:
            raise ValueError("give lr or learning_rate (the same setting), not both")
        if self.local_steps is not None and self.epochs is not None:
            raise ValueError("give local_steps or epochs (epochs sets the steps from the shard's size), not both")
        return self

    def overrides(self) -> JobOverrides:
        """What the job stores: ``lr`` under one name; ``epochs`` replaces ``local_steps``."""
        out = cast(JobOverrides, self.model_dump(exclude_none=True, exclude={"learning_rate"}))
        if self.learning_rate is not None:
            out["lr"] = self.learning_rate
        return out


class JobCreate(Body):
    worker_id: str = Field(min_length=1, max_length=64)
    shard_id: str = Field(min_length=1, max_length=100)  # a shard's CID from the run's manifest
    config: JobConfig = Field(default_factory=JobConfig)


class PhaseSet(Body):
    phase: Literal["distributing", "training", "aggregating", "complete"]
    # the training config (with -> distributing only; none: every default)
    config: Distribute | None = None


class Aggregate(Body):
    updates: list[str] = Field(max_length=10_000)  # update CIDs of the closed round; none: the round is skipped
    weights: list[float] | None = None  # one per update; default: the shards' sample counts


MetricKey = Annotated[str, Field(min_length=1, max_length=64)]
MetricValue = float | int | bool | Annotated[str, Field(max_length=500)] | None


class ResultSave(Body):
    # a checkpoint of one of the run's rounds, or any blob the owner uploaded (its model)
    model_cid: str = Field(min_length=1, max_length=100)
    # the owner's own figures kept with it (final loss, workers, epochs): flat, at most 64
    metrics: dict[MetricKey, MetricValue] = Field(default_factory=dict, max_length=64)


class JobEnd(Body):
    status: Literal["failed", "released"]
    reason: str | None = Field(None, max_length=500)


class JobMove(Body):
    worker_id: str | None = Field(None, min_length=1, max_length=64)  # default: the best free worker


class RecordPublish(Body):
    """A gossip worker's signed model record (:mod:`aitbc.ledger.records`)."""

    record: dict[str, Any]
    signature: str = Field(max_length=200)


class WitnessReport(Body):
    """Gossip records of other workers of one run, as the reporter received them."""

    records: list[RecordPublish] = Field(min_length=1, max_length=64)
