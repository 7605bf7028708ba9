"""A worker's job: how it looks in a run (:class:`JobView`), what its worker is told to do
(:class:`JobOrder`), its updates and their spot checks, and the owner's manual moves on it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from aitbc.replies.base import JsonObject, MicroAIT, Reply
from aitbc.replies.blobs import PeerRef
from aitbc.replies.gossip import GossipOrder
from aitbc.states import JobStatus, RunStatus, UpdateStatus


class JobView(Reply):
    job_id: str
    worker_id: str
    contract_id: str
    gpu_type: str | None = Field(description="the worker's advertised GPU class")
    shard_index: int
    shard_cid: str
    job_status: JobStatus
    status: str = Field(
        description="complete once its update for the run's current round is in (rejected if refused); "
        "before that the worker's last report for this round (training, ...) or waiting; "
        "failed/released once the job ended"
    )
    progress: float = Field(description="percent of this job's work in the current round (its steps), 0-100")
    loss: float | None = Field(
        description="the worker's last reported training loss; before its first report the validation "
        "loss of the model it starts from; null only before training started"
    )
    epoch: float = Field(description="passes over its shard so far")
    steps: int = Field(description="its local steps a round: its own, epochs over its shard, or the run's")
    speed: float = Field(description="samples per second, measured between its progress reports; 0 until measured")
    rounds_done: int
    this_round: UpdateStatus | None = Field(description="its update of the open round, if sent")
    joined_round: int
    replaces: str | None
    moved_from: int | None = Field(
        description="the shard it trained before its latest move (a split of its shard, or the coordinator "
        "moving it to a shard left without a worker); null if it never moved"
    )
    end_reason: str | None
    compute_seconds: float
    config: JsonObject
    last_heartbeat_age: float | None


class JobDetail(JobView):
    training_id: str
    round: int
    run_status: RunStatus


class WorkerJob(JobView):
    training_id: str


class SplitJobs(Reply):
    job: JobDetail = Field(description="the job, keeping the first half")
    new_job: JobDetail = Field(description="the job on the second half")


class ShardView(Reply):
    shard_index: int
    shard_id: str = Field(description="the shard's CID")
    samples: int
    split_from: int | None
    split_into: list[int] | None
    jobs: list[str] = Field(description="active jobs on this shard")


class Challenge(Reply):
    round: int
    boundaries: list[int] = Field(description="the committed states to reveal (indices into the proof's lists)")
    residual: bool = Field(description="also reveal the error-feedback residual the round began with")
    at: float = Field(description="when it was drawn; reveal within the coordinator's verify_timeout")


class UpdateAccepted(Reply):
    status: Literal["accepted"]
    round: int
    cid: str
    size: int
    verification: str | None = Field(
        description="unchecked, or challenged (reveal the states named in challenge); null: the run does not verify"
    )
    challenge: Challenge | None


class Revealed(Reply):
    round: int
    verification: str


class UpdateView(Reply):
    checkpoint_id: str
    cid: str
    training_id: str
    job_id: str
    worker_id: str
    round: int
    samples: int
    shard_index: int | None
    train_loss: float | None
    size: int
    status: UpdateStatus
    reason: str | None
    created_at: float
    verification: str | None = Field(
        description="unchecked, challenged, revealed, passed, drift (a replay missed within its drift bound: "
        "unpaid, not slashed), failed (proof: slashed) or unanswered; null: not verified"
    )
    verify_detail: str | None
    verify_steps: int = Field(description="local steps the coordinator re-ran to check it")


class ResendRequested(Reply):
    job_id: str
    worker_id: str
    round: int
    dropped: str = Field(description="the CID of the update dropped")
    status: Literal["resend_requested"]


class Aggregated(Reply):
    training_id: str
    round: int
    model_id: str
    model_cid: str
    loss: float | None
    accuracy: float | None
    updates: int
    skipped: bool
    weights: list[float]


Action = Literal["train", "wait"]  # what a job's worker is to do now


class BondRequired(Reply):
    """On an EVM coordinator: the bond this job's provider must post on chain before it
    trains (approve ``amount_micro`` of ``token`` to ``escrow``, then ``post_bond(key, amount_micro)``;
    0 is a bond too, and only a bonded provider can be paid). The job waits until the bond
    is seen on chain; updates sent before are refused 409 ``bond_required``."""

    chain_id: int
    escrow: str = Field(description="the RunEscrow contract's address")
    token: str = Field(description="the AIT token's address")
    key: str = Field(description="the run's key on chain, 0x + 64 hex digits")
    amount_micro: MicroAIT = Field(description="the bond, in micro-AIT (token units)")


class JobOrder(Reply):
    """What a worker should do now with its job."""

    job_id: str
    training_id: str
    action: Action
    run_status: RunStatus
    round: int
    send_round: int = Field(
        description="the round this job's next update is for: the open one, or with overlap 2 the next "
        "once its update of the open one is in (sent before that round opens)"
    )
    rounds: int | None
    global_model_cid: str | None
    shard_cid: str
    shard_index: int
    seed: int
    model_type: str
    model_options: JsonObject
    data_spec: JsonObject | None
    local_steps: int | None
    batch_size: int | None
    lr: float | None
    epochs: int | None = Field(
        description="passes over its shard a round, if the owner set them (local_steps is their steps)"
    )
    inner_opt: str | None
    compression: str | None
    error_feedback: bool | None
    d: int | None
    deadline_at: float | None
    verify_rate: float = Field(description="the run spot-checks updates (> 0): each must carry its proof")
    overlap: int = Field(
        0,
        description="1: the worker may train the next round from this round's model as soon as it has sent this one; "
        "2: it may also send the next round's update while this round is open (send_round), and train two ahead",
    )
    precision: str = Field("fp32", description="the inner steps' arithmetic: fp32, or bf16 (bfloat16 autocast)")
    mode: str = Field(
        "sync",
        description="async: the update names the version it was trained from (base_cid) and joins the open buffer",
    )
    challenge: Challenge | None = Field(description="this round's spot check of its update, while unanswered")
    model_peers: list[PeerRef] = Field(
        default_factory=list,
        description="workers to fetch global_model_cid from first (then the coordinator); empty: the coordinator",
    )
    global_model: str | None = Field(
        None,
        description="the bytes of global_model_cid, base64, when the poll asked for models up to `inline` bytes "
        "and this one is no larger (check them against the CID); null: fetch it by its CID",
    )
    gossip: GossipOrder | None = Field(None, description="gossip runs: the roster and how to mix")
    bond_required: BondRequired | None = Field(
        None,
        description="on an EVM coordinator, until this job's bond is seen on chain: post it, then ask again "
        "(the job waits meanwhile); null: bonded, or a local coordinator",
    )


class JobPoll(Reply):
    job: JobOrder | None
    version: int
