"""What an offer states it trains: 3/4 of the device's memory over the training state's
bytes a parameter (20 at fp32, 22 at bf16), the least over the precisions; the operator's
number instead where given; no limit where the memory is unknown."""

from __future__ import annotations

import pytest

from aitbc.market.capacity import (
    BYTES_PER_PARAM,
    count_too_small,
    format_params,
    offer_max_params,
    too_small,
    trainable_params,
)
from aitbc.run_defaults import PRECISIONS

GIB = 1 << 30


def test_trainable_params_from_memory_and_precision():
    # 3/4 of 80 GiB = 64,424,509,440 bytes of training state
    assert trainable_params(80 * GIB, "fp32") == 64_424_509_440 // 20 == 3_221_225_472
    assert trainable_params(80 * GIB, "bf16") == 64_424_509_440 // 22 == 2_928_386_792
    assert trainable_params(24 * GIB, "fp32") == 966_367_641
    assert trainable_params(0, "fp32") == 0
    assert set(BYTES_PER_PARAM) == set(PRECISIONS)  # every precision a run may ask for is counted
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, got 'fp16'"):
        trainable_params(GIB, "fp16")
    with pytest.raises(ValueError, match="memory_bytes must be >= 0"):
        trainable_params(-1, "fp32")


def test_an_offer_states_the_least_over_precisions_or_its_operators_number():
    assert offer_max_params(80 * GIB) == trainable_params(80 * GIB, "bf16")  # bf16's state is the larger
    assert offer_max_params(80 * GIB, override=1_000) == 1_000  # --max-params wins, even over the device
    assert offer_max_params(None, override=5) == 5
    assert offer_max_params(None) is None  # memory unknown: no stated limit
    # two data-parallel CPU ranks each hold the model in one machine's RAM: half each
    assert offer_max_params(80 * GIB, sharing=2) == trainable_params(40 * GIB, "bf16")
    with pytest.raises(ValueError, match="sharing must be >= 1"):
        offer_max_params(GIB, sharing=0)


def test_too_small_only_when_both_are_known():
    assert too_small(600, 610) and not too_small(610, 610) and not too_small(611, 610)
    assert not too_small(None, 10**12)  # no stated limit: takes any run
    assert not too_small(1, None)  # a model not counted (code): fits any offer
    assert count_too_small([600, 1_000, None, 10], 610) == 2


def test_format_params():
    assert [format_params(n) for n in (None, 950, 12_000, 878_087_074, 2_928_386_792, 10**13)] == [
        "any", "950", "12k", "878M", "2.93B", "10T",
    ]  # fmt: skip
