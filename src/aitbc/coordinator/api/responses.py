"""What the API answers: one pydantic model per response shape, and the error responses
each route declares, so the OpenAPI document says exactly what a client receives.

The models mirror the read views (:mod:`aitbc.coordinator.runs.views` and the use-cases'
return values) key for key. They forbid extra keys on purpose: a view that gains a key
the model lacks fails loudly in the tests (a 500) instead of the key being dropped from
the reply without anyone noticing. Lists are ``{data, count}`` (:class:`Page`).

Money is shown as AIT text (``"1.5"``) and, where clients compute with it, as integer
micro-AIT in a ``*_micro`` field; prices (AIT per round) are numbers (``1.5``) with the
exact ``price_micro`` beside them. Times are unix seconds.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from aitbc.coordinator.store.states import (
    ContractStatus,
    Control,
    JobStatus,
    OfferStatus,
    RunStatus,
    ScoreStatus,
    UpdateStatus,
)

T = TypeVar("T")


class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- errors ---------------------------------------------------------------------------------


class ErrorBody(Reply):
    """Every 4xx (and the rare 500): a stable machine-readable code and one line for people."""

    error: str = Field(description="stable code, e.g. unknown_run, bad_signature, invalid_request")
    detail: str = Field(description="one line: what was wrong and what is allowed")


_WHY = {
    400: "Malformed request: the body is not valid JSON (malformed_json), or a bad CID",
    401: "Missing, wrong, expired or replayed request signature (X-Aitbc-* headers)",
    403: "The signer may not do this (not the owner of the run, job or worker)",
    404: "No such run, job, worker, contract or blob",
    409: "Refused in the current state (run ended, wrong phase, a conflict with what exists; a pin over max_pinned_bytes or of an incomplete folder)",
    413: "The body is larger than this coordinator takes (blob_too_large: max_blob_bytes; body_too_large: a JSON body over max_json_bytes)",
    408: "The upload's body came slower than this coordinator's floor (upload_too_slow: min_upload_rate over upload_rate_window); nothing stored",
    429: "Too many blob uploads in flight at once, or from this signer (too_many_uploads: max_uploads, max_uploads_per_signer); try again later",
    422: "A field is missing, of the wrong type, out of range, or not allowed here",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entries for the error statuses a route can send, each with
    :class:`ErrorBody`."""
    return {s: {"model": ErrorBody, "description": _WHY[s]} for s in statuses}


# A signed action on a run or a job: not the signer's (403), no such one (404), not in
# its current state (409). The app adds 401 to every signed route, and 400 and 422 to
# every route with a JSON body (see ``aitbc.coordinator.app``).
OWNED = errors(403, 404, 409)


class Page(Reply, Generic[T]):
    """A list: the items and how many there are."""

    data: list[T]
    count: int


# --- health -----------------------------------------------------------------------------------


class Health(Reply):
    status: Literal["ok"]
    version: str
    time: float = Field(description="the coordinator's clock (clients sign with timestamps)")
    replica: str = Field(description="this coordinator process's id among those sharing its database")
    driving: bool = Field(description="whether this process holds the driver lease (moves the rounds)")


# --- blobs ------------------------------------------------------------------------------------


class BlobStored(Reply):
    cid: str
    size: int
    stored: bool = Field(description="false: the coordinator already held this blob")


class BlobsMissing(Reply):
    missing: list[str] = Field(description="the CIDs asked about that this coordinator does not hold")


class PinView(Reply):
    cid: str = Field(description="the pinned root: a file's CID or a folder's")
    owner: str
    bytes: int = Field(description="bytes of every blob under the root, each once")
    blobs: int
    created_at: float


class PinList(Reply):
    data: list[PinView]
    count: int
    pinned_bytes: int
    max_pinned_bytes: int = Field(description="what one wallet may keep pinned")


# --- runs -------------------------------------------------------------------------------------


class RunSummary(Reply):
    training_id: str
    status: RunStatus
    owner: str
    model_type: str
    dataset_size: str
    target_workers: int
    round: int
    rounds: int | None
    val_loss: float | None
    control: Control
    created_at: float
    updated_at: float


class ContractView(Reply):
    contract_id: str
    worker_id: str
    training_id: str
    price: float = Field(description="AIT per round, a number (price_micro / 1e6)")
    price_micro: int = Field(description="the exact price in micro-AIT")
    status: ContractStatus
    score: float


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
    config: dict[str, Any]
    last_heartbeat_age: float | None


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


