"""Outer optimizers: FedAvg and DiLoCo's Nesterov step over flat ``(d,)`` tensors."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from aitbc.core.outer import OUTER_OPTIMIZERS, DiLoCo, FedAvg, build_outer
from aitbc.errors import UsageError


def sgd_reference(params: torch.Tensor, deltas: list[torch.Tensor], **sgd_kw) -> list[torch.Tensor]:
    """Apply torch.optim.SGD to a parameter whose .grad is each delta in turn."""
    p = torch.nn.Parameter(params.clone())
    opt = torch.optim.SGD([p], **sgd_kw)
    out = []
    for d in deltas:
        p.grad = d.clone()
        opt.step()
        out.append(p.detach().clone())
    return out


def test_registry_names():
    assert OUTER_OPTIMIZERS.names() == ["diloco", "fedavg"]


def test_build_outer_defaults():
    fedavg, diloco = build_outer("fedavg"), build_outer("diloco")

    assert isinstance(fedavg, FedAvg) and fedavg.cfg.lr == 1.0
    assert isinstance(diloco, DiLoCo)
    assert (diloco.cfg.lr, diloco.cfg.momentum, diloco.cfg.nesterov) == (0.7, 0.9, True)


# --- fedavg ------------------------------------------------------------------------------------


def test_fedavg_hand_computed():
    params = torch.tensor([1.0, 2.0, 3.0])
    delta = torch.tensor([0.5, -1.0, 2.0])
    opt = build_outer("fedavg", {"lr": "0.5"})

    new = opt.step(params, delta)

    # [1 - 0.25, 2 + 0.5, 3 - 1]
    assert_close(new, torch.tensor([0.75, 2.5, 2.0]))


def test_fedavg_lr_one_applies_the_mean_and_leaves_inputs_alone():
    params = torch.tensor([1.0, 2.0])
    delta = torch.tensor([0.25, -0.5])

    new = build_outer("fedavg").step(params, delta)

    assert_close(new, torch.tensor([0.75, 2.5]))
    assert_close(params, torch.tensor([1.0, 2.0]))
    assert_close(delta, torch.tensor([0.25, -0.5]))


def test_fedavg_has_no_state():
    opt = build_outer("fedavg")

    opt.load_state_dict({})

    assert opt.state_dict() == {}


# --- diloco ------------------------------------------------------------------------------------


def test_diloco_two_steps_hand_computed():
    opt = build_outer("diloco")  # lr 0.7, momentum 0.9, nesterov
    p0 = torch.tensor([1.0, 0.0], dtype=torch.float64)

    # step 1: buf = d1 = [1, -2]; dir = d1 + 0.9 buf = [1.9, -3.8]; p1 = p0 - 0.7 dir
    p1 = opt.step(p0, torch.tensor([1.0, -2.0], dtype=torch.float64))
    # step 2: buf = 0.9 [1, -2] + [0.5, 0] = [1.4, -1.8]; dir = [0.5 + 1.26, 0 - 1.62]
    p2 = opt.step(p1, torch.tensor([0.5, 0.0], dtype=torch.float64))

    assert_close(p1, torch.tensor([-0.33, 2.66], dtype=torch.float64))
    assert_close(p2, torch.tensor([-1.562, 3.794], dtype=torch.float64))
    assert_close(opt.state_dict()["momentum_buffer"], torch.tensor([1.4, -1.8], dtype=torch.float64))


def test_diloco_matches_torch_sgd_nesterov():
    torch.manual_seed(0)
    p0 = torch.randn(6, dtype=torch.float64)
    deltas = [torch.randn(6, dtype=torch.float64) for _ in range(3)]
    opt = build_outer("diloco")

    ours, p = [], p0
    for d in deltas:
        p = opt.step(p, d)
        ours.append(p)

    expected = sgd_reference(p0, deltas, lr=0.7, momentum=0.9, nesterov=True)
    for got, want in zip(ours, expected, strict=True):
        assert_close(got, want)


def test_diloco_without_nesterov_matches_torch_sgd_momentum():
    torch.manual_seed(1)
    p0 = torch.randn(4, dtype=torch.float64)
    deltas = [torch.randn(4, dtype=torch.float64) for _ in range(3)]
    opt = build_outer("diloco", {"nesterov": "false", "lr": "0.3", "momentum": "0.5"})

    p = p0
    for d in deltas:
        p = opt.step(p, d)

    assert_close(p, sgd_reference(p0, deltas, lr=0.3, momentum=0.5)[-1])


def test_diloco_does_not_modify_inputs():
    params, delta = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    opt = build_outer("diloco")

    opt.step(params, delta)
    opt.step(params, delta)

    assert_close(params, torch.tensor([1.0, 2.0]))
    assert_close(delta, torch.tensor([3.0, 4.0]))


def test_diloco_state_dict_empty_before_first_step():
    assert build_outer("diloco").state_dict() == {}


def test_diloco_state_round_trip_continues_identically():
    torch.manual_seed(2)
    p = torch.randn(5)
    deltas = [torch.randn(5) for _ in range(4)]
    a = build_outer("diloco")
    for d in deltas[:2]:
        p = a.step(p, d)
    b = build_outer("diloco")

    b.load_state_dict(a.state_dict())

    pa, pb = p, p
    for d in deltas[2:]:
        pa, pb = a.step(pa, d), b.step(pb, d)
    assert torch.equal(pa, pb)


def test_diloco_state_dict_is_a_copy():
    opt = build_outer("diloco")
    opt.step(torch.zeros(2), torch.ones(2))
    state = opt.state_dict()

    opt.step(torch.zeros(2), torch.ones(2))

    assert_close(state["momentum_buffer"], torch.ones(2))


def test_diloco_load_state_dict_does_not_alias_the_callers_tensor():
    # step() updates the buffer in place, so loading must copy it
    src = build_outer("diloco")
    src.step(torch.zeros(2), torch.ones(2))
    state = src.state_dict()  # momentum_buffer = [1, 1]
    a, b = build_outer("diloco"), build_outer("diloco")
    a.load_state_dict(state)
    b.load_state_dict(state)

    pa = a.step(torch.zeros(2), torch.ones(2))
    pb = b.step(torch.zeros(2), torch.ones(2))

    assert_close(state["momentum_buffer"], torch.ones(2))
    assert_close(pa, pb)


def test_diloco_rejected_delta_leaves_momentum_unchanged():
    opt = build_outer("diloco")
    opt.step(torch.zeros(2), torch.ones(2))

    with pytest.raises(ValueError):
        opt.step(torch.zeros(2), torch.tensor([1.0, float("nan")]))

    assert_close(opt.state_dict()["momentum_buffer"], torch.ones(2))


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("fedavg", {"lr": 0}, "got 0"),
        ("fedavg", {"lr": "-1"}, "got -1.0"),
        ("fedavg", {"lr": "nan"}, "got nan"),
        ("fedavg", {"lr": "inf"}, "got inf"),
        ("diloco", {"lr": "0"}, "got 0"),
        ("diloco", {"lr": "-inf"}, "got -inf"),
        ("diloco", {"momentum": "1"}, "momentum must be in [0, 0.99], got 1.0"),
        ("diloco", {"momentum": 1.5}, "momentum must be in [0, 0.99]"),
        ("diloco", {"momentum": "-0.1"}, "momentum must be in [0, 0.99]"),
        ("fedavg", {"momentum": "0.9"}, "unknown outer optimizer 'fedavg' option 'momentum'; allowed: lr"),
        ("diloco", {"nesterov": "maybe"}, "nesterov='maybe' must be bool"),
    ],
)
def test_bad_config_is_a_usage_error(name, options, message):
    with pytest.raises(UsageError) as exc:
        build_outer(name, options)

    assert f"outer optimizer {name!r}" in str(exc.value)
    assert message in str(exc.value)


def test_unknown_outer_optimizer_lists_names():
    with pytest.raises(UsageError, match="unknown outer optimizer 'adam'; allowed: diloco, fedavg"):
        build_outer("adam")


@pytest.mark.parametrize("name", ["fedavg", "diloco"])
@pytest.mark.parametrize(
    ("params", "delta"),
    [
        (torch.zeros(3), torch.zeros(4)),  # length mismatch
        (torch.zeros(2, 2), torch.zeros(2, 2)),  # not flat
        (torch.zeros(()), torch.zeros(())),  # scalar
    ],
)
def test_shape_errors(name, params, delta):
    with pytest.raises(ValueError, match="flat tensors of equal shape"):
        build_outer(name).step(params, delta)


@pytest.mark.parametrize("name", ["fedavg", "diloco"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_delta_is_rejected(name, bad):
    with pytest.raises(ValueError, match="non-finite delta"):
        build_outer(name).step(torch.zeros(2), torch.tensor([0.0, bad]))
