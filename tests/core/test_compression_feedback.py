"""``ErrorFeedback``: what a codec drops is sent later; the running sums agree."""

from __future__ import annotations

import pytest
import torch

from aitbc.core.compression import CODEC_NAMES, ErrorFeedback, build_codec, decode
from aitbc.errors import UsageError

D = 240  # (12, 20) as a matrix for powersgd


def worker(name: str, **options) -> ErrorFeedback:
    layout = [(12, 20)] if name == "powersgd" else None
    return build_codec(name, options, layout=layout, error_feedback=True)


def updates(steps: int, *, seed: int = 0, integers: bool = False) -> list[torch.Tensor]:
    """A drifting direction plus noise, like successive pseudo-gradients."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(D, generator=g)
    xs = [base + 0.5 * torch.randn(D, generator=g) for _ in range(steps)]
    return [(10 * x).round() for x in xs] if integers else xs


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_decoded_sum_is_input_sum_minus_final_residual(name):
    ef = worker(name)
    total_in, total_out = torch.zeros(D), torch.zeros(D)

    for x in updates(30):
        total_in += x
        total_out += decode(ef.encode(x))

    assert torch.allclose(total_out + ef.residual, total_in, atol=1e-4, rtol=1e-5)


def test_topk_bookkeeping_is_exact():
    # integer-valued updates: every sum and difference is exact in float32
    ef = worker("topk", ratio=0.05)
    total_in, total_out = torch.zeros(D), torch.zeros(D)

    for x in updates(40, integers=True):
        total_in += x
        total_out += decode(ef.encode(x))

    assert torch.equal(total_out + ef.residual, total_in)


@pytest.mark.parametrize(
    ("name", "options"), [("topk", {"ratio": 0.1}), ("sign", {}), ("int4", {}), ("powersgd", {"rank": 1})]
)
def test_residual_stays_bounded_and_the_sums_converge(name, options):
    ef = worker(name, **options)
    xs = updates(200, seed=1)
    total_in, total_out, worst = torch.zeros(D), torch.zeros(D), 0.0

    for x in xs:
        total_in += x
        total_out += decode(ef.encode(x))
        worst = max(worst, ef.residual.norm().item())

    biggest = max(x.norm().item() for x in xs)
    assert worst <= 20 * biggest  # bounded, not growing with the number of rounds
    assert (total_out - total_in).norm() <= 0.1 * total_in.norm()  # the running sum tracks


def test_without_feedback_topk_loses_the_small_coordinates_for_good():
    plain, ef = build_codec("topk", {"ratio": 0.05}), worker("topk", ratio=0.05)
    xs = updates(100, seed=2)
    total_in = sum(xs)

    lost_plain = (sum(decode(plain.encode(x)) for x in xs) - total_in).norm()
    lost_ef = (sum(decode(ef.encode(x)) for x in xs) - total_in).norm()

    assert lost_ef < 0.25 * lost_plain


def test_blobs_are_the_wrapped_codecs_own():
    ef, x = worker("int8"), torch.randn(D)

    blob = ef.encode(x)

    assert torch.equal(decode(blob), build_codec("int8").decode(blob))
    assert torch.equal(ef.decode(blob), decode(blob))
    assert ef.name == "int8" and ef.expected_bytes(D) == build_codec("int8").expected_bytes(D)


def test_first_blob_equals_the_plain_codecs():
    x = torch.randn(D)

    assert worker("topk", ratio=0.1).encode(x) == build_codec("topk", {"ratio": 0.1}).encode(x)


def test_keeps_shape_and_dtype_and_the_residual_is_what_the_receiver_missed():
    ef, x = worker("topk", ratio=0.25), torch.randn(4, 5).to(torch.float16)

    y = decode(ef.encode(x))

    assert y.shape == (4, 5) and y.dtype == torch.float16
    assert torch.equal(ef.residual, x.float().reshape(-1) - y.float().reshape(-1))


def test_one_worker_one_model_size():
    ef = worker("sign")
    ef.encode(torch.randn(D))

    with pytest.raises(UsageError, match="residual of 240 values, this update has 10"):
        ef.encode(torch.randn(10))
    ef.reset()
    assert ef.residual is None
    decode(ef.encode(torch.randn(10)))


def test_two_workers_with_the_same_updates_send_the_same_bytes():
    a, b = worker("powersgd", rank=2), worker("powersgd", rank=2)

    assert [a.encode(x) for x in updates(5)] == [b.encode(x) for x in updates(5)]