class GossipView(Reply):
    topology: str | None
    recorded_round: int = Field(description="the last round whose record closed (consensus evaluated)")
    spread: float | None = Field(description="that round's mean L2 distance of the kept models to their mean")
    newest_round: int = Field(description="the newest round any worker has published")
    records: int = Field(description="model records published so far")
    outliers: int = Field(description="published models flagged as outliers or corrupt")


class RunDetail(RunSummary):
    model_options: dict[str, Any]
    seed: int
    dataset_size_bytes: int
    data_source: str | None
    manifest_cid: str | None
    data_bytes: int | None
    shards: int
    config: dict[str, Any]
    global_model_cid: str | None
    network: str
    budget: str | None
    bond: str
    escrowed: str
    initial_val_loss: float | None
    val_accuracy: float | None
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
    price: float = Field(description="AIT per round, a number (price_micro / 1e6)")
    price_micro: int = Field(description="the exact price in micro-AIT")
    reputation: float
    availability: float
    score: float
    hired: bool


class Discovery(Reply):
    training_id: str
    ranked: list[RankedOffer]
    contracts: list[ContractView]
    count: int = Field(description="contracts made")


class RoundView(Reply):
    round: int
    checkpoint_cid: str
    val_loss: float | None
    val_accuracy: float | None
    train_loss: float | None
    train_accuracy: float | None = Field(
        description="the mean of the accepted updates' training accuracy as their workers report it (classifiers; null for language data and rounds recorded before it was kept)"
    )
    accepted: int
    rejected: int
    stragglers: list[str]
    skipped: bool
    bytes_up: int | None = Field(
        description="the bytes of the updates this round received; null for rounds recorded before it was counted"
    )
    bytes_down: int | None = Field(description="the global model's bytes once per answering worker; null as bytes_up")
    started_at: float
    closed_at: float


class ScoreView(Reply):
    round: int
    worker_id: str
    contract_id: str
    status: ScoreStatus
    quality: float = Field(description="0..1: the share of the round's price this contract was paid for the round")
    gain: float | None = Field(description="relative held-out loss reduction of its update alone")
    own_gain: float | None = Field(description="the same on its own shard")
    other_gain: float | None = Field(description="the same on the other workers' data")
    kept: float | None = Field(description="the share of it the robust rule kept")
    flags: list[str]
    provable: bool = Field(description="true: misbehaviour anyone can re-check (it was slashed)")


class ScorePage(Page[ScoreView]):
    next: int | None = Field(description="pass as after= for the next page; null on the last")


class Checkpoint(Reply):
    round: int
    cid: str


class ContractRef(Reply):
    worker_id: str
    contract_id: str
    status: ContractStatus


class ResultWorker(WorkerScore, ContractRef):
    pass


class Results(Reply):
    training_id: str
    status: RunStatus
    error: str | None
    model_cid: str | None
    metrics: dict[str, Any] = Field(description="what its owner saved with the result (save_training_results)")
    rounds_completed: int
    rounds: int | None
    initial_val_loss: float | None
    final_val_loss: float | None
    final_val_accuracy: float | None
    bytes_up: int
    bytes_down: int
    updates_accepted: int
    updates_rejected: int
    wall_seconds: float | None
    settled_round: int = Field(
        description="rounds scored and paid so far: the workers' scores are means over these "
        "(settlement runs behind the rounds, so a just-finished run may show fewer)"
    )
    checkpoints: list[Checkpoint]
    workers: list[ResultWorker]


class SavedResult(Results):
    round: int | None = Field(description="the round whose checkpoint was kept; null for an uploaded model")


class WorkerPay(Reply):
    worker_id: str
    contract_id: str
    price: float = Field(description="AIT per round, a number (price_micro / 1e6)")
    price_micro: int = Field(description="the exact price in micro-AIT")
    status: ContractStatus
    rounds_accepted: int
    rounds_scored: int
    score: float | None
    flags: list[str]
    paid: str
    paid_micro: int
    due: str
    due_micro: int
    bond: str
    slashed: str
    slashed_micro: int
    reputation: float | None


class Payments(Reply):
    training_id: str
    network: str
    control: Control
    escrowed: str
    escrow_balance: str
    settled_round: int
    rounds_closed: int
    finalized: bool
    data: list[WorkerPay]
    count: int


class ManualPayment(Reply):
    contract_id: str
    worker_id: str
    amount: str
    amount_micro: int
    entry: int = Field(description="the ledger entry's sequence number")
    escrow_left: str


# --- manual control and jobs ----------------------------------------------------------------


class ShardView(Reply):
    shard_index: int
    shard_id: str = Field(description="the shard's CID")
    samples: int
    split_from: int | None
    split_into: list[int] | None
    jobs: list[str] = Field(description="active jobs on this shard")


class JobDetail(JobView):
    training_id: str
    round: int
    run_status: RunStatus


