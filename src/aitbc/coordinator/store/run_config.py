"""A run's training config, typed: what ``distribute`` (or a manual run's ``distributing``
phase) checked and stored, read everywhere as attributes (``run.cfg.rounds``).

It is the request's :class:`~aitbc.coordinator.schemas.Distribute` with the defaults the
coordinator resolved (workers, quorum) and what it derived by building the model once
(``d`` parameters, ``f`` tolerated attackers, the model's full options). Stored as JSON in
``runs.config``; validated when it is made and when it is read back.
"""

from __future__ import annotations

from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from aitbc import run_defaults
from aitbc.run_mode import RunMode


class RunConfig(BaseModel):
    # extra="ignore": a config stored by an earlier release may carry a key since dropped.
    model_config = ConfigDict(frozen=True, extra="ignore")

    strategy: str = "data-parallel"
    rounds: int = Field(ge=1)
    local_steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0)
    inner_opt: str
    outer: str
    outer_options: dict[str, Any] = Field(default_factory=dict)
    aggregator: str
    compression: str
    error_feedback: bool = False
    # how the rounds go (aitbc/run_mode.py); stored and sent as its name, so a stored config loads as it was
    mode: RunMode = RunMode.SYNC
    buffer: int | None = None  # async: accepted updates per application (resolved when checked)
    max_staleness: int = 4  # async: older updates are refused
    staleness: str = "polynomial"  # async: the down-weighting rule (core/staleness.py)
    topology: str | None = None  # gossip: ring or random:K (core/gossip.py)
    deadline: float | None = (
        None  # seconds a round waits at most, as the owner gave it (None: round_deadline's default)
    )
    quorum: int = Field(ge=1)  # accepted updates a round needs to close at its deadline
    min_workers: int = Field(ge=1)
    max_workers: int = Field(ge=1)
    eval_every: int = Field(1, ge=1)
    verify_rate: float = Field(0.0, ge=0, le=1)  # spot checks (a config stored before 0005: none)
    overlap: int = Field(0, ge=0, le=2)  # k: updates may start from one of the k models before the round's
    # how much an update trained from the model before its round's counts (core/staleness.py):
    # (1 + s)^-1, a half for one round late. At 1 (full weight) a long local round's update
    # overshoots and the model circles (bench/overlap_loss.py)
    overlap_staleness: str = "polynomial:a=1"
    precision: str = "fp32"  # workers' inner steps: fp32, or bf16 autocast (a config stored before it: fp32)
    # Derived by the coordinator when the config was checked:
    d: int = Field(ge=1)  # parameters of the model
    f: int = Field(ge=0)  # attackers the robust rule tolerates when the owner named none
    model_options_full: dict[str, Any] = Field(default_factory=dict)

    @property
    def round_deadline(self) -> float:
        """Seconds a round waits at most: the owner's ``deadline``, else
        :data:`aitbc.run_defaults.DEADLINE`. Every run has one: without it one silent hired
        provider would hold the run at its round for ever."""
        return run_defaults.DEADLINE if self.deadline is None else self.deadline

    @property
    def base_lag(self) -> int:
        """Versions before a round's own model that an update of it may be trained from
        and is judged against: ``max_staleness + 1`` in a buffered (async) run, else 0."""
        return self.max_staleness + 1 if self.mode.buffered else 0

    def eval_due(self, r: int) -> bool:
        """Whether round ``r``'s model is evaluated on the validation split."""
        return r % self.eval_every == 0 or r >= self.rounds


class JobSettings(TypedDict):
    """What a job trains with each round: its owner's overrides over its run's config
    (:func:`aitbc.coordinator.store.repository.job_settings`)."""

    local_steps: int
    batch_size: int
    lr: float
    epochs: int | None  # passes over its shard, if its owner set them (local_steps is their steps)
