"""The in-process simulation: determinism, byte and time accounting, the DP baseline."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from aitbc.core.compression import build_codec
from aitbc.errors import UsageError
from aitbc.sim.config import SimConfig
from aitbc.sim.network import WorkerProfile, build_profiles, parse_per_worker
from aitbc.sim.runner import Simulation, run_simulation
from aitbc.training.local import loss_fn

FAST = dict(workers=4, rounds=3, local_steps=5, batch_size=16)


def _run(tmp_path, name="run", **kw):
    cfg = SimConfig(**{**FAST, **kw})
    return run_simulation(cfg, home=tmp_path / "home", out_dir=tmp_path / name)


def _rows(result):
    with open(result.metrics_path) as f:
        return [json.loads(line) for line in f]


def test_same_seed_gives_same_numbers(tmp_path):
    a = _run(tmp_path, "a", seed=7)
    b = _run(tmp_path, "b", seed=7)

    assert _rows(a) == _rows(b)
    assert (a.final_val_loss, a.final_model_cid, a.manifest_cid) == (
        b.final_val_loss,
        b.final_model_cid,
        b.manifest_cid,
    )


def test_different_seed_gives_different_numbers(tmp_path):
    a = _run(tmp_path, "a", seed=1)
    b = _run(tmp_path, "b", seed=2)

    assert a.final_val_loss != b.final_val_loss
    assert a.manifest_cid != b.manifest_cid


def test_metrics_rows_and_byte_totals_come_from_real_blobs(tmp_path):
    result = _run(tmp_path)
    rows = _rows(result)

    assert [r["round"] for r in rows] == [1, 2, 3]
    assert set(rows[0]) >= {"round", "val_loss", "val_accuracy", "bytes_up", "virtual_time"}
    assert rows[-1]["bytes_up"] == result.bytes_up  # rows carry running totals
    assert rows[-1]["bytes_down"] == result.bytes_down
    one_update = len(build_codec("none").encode(torch.zeros(result.params)))
    assert result.bytes_up == 3 * 4 * one_update  # rounds x workers x encoded size
    assert result.bytes_down > 4 * result.params * 3 * 4  # a safetensors checkpoint per worker per round
    assert [r["virtual_time"] for r in rows] == sorted(r["virtual_time"] for r in rows)


def test_artifacts_are_blobs_in_the_store(tmp_path):
    from aitbc.storage.blobstore import LocalBlobStore
    from aitbc.training.checkpoint import read_metadata

    result = _run(tmp_path)
    store = LocalBlobStore(tmp_path / "home")

    manifest = json.loads(store.get_bytes(result.manifest_cid))
    assert len(manifest["shards"]) == 4 and all(store.has(s["cid"]) for s in manifest["shards"])
    assert read_metadata(store.get_bytes(result.final_model_cid))["round"] == "3"


def test_slow_worker_sets_the_pace_of_a_sync_round(tmp_path):
    net = dict(latency="0", bandwidth="1e6")  # a fast network, so compute sets the pace
    even = _run(tmp_path, "even", speeds="1", **net)
    slow = _run(tmp_path, "slow", speeds="1,1,1,0.1", **net)

    assert slow.virtual_seconds == pytest.approx(10 * even.virtual_seconds, rel=0.05)
    assert slow.final_val_loss == even.final_val_loss  # speed changes time, not the math


def test_round_time_is_download_compute_upload_of_the_slowest():
    p = WorkerProfile(speed=0.5, bandwidth_mbps=8.0, latency_ms=10.0)

    # 1 MB at 8 Mbit/s = 1 s, plus 10 ms latency; 4 steps of 0.25 s at half speed = 2 s.
    assert p.transfer_seconds(1_000_000) == pytest.approx(1.01)
    assert p.compute_seconds(4, 0.25) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [("1,2", "gives 2 values for 4 workers"), ("a", "must be numbers"), ("0", "must be > 0"), ("inf", "must be > 0")],
)
def test_bad_per_worker_specs_are_usage_errors(spec, message):
    with pytest.raises(UsageError, match=message):
        parse_per_worker(spec, 4, flag="--speeds")


def test_profiles_take_one_value_or_one_per_worker():
    profiles = build_profiles(3, speeds="1,0.5,2", bandwidth="100", latency="0")

    assert [p.speed for p in profiles] == [1.0, 0.5, 2.0]
    assert {p.bandwidth_mbps for p in profiles} == {100.0}


def test_local_steps_1_fedavg_sgd_is_synchronous_data_parallel_sgd(tmp_path):
    # Prepare: a 1-round, 1-step, plain-SGD run and its starting point.
    cfg = SimConfig(workers=2, rounds=1, local_steps=1, batch_size=8, lr=0.1, inner_opt="sgd", outer="fedavg", seed=3)
    sim = Simulation(cfg, home=tmp_path / "home", out_dir=tmp_path / "out")
    start = sim.params.clone()
    grads, counts = [], []
    for i, t in enumerate(sim.trainers):  # replay each worker's first batch from its seed
        idx = torch.randperm(t.x.shape[0], generator=torch.Generator().manual_seed(cfg.seed * 100_003 + i))[:8]
        model = copy.deepcopy(t.model)
        model.zero_grad()
        loss_fn(model(t.x[idx]), t.y[idx]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        counts.append(t.x.shape[0])

    # Execute
    sim.run()

    # Assert: one step of SGD on the sample-weighted mean gradient.
    w = torch.tensor(counts, dtype=torch.float32) / sum(counts)
    expected = start - 0.1 * (w[0] * grads[0] + w[1] * grads[1])
    assert torch.allclose(sim.params, expected, atol=1e-6)


def test_transformer_on_stdlib_learns_below_uniform_bytes(tmp_path):
    result = _run(
        tmp_path,
        model="transformer",
        dataset="stdlib",
        workers=2,
        rounds=4,
        local_steps=10,
        lr=3e-3,
        model_options={"context": 32, "d_model": 32, "n_layers": 1, "n_heads": 2},
        max_bytes=200_000,
        eval_samples=128,
    )

    assert result.final_val_accuracy is None
    assert result.initial_val_loss == pytest.approx(math.log(256), abs=0.1)
    assert result.final_val_loss < math.log(256) - 1.0


def test_cnn_learns_digits(tmp_path):
    result = _run(tmp_path, model="cnn", rounds=5, local_steps=10, lr=5e-3)

    assert result.final_val_loss < result.initial_val_loss
    assert result.final_val_accuracy > 0.3  # chance is 0.1


def test_label_skewed_shards_still_train(tmp_path):
    result = _run(tmp_path, alpha=0.3, rounds=5, local_steps=10)

    assert result.final_val_loss < result.initial_val_loss


def test_bad_config_fails_before_anything_is_written(tmp_path):
    with pytest.raises(UsageError, match="unknown model 'nope'"):
        Simulation(SimConfig(model="nope"), home=tmp_path / "home", out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field", ["workers", "rounds"])
def test_zero_counts_are_refused(field):
    with pytest.raises(UsageError, match=f"--{field} must be at least 1"):
        SimConfig(**{field: 0})