class WorkerJob(JobView):
    training_id: str


class SplitJobs(Reply):
    job: JobDetail = Field(description="the job, keeping the first half")
    new_job: JobDetail = Field(description="the job on the second half")


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


# --- workers ----------------------------------------------------------------------------------


class OfferView(Reply):
    worker_id: str
    gpu_type: str
    price: float = Field(description="AIT per round, a number (price_micro / 1e6)")
    price_micro: int = Field(description="the exact price in micro-AIT")
    reputation: float
    availability: float
    status: OfferStatus
    live: bool
    last_heartbeat: float
    max_bond: str
    last_heartbeat_age: float
    device: dict[str, Any]
    flags: int


class MarketOffer(OfferView):
    busy: bool = Field(description="hired by or working for a run that has not ended")


class Heartbeat(Reply):
    ok: bool
    time: float
    version: int


class PeerRef(Reply):
    """A worker that serves a blob (peer transport): fetch ``{url}/v1/blobs/{cid}``."""

    worker: str
    url: str


class Holders(Reply):
    cid: str
    data: list[PeerRef]
    count: int


class PeerVerdict(Reply):
    verdict: Literal["bad", "gone", "ok", "unknown"] = Field(
        description="the coordinator's own fetch from the peer: bad (flagged), gone (its claim dropped), "
        "ok (served right: the report counts only as a signal), unknown (nothing to check)"
    )
    reports: int = Field(description="distinct workers that have reported this peer")


class RosterEntry(Reply):
    worker: str
    job_id: str
    public_key: str = Field(description="checks the worker's signed model records")
    url: str | None = Field(
        description="its peer server; None: it cannot be reached, its models go through the coordinator"
    )
    samples: int


class GossipOrder(Reply):
    topology: str | None
    seed: int = Field(description="the run's seed: random:K neighbours are drawn from it (seed + 3), as the simulator")
    aggregator: str = Field(description="the rule each worker mixes with")
    f: int = Field(description="attackers the rule tolerates when its spec names none")
    next_round: int = Field(description="the round this worker trains next (one past its last published record)")
    roster: list[RosterEntry] = Field(description="the run's workers in topology order")
    norm_clip: float
    norm_reject: float
    max_staleness: int = Field(description="a neighbour's model at most this many rounds old is still mixed")
    staleness: str = Field(description="the rule weighting a neighbour's model of an older round (its samples x it)")
    wait: float | None = Field(description="seconds to wait for a neighbour's model of the round (None: the default)")


class SignedRecord(Reply):
    record: dict[str, Any]
    signature: str


class Witnessed(Reply):
    worker: str = Field(description="who signed the record")
    job_id: str
    round: int
    cid: str
    verdict: Literal["consistent", "kept", "unmatched", "equivocation"] = Field(
        description="consistent: the coordinator holds this record's CID for its job and round; kept: it holds "
        "none yet, and a different one published later is caught; unmatched: the round closed without the "
        "job's record, so there is nothing to compare (not stored); equivocation: it holds another CID the "
        "same worker signed for that round (flagged)"
    )


class RecordAccepted(Reply):
    status: Literal["recorded"]
    round: int
    cid: str
    duplicate: bool


class JobOrder(Reply):
    """What a worker should do now with its job."""

    job_id: str
    training_id: str
    action: Literal["train", "wait"]
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
    model_options: dict[str, Any]
    data_spec: dict[str, Any] | None
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


class JobPoll(Reply):
    job: JobOrder | None
    version: int


class Ok(Reply):
    ok: bool


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


# --- money ------------------------------------------------------------------------------------


class Funded(Reply):
    address: str
    amount: str
    entry: int
    balance: str


class Sent(Reply):
    model_config = ConfigDict(populate_by_name=True)

    from_: str = Field(alias="from")
    to: str
    amount: str
    entry: int
    balance: str


class Balance(Reply):
    address: str
    network: str
    balance: str
    balance_micro: int


class EntryView(Reply):
    seq: int
    hash: str
    prev_hash: str
    network: str
    kind: str
    debit: str
    credit: str
    amount: int = Field(description="micro-AIT")
    memo: dict[str, Any]
    key: str | None
    signer: str
    auth: dict[str, Any]
    signature: str
    created_at: float
    amount_ait: str


class Entries(Page[EntryView]):
    next: int | None = Field(description="pass as after= for the next page; null on the last")


class LedgerInfo(Reply):
    network: str
    system_key: str
    entries: int
    head: str | None
    stored: int


class Balances(Reply):
    data: dict[str, int] = Field(description="account name -> micro-AIT (accounts at 0 left out)")
    count: int
