"""The simulator hands ``trend`` (and ``centered-clip:start=previous``) the coordinator's reference: the global model's last
step (with ``fedavg`` at lr 1, the previous round's aggregate), none in the first round or
after a skipped one, and none in gossip, which mixes models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aitbc.core.aggregation.pipeline import AggregatorPipeline
from aitbc.sim.config import SimConfig
from aitbc.sim.runner import run_simulation


def _spy(monkeypatch) -> list[tuple[torch.Tensor | None, torch.Tensor]]:
    calls: list[tuple[torch.Tensor | None, torch.Tensor]] = []
    real = AggregatorPipeline.__call__

    def spying(self, updates, weights=None, *, round_index=0, reference=None):
        out = real(self, updates, weights, round_index=round_index, reference=reference)
        calls.append((None if reference is None else reference.clone(), out.clone()))
        return out

    monkeypatch.setattr(AggregatorPipeline, "__call__", spying)
    return calls


def _run(tmp: Path, **options) -> object:
    cfg = SimConfig(workers=6, rounds=4, local_steps=5, seed=0, **options)
    return run_simulation(cfg, home=tmp / "home", out_dir=tmp / "run")


@pytest.mark.parametrize("aggregator", ["trend+centered-clip", "centered-clip:start=previous"])
def test_each_round_gets_the_last_model_step(tmp_path, monkeypatch, aggregator):
    calls = _spy(monkeypatch)
    _run(tmp_path, aggregator=aggregator, attack="ipm", byzantine=1)

    assert len(calls) == 4
    assert calls[0][0] is None  # round 1: no step yet
    for (_, previous), (reference, _) in zip(calls, calls[1:], strict=False):
        assert reference is not None
        torch.testing.assert_close(reference, previous)  # fedavg lr 1: the step is the aggregate


def test_the_step_is_the_outer_optimizers_not_the_aggregate(tmp_path, monkeypatch):
    calls = _spy(monkeypatch)
    _run(tmp_path, aggregator="trend+centered-clip", outer="fedavg", outer_options={"lr": 0.5})

    for (_, previous), (reference, _) in zip(calls, calls[1:], strict=False):
        torch.testing.assert_close(reference, 0.5 * previous)


def test_trend_drops_ipm_and_the_same_seed_gives_the_same_run(tmp_path):
    a = _run(tmp_path / "a", aggregator="trend+centered-clip", attack="ipm", byzantine=2)
    b = _run(tmp_path / "b", aggregator="trend+centered-clip", attack="ipm", byzantine=2)
    plain = _run(tmp_path / "c", aggregator="centered-clip", attack="ipm", byzantine=2)

    assert a.final_val_loss == b.final_val_loss
    assert a.final_val_loss != plain.final_val_loss  # rounds 2-4 left the attackers out


def test_gossip_passes_no_reference(tmp_path, monkeypatch):
    calls = _spy(monkeypatch)
    _run(tmp_path, aggregator="trend+centered-clip", mode="gossip")

    assert calls and all(reference is None for reference, _ in calls)
