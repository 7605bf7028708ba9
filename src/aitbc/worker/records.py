"""What the worker's parts hand each other: a job's state between rounds, a trained update,
an update sent. The lowest module of :mod:`aitbc.worker` but for its settings and peer
transport: every part imports it, it imports none of them."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from aitbc.core.compression import ErrorFeedback
from aitbc.errors import AitbcError
from aitbc.replies.jobs import JobOrder
from aitbc.training.checkpoint import Layout
from aitbc.training.local import LocalTrainer
from aitbc.training.proof import Recorder


class ModelRefused(AitbcError):
    """A job's model this worker will not build (see :meth:`aitbc.worker.job_loop.JobLoop.decline`)."""


class BadShard(ModelRefused):
    """A job's shard that is not data of its spec (token ids or labels out of range, windows
    of another length): declined as a model is, never trained on."""


@dataclass(frozen=True, slots=True)
class RoundStart:
    """Where the optimizer and the error-feedback residual stood when a round began."""

    round: int
    optimizer: dict[str, Any]  # the inner optimizer's state_dict (a deep copy)
    residual: Tensor | None


@dataclass(frozen=True, slots=True)
class KeptProof:
    """A round's committed states and the residual it began with, kept until its spot check."""

    recorder: Recorder
    residual_in: Any


@dataclass(frozen=True, slots=True)
class OwnUpdate:
    """One of this worker's own updates as the coordinator stores it: its CID and blob."""

    cid: str
    blob: bytes


@dataclass(frozen=True, slots=True)
class SentUpdate:
    """The last update the coordinator recorded from this worker."""

    job_id: str
    round: int
    update: OwnUpdate


@dataclass
class JobState:
    """What a worker keeps between the rounds of one job: its trainer (model, inner
    optimizer, batch order) and its codec (with the error-feedback residual)."""

    job_id: str
    trainer: LocalTrainer
    codec: Any
    rounds: int | None
    shard_cid: str = ""
    done: set[int] = field(default_factory=set)
    # the last rounds' committed states (runs that verify work), by round, each kept until
    # its spot check is answered (overlap 2: the next round's update may be sent while this
    # one's spot check is still to answer)
    proofs: dict[int, KeptProof] = field(default_factory=dict)
    # where the round began: restored if the round's update is not recorded, so the next
    # round starts where the last recorded update ended, as a verifying coordinator requires
    round_start: RoundStart | None = None
    # its model's parameters as (name, shape) when they are its whole state (param_layout):
    # a checkpoint's flat parameters can then be read without the model
    layout: Layout | None = None

    @property
    def epoch(self) -> float:
        """Passes over this shard so far."""
        return self.trainer.samples_seen / self.trainer.x.shape[0]

    def mark_round_start(self, round: int) -> None:
        """Remember where this round starts; training a round again (its update was
        dropped, e.g. the owner asked for it again) starts from there once more."""
        if self.round_start is not None and self.round_start.round == round:
            self.restore_round_start()
            return
        codec = self.codec
        residual = codec.residual.clone() if isinstance(codec, ErrorFeedback) and codec.residual is not None else None
        self.round_start = RoundStart(round, copy.deepcopy(self.trainer.opt.state_dict()), residual)

    def restore_round_start(self, start: RoundStart | None = None) -> None:
        """Put the optimizer and residual back to ``start`` (default: the round's mark)."""
        start = start or self.round_start
        if start is None:
            return
        self.round_start = start
        self.trainer.opt.load_state_dict(copy.deepcopy(start.optimizer))
        for group in self.trainer.opt.param_groups:  # the state, not the settings: the job's lr now
            group["lr"] = self.trainer.cfg.lr
        if isinstance(self.codec, ErrorFeedback):
            self.codec.residual = None if start.residual is None else start.residual.clone()


@dataclass
class Trained:
    """One round's update, trained and encoded, not yet sent."""

    key: tuple[Any, ...]  # the job view it was trained for (:func:`ahead_key`)
    round: int
    blob: bytes
    body: dict[str, Any]  # POST /jobs/{id}/updates
    recorder: Recorder | None  # its committed states (runs that verify work)
    residual_in: Any = None
    # where the optimizer and residual stood when it began (JobState.round_start), if kept
    start: RoundStart | None = None
    # seconds spent on it: download (the global model fetched and loaded), compute (local
    # steps), encode (codec, CID, proof); upload is added as it is sent
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def update(self) -> OwnUpdate:
        return OwnUpdate(self.body["cid"], self.blob)


def ahead_key(job: JobOrder, round: int) -> tuple[Any, ...]:
    """What a round trained ahead must match in the job's view of that round to be sent:
    the job, the round, the shard and every training setting (the owner may change them)."""
    settings = (job.local_steps, job.batch_size, job.lr, job.epochs, job.inner_opt, job.precision, job.compression)
    return (job.job_id, round, job.shard_cid, *settings, job.error_feedback, job.verify_rate, job.seed)
