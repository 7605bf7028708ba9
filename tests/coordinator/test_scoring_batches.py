"""Scoring's per-sample losses come from one forward pass per model (a base over every
batch measured on it; an update over its own three), and its shards from a cache by CID:
the signals are those of measuring each batch on its own, and a cached shard is the one
the store holds, read once."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aitbc.coordinator.live.books import ShardCache
from aitbc.coordinator.verification.scoring import judge
from aitbc.core.scoring import relative_gain
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.training.checkpoint import flat_params, set_flat_params, shard_bytes


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


@torch.no_grad()
def _losses_alone(model: nn.Module, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    set_flat_params(model, params)
    model.eval()
    return F.cross_entropy(model(x), y, reduction="none").to(torch.float64)  # (B,)


def _gain(before: torch.Tensor, after: torch.Tensor) -> float:
    return relative_gain(float(before.mean()), float(after.mean()))


def _reference(model, before, U, trained, shards, split, val, *, samples, seed):
    """The signals measured batch by batch, each on its own forward pass (the draws in the
    order scoring makes them: each update's own shard's, then the others')."""
    g = torch.Generator().manual_seed(seed)
    vx, vy = val[0][:samples], val[1][:samples]
    gains, own, other = [], [], []
    for i, k in enumerate(trained):
        b = before[i] if isinstance(before, list) else before
        after = b - U[i]
        gains.append(_gain(_losses_alone(model, b, vx, vy), _losses_alone(model, after, vx, vy)))
        ox, oy = shards[k]
        pick = torch.randperm(ox.shape[0], generator=g)[:samples]
        own.append(_gain(_losses_alone(model, b, ox[pick], oy[pick]), _losses_alone(model, after, ox[pick], oy[pick])))
        rest = [sh for m, sh in enumerate(shards) if m != k and not split[m]] or [shards[k]]
        rx, ry = torch.cat([sh[0] for sh in rest]), torch.cat([sh[1] for sh in rest])
        pick = torch.randperm(rx.shape[0], generator=g)[:samples]
        other.append(
            _gain(_losses_alone(model, b, rx[pick], ry[pick]), _losses_alone(model, after, rx[pick], ry[pick]))
        )
    return gains, own, other


@pytest.mark.parametrize("bases", ["one", "per update"])
def test_one_pass_per_model_measures_what_one_pass_per_batch_does(bases):
    model = _mlp()
    theta = flat_params(model)  # (d,)
    d = theta.numel()
    shards = [_data(n, seed) for seed, n in enumerate((40, 25, 60, 33))]
    split = [False, False, True, False]  # shard 2 lives on in halves: not "others' data"
    val = _data(50, 99)
    g = torch.Generator().manual_seed(7)
    U = 0.05 * torch.randn(4, d, generator=g)  # (n, d)
    U[3] = -U[0]  # its opposite
    trained = [0, 1, 3, 1]  # two updates trained on the same shard
    before = theta if bases == "one" else [theta, theta + 0.01, theta, theta + 0.01]
    kept = [1.0] * 4

    got = judge(model, before, U, trained, shards, split, val, kept, samples=32, seed=5)
    gains, own, other = _reference(model, before, U, trained, shards, split, val, samples=32, seed=5)
    assert [s.gain for s in got] == pytest.approx(gains, abs=1e-6)
    assert [s.own_gain for s in got] == pytest.approx(own, abs=1e-6)
    assert [s.other_gain for s in got] == pytest.approx(other, abs=1e-6)
    assert all(math.isfinite(s.quality) for s in got)
    assert got[3].gain == pytest.approx(-got[0].gain, abs=0.05)  # U[3] = -U[0]: opposite gains, near 0


def test_a_shard_is_read_from_the_store_once_and_is_what_the_store_holds(tmp_path, monkeypatch):
    store = LocalBlobStore(tmp_path)
    x, y = _data(30, 1)
    cid = store.put_bytes(shard_bytes(x, y, dataset="t", index=0, count=1))
    reads = []
    real = store.get_bytes
    monkeypatch.setattr(store, "get_bytes", lambda c: reads.append(c) or real(c))
    cache = ShardCache()
    for _ in range(3):
        cx, cy = cache.get(store, cid)
        assert torch.equal(cx, x) and torch.equal(cy, y)
    assert reads == [cid]
    assert cache.nbytes == x.numel() * 4 + y.numel() * 8


def test_the_cache_keeps_at_most_its_bound_least_recently_used_leaving_first(tmp_path):
    store = LocalBlobStore(tmp_path)
    cids = [store.put_bytes(shard_bytes(*_data(10, s), dataset="t", index=s, count=4)) for s in range(4)]
    size = 10 * 8 * 4 + 10 * 8  # float32 x (10, 8), int64 y (10,)
    cache = ShardCache(limit_bytes=2 * size)
    cache.get(store, cids[0])
    cache.get(store, cids[1])
    cache.get(store, cids[0])  # 0 used again: 1 is the least recent
    cache.get(store, cids[2])
    assert len(cache) == 2 and cache.nbytes == 2 * size
    assert set(cache._shards) == {cids[0], cids[2]}

    big = ShardCache(limit_bytes=size - 1)  # a shard larger than the bound is read, not kept
    bx, _ = big.get(store, cids[3])
    assert bx.shape == (10, 8) and len(big) == 0 and big.nbytes == 0


def test_a_finalized_run_s_shards_leave_the_cache(tmp_path):
    store = LocalBlobStore(tmp_path)
    cids = [store.put_bytes(shard_bytes(*_data(10, s), dataset="t", index=s, count=3)) for s in range(3)]
    cache = ShardCache()
    cache.get(store, cids[0], "run_a")
    cache.get(store, cids[1], "run_a")
    cache.get(store, cids[2], "run_b")
    cache.drop_run("run_a")
    assert len(cache) == 1 and set(cache._shards) == {cids[2]}
    assert cache.nbytes == 10 * 8 * 4 + 10 * 8
    cache.drop_run("run_a")  # twice, or a run that never asked: nothing
    cache.drop_run("run_c")
    assert len(cache) == 1
