"""bench/communication.py ``--configs``: only the named configurations run, beside each
seed's dense baseline (their target), and a name that matches nothing is refused before
anything runs. The simulations are replaced by a stub: the real matrix takes hours."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def communication():
    sys.path.insert(0, str(BENCH))  # its siblings (_common, _sims) import by name
    try:
        yield importlib.import_module("communication")
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture
def runs(communication, monkeypatch):
    """Every simulation the program starts, as (model, H, compression, seed); each reaches
    the target at a tenth of the dense bytes."""
    calls: list[tuple[str, int, str, int]] = []

    def run(options):
        calls.append((options["model"], options["local_steps"], options["compression"], options["seed"]))
        dense = options["compression"] == "none" and options["local_steps"] == 1
        result = SimpleNamespace(
            final_val_loss=1.0,
            bytes_up=1000.0 * options["workers"],
            bytes_to_target=None if dense else 100.0 * options["workers"],
            rounds=options["rounds"],
            rounds_to_target=None if dense else 1,
            compression_ratio=1.0,
            skipped_rounds=0,
        )
        return result, [], math.nan

    monkeypatch.setattr(communication, "run", run)
    wire = dict(d=8, kept=1, blob=4, header=1, scales=1, codes=1, indices=1)
    monkeypatch.setattr(communication, "wire_bytes", lambda task: wire)
    return calls


def main(communication, monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["communication.py", *args])
    communication.main()


def test_only_the_named_configurations_run_beside_the_baseline(communication, runs, monkeypatch, tmp_path, capsys):
    out = tmp_path / "c.json"
    names = "sparseloco H=30, 1%;SPARSELOCO H=50, 1%"  # case does not matter
    main(communication, monkeypatch, "--seeds", "0-1", "--configs", names, "--out", str(out))

    sl = "sparseloco:density=0.01,bits=2,error_feedback_decay=0.95"
    assert runs == [
        call
        for seed in (0, 1)
        for call in [
            ("mlp", 1, "none", seed),  # the dense baseline: the target
            ("mlp", 30, sl, seed),
            ("transformer", 1, "none", seed),
            ("transformer", 50, sl, seed),
            ("transformer", 50, sl, seed),  # the same at outer lr 2: its label holds the name too
        ]
    ]
    result = json.loads(out.read_text())
    configs = {(r["task"], r["config"]) for r in result["summary"]}
    assert configs == {
        ("digits", "dense baseline (H=1, fp32, 600 steps)"),
        ("digits", "sparseloco H=30, 1%, 2-bit"),
        ("transformer", "dense baseline (H=1, fp32, 300 steps)"),
        ("transformer", "sparseloco H=50, 1%, 2-bit"),
        ("transformer", "sparseloco H=50, 1%, 2-bit, outer lr 2"),
    }
    assert result["robust_rules"] == []  # the rules' table is not part of a chosen run
    assert "robust rules" not in capsys.readouterr().out


def test_a_task_with_no_named_configuration_is_not_run(communication, runs, monkeypatch, tmp_path, capsys):
    main(communication, monkeypatch, "--seeds", "0", "--configs", "sparseloco H=30, 1%", "--out", str(tmp_path / "c"))
    assert [c[0] for c in runs] == ["mlp", "mlp"]
    assert "transformer: no configuration matches --configs" in capsys.readouterr().out


@pytest.mark.parametrize("names", ["sparseloco H=7", "sparseloco H=30, 1%;Nope", " ; "])
def test_a_name_that_matches_nothing_is_refused(communication, runs, monkeypatch, capsys, names):
    with pytest.raises(SystemExit) as e:
        main(communication, monkeypatch, "--configs", names)
    err = capsys.readouterr().err
    assert e.value.code == 2 and runs == []
    assert "error: configs: " in err.strip().splitlines()[-1]
    if names.strip(" ;"):
        assert "matches no configuration of digits,transformer" in err and "sparseloco H=30, 1%, 2-bit" in err
        assert f"{names.split(';')[-1]!r} matches" in err  # the name as typed


def test_an_unknown_task_is_refused(communication, runs, monkeypatch, capsys):
    with pytest.raises(SystemExit) as e:
        main(communication, monkeypatch, "--tasks", "digits,mnist")
    assert e.value.code == 2 and runs == []
    assert "tasks: mnist not one of digits, transformer, llama" in capsys.readouterr().err


def test_an_outer_lr_reaches_the_simulation_and_the_label(communication):
    c = communication.sparseloco(50, density=0.01, outer_lr=2)
    assert c["outer_options"] == {"lr": 2} and c["label"].endswith(", outer lr 2")
    plain = communication.sparseloco(50, density=0.01)
    assert "outer_options" not in plain and plain["label"] == "sparseloco H=50, 1%, 2-bit"


def test_parts_run_apart_combine_into_one_report(communication, runs, monkeypatch, tmp_path, capsys):
    """Seed 0 in one process and seed 1 in another, combined: one table over both seeds,
    the robust rules' rows of both, each part named."""
    for seed in ("0", "1"):
        main(communication, monkeypatch, "--quick", "--tasks", "digits", "--seeds", seed, "--out", str(tmp_path / seed))
    capsys.readouterr()
    out = tmp_path / "all.json"
    main(communication, monkeypatch, "--quick", "--combine", f"{tmp_path / '0'},{tmp_path / '1'}", "--out", str(out))
    result = json.loads(out.read_text())
    assert sorted({r["seed"] for r in result["rows"]}) == [0, 1]
    assert {s["seeds"] for s in result["summary"]} == {2}
    assert sorted({r["seed"] for r in result["robust_rules"]}) == [0, 1]
    assert [p["file"] for p in result["parts"]] == ["0", "1"]
    assert "communication over seeds 0,1" in capsys.readouterr().out
    n_runs = len(runs)
    with pytest.raises(SystemExit, match=r"ran with other max_factor, quick than this run's"):
        main(communication, monkeypatch, "--max-factor", "5", "--combine", str(tmp_path / "0"), "--out", str(out))
    assert len(runs) == n_runs  # combining runs nothing


@pytest.mark.parametrize(
    "args, said",
    [
        (["--combine", "/nonexistent/part.json"], "no such file"),
        (["--combine", ","], "name the parts' JSON files"),
        (["--combine", __file__, "--configs", "sparseloco"], "not with --configs"),
    ],
)
def test_combine_refuses_what_it_cannot_merge(communication, runs, monkeypatch, capsys, args, said):
    with pytest.raises(SystemExit) as e:
        main(communication, monkeypatch, *args)
    assert e.value.code == 2 and said in capsys.readouterr().err and runs == []


def test_combine_refuses_a_file_that_is_not_a_part(communication, runs, monkeypatch, tmp_path):
    bad = tmp_path / "bad.json"
    for text in ('{"args": {}}', "[1, 2]", '{"args": {}, "pareto": {}, "rows": [{"task": "digits"}]}'):
        bad.write_text(text)
        with pytest.raises(SystemExit, match="is not a part written by this program"):
            main(communication, monkeypatch, "--combine", str(bad), "--out", str(tmp_path / "o.json"))
    assert not (tmp_path / "o.json").exists()
