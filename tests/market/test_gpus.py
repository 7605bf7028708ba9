"""GPU classes: canonical names, the score table, --min-gpu checks, device detection."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from aitbc.errors import UsageError
from aitbc.market.gpus import (
    GPU_SCORES,
    UNKNOWN_GPU_SCORE,
    check_gpu_class,
    detect_device,
    gpu_score,
    known_gpu_classes,
    normalize_gpu,
)


def test_the_four_design_scores_are_fixed():
    assert GPU_SCORES["RTX4090"] == 1.0
    assert GPU_SCORES["RTX3090"] == 0.85
    assert GPU_SCORES["RTX3080"] == 0.75
    assert GPU_SCORES["RTX3070"] == 0.65


def test_every_score_is_in_unit_interval_and_data_centre_tops_the_scale():
    assert all(0.0 <= s <= 1.0 for s in GPU_SCORES.values())
    assert GPU_SCORES["H200"] == GPU_SCORES["H100"] == 1.0
    assert GPU_SCORES["A100"] == 0.95
    assert GPU_SCORES["CPU"] < GPU_SCORES["T4"] < UNKNOWN_GPU_SCORE < GPU_SCORES["RTX3070"]


def test_table_keys_are_their_own_canonical_form():
    assert all(normalize_gpu(key) == key for key in GPU_SCORES)


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("rtx 3090", "RTX3090"),
        ("RTX-3090", "RTX3090"),
        ("rtx3090", "RTX3090"),
        ("  GeForce RTX 3090 ", "RTX3090"),
        ("NVIDIA GeForce RTX 3090", "RTX3090"),
        ("NVIDIA GeForce RTX 3080 Ti", "RTX3080"),  # suffix falls back to the base class
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("Tesla T4", "T4"),
        ("NVIDIA RTX A6000", "A6000"),
        ("NVIDIA A10G", "A10"),
        ("NVIDIA L40S", "L40S"),
        ("cpu", "CPU"),
    ],
)
def test_normalize_known_names(name, canonical):
    assert normalize_gpu(name) == canonical


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("GeForce GTX 1080", "GTX1080"),
        ("NVIDIA RTX A1000", "RTXA1000"),  # not A10 or A100: classes match whole words
        ("my gpu!", "MYGPU"),
        ("NVIDIA", "NVIDIA"),  # only vendor words: kept rather than emptied
        ("", ""),
    ],
)
def test_normalize_unknown_names_to_upper_alnum(name, canonical):
    assert normalize_gpu(name) == canonical


def test_gpu_score_uses_table_or_unknown_default():
    assert gpu_score("GeForce RTX 3090") == 0.85
    assert gpu_score("NVIDIA H200") == 1.0
    assert gpu_score("GeForce GTX 1080") == UNKNOWN_GPU_SCORE == 0.5


def test_check_gpu_class_returns_canonical():
    assert check_gpu_class("rtx-3080") == "RTX3080"
    assert check_gpu_class("NVIDIA H100 PCIe") == "H100"


def test_check_gpu_class_unknown_lists_known_strongest_first():
    # Prepare
    known = known_gpu_classes()

    # Execute
    with pytest.raises(UsageError) as exc:
        check_gpu_class("GTX 1080")

    # Assert
    assert str(exc.value) == f"unknown GPU class 'GTX 1080'; known: {', '.join(known)}"
    assert known[:3] == ["H100", "H200", "RTX4090"]
    assert known[-1] == "CPU"
    assert exc.value.exit_code == 2


def test_check_gpu_class_rejects_empty():
    with pytest.raises(UsageError, match="unknown GPU class ''"):
        check_gpu_class("")


def test_detect_device_on_cpu(monkeypatch):
    # Prepare
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)

    # Execute
    info = detect_device()

    # Assert
    assert info["device"] == "cpu"
    assert info["gpu_class"] == "CPU"
    assert isinstance(info["name"], str) and info["name"]
    assert info["memory_bytes"] is None or info["memory_bytes"] > 0


def test_detect_device_reports_cuda_card(monkeypatch):
    # Prepare
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA GeForce RTX 3090")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: SimpleNamespace(total_memory=24 * 2**30))

    # Execute
    info = detect_device()

    # Assert
    assert info == {
        "device": "cuda",
        "name": "NVIDIA GeForce RTX 3090",
        "memory_bytes": 24 * 2**30,
        "gpu_class": "RTX3090",
    }


def test_detect_device_reports_mps_as_its_own_class(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 16 * 2**30, raising=False)

    info = detect_device()

    assert info["device"] == "mps"
    assert info["gpu_class"] == "MPS"
    assert info["memory_bytes"] == 16 * 2**30


def test_detect_device_really():
    info = detect_device()

    assert set(info) == {"device", "name", "memory_bytes", "gpu_class"}
    assert (info["device"] == "cuda") == torch.cuda.is_available()
    if info["device"] == "cuda":
        assert info["gpu_class"] == normalize_gpu(torch.cuda.get_device_name(0))
        assert info["memory_bytes"] > 0


def test_detect_device_describes_the_device_it_trains_on(monkeypatch):
    names = {0: "NVIDIA GeForce RTX 3090", 3: "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: names[i])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: SimpleNamespace(total_memory=(i + 1) << 30))

    info = detect_device([torch.device("cuda", 3)])
    assert info == {
        "device": "cuda",
        "name": "NVIDIA H100 80GB HBM3",
        "memory_bytes": 4 << 30,
        "gpu_class": "H100",
        "train_device": "cuda:3",
        "processes": 1,
    }
    assert detect_device([torch.device("cuda", 0), torch.device("cuda", 1)])["processes"] == 2
    on_cpu = detect_device([torch.device("cpu")] * 2)  # --device cpu on a GPU machine offers the CPU
    assert (on_cpu["device"], on_cpu["gpu_class"], on_cpu["train_device"], on_cpu["processes"]) == (
        "cpu",
        "CPU",
        "cpu",
        2,
    )
