"""The simulator runs the coordinator's norm bound (aitbc.core.norms): one provider sending a
huge, correctly shaped update cannot wreck a plain mean, and the same seed gives the same run."""

from __future__ import annotations

from pathlib import Path

from aitbc.sim.config import SimConfig
from aitbc.sim.runner import run_simulation


def _run(tmp: Path, **options) -> object:
    cfg = SimConfig(workers=6, rounds=3, local_steps=10, aggregator="mean", seed=0, **options)
    return run_simulation(cfg, home=tmp / "home", out_dir=tmp / "run")


def test_a_3e38_update_is_rejected_every_round_and_mean_still_learns(tmp_path):
    clean = _run(tmp_path / "clean")
    hit = _run(tmp_path / "hit", attack="scale:value=3e38", byzantine=1)

    assert hit.rejected_updates == 3  # one per round
    assert hit.final_val_loss < hit.initial_val_loss
    assert abs(hit.final_val_loss - clean.final_val_loss) < 0.05 * clean.final_val_loss


def test_a_moderately_scaled_update_is_clipped_not_rejected(tmp_path):
    hit = _run(tmp_path / "hit", attack="scale:factor=20", byzantine=1)
    again = _run(tmp_path / "again", attack="scale:factor=20", byzantine=1)

    assert hit.rejected_updates == 0
    assert hit.final_val_loss < hit.initial_val_loss
    assert hit.final_val_loss == again.final_val_loss
