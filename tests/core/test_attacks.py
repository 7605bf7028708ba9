"""Each attack changes what it should, from what a colluding attacker can see."""

from __future__ import annotations

import math

import pytest
import torch

from aitbc.core.attacks import ATTACKS, AttackView, alie_z, build_attack
from aitbc.errors import UsageError


def _view(own=None, honest=None, previous=None, n=4, f=1, seed=0):
    honest = torch.tensor([[1.0, 2.0], [3.0, 2.0], [2.0, 5.0]]) if honest is None else honest
    return AttackView(
        own=own, honest=honest, previous=previous, n=n, f=f, generator=torch.Generator().manual_seed(seed)
    )


def test_registry_has_every_attack_of_the_issue():
    # the issue's six, and the scaled update of the trust work (issue 12)
    assert set(ATTACKS.names()) == {"sign-flip", "gaussian", "label-flip", "alie", "ipm", "free-rider", "scale"}


def test_sign_flip_reverses_and_scales_the_own_update():
    attack = build_attack("sign-flip", {"scale": "2"})

    out = attack.craft(_view(own=torch.tensor([1.0, -3.0])))

    assert out.tolist() == [-2.0, 6.0]
    assert attack.trains


def test_gaussian_is_seeded_noise_of_the_right_size():
    attack = build_attack("gaussian", {"std": "3"})

    a = attack.craft(_view(seed=1))
    b = attack.craft(_view(seed=1))

    assert a.shape == (2,) and torch.equal(a, b)
    big = attack.craft(_view(honest=torch.zeros(1, 100_000)))
    assert big.std().item() == pytest.approx(3.0, rel=0.02)


def test_ipm_points_against_the_honest_mean():
    out = build_attack("ipm", {"eps": "0.5"}).craft(_view())

    assert out.tolist() == [-1.0, -1.5]  # -0.5 * mean([[1,2],[3,2],[2,5]]) = -0.5 * [2, 3]


def test_ipm_evading_the_trend_keeps_a_small_positive_cosine_with_the_last_update():
    previous = torch.tensor([2.0, 3.0, 0.5])  # near the honest mean: plain IPM points against it
    honest = torch.tensor([[1.0, 2.0, 1.0], [3.0, 2.0, -1.0], [2.0, 5.0, 0.0]])
    plain = build_attack("ipm").craft(_view(honest=honest, previous=previous))

    out = build_attack("ipm", {"evade": "0.05"}).craft(_view(honest=honest, previous=previous))

    cos = float(out @ previous / (out.norm() * previous.norm()))
    assert float(plain @ previous) < 0
    assert cos == pytest.approx(0.05 / math.sqrt(1 + 0.05**2), rel=1e-5)
    perp = plain - (plain @ previous) / (previous @ previous) * previous  # what IPM keeps
    assert torch.allclose(out - (out @ previous) / (previous @ previous) * previous, perp, atol=1e-6)
    # no last update (the first round) or a zero one: plain IPM
    assert torch.equal(build_attack("ipm", {"evade": "0.05"}).craft(_view(honest=honest)), plain)
    assert torch.equal(
        build_attack("ipm", {"evade": "0.05"}).craft(_view(honest=honest, previous=torch.zeros(3))), plain
    )


def test_alie_shifts_the_mean_by_z_standard_deviations():
    honest = torch.tensor([[1.0, 2.0], [3.0, 2.0], [2.0, 5.0]])
    mu, sigma = honest.mean(0), honest.std(0, unbiased=False)

    out = build_attack("alie", {"z": "1.5"}).craft(_view(honest=honest))

    assert torch.allclose(out, mu - 1.5 * sigma)


def test_alie_default_z_follows_baruch_et_al():
    # n=50, f=12 (the paper's setting): s = floor(26) - 12 = 14, z = Phi^-1(36/50) ~ 0.58
    assert alie_z(50, 12) == pytest.approx(0.5828, abs=1e-3)


def test_free_rider_sends_zeros_or_the_public_previous_update():
    prev = torch.tensor([0.5, -0.5])

    assert build_attack("free-rider").craft(_view(previous=prev)).tolist() == [0.0, 0.0]
    assert build_attack("free-rider", {"mode": "stale"}).craft(_view(previous=prev)).tolist() == [0.5, -0.5]
    assert not build_attack("free-rider").trains


def test_label_flip_sends_its_poisoned_training_result():
    attack = build_attack("label-flip")

    assert attack.flips_labels and attack.trains
    assert attack.craft(_view(own=torch.tensor([7.0, 8.0]))).tolist() == [7.0, 8.0]


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("sign-flip", {"scale": "-1"}, "scale must be > 0"),
        ("gaussian", {"std": "nan"}, "std must be >= 0"),
        ("free-rider", {"mode": "lazy"}, "must be one of: zeros, stale"),
        ("ipm", {"eps": "0"}, "eps must be > 0"),
        ("ipm", {"evade": "-0.1"}, "evade must be >= 0 and finite, got -0.1"),
        ("nope", {}, "unknown attack 'nope'"),
    ],
)
def test_bad_attack_options_are_usage_errors(name, options, message):
    with pytest.raises(UsageError, match=message):
        build_attack(name, options)


def test_empty_honest_view_still_gives_a_finite_update():
    empty = torch.zeros(0, 3)
    for name in ("alie", "ipm"):
        out = build_attack(name).craft(_view(honest=empty))
        assert out.shape == (3,) and torch.isfinite(out).all() and not math.isnan(out.sum())
