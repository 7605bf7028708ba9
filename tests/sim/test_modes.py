"""Round modes, attacks and compression in the simulation, end to end in one process."""

from __future__ import annotations

import json

import pytest

from aitbc.errors import UsageError
from aitbc.sim.config import SimConfig
from aitbc.sim.runner import Simulation, run_simulation

BASE = dict(workers=8, rounds=12, local_steps=20, seed=0)


def _run(tmp_path, **kw):
    cfg = SimConfig(**{**BASE, **kw})
    return run_simulation(cfg, home=tmp_path / "home", out_dir=tmp_path / "run")


def _rows(result):
    return [json.loads(line) for line in open(result.metrics_path)]


def test_async_converges_on_digits(tmp_path):
    result = _run(tmp_path, mode="async", buffer=4, rounds=30)

    assert result.final_val_accuracy >= 0.85
    assert result.rounds == 30


def test_async_drops_updates_past_max_staleness(tmp_path):
    result = _run(tmp_path, mode="async", buffer=2, max_staleness=0, speeds="1,1,1,1,1,1,1,0.1", rounds=10)

    assert result.dropped_updates > 0
    assert result.final_val_loss < result.initial_val_loss


@pytest.mark.parametrize("topology", ["ring", "random:3"])
def test_gossip_converges_and_reports_spread(tmp_path, topology):
    result = _run(tmp_path, mode="gossip", topology=topology)

    assert result.final_val_accuracy >= 0.9
    assert result.spread is not None and result.spread >= 0
    assert all("spread" in row for row in _rows(result))


def test_gossip_refuses_codecs_that_destroy_whole_models(tmp_path):
    with pytest.raises(UsageError, match="gossip sends whole models"):
        _run(tmp_path, mode="gossip", compression="topk:ratio=0.01", rounds=1)


def test_deadline_drops_the_straggler_and_keeps_the_pace(tmp_path):
    slow = "1,1,1,1,1,1,1,0.1"
    waits = _run(tmp_path / "a", speeds=slow, rounds=3)
    deadline = _run(tmp_path / "b", speeds=slow, rounds=3, deadline=0.1)

    assert deadline.dropped_updates == 3  # the slow worker, every round
    assert deadline.virtual_seconds == pytest.approx(0.3)
    assert waits.virtual_seconds > 2 * deadline.virtual_seconds


def test_quorum_waits_past_the_deadline(tmp_path):
    result = _run(tmp_path, rounds=2, deadline=1e-6, quorum=3)

    assert result.dropped_updates == 2 * 5
    assert all(row["accepted"] == 3 for row in _rows(result))


def test_sign_flip_breaks_mean_and_not_trimmed_mean(tmp_path):
    attack = dict(workers=12, byzantine=3, attack="sign-flip", rounds=15)

    mean = _run(tmp_path / "mean", aggregator="mean", **attack)
    trimmed = _run(tmp_path / "trim", aggregator="trimmed-mean:beta=0.25", **attack)

    assert mean.final_val_accuracy < 0.5
    assert trimmed.final_val_accuracy >= 0.9
    assert len(mean.byzantine_workers) == 3


def test_compression_ratio_is_measured_on_real_bytes(tmp_path):
    dense = _run(tmp_path / "dense", rounds=2)
    int8 = _run(tmp_path / "int8", rounds=2, compression="int8")
    topk = _run(tmp_path / "topk", rounds=2, compression="topk:ratio=0.01", error_feedback=True)

    assert dense.compression_ratio == pytest.approx(1.0, rel=0.01)  # fp32 plus a small header
    assert 3.5 < int8.compression_ratio < 4.0
    assert topk.compression_ratio > 30
    assert topk.bytes_up < int8.bytes_up < dense.bytes_up


def test_target_reports_bytes_and_time_and_can_stop_the_run(tmp_path):
    result = _run(tmp_path, rounds=30, target_accuracy=0.8, stop_at_target=True)
    rows = _rows(result)

    assert result.rounds_to_target == result.rounds == len(rows) < 30
    assert rows[-1]["val_accuracy"] >= 0.8 > rows[-2]["val_accuracy"]
    assert result.bytes_to_target == rows[-1]["bytes_up"]
    assert result.virtual_seconds_to_target == pytest.approx(rows[-1]["virtual_time"])


