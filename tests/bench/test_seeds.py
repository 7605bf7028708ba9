"""The benchmarks' seeds: ``--seeds 0-4`` parsed as the programs take it, each figure's
median and worst seed, and bench/robustness.py measuring each cell against the
honest-absent run of its own seed. The programs' own runs take hours
(``python bench/robustness.py``); here their simulations are replaced by a table of known
accuracies, and one real run of a few cells is under ``long``."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from aitbc import run_defaults

BENCH = Path(__file__).resolve().parents[2] / "bench"
DEFAULT = run_defaults.AGGREGATOR  # the rule the verdicts name


@pytest.fixture(scope="module")
def bench():
    """bench/'s modules by name, as its programs import their siblings."""
    sys.path.insert(0, str(BENCH))
    try:
        yield SimpleNamespace(**{m: importlib.import_module(m) for m in ("_common", "robustness", "sparse_robust")})
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize(
    "text, seeds",
    [("0-4", [0, 1, 2, 3, 4]), ("3", [3]), ("0,2,5", [0, 2, 5]), ("1-3,7,2", [1, 2, 3, 7]), (" 0 - 1", None)],
)
def test_seeds_parse_as_ranges_and_lists(bench, text, seeds):
    if seeds is None:
        with pytest.raises(ValueError, match="is not a seed or a range"):
            bench._common.parse_seeds(text)
    else:
        assert bench._common.parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "a", "4-2", "1-", "-1", "0,,1"])
def test_bad_seeds_are_named(bench, text):
    with pytest.raises(ValueError, match="seeds: .* is not a seed or a range of them"):
        bench._common.parse_seeds(text)


def test_the_spread_is_the_median_and_the_worst_seed(bench):
    spread = bench._common.spread
    s = spread({0: 0.99, 1: 0.95, 2: 1.0, 3: 0.95, 4: 0.97})
    assert (s.median, s.worst, s.worst_seed, s.seeds) == (0.97, 0.95, 1, 5)  # a tie: the first seed
    loss = spread({0: 0.11, 1: 0.19, 2: 0.07}, higher_is_better=False)
    assert (loss.median, loss.worst, loss.worst_seed) == (0.11, 0.19, 1)
    assert spread({}) is None


def recorded() -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in (BENCH / "results").glob("robustness*.json")}


# (seed, shard alpha, rule, attack) -> final accuracy; the absent run is the reference
ACCURACY = {
    (0, 0.3, DEFAULT, None): 0.90,
    (0, 0.3, DEFAULT, "absent"): 0.80,
    (0, 0.3, DEFAULT, "sign-flip"): 0.79,  # 98.75% of absent, 87.8% of clean
    (1, 0.3, DEFAULT, None): 0.92,
    (1, 0.3, DEFAULT, "absent"): 0.90,
    (1, 0.3, DEFAULT, "sign-flip"): 0.864,  # 96%
    (2, 0.3, DEFAULT, None): 0.88,
    (2, 0.3, DEFAULT, "absent"): 0.85,
    (2, 0.3, DEFAULT, "sign-flip"): 0.85,  # 100%
}


