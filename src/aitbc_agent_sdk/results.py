"""What the agents return besides the coordinator's own replies (:mod:`aitbc.replies`):
shapes the SDK puts together from one or more replies, each a typed model like the
replies, read by attribute (``run.training_id``) or, as the documentation's examples read
them, by key (``run["training_id"]``).

Some are a reply with a field or two more (:class:`TrainingStatus` is the run's detail
with ``phase``); :class:`Liveness`, :class:`Validity` and the :class:`Outcome` results are
truthy exactly when their verdict is, so ``if not agent.ping_worker(w):`` reads as it says."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from aitbc.replies.base import Reply
from aitbc.replies.jobs import Aggregated, JobDetail, WorkerJob
from aitbc.replies.runs import ContractView, MeasuredSize, RankedOffer, RunDetail, RunSummary
from aitbc.replies.workers import MarketOffer
from aitbc.states import JobStatus, OfferStatus, RunStatus, UpdateStatus

# --- the agent ------------------------------------------------------------------------------


class Started(Reply):
    status: str = Field(description='"started"')
    name: str
    address: str | None = Field(description="the wallet's address; None for a read-only agent")
    coordinator: str
    network: str
    coordinator_version: str


class Stopped(Reply):
    status: str = Field(description='"stopped"')
    name: str


# --- a run ----------------------------------------------------------------------------------


class NewRun(RunSummary):
    """The new run's summary, with ``phase`` (its status)."""

    phase: RunStatus

    @classmethod
    def of(cls, run: RunSummary) -> NewRun:
        return cls(**run.__dict__, phase=run.status)


class TrainingStatus(RunDetail):
    """The run's detail, with ``phase`` (its status)."""

    phase: RunStatus

    @classmethod
    def of(cls, run: RunDetail) -> TrainingStatus:
        return cls(**run.__dict__, phase=run.status)


class TrainingProgress(Reply):
    round: int = Field(description="the open round (1-based); 0 before training")
    rounds: int | None = Field(description="rounds planned; null for a run without a round limit")
    rounds_completed: int = Field(description="rounds closed")
    speed: float = Field(description="rounds completed per second since training started")
    target_speed: float | None = Field(description="the rounds per second the run's plan asks for")
    val_loss: float | None = Field(description="validation loss of the latest evaluated round")
    phase: RunStatus = Field(description="the run's status")


class DataUploaded(Reply):
    training_id: str
    manifest_cid: str
    shards: list[str] = Field(description="the shards' CIDs")
    shard_samples: list[int]
    val_cid: str
    samples: int
    val_samples: int
    data_bytes: int | None = Field(description="as the coordinator measured them")
    dataset_size: str = Field(description="as the owner declared it")
    dataset: str
    task: str
    measured: MeasuredSize | None = Field(None, description="bytes, documents, tokens, samples as read")
    tokenizer_cid: str | None = Field(None, description="the tokenizer blob (token data); null for bytes/arrays")
    vocab_size: int | None = Field(None, description="the tokenizer's vocabulary size")


class ShardRef(Reply):
    shard_id: str = Field(description="the shard's CID")
    samples: int
    shard_index: int


class ModelDownload(Reply):
    training_id: str
    path: str = Field(description="the file written")
    cid: str = Field(description="the model's CID, which its bytes were checked against")
    bytes: int = Field(description="its size")


class RoundCheckpoint(Reply):
    round: int = Field(description="0: the initial model")
    checkpoint_id: str = Field(description="the checkpoint's CID")
    checkpoint_cid: str
    val_loss: float | None
    val_accuracy: float | None


class AveragedModel(Aggregated):
    """The aggregated round, with the model itself."""

    model: dict[str, Any] = Field(exclude=True, description="the model's tensors by name (its state dict)")


# --- workers --------------------------------------------------------------------------------


class FreeOffer(MarketOffer):
    """A live offer no run holds, with its marketplace score."""

    score: float


class HiredOffer(RankedOffer):
    """A ranked offer of a discovery that hired; ``contract_id`` when it was hired."""

    contract_id: str | None = None


class WorkerProgress(Reply):
    job_id: str
    worker_id: str
    training_id: str
    gpu_type: str | None
    progress: float = Field(description="percent of the job's work in the open round, 0-100")
    loss: float = Field(description="its latest training loss; before that, the loss of the model it starts from")
    epoch: float
    status: str
    speed: float
    rounds_done: int
    round: int
    round_update: UpdateStatus | None = Field(description="its update of the open round, once sent")
    job_status: JobStatus


class FailedJob(WorkerJob):
    """A job marked failed; ``round`` and ``run_status`` are None for one that had failed already."""

    already_failed: bool
    round: int | None = None
    run_status: RunStatus | None = None


class WorkerAdded(Reply):
    contract: ContractView
    job: JobDetail | None = Field(description="its job, in an owner-driven run that is training")
    worker_id: str


# --- verdicts -------------------------------------------------------------------------------


class Verdict(Reply):
    """A result that is truthy exactly when its verdict field (``verdict``) is."""

    verdict: ClassVar[str]

    def __bool__(self) -> bool:
        return bool(getattr(self, self.verdict))


class Liveness(Verdict):
    """``ping_worker``: truthy exactly when the worker is ``alive``."""

    verdict = "alive"
    worker_id: str
    alive: bool = Field(description="its offer is online and its last heartbeat recent (within the lease, or max_age)")
    last_heartbeat_age: float = Field(description="seconds since its last heartbeat")
    status: OfferStatus = Field(description="its offer's status")
    gpu_type: str
    busy: bool = Field(description="hired by or working for a run that has not ended")


class Validity(Verdict):
    """``verify_checkpoint``: truthy exactly when the checkpoint is ``valid``."""

    verdict = "valid"
    valid: bool
    cid: str
    round: int | None
    detail: str
    worker_id: str | None = Field(None, description="a worker's update: its worker")
    pruned: bool = Field(False, description="a recorded round whose bytes the coordinator's blob retention deleted")


class Outcome(Verdict):
    """A fault-tolerance action that may find nothing to do (no free worker, no active
    job): truthy exactly when it was ``done``; ``detail`` says what happened."""

    verdict = "done"
    done: bool
    worker_id: str
    detail: str


class WorkloadReduced(Outcome):
    job_id: str | None
    local_steps: int | None
    job: JobDetail | None


class WorkSplit(Outcome):
    job: JobDetail | WorkerJob | None = Field(description="the job, keeping the first half")
    new_job: JobDetail | None = Field(description="the job on the second half")