def test_every_attack_runs_and_is_deterministic(tmp_path):
    for attack in ["gaussian", "label-flip", "alie", "ipm", "free-rider"]:
        a = _run(tmp_path / f"{attack}1", workers=6, byzantine=1, attack=attack, rounds=2, local_steps=5)
        b = _run(tmp_path / f"{attack}2", workers=6, byzantine=1, attack=attack, rounds=2, local_steps=5)
        assert a.final_val_loss == b.final_val_loss, attack


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(byzantine=2), "--byzantine K needs an --attack"),
        (dict(attack="ipm"), "needs --byzantine K > 0"),
        (dict(byzantine=8, attack="ipm"), "--byzantine must be between 0 and workers-1"),
        (dict(mode="swarm"), "unknown --mode 'swarm'"),
        (dict(quorum=9), "--quorum 9 exceeds"),
        (dict(deadline=0.0), "--deadline must be > 0"),
        (dict(buffer=20), "--buffer must be between 1 and 8"),
        (dict(target_accuracy=1.5), "--target-accuracy must be in"),
    ],
)
def test_inconsistent_options_are_refused(options, message):
    with pytest.raises(UsageError, match=message):
        SimConfig(**{**BASE, **options})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(aggregator="krum:f=x"), "aggregator"),
        (dict(aggregator="nope"), "unknown aggregator 'nope'"),
        (dict(compression="zip"), "unknown codec 'zip'"),
        (
            dict(
                byzantine=1,
                attack="label-flip",
                model="transformer",
                dataset="stdlib",
                model_options={"context": 16, "d_model": 16, "n_heads": 2, "n_layers": 1},
                max_bytes=50_000,
            ),
            "label-flip' needs a classification dataset",
        ),
        (dict(mode="gossip", topology="star"), "unknown --topology 'star'; allowed: ring, random:K"),
        (dict(mode="gossip", topology="random:8"), "unknown --topology 'random:8'"),
        (dict(staleness="linear"), "unknown staleness rule"),
    ],
)
def test_bad_component_specs_fail_before_training(tmp_path, options, message):
    with pytest.raises(UsageError, match=message):
        sim = Simulation(SimConfig(**{**BASE, "rounds": 1, **options}), home=tmp_path / "h", out_dir=tmp_path / "o")
        sim.run()


def test_sparseloco_trains_deterministically_and_sends_few_bytes(tmp_path):
    # SparseLoCo: chunk-wise top-k at 2 bits, decayed error feedback as the outer momentum
    spec = "sparseloco:chunk=1024,density=0.05,error_feedback_decay=0.95"
    runs = [_run(tmp_path / f"r{i}", rounds=8, local_steps=10, outer="fedavg", compression=spec) for i in (0, 1)]
    a, b = runs
    losses = [row["val_loss"] for row in _rows(a)]

    assert a.final_val_loss < 0.85 * a.initial_val_loss and a.final_val_accuracy > 0.6
    assert losses[-1] < losses[0]
    assert a.compression_ratio > 50  # real bytes, header included
    assert [row["val_loss"] for row in _rows(b)] == losses  # same seed, same numbers
    assert a.bytes_up == b.bytes_up


def test_sparseloco_decay_refuses_a_second_outer_momentum(tmp_path):
    with pytest.raises(UsageError, match="outer momentum"):
        Simulation(
            SimConfig(**BASE, outer="diloco", compression="sparseloco:error_feedback_decay=0.95"),
            home=tmp_path / "home",
            out_dir=tmp_path / "run",
        )


def test_attackers_send_the_plain_codec_even_when_the_spec_asks_for_feedback(tmp_path):
    sim = Simulation(
        SimConfig(**BASE, compression="sparseloco:error_feedback_decay=0.9", byzantine=1, attack="sign-flip"),
        home=tmp_path / "home",
        out_dir=tmp_path / "run",
    )
    assert all(c.decay == 0.9 for c in sim.codecs)
    assert sim.plain_codec.name == "sparseloco" and not hasattr(sim.plain_codec, "residual")