def test_robustness_measures_each_seed_against_its_absent_run(bench, monkeypatch, tmp_path, capsys):
    calls = []

    def simulate(*, seed, alpha, aggregator, attack, byzantine, **shared):
        calls.append((seed, alpha, aggregator, attack, byzantine))
        assert shared["workers"] == 12 and shared["rounds"] == 20
        return SimpleNamespace(final_val_accuracy=ACCURACY[(seed, alpha, aggregator, attack)])

    monkeypatch.setattr(bench.robustness, "simulate", simulate)
    before = recorded()
    out = tmp_path / "rob.json"
    argv = ["robustness.py", "--seeds", "0-2", "--shards", "0.3", "--attacks", "sign-flip", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", [*argv, "--aggregators", DEFAULT])
    bench.robustness.main()

    # every seed: the clean run, the absent run (3 workers out) and the attack (3 attacking)
    assert calls == [
        (seed, 0.3, DEFAULT, attack, byz)
        for seed in (0, 1, 2)
        for attack, byz in ((None, 0), ("absent", 3), ("sign-flip", 3))
    ]
    result = json.loads(out.read_text())
    verdict = result["verdicts"]["dirichlet 0.3"]["sign-flip"]
    assert verdict["default"] == pytest.approx({"median": 0.9875, "worst": 0.96, "worst_seed": 1, "seeds": 3})
    assert verdict["default_meets"] is True  # >= 97% at the median, >= 95% on the worst seed
    assert result["by_seed"]["1"]["dirichlet 0.3"][DEFAULT]["absent"] == 0.90
    printed = capsys.readouterr().out
    assert "98.8% / 96.0% s1" in printed and "target 97% / 95%: met" in printed
    assert recorded() == before  # --out: the recorded results are left as they are


def test_robustness_misses_on_a_worst_seed_under_95(bench, monkeypatch, tmp_path, capsys):
    acc = dict(ACCURACY) | {(1, 0.3, DEFAULT, "sign-flip"): 0.85}  # 94.4% of 0.90
    monkeypatch.setattr(
        bench.robustness,
        "simulate",
        lambda *, seed, alpha, aggregator, attack, **_: SimpleNamespace(
            final_val_accuracy=acc[(seed, alpha, aggregator, attack)]
        ),
    )
    argv = ["robustness.py", "--seeds", "0-2", "--shards", "0.3", "--attacks", "sign-flip"]
    monkeypatch.setattr(sys, "argv", [*argv, "--aggregators", DEFAULT, "--out", str(tmp_path / "r")])
    bench.robustness.main()
    assert "target 97% / 95%: MISSED" in capsys.readouterr().out


def test_parts_run_apart_combine_into_one_matrix(bench, monkeypatch, tmp_path, capsys):
    """Seeds 0-1 in one process and seed 2 in another, combined: the verdicts of one run of
    all three, written with each part named."""
    monkeypatch.setattr(
        bench.robustness,
        "simulate",
        lambda *, seed, alpha, aggregator, attack, **_: SimpleNamespace(
            final_val_accuracy=ACCURACY[(seed, alpha, aggregator, attack)]
        ),
    )
    common = ["--shards", "0.3", "--attacks", "sign-flip", "--aggregators", DEFAULT]
    for seeds, name in (("0-1", "a.json"), ("2", "b.json")):
        monkeypatch.setattr(sys, "argv", ["robustness.py", "--seeds", seeds, *common, "--out", str(tmp_path / name)])
        bench.robustness.main()
    capsys.readouterr()
    before = recorded()
    out = tmp_path / "all.json"
    combine = f"{tmp_path / 'a.json'},{tmp_path / 'b.json'}"
    monkeypatch.setattr(sys, "argv", ["robustness.py", "--combine", combine, "--out", str(out)])
    bench.robustness.main()
    result = json.loads(out.read_text())
    verdict = result["verdicts"]["dirichlet 0.3"]["sign-flip"]
    assert verdict["default"] == pytest.approx({"median": 0.9875, "worst": 0.96, "worst_seed": 1, "seeds": 3})
    assert sorted(result["by_seed"]) == ["0", "1", "2"]
    assert [p["file"] for p in result["parts"]] == ["a.json", "b.json"]
    assert result["parts"][1]["args"]["seeds"] == "2"
    assert "seeds 0,1,2" in capsys.readouterr().out
    assert recorded() == before


def test_combine_refuses_parts_it_cannot_merge(bench, monkeypatch, tmp_path, capsys):
    part = tmp_path / "part.json"
    part.write_text(json.dumps({"args": {"rounds": 5, "compression": "int8", "workers": 12, "byzantine": 3},
                                "machine": {}, "by_seed": {}}))  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["robustness.py", "--combine", str(part), "--out", str(tmp_path / "o.json")])
    with pytest.raises(SystemExit, match=r"ran with other rounds than this run's \(rounds=20\)"):
        bench.robustness.main()
    for bad in ({"accuracy": {}}, [1], {"args": {}, "machine": {}, "by_seed": {"0": {"iid": {"mean": 0.9}}}}):
        (tmp_path / "old.json").write_text(json.dumps(bad))
        monkeypatch.setattr(sys, "argv", ["robustness.py", "--combine", str(tmp_path / "old.json")])
        with pytest.raises(SystemExit, match="is not a part written by this program with --out"):
            bench.robustness.main()
    for argv, said in (
        (["--combine", str(tmp_path / "none.json")], "no such file"),
        (["--combine", " , "], "name the parts' JSON files"),
        (["--combine", str(part), "--merge"], "--combine runs nothing"),
    ):
        monkeypatch.setattr(sys, "argv", ["robustness.py", *argv])
        with pytest.raises(SystemExit) as e:
            bench.robustness.main()
        assert e.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_robustness_refuses_bad_seeds(bench, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["robustness.py", "--seeds", "4-0"])
    with pytest.raises(SystemExit) as e:
        bench.robustness.main()
    assert e.value.code == 2 and "'4-0' is not a seed or a range" in capsys.readouterr().err


def test_sparse_robust_summary_names_the_worst_seed(bench):
    rows = [
        dict(rule="sparse-robust", attack="ipm", seed=s, reduction=r, reached=r is not None, rounds=n)
        for s, r, n in [(0, 1843.0, 39), (1, None, 60), (2, 3124.0, 23)]
    ]
    (s,) = bench.sparse_robust.summary(rows)
    assert (s["median"], s["worst"], s["worst_seed"], s["reached"], s["seeds"]) == (1843.0, 0.0, 1, 2, 3)
    assert (s["rounds_median"], s["rounds_worst"]) == (39, 60)


@pytest.mark.long
def test_the_robustness_program_runs_a_few_real_cells(tmp_path):
    """The program as typed, on real simulations (small: 4 workers, 1 round, two seeds)."""
    import subprocess

    out = tmp_path / "rob.json"
    cmd = [sys.executable, "robustness.py", "--seeds", "0-1", "--shards", "0.3", "--rounds", "1", "--workers", "4"]
    cmd += ["--byzantine", "1", "--aggregators", DEFAULT, "--attacks", "sign-flip", "--out", str(out)]
    done = subprocess.run(cmd, cwd=BENCH, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    cells = json.loads(out.read_text())["by_seed"]
    assert sorted(cells) == ["0", "1"]
    for seed in cells.values():
        row = seed["dirichlet 0.3"][DEFAULT]
        assert set(row) == {"clean", "absent", "sign-flip"} and all(isinstance(v, float) for v in row.values())
    assert "of the honest-absent accuracy (median / worst seed" in done.stdout
