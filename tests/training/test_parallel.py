"""Data parallelism inside a provider (training/parallel.py), devices and bf16 autocast
(training/devices.py), on the CPU: two gloo processes train the model one process would."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

from aitbc.errors import UsageError
from aitbc.training.checkpoint import flat_params
from aitbc.training.data_spec import DataSpec
from aitbc.training.devices import check_device_spec, resolve_devices
from aitbc.training.local import LocalConfig, LocalTrainer
from aitbc.training.models import build_model
from aitbc.training.parallel import RankFailed, Ranks

SPEC = DataSpec("classification", (6,), 4)


def problem(n: int = 48, seed: int = 0):
    torch.manual_seed(seed)
    model = build_model("mlp", SPEC, {"hidden": "16"})
    x = torch.randn(n, 6)
    y = torch.randint(0, 4, (n,))
    return model, x, y


def _two_rounds(trainer: LocalTrainer, start: torch.Tensor, ranks: Ranks | None = None):
    results = []
    params = start
    for r in (1, 2):
        if ranks is not None:
            ranks.round(trainer, params, r)
        res = trainer.train_round(params, round=r)
        results.append(res)
        params = params - res.delta
    return results, params


@pytest.mark.parametrize("batch_size", [16, 7])  # 7: the two ranks' slices differ (3 and 4)
def test_two_gloo_ranks_train_the_model_one_process_trains(batch_size):
    cfg = dict(steps=5, batch_size=batch_size, optimizer="adamw", lr=0.01, grad_clip=1.0)
    model, x, y = problem()
    start = flat_params(model)
    single = LocalTrainer(copy.deepcopy(model), x, y, LocalConfig(**cfg), seed=3)
    one, one_end = _two_rounds(single, start)

    ranks = Ranks([torch.device("cpu")] * 2)
    try:
        ranks.job("mlp", {"hidden": "16"}, SPEC, LocalConfig(**cfg), 3, x, y)
        dp = LocalTrainer(copy.deepcopy(model), x, y, LocalConfig(**cfg), seed=3, group=ranks.group)
        two, two_end = _two_rounds(dp, start, ranks)
    finally:
        ranks.close()

    assert_close(two_end, one_end, rtol=1e-5, atol=1e-6)
    for a, b in zip(one, two, strict=True):
        assert_close(b.delta, a.delta, rtol=1e-5, atol=1e-6)
        assert b.loss == pytest.approx(a.loss, rel=1e-5)
        assert b.accuracy == pytest.approx(a.accuracy)
        assert b.samples == a.samples
    assert one[0].delta.abs().sum() > 0


def test_a_rank_without_a_sample_still_takes_the_step():
    """A batch smaller than the world (1 sample, 2 ranks): rank 1 joins at weight 0."""
    cfg = dict(steps=3, batch_size=1, optimizer="sgd", lr=0.1)
    model, x, y = problem(n=5)
    start = flat_params(model)
    one, _ = _two_rounds(LocalTrainer(copy.deepcopy(model), x, y, LocalConfig(**cfg), seed=1), start)
    ranks = Ranks([torch.device("cpu")] * 2)
    try:
        ranks.job("mlp", {"hidden": "16"}, SPEC, LocalConfig(**cfg), 1, x, y)
        dp = LocalTrainer(copy.deepcopy(model), x, y, LocalConfig(**cfg), seed=1, group=ranks.group)
        two, _ = _two_rounds(dp, start, ranks)
    finally:
        ranks.close()
    for a, b in zip(one, two, strict=True):
        assert_close(b.delta, a.delta, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_trains_on_the_cpu():
    model, x, y = problem(n=64)
    start = flat_params(model)
    trainer = LocalTrainer(model, x, y, LocalConfig(steps=30, batch_size=64, lr=0.02, precision="bf16"), seed=0)
    first = trainer.train_round(start, round=1)
    second = trainer.train_round(start - first.delta, round=2)
    assert second.loss < first.loss * 0.8, (first.loss, second.loss)
    fp32 = LocalTrainer(copy.deepcopy(model), x, y, LocalConfig(steps=30, batch_size=64, lr=0.02), seed=0)
    assert not torch.equal(fp32.train_round(start, round=1).delta, first.delta)  # autocast really ran


def test_bad_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, got 'fp16'"):
        LocalConfig(precision="fp16")


@pytest.mark.parametrize("spec", ["gpu", "cuda:", "cuda:x", "cpu:0", "auto:1", "", "cuda:-1", "cuda:99999"])
def test_bad_device_spelling_is_refused(spec):
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N"):
        check_device_spec(spec)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals of a machine without a GPU")
def test_devices_on_a_machine_without_a_gpu():
    assert resolve_devices("auto") == [torch.device("cpu")]
    assert resolve_devices("CPU", 2) == [torch.device("cpu")] * 2
    with pytest.raises(UsageError, match=r"^--device cuda:3: this machine has no CUDA GPU"):
        resolve_devices("cuda:3")
    with pytest.raises(UsageError, match="no CUDA GPU"):
        resolve_devices("cuda", 2)
    with pytest.raises(UsageError, match="--gpus must be >= 1"):
        resolve_devices("cpu", 0)


def test_a_rank_that_died_is_named():
    model, x, y = problem()
    cfg = LocalConfig(steps=2, batch_size=8)
    ranks = Ranks([torch.device("cpu")] * 2)
    try:
        ranks.job("mlp", {"hidden": "16"}, SPEC, cfg, 0, x, y)
        trainer = LocalTrainer(model, x, y, cfg, seed=0, group=ranks.group)
        ranks.procs[0].kill()
        ranks.procs[0].wait()
        with pytest.raises(RankFailed, match=r"^data-parallel rank 1 exited \(code -9\)$"):
            ranks.round(trainer, flat_params(model), 1)
        assert str(ranks.failure(RuntimeError("gloo: connection closed"))).startswith("data-parallel rank 1 exited")
    finally:
        ranks.close()


def test_the_ranks_listen_on_loopback_only():
    """The rendezvous store and gloo's sockets: 127.0.0.1, not every interface (torch's own
    master store binds them all) nor the host name's address."""
    psutil = pytest.importorskip("psutil")
    ranks = Ranks([torch.device("cpu")] * 2)
    try:
        listening = [
            c.laddr
            for p in (psutil.Process(), psutil.Process(ranks.procs[0].pid))
            for c in p.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        ours = [a for a in listening if a.port == ranks._listener.getsockname()[1]]
        assert ours and len(listening) >= 3, listening  # the store, and each rank's gloo listener
        assert all(a.ip == "127.0.0.1" for a in listening), listening
    finally:
        ranks.close()


def test_devices_on_a_two_gpu_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_devices("auto") == [torch.device("cuda", 0)]
    assert resolve_devices("cuda", 2) == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert resolve_devices("cuda:1") == [torch.device("cuda", 1)]
    assert resolve_devices("cpu", 3) == [torch.device("cpu")] * 3
    with pytest.raises(UsageError, match=r"^--device cuda:3: no such GPU; this machine has cuda:0\.\.cuda:1$"):
        resolve_devices("cuda:3")
    with pytest.raises(UsageError, match=r"^--gpus 4: this machine has 2 CUDA GPUs$"):
        resolve_devices("auto", 4)
    with pytest.raises(UsageError, match="several GPUs are cuda:0..cuda:1; give --device cuda"):
        resolve_devices("cuda:1", 2)
