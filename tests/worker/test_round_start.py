"""A worker in a verifying run starts each round where its last recorded update ended
(the coordinator refuses any other start but a fresh one): when a round's update is not
recorded (a straggler's 409) or the round is trained again (a resend), the optimizer state
and the error-feedback residual go back to where the round began."""

from __future__ import annotations

import torch

from aitbc.core.compression import build_codec
from aitbc.training.checkpoint import flat_params
from aitbc.training.data_spec import DataSpec
from aitbc.training.local import LocalConfig, LocalTrainer
from aitbc.training.models import build_model
from aitbc.training.proof import Recorder, tensor_digest
from aitbc.worker.records import JobState


def _state() -> tuple[JobState, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model("mlp", DataSpec("classification", (8,), 4), {})
    x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
    trainer = LocalTrainer(model, x, y, LocalConfig(steps=6, batch_size=16, lr=1e-2), seed=3)
    codec = build_codec("topk", {"ratio": 0.1}, error_feedback=True)
    return JobState(job_id="job", trainer=trainer, codec=codec, rounds=5), flat_params(model)


def _round(state: JobState, start: torch.Tensor, r: int):
    state.mark_round_start(r)
    rec = Recorder(6)
    res_in = state.codec.residual.clone() if state.codec.residual is not None else torch.zeros(start.numel())
    res = state.trainer.train_round(start, round=r, recorder=rec)
    state.codec.encode(res.delta)
    return rec.commitment(res_in, state.codec.residual), res


def test_a_round_not_recorded_is_forgotten_and_the_next_starts_where_the_last_recorded_ended():
    state, start = _state()
    first, res = _round(state, start, 1)  # recorded
    start = start - res.delta
    _round(state, start, 2)  # trained, then refused (the round closed): not recorded
    state.restore_round_start()
    third, _ = _round(state, start, 3)
    assert third.optim[0] == first.optim[-1] and third.residual_in == first.residual_out


def test_a_round_trained_again_starts_from_the_same_state():
    state, start = _state()
    first, res = _round(state, start, 1)
    start = start - res.delta
    again_a, _ = _round(state, start, 2)
    again_b, _ = _round(state, start, 2)  # the owner dropped its update: the same round once more
    assert again_a.optim[0] == again_b.optim[0] == first.optim[-1]
    assert again_a == again_b  # the same round from the same state: the same commitment, bit for bit
    assert again_a.params[0] == tensor_digest(start)
