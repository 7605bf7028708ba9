"""A distribute request that names no aggregation rule gets the codec's: sparse-robust for a
sparse codec (topk, topk-int8, sparseloco), the dense default otherwise, as ``aitbc
simulate`` picks it (``run_defaults.default_aggregator``). A rule the owner names is kept."""

from __future__ import annotations

import itertools

import pytest

from aitbc import run_defaults

RUNS = itertools.count()  # each case hires workers of its own on the module's coordinator
SPARSELOCO = "sparseloco:density=0.02,bits=2,error_feedback_decay=0.95"


@pytest.mark.parametrize(
    "body, rule",
    [
        ({"compression": SPARSELOCO}, run_defaults.SPARSE_AGGREGATOR),
        ({"compression": "topk:ratio=0.05"}, run_defaults.SPARSE_AGGREGATOR),
        ({"compression": "topk-int8:ratio=0.05", "mode": "async"}, run_defaults.SPARSE_AGGREGATOR),
        ({"compression": "int8"}, run_defaults.AGGREGATOR),
        ({}, run_defaults.AGGREGATOR),
        ({"compression": SPARSELOCO, "aggregator": "mean"}, "mean"),
        ({"compression": SPARSELOCO, "aggregator": None}, run_defaults.SPARSE_AGGREGATOR),
    ],
)
def test_distribute_picks_the_rule_by_codec(server, api, body, rule):
    _, owner, run_id = api.hired_run(server, 2, prefix=f"agg{next(RUNS)}-")
    detail = owner.post(f"/runs/{run_id}/distribute", {"rounds": 2, "local_steps": 1, **body})
    assert detail["config"]["aggregator"] == rule
    assert owner.get(f"/runs/{run_id}")["config"]["aggregator"] == rule  # as stored, read back
