"""`aitbc simulate` as a user runs it: a real process, real files, JSON on the last line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

REQUIRED = {
    "final_val_loss",
    "final_val_accuracy",
    "rounds",
    "workers",
    "bytes_up",
    "bytes_down",
    "virtual_seconds",
    "wall_seconds",
    "metrics_path",
}


def _json(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("outer", ["fedavg", "diloco"])
def test_mlp_on_digits_reaches_93_percent(aitbc, outer):
    # The acceptance command of the foundation issue, as written.
    proc = aitbc(
        "simulate",
        "--model",
        "mlp",
        "--dataset",
        "digits",
        "--workers",
        "8",
        "--rounds",
        "30",
        "--local-steps",
        "20",
        "--outer",
        outer,
        "--json",
    )

    result = _json(proc)
    assert set(result) >= REQUIRED
    assert result["final_val_accuracy"] >= 0.93
    assert (result["rounds"], result["workers"]) == (30, 8)
    rows = [json.loads(line) for line in Path(result["metrics_path"]).read_text().splitlines()]
    assert len(rows) == 30 and {"round", "val_loss", "val_accuracy", "bytes_up", "virtual_time"} <= set(rows[0])


def test_summary_without_json_is_readable(aitbc, tmp_path):
    proc = aitbc("simulate", "--rounds", "2", "--local-steps", "3", "--out", str(tmp_path / "run"))

    assert proc.returncode == 0, proc.stderr
    assert "validation accuracy" in proc.stdout and "final model CID" in proc.stdout
    assert (tmp_path / "run" / "metrics.jsonl").exists()


def test_text_folder_and_npz_datasets_run_end_to_end(aitbc, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
    (corpus / "b.txt").write_text("pack my box with five dozen liquor jugs! " * 200)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, size=120)
    x = (rng.normal(size=(120, 5)) + y[:, None]).astype(np.float32)
    np.savez(tmp_path / "toy.npz", x=x, y=y)

    text = _json(
        aitbc(
            "simulate",
            "--model",
            "transformer",
            "--dataset",
            f"text:{corpus}",
            "--workers",
            "2",
            "--rounds",
            "3",
            "--local-steps",
            "5",
            "--lr",
            "3e-3",
            "--model-opt",
            "context=32,d_model=32",
            "--model-opt",
            "n_layers=1",
            "--json",
        )
    )
    npz = _json(
        aitbc(
            "simulate",
            "--model",
            "mlp",
            "--dataset",
            f"npz:{tmp_path / 'toy.npz'}",
            "--workers",
            "3",
            "--rounds",
            "3",
            "--local-steps",
            "5",
            "--json",
        )
    )

    assert text["final_val_accuracy"] is None and text["final_val_loss"] < math.log(256)
    assert 0 <= npz["final_val_accuracy"] <= 1


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--model", "resnet"], 2, "unknown model 'resnet'; allowed: cnn, mlp, transformer"),
        (["--dataset", "imagenet"], 2, "unknown dataset 'imagenet'; allowed:"),
        (["--inner-opt", "lion"], 2, "unknown inner optimizer 'lion'; allowed: adam, adamw, sgd"),
        (["--outer", "magic"], 2, "unknown outer optimizer 'magic'; allowed: diloco, fedavg"),
        (["--workers", "0"], 2, "--workers must be at least 1, got 0"),
        (["--workers", "100000"], 2, "cannot split"),
        (["--model", "cnn", "--dataset", "stdlib"], 2, "needs image inputs"),
        (["--model-opt", "depth=3"], 2, "unknown model 'mlp' option 'depth'; allowed: hidden"),
        (["--speeds", "1,1"], 2, "--speeds gives 2 values for 8 workers"),
        (["--alpha", "0"], 2, "--alpha must be > 0"),
        (["--outer", "diloco", "--outer-momentum", "1.5"], 2, "momentum must be in [0, 0.99]"),
        (["--dataset", "text:/no/such/corpus"], 1, "no such file or directory: /no/such/corpus"),
        (["--model", "no_such_pkg.models:build"], 2, "cannot load user model"),
        (["--workers", "two"], 2, "Invalid value for '--workers'"),
    ],
)
def test_bad_input_is_one_line_with_the_right_exit_code(aitbc, args, code, message):
    proc = aitbc("simulate", "--rounds", "1", *args)

    assert proc.returncode == code
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    if code == 1 or "unknown" in message:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (aitbc.home / "sims").exists()  # nothing was started


def test_debug_shows_the_traceback(aitbc):
    proc = aitbc("--debug", "simulate", "--model", "resnet")

    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.parametrize(
    ("aggregator", "check"), [("mean", lambda a: a < 0.5), ("trimmed-mean:beta=0.25", lambda a: a >= 0.9)]
)
def test_sign_flip_acceptance_mean_collapses_trimmed_mean_holds(aitbc, aggregator, check):
    # The robustness acceptance command of the compression/robustness issue.
    proc = aitbc(
        "simulate",
        "--model",
        "mlp",
        "--dataset",
        "digits",
        "--workers",
        "12",
        "--byzantine",
        "3",
        "--attack",
        "sign-flip",
        "--aggregator",
        aggregator,
        "--rounds",
        "20",
        "--local-steps",
        "20",
        "--compression",
        "int8",
        "--json",
    )

    result = _json(proc)
    assert check(result["final_val_accuracy"]), result["final_val_accuracy"]
    assert 3.5 < result["compression_ratio"] < 4.0


def test_compressed_async_run_reports_target_figures(aitbc):
    proc = aitbc(
        "simulate",
        "--mode",
        "async",
        "--buffer",
        "4",
        "--compression",
        "topk-int8:ratio=0.05",
        "--error-feedback",
        "--rounds",
        "40",
        "--target-accuracy",
        "0.8",
        "--json",
    )

    result = _json(proc)
    assert {"compression_ratio", "bytes_to_target", "virtual_seconds_to_target"} <= set(result)
    assert result["compression_ratio"] > 20
    assert result["bytes_to_target"] is not None and result["bytes_to_target"] <= result["bytes_up"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--aggregator", "bulyan", "--byzantine", "3", "--attack", "ipm"], "bulyan"),
        (["--aggregator", "trimmed-mean:beta=0.5"], "beta"),
        (["--compression", "topk:ratio=2"], "ratio"),
        (["--attack", "sign-flip"], "needs --byzantine K > 0"),
        (["--mode", "gossip", "--topology", "mesh"], "unknown --topology 'mesh'"),
    ],
)
def test_bad_robustness_options_are_one_line_usage_errors(aitbc, args, message):
    proc = aitbc("simulate", "--rounds", "1", *args)

    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.long  # two processes of the CLI (SimConfig's choice itself: tests/core/test_aggregation_sparse.py)
@pytest.mark.parametrize(
    ("args", "rule"),
    [
        (["--compression", "sparseloco:density=0.02,bits=2"], "sparse-robust"),
        (["--compression", "sparseloco:density=0.02,bits=2", "--aggregator", "mean"], "mean"),
    ],
)
def test_a_sparse_codec_gets_the_sparse_rule_unless_one_is_named(aitbc, args, rule):
    proc = aitbc("simulate", "--rounds", "1", "--local-steps", "1", "--workers", "4", *args, "--json")
    assert _json(proc)["config"]["aggregator"] == rule
