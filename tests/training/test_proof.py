"""Verifiable local training (training/proof.py, training/checks.py): a round's commitments
replay bit-exact from what the coordinator knows, and each kind of cheat fails the check
that targets it."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aitbc.core.compression import build_codec
from aitbc.errors import IntegrityError, UsageError
from aitbc.training.batches import BatchOrder, data_seed
from aitbc.training.checkpoint import flat_params
from aitbc.training.checks import (
    DEFAULT_TOLERANCE,
    Replay,
    check_interval,
    check_start,
    check_update,
    choose_intervals,
    relative_error,
    replay,
)
from aitbc.training.data_spec import DataSpec
from aitbc.training.local import LocalConfig, LocalTrainer
from aitbc.training.models import build_model
from aitbc.training.proof import Commitment, Recorder, TrainState, boundaries, commit_every

SPEC = DataSpec("classification", (8,), 4)


def problem(model_type: str = "mlp", options: dict | None = None, n: int = 64, seed: int = 0):
    torch.manual_seed(seed)
    if model_type == "cnn":
        spec = DataSpec("classification", (1, 8, 8), 4)
        x = torch.randn(n, 1, 8, 8)
    else:
        spec, x = SPEC, torch.randn(n, 8)
    model = build_model(model_type, spec, options or {})
    return model, x, torch.randint(0, 4, (n,))


def trained(model_type="mlp", options=None, *, steps=10, optimizer="adamw", rounds=2, codec=None):
    """A trainer after ``rounds`` rounds (so the optimizer carries state in), the last
    one recorded: (trainer, start params, recorder, result, blob, residual_in)."""
    model, x, y = problem(model_type, options)
    cfg = LocalConfig(steps=steps, batch_size=16, optimizer=optimizer, lr=1e-2)
    tr = LocalTrainer(copy.deepcopy(model), x, y, cfg, seed=7)
    start = flat_params(model)
    for r in range(1, rounds):
        res = tr.train_round(start, round=r)
        start = start - 0.5 * res.delta
        if codec is not None:
            codec.encode(res.delta)
    rec = Recorder(steps)
    res_in = None if codec is None or codec.residual is None else codec.residual.clone()
    res = tr.train_round(start, round=rounds, recorder=rec)
    blob = None if codec is None else codec.encode(res.delta)
    return tr, start, rec, res, blob, res_in


def replayer(tr: LocalTrainer, round: int, model_type="mlp", options=None) -> Replay:
    model, _, _ = problem(model_type, options)
    return Replay(model, tr.x, tr.y, copy.deepcopy(tr.cfg), data_seed(tr.seed, round))


def test_boundaries_and_every():
    assert commit_every(20) == 2 and boundaries(20, 2) == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert commit_every(5) == 1 and boundaries(5, 1) == [0, 1, 2, 3, 4, 5]
    assert commit_every(100) == 7 and boundaries(100, 7)[-2:] == [98, 100]  # the last interval is shorter
    assert commit_every(160) == 10 and commit_every(1000) == 10 and commit_every(2560) == 10
    assert commit_every(100_000) == 391 and len(boundaries(100_000, 391)) == 257  # at most 256 intervals


@pytest.mark.parametrize(
    "model_type,options,optimizer",
    [("mlp", None, "adamw"), ("mlp", None, "sgd"), ("cnn", {"channels": (4, 4)}, "adam")],
)
def test_every_interval_replays_bit_exact(model_type, options, optimizer):
    tr, start, rec, _, _, _ = trained(model_type, options, optimizer=optimizer)
    c = rec.commitment(None, None)
    assert check_start(c, start).ok
    r = replayer(tr, 2, model_type, options)
    steps = c.boundaries
    for i in range(c.intervals):
        v = check_interval(c, i, rec.states[steps[i]], rec.states[steps[i + 1]], r)
        assert v.ok and v.error == 0.0 and "bit-exact" in v.detail, v
        assert v.steps_replayed == steps[i + 1] - steps[i]


@pytest.mark.long  # a minute or more on 2 cores: make test-long
def test_a_replay_with_another_thread_count_lands_within_tolerance(tmp_path):
    """The coordinator re-runs with its own thread count: kernels sum in another order, so
    a cnn's states are not bit-exact, but every interval lands within the tolerance, far
    from what leaving out one step does."""
    code = (
        f"import sys, torch; torch.set_num_threads(int(sys.argv[1])); sys.path.insert(0, {str(Path(__file__).parent)!r});"
        "from test_proof import trained; tr, start, rec, *_ = trained('cnn', {'channels': (8, 8)}, steps=20);"
        "sys.stdout.buffer.write(b''.join(rec.states[s].to_bytes() + b'--SPLIT--' for s in sorted(rec.states)))"
    )
    raw = subprocess.run([sys.executable, "-c", code, "1"], capture_output=True, check=True).stdout
    model, _, _ = problem("cnn", {"channels": (8, 8)})
    numel = sum(p.numel() for p in model.parameters())
    states = [TrainState.from_bytes(b, numel=numel) for b in raw.split(b"--SPLIT--")[:-1]]
    rec = Recorder(20)
    rec.states = {s.step: s for s in states}
    c = rec.commitment(None, None)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        tr, *_ = trained("cnn", {"channels": (8, 8)}, steps=20)  # the same shard and seed, in this process
        r = replayer(tr, 2, "cnn", {"channels": (8, 8)})
        for i in range(c.intervals):
            v = check_interval(c, i, rec.states[c.boundaries[i]], rec.states[c.boundaries[i + 1]], r)
            assert v.ok and v.error is not None and v.error < DEFAULT_TOLERANCE / 10, v
        short = replay(r, rec.states[0], 1)  # one step of the first interval's two
    finally:
        torch.set_num_threads(threads)
    assert relative_error(short.params, rec.states[2].params, rec.states[0].params) > 10 * DEFAULT_TOLERANCE


def test_dropout_replays_from_the_step_seed():
    opts = {"d_model": "16", "n_layers": "1", "n_heads": "2", "dropout": "0.3", "context": "8"}
    torch.manual_seed(0)
    spec = DataSpec("language", (8,), 11)
    model = build_model("transformer", spec, opts)
    x = torch.randint(0, 11, (32, 8))
    cfg = LocalConfig(steps=4, batch_size=8, lr=1e-2)
    tr = LocalTrainer(copy.deepcopy(model), x, x.roll(-1, 1), cfg, seed=3)
    rec = Recorder(4)
    torch.manual_seed(123)  # the worker's global RNG does not matter
    tr.train_round(flat_params(model), round=5, recorder=rec)
    c = rec.commitment(None, None)
    r = Replay(copy.deepcopy(model), tr.x, tr.y, copy.deepcopy(cfg), data_seed(3, 5))
    torch.manual_seed(999)
    v = check_interval(c, 2, rec.states[2], rec.states[3], r)
    assert v.ok and v.error == 0.0, v


def test_the_update_is_the_encoding_of_the_committed_work():
    codec = build_codec("topk", {"ratio": 0.1}, error_feedback=True)
    tr, start, rec, res, blob, res_in = trained(codec=codec)
    assert res_in is not None  # round 1 left a residual
    c = rec.commitment(res_in, codec.residual)
    final = rec.states[c.steps]
    fresh = lambda: build_codec("topk", {"ratio": 0.1}, error_feedback=True)
    assert check_update(c, blob, start, final, res_in, fresh()).ok
    # another update (copied, noised, zero) under the same commitment
    for other in (
        build_codec("topk", {"ratio": 0.1}).encode(res.delta * 1.01),
        build_codec("topk", {"ratio": 0.1}).encode(torch.zeros_like(res.delta)),
    ):
        v = check_update(c, other, start, final, res_in, fresh())
        assert not v.ok and "not the codec's encoding" in v.detail
    # a residual other than the committed one
    v = check_update(c, blob, start, final, torch.zeros_like(res_in), fresh())
    assert not v.ok and "residual" in v.detail


def test_the_first_state_must_be_the_rounds_model():
    tr, start, rec, *_ = trained()
    c = rec.commitment(None, None)
    stale = start + 0.01
    v = check_start(c, stale)
    assert not v.ok and "not the round's model" in v.detail


def _fake(rec: Recorder, step: int, params: torch.Tensor) -> TrainState:
    return TrainState(step, params, rec.states[step].optim)


def test_skipped_steps_do_not_replay():
    """A worker that trained half the steps of an interval and committed the result as
    the interval's end is caught on that interval, not on the honest ones."""
    tr, start, rec, *_ = trained(steps=8)
    r = replayer(tr, 2)
    steps = boundaries(8, 1)
    # the cheat: interval 3's end is its start (no steps done), and every later state follows from that
    rec.states[4] = _fake(rec, 4, rec.states[3].params.clone())
    c = rec.commitment(None, None)
    bad = check_interval(c, 3, rec.states[3], rec.states[4], r)
    assert not bad.ok and bad.error and bad.error > 0.5 and "do not replay" in bad.detail
    assert check_interval(c, 2, rec.states[2], rec.states[3], r).ok
    assert steps[3:5] == [3, 4]


