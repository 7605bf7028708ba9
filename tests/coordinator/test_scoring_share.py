"""Pay is judged at an update's share of the round's mean, the flags on the update alone.

Near convergence each honest update alone carries noise of its own (an optimizer restarted
each round moves every parameter about ``lr`` a step) that the mean averages out: alone it
raises the loss on held-out data and on its own shard, while the share the close applies of
it lowers both. Judged alone, such a round paid none of its honest workers; judged at the
share, each is paid, and a free-rider and a reversed update are still not."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from aitbc.coordinator.verification import scoring
from aitbc.coordinator.verification.scoring import judge, mean_shares
from aitbc.training.checkpoint import flat_params, set_flat_params

D, C = 16, 4
TEACHER = torch.randn(D, C, generator=torch.Generator().manual_seed(1))


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    return x, (x @ TEACHER).argmax(1)


def _round(noise: float = 6.0):
    """A model, its parameters, IID shards, a validation split, and four honest updates:
    the true descent step plus each worker's own noise (``U``: ``after = before - U[i]``)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 32), nn.Tanh(), nn.Linear(32, C))
    theta = flat_params(model)  # (d,)
    x, y = _data(4000, 5)
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # (d,)
    step = 0.5 * grad / grad.norm()
    g = torch.Generator().manual_seed(3)
    d = theta.numel()
    U = torch.stack([step + noise * torch.randn(d, generator=g) / d**0.5 for _ in range(4)])  # (4, d)
    shards = [_data(600, 10 + k) for k in range(6)]
    return model, theta, U, shards, _data(600, 99)


@torch.no_grad()
def _loss(model: nn.Module, params: torch.Tensor, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    set_flat_params(model, params)
    return float(F.cross_entropy(model(data[0]), data[1]))


def _judge(model, theta, U, shards, val, shares):
    n = U.shape[0]
    return judge(
        model,
        theta,
        U,
        list(range(n)),
        shards,
        [False] * len(shards),
        val,
        [1.0] * n,
        samples=512,
        seed=1,
        shares=shares,
    )


def test_honest_updates_that_cost_loss_alone_are_paid_at_their_share_of_the_mean():
    model, theta, U, shards, val = _round()
    before = _loss(model, theta, val)
    # the round as it is: each update alone raises the validation loss, its quarter lowers it,
    # and so does the mean the close applies
    assert all(_loss(model, theta - u, val) > before for u in U)
    assert all(_loss(model, theta - u / 4, val) < before for u in U)
    assert _loss(model, theta - U.mean(0), val) < before

    alone = _judge(model, theta, U, shards, val, None)  # judged alone: no honest worker paid
    assert all(s.gain < 0 and s.own_gain < 0 for s in alone)
    assert [s.quality for s in alone] == [0.0] * 4 and not any(s.flags for s in alone)

    paid = _judge(model, theta, U, shards, val, mean_shares(torch.full((4,), 600.0)))
    assert not any(s.flags for s in paid)  # the flags still judge the update alone: none here
    assert [s.gain for s in paid] == [s.gain for s in alone]  # the record keeps the gain alone
    assert min(s.quality for s in paid) > 0.5, [s.quality for s in paid]


def test_a_free_rider_and_a_reversed_update_are_still_unpaid_at_their_share():
    model, theta, U, shards, val = _round()
    zero = torch.zeros_like(U[0])
    reversed_ = -2 * U.mean(0)  # the round's direction turned back, at twice its length
    rounds = torch.cat([U, zero[None], reversed_[None]])  # (6, d)
    w = torch.full((6,), 600.0)
    got = _judge(model, theta, rounds, shards, val, mean_shares(w))
    assert got[4].quality == 0.0  # the zero update gains nothing anywhere
    assert got[5].quality == 0.0  # the reversed one raises the loss at any share
    assert min(s.quality for s in got[:4]) > 0.5, [s.quality for s in got]
    assert not any(s.flags for s in got[:4])


def test_mean_shares_are_the_samples_over_the_rounds_or_equal_when_none_count():
    assert mean_shares(torch.tensor([100.0, 300.0])) == [0.25, 0.75]
    assert mean_shares(torch.tensor([0.0, 0.0, 0.0])) == [1 / 3] * 3


def test_a_rounds_only_update_is_judged_alone_in_one_pass(monkeypatch):
    model, theta, U, shards, val = _round()
    passes = []
    real = scoring._losses
    monkeypatch.setattr(scoring, "_losses", lambda *a, **k: passes.append(a[2].shape[0]) or real(*a, **k))
    (one,) = _judge(model, theta, U[:1], shards, val, mean_shares(torch.tensor([600.0])))
    (alone,) = _judge(model, theta, U[:1], shards, val, None)
    assert one == alone  # its whole share is the update alone
    assert passes == [3 * 512, 3 * 512] * 2  # the base's pass and the update's: no third
