"""bench/honest_runs.py cannot rot: its transformer task scores each round on the batch the
coordinator's budget gives a 64-token sequence (128 of them at 8192 terms, 512 at 32768),
and a round of honest work is neither flagged nor unpaid. The runs themselves are minutes:
``python bench/honest_runs.py --task transformer --score-terms 32768,8192``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.long  # the stdlib corpus read and a transformer round: about 10-20 s on 2 cores
def test_the_transformer_task_is_scored_on_the_terms_budget():
    sys.path.insert(0, str(BENCH))  # its siblings (_common, _sims) import by name
    threads = torch.get_num_threads()
    try:
        honest_runs = importlib.import_module("honest_runs")
        torch.set_num_threads(1)
        res = honest_runs.play(workers=2, rounds=1, alpha=None, seed=0, cheat=None, task="transformer")
    finally:
        torch.set_num_threads(threads)
        sys.path.remove(str(BENCH))
    assert res["score_samples"] == 128
    assert res["honest_flags_max"] == 0 and res["honest_pay_share_min"] == 1.0
