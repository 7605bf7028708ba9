"""A worker builds a job's model only within its ``max_params``: a built-in model is counted
from its config (``build_model`` refuses it before any tensor is allocated); code (``module:callable``), which
cannot be counted without running it, is refused once built; code its operator did not allow
is refused as before, unimported, whatever its size."""

from __future__ import annotations

import sys
import textwrap

import pytest
from torch import nn

from aitbc.training.data_spec import DataSpec
from aitbc.worker.model_cap import ModelTooLarge, build_within
from aitbc.worker.records import ModelRefused

DIGITS = DataSpec("classification", (64,), 10)


def test_a_builtin_model_over_the_cap_is_refused():
    with pytest.raises(ModelTooLarge) as e:
        build_within("mlp", DIGITS, {"hidden": [16]}, allow_code=(), max_params=1_000)
    assert "1,210 parameters for this data" in str(e.value) and "at most 1,000" in str(e.value)
    with pytest.raises(ModelTooLarge, match="at least 4,353 parameters"):  # counted from the options first
        build_within("mlp", DIGITS, {"hidden": [64, 64]}, allow_code=(), max_params=1_000)


def test_a_model_within_the_cap_or_with_no_cap_is_built():
    for cap in (1_210, None):
        model = build_within("mlp", DIGITS, {"hidden": [16]}, allow_code=(), max_params=cap)
        assert sum(p.numel() for p in model.parameters()) == 1_210


@pytest.fixture
def code_module(tmp_path, monkeypatch) -> str:
    (tmp_path / "aitbc_cap_test_model.py").write_text(
        textwrap.dedent(
            """
            from torch import nn

            def build(spec):
                return nn.Sequential(nn.Flatten(), nn.Linear(64, spec.num_classes))
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "aitbc_cap_test_model"
    sys.modules.pop("aitbc_cap_test_model", None)


def test_code_is_counted_once_built(code_module):
    name = f"{code_module}:build"
    with pytest.raises(ModelTooLarge, match="650 parameters for this data; at most 100 are allowed"):
        build_within(name, DIGITS, {}, allow_code=[code_module], max_params=100)
    assert isinstance(build_within(name, DIGITS, {}, allow_code=[code_module], max_params=650), nn.Module)


def test_code_not_allowed_is_refused_unimported_whatever_the_cap(code_module):
    with pytest.raises(ModelRefused) as e:
        build_within(f"{code_module}:build", DIGITS, {}, allow_code=(), max_params=None)
    assert not isinstance(e.value, ModelTooLarge) and "--allow-code" in str(e.value)
    assert code_module not in sys.modules
