"""bench/gpu.py cannot rot: its --dry path (a tiny transformer, the worker's training path,
one process and two gloo ranks) runs here on the CPU, and without a GPU the default run
says so in one line and writes nothing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"


@pytest.fixture(scope="module")
def gpu_bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_measures_one_process_and_two_ranks(gpu_bench, capsys):
    before = set(gpu_bench.RESULTS.glob("gpu.*"))
    assert gpu_bench.main(["--dry", "--world", "2", "--precisions", "fp32,bf16"]) == 0
    out = capsys.readouterr().out
    rows = [r for r in (line.split() for line in out.splitlines()) if r[:1] == ["tiny"] and len(r) == 8]
    modes = sorted((r[2], r[3], r[4]) for r in rows)
    assert modes == [
        ("bf16", "data-parallel", "2"),
        ("bf16", "single", "1"),
        ("fp32", "data-parallel", "2"),
        ("fp32", "single", "1"),
    ], out
    assert all(float(r[5].replace(",", "")) > 0 for r in rows), out  # tokens/s measured
    assert set(gpu_bench.RESULTS.glob("gpu.*")) == before  # a CPU run writes no result


@pytest.mark.skipif(torch.cuda.is_available(), reason="the answer of a machine without a GPU")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(gpu_bench, capsys):
    assert gpu_bench.main([]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU visible" in lines[0], lines


def test_bad_sizes_are_refused(gpu_bench):
    with pytest.raises(SystemExit) as e:
        gpu_bench.main(["--sizes", "7B"])
    assert e.value.code == 2
