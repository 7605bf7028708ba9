"""``--attack absent``: the K workers an attack would take (the same ones, by seed) take no
part at all, so an attacked run has a reference with the attackers' data gone too."""

from __future__ import annotations

import json

import pytest

from aitbc.errors import UsageError
from aitbc.sim.config import SimConfig
from aitbc.sim.runner import Simulation

FAST = dict(workers=6, rounds=2, local_steps=3, batch_size=16, compression="int8", alpha=0.3)


def _sim(tmp_path, name: str, **kw) -> Simulation:
    return Simulation(SimConfig(**{**FAST, **kw}), home=tmp_path / name / "home", out_dir=tmp_path / name / "run")


def _rows(result) -> list[dict]:
    with open(result.metrics_path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize(
    "mode, extra",
    [("sync", {}), ("async", {"buffer": 2}), ("gossip", {"topology": "ring"})],
)
def test_the_absent_workers_never_train_or_send(tmp_path, mode, extra):
    sim = _sim(tmp_path, mode, attack="absent", byzantine=2, mode=mode, **extra)
    attacked = _sim(tmp_path, f"{mode}-attacked", attack="sign-flip", byzantine=2, mode=mode, **extra)
    assert sim.byzantine == attacked.byzantine and len(sim.byzantine) == 2  # the same workers leave
    assert sim.present == [i for i in range(6) if i not in sim.byzantine]
    trained: list[int] = []
    for i, trainer in enumerate(sim.trainers):
        train_round = trainer.train_round

        def spy(*args, i=i, train_round=train_round, **kw):
            trained.append(i)
            return train_round(*args, **kw)

        trainer.train_round = spy
    result = sim.run()
    assert trained and set(trained) == set(sim.present)
    rows = _rows(result)
    assert len(rows) == 2
    if mode == "sync":
        assert [r["accepted"] for r in rows] == [4, 4]  # n - f updates a round
        assert rows[1]["bytes_up"] == 2 * rows[0]["bytes_up"]  # int8: the same size each
    if mode == "gossip":
        assert [r["accepted"] for r in rows] == [8, 8]  # 4 workers on a ring of 4: two neighbours each
        assert len(rows[0]["published"]) == 4


def test_same_seed_same_numbers(tmp_path):
    a = _sim(tmp_path, "a", attack="absent", byzantine=2, seed=3).run()
    b = _sim(tmp_path, "b", attack="absent", byzantine=2, seed=3).run()
    assert _rows(a) == _rows(b)
    assert (a.final_val_loss, a.final_model_cid) == (b.final_val_loss, b.final_model_cid)
    clean = _sim(tmp_path, "clean", seed=3).run()
    assert clean.final_model_cid != a.final_model_cid  # two workers' shards fewer: another model


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"attack": "absent:k=1", "byzantine": 2}, "absent takes no options"),
        ({"attack": "absent", "byzantine": 0}, "needs --byzantine"),
        ({"attack": "absent", "byzantine": 2, "quorum": 5}, "4 workers taking part"),
        ({"attack": "absent", "byzantine": 2, "mode": "async", "buffer": 5}, "between 1 and 4"),
        ({"attack": "absent", "byzantine": 2, "mode": "gossip", "topology": "random:4"}, "taking part (4)"),
    ],
)
def test_bad_absent_options_are_refused(kw, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
        SimConfig(**{**FAST, **kw})
