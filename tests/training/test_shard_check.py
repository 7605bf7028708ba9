"""An owner's shard is someone else's input: a worker (and the coordinator, for its
validation split and its replays) checks it is data of the run's spec before training on
it. A token id past the vocabulary would be an IndexError on a CPU and a device-side assert
that kills a GPU worker's process; int32 token windows can carry any id, as uint8 bytes
never could."""

from __future__ import annotations

import pytest
import torch

from aitbc.errors import IntegrityError
from aitbc.training.checkpoint import check_shard, load_shard, load_shard_file, shard_bytes
from aitbc.training.data_spec import DataSpec

TOKENS = DataSpec("language", (8,), 300)
DIGITS = DataSpec("classification", (1, 8, 8), 10)


def windows(lo: int = 0, hi: int = 299, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Token windows whose ids span ``lo..hi`` (both present)."""
    x = torch.randint(0, 300, (n, 8), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    x = x.clamp(lo, hi)
    x[0, 0], x[-1, -1] = lo, hi
    return x, x.roll(-1, dims=1)


def test_data_of_the_spec_passes():
    check_shard(*windows(), TOKENS)
    check_shard(torch.randint(0, 256, (3, 8), dtype=torch.uint8), torch.zeros(3, 8, dtype=torch.uint8), TOKENS)
    check_shard(torch.rand(5, 1, 8, 8), torch.arange(5), DIGITS)
    x, y = windows()
    check_shard(x[:0], y[:0], TOKENS)  # an empty shard has nothing out of range


@pytest.mark.parametrize(
    ("x", "y", "spec", "words"),
    [
        (*windows(hi=300), TOKENS, "token ids must be in [0, 300), found 0..300"),
        (*windows(lo=-1, hi=5), TOKENS, "token ids must be in [0, 300), found -1.."),
        (torch.zeros(2, 8, dtype=torch.int32), torch.full((2, 8), 300), TOKENS, "found 300..300"),
        (torch.zeros(2, 8), torch.zeros(2, 8), TOKENS, "token ids must be integers, got torch.float32"),
        (torch.zeros(2, 9, dtype=torch.int32), torch.zeros(2, 9, dtype=torch.int32), TOKENS, "windows of shape (9,)"),
        (torch.rand(3, 1, 8, 8), torch.tensor([0, 10, 1]), DIGITS, "labels must be in [0, 10), found 0..10"),
        (torch.rand(3, 64), torch.tensor([0, 1, 2]), DIGITS, "inputs of shape (64,)"),
        (torch.rand(3, 1, 8, 8), torch.tensor([0.0, 1.0, 2.0]), DIGITS, "labels must be integers"),
    ],
)
def test_data_outside_the_spec_is_refused_in_one_line(x, y, spec, words):
    with pytest.raises(IntegrityError) as e:
        check_shard(x, y, spec)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_loading_with_a_spec_checks_the_blob(tmp_path):
    x, y = windows(hi=300)
    blob = shard_bytes(x, y, dataset="t", index=0, count=1)
    assert load_shard(blob)[0].shape == (4, 8)  # without a spec: as before
    with pytest.raises(IntegrityError, match="token ids"):
        load_shard(blob, TOKENS)
    (tmp_path / "s").write_bytes(blob)
    with pytest.raises(IntegrityError, match="token ids"):
        load_shard_file(tmp_path / "s", TOKENS)
