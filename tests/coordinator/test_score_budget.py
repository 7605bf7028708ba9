"""Scoring's batches are sized by loss terms, not samples: a sample of T target positions
(a sequence's tokens) counts T, within a floor (the standard errors need samples) and the
``score_samples`` cap; images keep the cap. The live path (``_judge_decoded``) sizes every
batch it measures (validation, own shard, others') from the run's data; bad budgets are
refused with one line naming the flag or variable."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from aitbc.cli.settings_flags import flag_names
from aitbc.coordinator.config import Settings
from aitbc.coordinator.verification import scoring
from aitbc.coordinator.verification.scoring import MIN_SCORE_SAMPLES, score_batch
from aitbc.core.aggregation.streaming import TensorSource
from aitbc.errors import UsageError
from aitbc.settings import load_settings
from aitbc.training.checkpoint import flat_params

VOCAB = 11


def test_the_batch_holds_a_budget_of_loss_terms_within_the_floor_and_the_cap():
    assert score_batch(1, 8192, 512) == 512  # an image: one term, the cap
    assert score_batch(64, 8192, 512) == 128  # a 64-token sequence: 8192 / 64
    assert score_batch(32, 8192, 512) == 256
    assert score_batch(64, 16384, 512) == 256
    assert score_batch(1024, 8192, 512) == MIN_SCORE_SAMPLES == 64  # long sequences: the floor
    assert score_batch(64, 8192, 100) == 100  # the cap wins over the budget
    assert score_batch(64, 8192, 8) == 8  # ... and over the floor
    assert score_batch(0, 8192, 512) == 512  # no target positions counted as one


class _TinySeq(nn.Module):
    """(B, T) token ids -> (B, T, VOCAB) logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, 8)
        self.out = nn.Linear(8, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(x))


class _TinyMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def _seq(n: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (n, t), generator=g)
    return x, torch.roll(x, -1, dims=1)  # (n, t) each: the next token at every position


def _img(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def _measured_sizes(monkeypatch, model: nn.Module, shards, val, settings) -> list[int]:
    """The samples each of scoring's loss passes took, judging two updates of one round
    through the live path (no database: its reads stubbed with these shards)."""
    sizes: list[int] = []
    real = scoring._losses

    def spy(model_, params, x, y, *, rows=None):
        sizes.append(x.shape[0])
        return real(model_, params, x, y, rows=rows)

    monkeypatch.setattr(scoring, "_losses", spy)
    monkeypatch.setattr(scoring, "books_shards", lambda ctx, run_id, cids: shards)
    monkeypatch.setattr(scoring, "kept_shares", lambda *a, **k: [1.0, 1.0])
    theta = flat_params(model)
    U = 0.01 * torch.randn(2, theta.numel(), generator=torch.Generator().manual_seed(3))  # (n, d)
    ctx = SimpleNamespace(settings=settings)
    run = SimpleNamespace(id="run", seed=1, data_manifest={"shards": [{"cid": f"s{k}"} for k in range(len(shards))]})
    rt = SimpleNamespace(
        lock=threading.Lock(), aggregator=None, trend=lambda *a: None, val_x=val[0], val_y=val[1], eval_rows=None
    )
    accepted = [(SimpleNamespace(shard_index=k, samples=10), SimpleNamespace(shard_index=k)) for k in (0, 1)]
    scores = scoring._judge_decoded(ctx, run, rt, model, theta, TensorSource(U), accepted, 2)
    assert len(scores) == 2
    return sizes


def _settings(tmp_path, **given) -> Settings:
    return load_settings(Settings, {"home": tmp_path, **given})


def test_a_sequence_model_is_scored_on_its_terms_budget(monkeypatch, tmp_path):
    shards = [_seq(300, 64, 1), _seq(300, 64, 2)]
    val = _seq(600, 64, 9)
    sizes = _measured_sizes(monkeypatch, _TinySeq(), shards, val, _settings(tmp_path))
    # one pass for the base (validation, then each update's own and others' batches), then
    # per update one over its own three (the update alone) and one over validation and its own
    # shard's (at its share of the mean): every batch 8192 // 64 = 128 sequences
    assert sizes == [5 * 128, 3 * 128, 2 * 128, 3 * 128, 2 * 128]
    sizes = _measured_sizes(monkeypatch, _TinySeq(), shards, val, _settings(tmp_path, score_terms=16384))
    assert sizes == [5 * 256, 3 * 256, 2 * 256, 3 * 256, 2 * 256]


def test_images_keep_the_sample_cap(monkeypatch, tmp_path):
    shards = [_img(600, 1), _img(600, 2)]
    val = _img(600, 9)
    sizes = _measured_sizes(monkeypatch, _TinyMlp(), shards, val, _settings(tmp_path))
    assert sizes == [5 * 512, 3 * 512, 2 * 512, 3 * 512, 2 * 512]
    small = _settings(tmp_path, score_samples=40)
    assert _measured_sizes(monkeypatch, _TinyMlp(), shards, val, small) == [5 * 40, 3 * 40, 2 * 40, 3 * 40, 2 * 40]


def test_a_bad_terms_budget_is_refused_in_one_line(monkeypatch, tmp_path):
    assert flag_names(Settings)["score_terms"] == "--score-terms"
    with pytest.raises(
        UsageError, match=r"^--score-terms 0 is not allowed: input should be greater than or equal to 1$"
    ):
        load_settings(Settings, {"home": tmp_path, "score_terms": 0}, flag_names={"score_terms": "--score-terms"})
    monkeypatch.setenv("AITBC_SCORE_TERMS", "-5")
    with pytest.raises(UsageError, match=r"^AITBC_SCORE_TERMS='-5' is not allowed: .*greater than or equal to 1$"):
        load_settings(Settings, {"home": tmp_path})
    monkeypatch.setenv("AITBC_SCORE_TERMS", "4096")
    assert load_settings(Settings, {"home": tmp_path}).score_terms == 4096