def test_wrong_data_does_not_replay():
    model, x, y = problem()
    cfg = LocalConfig(steps=4, batch_size=16, lr=1e-2)
    other = LocalTrainer(copy.deepcopy(model), torch.randn_like(x), y, copy.deepcopy(cfg), seed=7)
    rec = Recorder(4)
    other.train_round(flat_params(model), round=1, recorder=rec)
    c = rec.commitment(None, None)
    r = Replay(copy.deepcopy(model), x, y, copy.deepcopy(cfg), data_seed(7, 1))  # the assigned shard
    v = check_interval(c, 0, rec.states[0], rec.states[1], r)
    assert not v.ok


def test_a_revealed_state_must_be_the_committed_one():
    tr, start, rec, *_ = trained(steps=4)
    c = rec.commitment(None, None)
    honest_next = rec.states[2]
    forged = TrainState(2, honest_next.params + 1e-3, honest_next.optim)
    v = check_interval(c, 1, rec.states[1], forged, replayer(tr, 2))
    assert not v.ok and v.check == "reveal"


def test_state_bytes_round_trip_and_refuse_junk():
    tr, start, rec, *_ = trained(steps=4)
    s = rec.states[2]
    back = TrainState.from_bytes(s.to_bytes(), numel=s.params.numel())
    assert back.digests() == s.digests() and back.step == 2
    with pytest.raises(IntegrityError):
        TrainState.from_bytes(s.to_bytes(), numel=s.params.numel() + 1)
    with pytest.raises(IntegrityError):
        TrainState.from_bytes(b"junk", numel=3)


