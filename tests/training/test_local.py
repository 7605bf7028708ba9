"""LocalTrainer (one worker's inner loop), evaluate, and the local training config."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from aitbc.core.compression import build_codec
from aitbc.core.compression import decode as decode_update
from aitbc.errors import IntegrityError, UsageError
from aitbc.training.checkpoint import flat_params, set_flat_params
from aitbc.training.data_spec import DataSpec
from aitbc.training.datasets import load_dataset
from aitbc.training.local import LocalConfig, LocalTrainer, eager_start, evaluate, local_config
from aitbc.training.models import build_model


def tiny_problem(seed: int = 0, n: int = 20) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """An MLP on 4 features and 3 classes, with ``n`` random samples."""
    torch.manual_seed(seed)
    model = build_model("mlp", DataSpec("classification", (4,), 3), {"hidden": "8"})
    x = torch.randn(n, 4)
    y = torch.randint(0, 3, (n,))
    return model, x, y


def sgd(**kw) -> LocalConfig:
    return LocalConfig(**({"optimizer": "sgd", "lr": 0.1, "steps": 1, "batch_size": 20} | kw))


# --- train_round ------------------------------------------------------------------------------


def test_delta_is_global_minus_local_and_global_is_untouched():
    model, x, y = tiny_problem()
    global_params = flat_params(model) + 0.5  # anything but the model's own weights
    before = global_params.clone()
    trainer = LocalTrainer(model, x, y, sgd(steps=3, batch_size=8), seed=0)

    result = trainer.train_round(global_params)

    assert torch.equal(global_params, before)
    assert_close(result.delta, global_params - flat_params(model))
    assert result.delta.shape == global_params.shape
    assert result.delta.abs().sum() > 0


def test_one_sgd_step_gives_lr_times_the_gradient():
    model, x, y = tiny_problem()
    reference = copy.deepcopy(model)
    eta = 0.05
    trainer = LocalTrainer(model, x, y, sgd(lr=eta), seed=0)  # one batch = the whole shard

    result = trainer.train_round(flat_params(model))

    loss = F.cross_entropy(reference(x), y)
    grads = torch.autograd.grad(loss, list(reference.parameters()))
    expected = eta * torch.cat([g.flatten() for g in grads])
    assert_close(result.delta, expected)
    assert result.loss == pytest.approx(loss.item(), rel=1e-5)


def test_grad_clip_bounds_the_step():
    model, x, y = tiny_problem()
    trainer = LocalTrainer(model, x, y, sgd(lr=1.0, grad_clip=1e-3), seed=0)

    result = trainer.train_round(flat_params(model))

    # one sgd step with lr 1: delta = the clipped gradient, whose norm is the clip value
    assert result.delta.norm().item() == pytest.approx(1e-3, rel=1e-4)


def test_round_bookkeeping():
    model, x, y = tiny_problem(n=20)
    trainer = LocalTrainer(model, x, y, sgd(steps=3, batch_size=8), seed=0)

    first = trainer.train_round(flat_params(model))
    second = trainer.train_round(flat_params(model))

    # 3 batches of 8 per round over 20 samples
    assert (first.steps, first.samples, first.epoch) == (3, 24, pytest.approx(1.2))
    assert (second.samples, second.epoch) == (24, pytest.approx(2.4))
    assert math.isfinite(first.loss)


def test_batch_larger_than_shard_uses_the_whole_shard():
    model, x, y = tiny_problem(n=5)
    trainer = LocalTrainer(model, x, y, sgd(batch_size=64), seed=0)

    result = trainer.train_round(flat_params(model))

    assert result.samples == 5


def test_same_seed_same_delta_different_seed_different_delta():
    model, x, y = tiny_problem()
    start = flat_params(model)
    cfg = sgd(steps=4, batch_size=4)

    def delta(seed: int) -> torch.Tensor:
        return LocalTrainer(copy.deepcopy(model), x, y, cfg, seed=seed).train_round(start).delta

    assert torch.equal(delta(1), delta(1))
    assert not torch.equal(delta(1), delta(2))


def test_loss_decreases_on_digits():
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = build_model("mlp", data.spec, {"hidden": "32"})
    trainer = LocalTrainer(
        model, data.train_x, data.train_y, LocalConfig(optimizer="adamw", lr=1e-2, steps=10, batch_size=64), seed=0
    )
    global_params = flat_params(model)
    val_before, _ = evaluate(model, data.val_x, data.val_y)

    losses = []
    for _ in range(4):
        result = trainer.train_round(global_params)
        global_params = global_params - result.delta  # FedAvg with one worker
        losses.append(result.loss)

    set_flat_params(model, global_params)
    val_after, acc_after = evaluate(model, data.val_x, data.val_y)
    assert losses[-1] < losses[0]
    assert val_after < 0.5 * val_before
    assert acc_after > 0.7


@pytest.mark.parametrize(
    ("x", "y"),
    [(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)), (torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))],
)
def test_shard_must_be_non_empty_and_matching(x, y):
    model, _, _ = tiny_problem()

    with pytest.raises(ValueError, match="shard needs matching non-empty x and y"):
        LocalTrainer(model, x, y, sgd(), seed=0)


# --- evaluate ---------------------------------------------------------------------------------


def test_evaluate_classification_hand_computed():
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))  # logits = x
    x = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 3.0]])
    y = torch.tensor([0, 1, 0])  # predictions 0, 1, 1: two of three right

    loss, acc = evaluate(model, x, y, batch_size=2)  # batches of 2 and 1

    assert acc == pytest.approx(2 / 3)
    assert loss == pytest.approx(F.cross_entropy(x, y).item())


def test_evaluate_language_has_no_accuracy():
    torch.manual_seed(0)
    spec = DataSpec("language", (8,), 256)
    model = build_model("transformer", spec, {"d_model": "16", "n_layers": "1", "n_heads": "2", "context": "8"})
    x = torch.randint(0, 256, (4, 8), dtype=torch.uint8)
    y = torch.randint(0, 256, (4, 8), dtype=torch.uint8)

    loss, acc = evaluate(model, x, y)

    assert acc is None
    assert loss == pytest.approx(math.log(256), abs=0.1)  # small init: near-uniform over bytes


def test_evaluate_leaves_model_in_eval_mode():
    model, x, y = tiny_problem()

    evaluate(model, x, y)

    assert not model.training


# --- config -----------------------------------------------------------------------------------


def test_local_config_from_strings():
    cfg = local_config({"steps": "5", "batch_size": "16", "optimizer": "sgd", "lr": "0.5", "momentum": "0.9"})

    assert cfg == LocalConfig(steps=5, batch_size=16, optimizer="sgd", lr=0.5, momentum=0.9)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"optimizer": "lion"}, "unknown inner optimizer 'lion'; allowed: adam, adamw, sgd"),
        ({"steps": "0"}, "local steps must be >= 1, got 0"),
        ({"batch_size": "0"}, "batch size must be >= 1"),
        ({"lr": "0"}, "lr must be a positive number"),
        ({"lr": "inf"}, "lr must be a positive number"),
        ({"momentum": "-1"}, "must be >= 0"),
        ({"epochs": "1"}, "unknown local training option 'epochs'"),
    ],
)
def test_local_config_errors(options, message):
    with pytest.raises(UsageError) as exc:
        local_config(options)

    assert message in str(exc.value)


@pytest.mark.parametrize(
    "options", [{"weight_decay": "nan"}, {"momentum": "inf"}, {"grad_clip": "nan"}], ids=["wd", "momentum", "clip"]
)
def test_local_config_rejects_non_finite_numbers(options):
    with pytest.raises(UsageError):
        local_config(options)


def test_a_round_reports_its_training_accuracy_and_a_language_round_none():
    """A classifier's round reports the share of its own batches it predicted right (what a
    worker sends as ``train_accuracy``); the seeded numbers do not change with it."""
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()  # a separable rule: accuracy rises well above chance
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    t = LocalTrainer(model, x, y, LocalConfig(steps=40, batch_size=16, optimizer="sgd", lr=0.5), seed=1)
    first = t.train_round(flat_params(model))
    assert first.accuracy is not None and 0.5 < first.accuracy <= 1.0
    later = t.train_round(flat_params(model))
    assert later.accuracy >= first.accuracy

    seq = torch.randint(0, 5, (8, 6))  # (B, T) labels: language data
    lm = torch.nn.Sequential(torch.nn.Embedding(5, 5))
    res = LocalTrainer(lm, seq, seq, LocalConfig(steps=2, batch_size=4, lr=0.1), seed=1).train_round(flat_params(lm))
    assert res.accuracy is None and res.loss > 0


def test_a_seeded_step_draws_what_torch_manual_seed_draws():
    """train_step seeds only the CPU generator on CPU (torch.manual_seed also seeds every
    accelerator's, at ~100x the cost): dropout's draws must be those torch.manual_seed gives,
    so proofs recorded before the change replay the same."""
    from aitbc.training.local import _step, build_inner_optimizer, train_step

    def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 3))
        return model, build_inner_optimizer(cfg, model.parameters())

    cfg = LocalConfig(steps=1, optimizer="sgd", lr=0.1)
    xb, yb = torch.randn(32, 8), torch.randint(0, 3, (32,))
    a, opt_a = fresh()
    loss_a, logits_a = train_step(a, opt_a, xb, yb, cfg, seed=1234)
    b, opt_b = fresh()
    torch.manual_seed(1234)
    loss_b, logits_b = _step(b, opt_b, xb, yb, cfg)
    assert torch.equal(logits_a, logits_b) and torch.equal(loss_a, loss_b)
    assert torch.equal(flat_params(a), flat_params(b))
    c, opt_c = fresh()
    _, logits_c = train_step(c, opt_c, xb, yb, cfg, seed=1235)
    assert not torch.equal(logits_a, logits_c)  # the seed is what decides the dropout mask


def test_an_eager_start_is_the_base_less_the_previous_update_as_it_decodes():
    """Overlap 1: a round trained ahead starts from the newest model less the worker's own
    last update as the coordinator decodes it (int8 here: lossy, so not the update it
    meant), bit for bit what the coordinator's spot check computes; a blob of another size
    is an IntegrityError, not a start."""
    g = torch.Generator().manual_seed(3)
    base, update = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
    blob = build_codec("int8", {}).encode(update)
    start = eager_start(base, [blob])
    assert start.dtype == torch.float32 and start.shape == (1000,)
    assert torch.equal(start, base - decode_update(blob).to(torch.float32))
    assert not torch.equal(start, base - update)  # the decoded bytes, not the worker's own float32
    with pytest.raises(IntegrityError):
        eager_start(base[:999], [blob])


def test_an_eager_start_two_rounds_ahead_takes_both_previous_updates_in_order():
    """Overlap 2: a round trained from the model two rounds back starts from it less the
    worker's own two updates since, each as its blob decodes; no priors is the base itself."""
    g = torch.Generator().manual_seed(4)
    base, u1, u2 = (torch.randn(500, generator=g) for _ in range(3))
    codec = build_codec("int8", {})
    b1, b2 = codec.encode(u1), codec.encode(u2)
    start = eager_start(base, [b2, b1])
    assert torch.equal(start, base - decode_update(b2).to(torch.float32) - decode_update(b1).to(torch.float32))
    assert torch.equal(eager_start(base, []), base)
    with pytest.raises(IntegrityError):
        eager_start(base, [b2, codec.encode(torch.randn(499, generator=g))])
