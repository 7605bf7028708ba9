"""What the dashboard's JSON routes answer (``/v1/dashboard/...``): an allow-list, as models
that forbid every other key, so a field added to the view without being added here is an
error in the tests, never a silent leak. No CID, data source, model option, key or request
detail has a field here (see :mod:`aitbc.coordinator.runs.dashboard`)."""

from __future__ import annotations

from pydantic import Field

from aitbc.replies.base import MicroAIT, Money, Reply
from aitbc.states import ContractStatus, Control, RunStatus


class DashboardRun(Reply):
    training_id: str
    status: RunStatus
    owner: str = Field(description="the owner's wallet address")
    model_type: str
    parameters: int | None = Field(description="the model's parameter count; null before distribute")
    dataset_size: str = Field(description="as the owner declared it")
    target_workers: int
    round: int = Field(description="the open round (1-based); 0 before training")
    rounds: int | None
    control: Control
    val_loss: float | None
    val_accuracy: float | None
    created_at: float
    updated_at: float


class DashboardRuns(Reply):
    data: list[DashboardRun]
    count: int


class DashboardRound(Reply):
    round: int = Field(description="0: the initial model")
    val_loss: float | None
    val_accuracy: float | None
    val_perplexity: float | None = Field(None, description="language models: exp(val_loss); null for a classifier")
    train_loss: float | None = Field(description="the mean of the accepted updates' training losses")
    train_accuracy: float | None = Field(
        description="the mean of the accepted updates' training accuracy, as workers report it (classifiers)"
    )
    accepted: int
    rejected: int
    skipped: bool
    bytes_up: int | None = Field(description="the bytes of this round's updates; null for rounds before it was counted")
    bytes_down: int | None
    closed_at: float


class DashboardWorker(Reply):
    worker_id: str = Field(description="the provider's wallet address")
    gpu_type: str | None
    contract_status: ContractStatus
    status: str | None = Field(description="its latest job's state in the current round; null before its first job")
    progress: float | None = Field(description="percent of its work in the current round")
    loss: float | None
    speed: float | None = Field(description="samples per second, as the coordinator measured it")
    rounds_done: int
    end_reason: str | None = Field(description="why its job ended, if it did (plain text)")
    last_heartbeat_age: float | None = Field(description="seconds since its last heartbeat")
    score: float | None = Field(description="its mean quality over its scored rounds, 0..1")
    rounds_accepted: int
    rounds_scored: int
    price: Money = Field(description="AIT per round at full quality")
    paid: Money = Field(description="AIT paid to it so far")
    paid_micro: MicroAIT = Field(description="paid in micro-AIT")
    slashed: Money = Field(description="AIT burned from its bond")
    slashed_micro: MicroAIT = Field(description="slashed in micro-AIT")
    flags: list[str] = Field(description="its scores' flags and the coordinator's records (rejected_update, ...)")


class DashboardChainTx(Reply):
    """One settlement transaction of a run on an EVM chain (public on the chain itself)."""

    kind: str = Field(description="settle or finalize")
    round: int = Field(description="the round it settles (0 for finalize)")
    tx_hash: str | None = Field(description="null until signed")
    status: str = Field(description="queued, signed, sent, mined, final or failed")
    confirmations: int


class DashboardPayments(Reply):
    network: str
    escrowed: Money = Field(description="AIT escrowed for the run")
    escrow_balance: Money = Field(description="AIT left in the escrow now")
    paid: Money = Field(description="AIT paid to the providers so far, all together")
    paid_micro: MicroAIT = Field(description="paid in micro-AIT")
    slashed: Money = Field(description="AIT burned from bonds so far, all together")
    slashed_micro: MicroAIT = Field(description="slashed in micro-AIT")
    settled_round: int
    finalized: bool
    chain_txs: list[DashboardChainTx] = Field(
        default_factory=list, description="on an EVM chain: the run's settlement transactions; empty otherwise"
    )


class DashboardLedger(Reply):
    network: str
    entries: int = Field(description="the head's sequence number")
    head: str | None = Field(description="the head entry's hash; null before the first entry")


class DashboardRunDetail(DashboardRun):
    data_bytes: int | None = Field(description="the text's (or arrays') bytes, measured as the data was read")
    data_documents: int | None = Field(description="documents measured; null for arrays or before data")
    data_tokens: int | None = Field(description="tokens measured (bytes for byte-level data); null for arrays")
    aggregator: str | None
    initial_val_loss: float | None
    rounds_completed: int
    error: str | None = Field(description="why it failed (plain text)")
    started_at: float | None
    finished_at: float | None
    bytes_up: int
    bytes_down: int
    curves: list[DashboardRound]
    curve_every: int = Field(
        description="the curves hold every n-th round (and the newest); 1: every round (a long run's are thinned)"
    )
    workers: list[DashboardWorker]
    payments: DashboardPayments
    ledger: DashboardLedger
    tokens_seen: int | None = Field(
        None, description="language models: tokens the accepted updates were trained on; null for a classifier"
    )
    val_perplexity: float | None = Field(None, description="language models: exp(val_loss); null for a classifier")
    time: float = Field(description="the coordinator's clock when this was read")