def test_commitment_json_is_checked():
    tr, start, rec, *_ = trained(steps=10)
    c = rec.commitment(None, None)
    d = json.loads(json.dumps(c.to_json()))
    assert Commitment.from_json(d, steps=10) == c
    for key, value, msg in [
        ("steps", 9, "proof.steps"),
        ("every", 3, "proof.every"),
        ("params", c.params[:-1], "proof.params"),
        ("optim", ["zz"] * len(c.optim), "proof.optim"),
        ("residual_in", "x", "proof.residual_in"),
        ("format", "v0", "proof.format"),
    ]:
        with pytest.raises(UsageError, match=msg):
            Commitment.from_json({**d, key: list(value) if isinstance(value, tuple) else value}, steps=10)
    with pytest.raises(UsageError, match="both"):
        Commitment.from_json({**d, "residual_in": "a" * 64}, steps=10)
    with pytest.raises(UsageError):
        Commitment.from_json([], steps=10)


def test_choose_intervals_has_the_rate_as_expectation():
    g = torch.Generator().manual_seed(0)
    for rate, n in ((0.1, 10), (0.05, 10), (0.25, 10), (1.0, 4), (0.0, 10)):
        picks = [choose_intervals(n, rate, g) for _ in range(4000)]
        mean = sum(len(p) for p in picks) / len(picks)
        assert abs(mean - rate * n) < 0.05 + 0.05 * rate * n, (rate, mean)
        assert all(len(set(p)) == len(p) and all(0 <= i < n for i in p) for p in picks)
    with pytest.raises(ValueError):
        choose_intervals(10, 1.5, g)


def test_batch_order_is_a_function_of_the_seed():
    a, b = BatchOrder(10, 4, 5), BatchOrder(10, 4, 5)
    b.skip(3)
    for _ in range(3):
        a.next()
    assert torch.equal(a.next(), b.next())
    assert data_seed(1, 2) != data_seed(1, 3) != data_seed(2, 2)
