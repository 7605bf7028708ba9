"""What a run produced: its rounds, the workers' scores, its checkpoints and results."""

from __future__ import annotations

from pydantic import Field

from aitbc.replies.base import JsonObject, Page, Reply
from aitbc.replies.runs import WorkerScore
from aitbc.states import ContractStatus, RunStatus, ScoreStatus


class RoundView(Reply):
    round: int = Field(description="0: the initial model")
    checkpoint_cid: str = Field(description="the global model's CID after the round")
    val_loss: float | None = Field(description="validation loss of that model; null until evaluated")
    val_accuracy: float | None = Field(description="its validation accuracy (classifiers; null otherwise)")
    eval_pending: bool = Field(
        False,
        description="its evaluation is due and not recorded yet (it lands a moment after the round closes); "
        "false for a round evaluated or not due (eval_every)",
    )
    train_loss: float | None = Field(description="the mean of the accepted updates' training losses")
    train_accuracy: float | None = Field(
        description="the mean of the accepted updates' training accuracy as their workers report it (classifiers; null for language data and rounds recorded before it was kept)"
    )
    accepted: int = Field(description="updates aggregated")
    rejected: int = Field(description="updates refused")
    stragglers: list[str] = Field(description="workers whose update missed the round")
    skipped: bool = Field(description="too few updates for the aggregation rule (or none): the model is unchanged")
    bytes_up: int | None = Field(
        description="the bytes of the updates this round received; null for rounds recorded before it was counted"
    )
    bytes_down: int | None = Field(description="the global model's bytes once per answering worker; null as bytes_up")
    started_at: float = Field(description="unix seconds")
    closed_at: float = Field(description="unix seconds")


class ScoreView(Reply):
    round: int
    worker_id: str
    contract_id: str
    status: ScoreStatus
    quality: float = Field(description="0..1: the share of the round's price this contract was paid for the round")
    gain: float | None = Field(
        description="relative held-out loss reduction of its update alone (the flags judge this; pay judges its "
        "share of the round's mean, which near convergence gains where the update alone does not)"
    )
    own_gain: float | None = Field(description="the same on its own shard")
    other_gain: float | None = Field(description="the same on the other workers' data")
    kept: float | None = Field(description="the share of it the robust rule kept")
    flags: list[str]
    provable: bool = Field(description="true: misbehaviour anyone can re-check (it was slashed)")


class ScorePage(Page[ScoreView]):
    next: int | None = Field(description="pass as after= for the next page; null on the last")


class Checkpoint(Reply):
    round: int = Field(description="0: the initial model")
    cid: str = Field(description="the global model's CID after the round")


class ContractRef(Reply):
    worker_id: str
    contract_id: str
    status: ContractStatus


class ResultWorker(WorkerScore, ContractRef):
    pass


class Results(Reply):
    """What a run produced: its model, its losses, its traffic and its workers' scores."""

    training_id: str
    status: RunStatus = Field(description="the run's state (results are final once complete)")
    error: str | None = Field(description="why it failed; null otherwise")
    model_cid: str | None = Field(description="the trained model's CID (download_model fetches it); null before one")
    metrics: JsonObject = Field(description="what its owner saved with the result (save_training_results)")
    rounds_completed: int = Field(description="rounds closed")
    rounds: int | None = Field(description="rounds planned; null for a run without a round limit")
    initial_val_loss: float | None = Field(description="validation loss of the initial model (round 0)")
    final_val_loss: float | None = Field(description="validation loss of the latest evaluated round")
    final_val_accuracy: float | None = Field(description="its validation accuracy (classifiers; null otherwise)")
    final_val_round: int | None = Field(
        None,
        description="the round final_val_loss is of (0: the initial model; a round's evaluation lands a moment "
        "after it closes); null before any",
    )
    bytes_up: int = Field(description="bytes of the workers' updates received, all rounds")
    bytes_down: int = Field(description="bytes of the global model sent to workers, all rounds")
    updates_accepted: int = Field(description="updates aggregated, all rounds")
    updates_rejected: int = Field(description="updates refused (robust rule, checks, spot checks)")
    wall_seconds: float | None = Field(description="seconds from training's start to its end; null before")
    settled_round: int = Field(
        description="rounds scored and paid so far: the workers' scores are means over these "
        "(settlement runs behind the rounds, so a just-finished run may show fewer)"
    )
    checkpoints: list[Checkpoint] = Field(description="each round's global model kept, by round")
    workers: list[ResultWorker] = Field(description="one row per contract: its worker, status and scores")
    tokens_seen: int | None = Field(
        None,
        description="language models: tokens the accepted updates were trained on (each one's local steps x "
        "batch size x context); null for a classifier",
    )
    final_val_perplexity: float | None = Field(
        None, description="language models: exp(final_val_loss); null for a classifier or before an evaluation"
    )


class SavedResult(Results):
    round: int | None = Field(description="the round whose checkpoint was kept; null for an uploaded model")
