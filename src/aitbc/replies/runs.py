"""A training run: the summary in a list, the detail its owner reads, its contracts and
workers, and discovery (the ranked offers and the contracts made)."""

from __future__ import annotations

from pydantic import Field

from aitbc.replies.base import JsonObject, MicroAIT, Money, Reply
from aitbc.replies.gossip import GossipView
from aitbc.replies.jobs import JobView
from aitbc.states import ContractStatus, Control, RunStatus


class RunSummary(Reply):
    training_id: str
    status: RunStatus = Field(description="where the run is in its life")
    owner: str = Field(description="the owner's wallet address")
    model_type: str = Field(description="the built-in model (mlp, transformer, ...) or hf:FAMILY")
    dataset_size: str = Field(description="as the owner declared it")
    target_workers: int = Field(description="workers the run trains on")
    round: int = Field(description="the open round (1-based); 0 before training")
    rounds: int | None = Field(description="rounds planned; null for a run without a round limit")
    val_loss: float | None = Field(description="validation loss of the latest evaluated round")
    control: Control = Field(description="automatic: the coordinator drives the rounds; manual: its owner does")
    created_at: float = Field(description="unix seconds")
    updated_at: float = Field(description="unix seconds")


class MeasuredSize(Reply):
    """What was measured of a run's data as it was read (the manifest's ``measured``)."""

    bytes: int = Field(description="UTF-8 bytes of the text read (a classifier's: its arrays' bytes)")
    documents: int | None = Field(None, description="documents read (text files, records); null for arrays")
    tokens: int | None = Field(None, description="tokens in the packed stream (bytes for byte-level data)")
    samples: int | None = Field(None, description="training samples (windows of the model's context)")
    val_samples: int | None = Field(None, description="validation samples")


class ContractView(Reply):
    contract_id: str
    worker_id: str = Field(description="the provider's wallet address")
    training_id: str
    price: Money = Field(description="AIT per round at full quality")
    price_micro: MicroAIT = Field(description="price in micro-AIT")
    status: ContractStatus
    score: float = Field(description="the offer's marketplace score when it was hired, 0..1")


class WorkerScore(Reply):
    score: float | None = Field(description="mean quality over the scored rounds")
    last_quality: float | None
    score_flags: list[str]


class RunWorker(WorkerScore, JobView):  # bases in reverse: the job's fields come first, as in the view
    staleness: int | None = Field(
        None,
        description="async: versions between the model its latest applied update was trained from and the one it "
        "was applied to (0: fresh); null in a sync run or before its first update",
    )


class AsyncView(Reply):
    version: int = Field(description="the newest published version (buffers applied)")
    updates_per_second: float = Field(description="updates applied per second since training started")
    applied: int = Field(description="updates applied so far")
    refused_stale: int = Field(description="updates refused as older than max_staleness")


class VerificationSummary(Reply):
    rate: float = Field(description="the expected share of each update's local steps re-run")
    updates: int
    checked: int
    passed: int
    drift: int = Field(description="updates whose replay missed within its drift bound: unpaid, not slashed")
    failed: int = Field(description="updates whose check proved a fault: rejected, the worker slashed")
    unanswered: int
    errors: int = Field(description="checks that could not run for a reason proving nothing against the worker")
    pending: int
    steps_replayed: int
    steps_trained: int
    extra_compute: float = Field(description="steps re-run over steps trained")
    verify_seconds: float
    extra_seconds: float | None = Field(description="seconds spent re-running over the workers' compute seconds")


class RunDetail(RunSummary):
    model_options: JsonObject
    seed: int
    dataset_size_bytes: int
    data_source: str | None
    manifest_cid: str | None
    data_bytes: int | None = Field(description="the stored data's bytes (shards, validation, tokenizer)")
    measured: MeasuredSize | None = Field(
        None, description="what was measured as the data was read; null for data uploaded before it was recorded"
    )
    vocab_size: int | None = Field(None, description="the data's tokenizer's vocabulary size; null for bytes/arrays")
    tokens_seen: int | None = Field(
        None, description="language models: tokens the accepted updates were trained on; null for a classifier"
    )
    val_perplexity: float | None = Field(None, description="language models: exp(val_loss); null for a classifier")
    shards: int
    config: JsonObject
    global_model_cid: str | None
    network: str
    budget: Money | None = Field(description="AIT its owner set aside at create (escrowed at distribute); null: none")
    bond: Money = Field(description="AIT each hired provider posts as bond")
    escrowed: Money = Field(description="AIT escrowed for the run so far")
    initial_val_loss: float | None
    val_accuracy: float | None
    val_round: int | None = Field(
        None,
        description="the round whose evaluation val_loss and val_accuracy are (0: the initial model; a round's "
        "lands a moment after it closes); null before any",
    )
    rounds_completed: int
    bytes_up: int
    bytes_down: int
    error: str | None
    flags: int
    verification: VerificationSummary | None = Field(description="spot checks so far (runs with verify_rate > 0)")
    round_started_at: float | None
    deadline_at: float | None
    started_at: float | None
    finished_at: float | None
    paused_from: RunStatus | None
    manual_since: float | None = Field(description="when its owner took over an automatic run (first phase move)")
    manual_from_round: int | None = Field(description="the first round its owner drove (earlier: the driver's)")
    speed: float = Field(description="rounds closed per second since training started; 0 before")
    target_speed: float = Field(
        description="rounds per second: 1/deadline; without a deadline 1 / (the slowest active job's "
        "steps x batch_size / its measured speed); equal to speed until a speed is measured"
    )
    contracts: list[ContractView]
    workers: list[RunWorker]
    asynchronous: AsyncView | None = Field(None, description="async runs: version, throughput, refusals")
    gossip: GossipView | None = Field(None, description="gossip runs: consensus spread and the record's progress")
    time: float


class RankedOffer(Reply):
    worker_id: str
    gpu_type: str
    price: Money = Field(description="AIT per round at full quality")
    price_micro: MicroAIT = Field(description="price in micro-AIT")
    reputation: float
    availability: float
    score: float
    hired: bool
    max_params: int | None = Field(
        None, description="the largest model this provider trains, in parameters (none: no stated limit)"
    )


class Discovery(Reply):
    training_id: str
    ranked: list[RankedOffer]
    contracts: list[ContractView]
    count: int = Field(description="contracts made")
