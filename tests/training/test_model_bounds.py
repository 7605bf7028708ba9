"""What a machine will build for someone else: built-in models within documented bounds
(counted before anything is allocated), and a ``module:callable`` only under a prefix its
operator allowed, refused without importing it."""

from __future__ import annotations

import sys
import textwrap

import pytest

from aitbc.errors import UsageError
from aitbc.run_defaults import MAX_PARAMS
from aitbc.training.allow_code import check_prefixes, code_allowed
from aitbc.training.data_spec import DataSpec
from aitbc.training.models import (
    MAX_SAMPLE_BYTES,
    CodeNotAllowed,
    build_model,
    check_model,
    count_params,
    model_config,
    sample_bytes,
)

DIGITS = DataSpec("classification", (8, 8), 10)
MNIST = DataSpec("classification", (1, 28, 28), 10)
TEXT = DataSpec("language", (64,), 256)


@pytest.mark.parametrize(
    ("name", "options", "spec"),
    [
        ("mlp", {}, DIGITS),
        ("mlp", {"hidden": [8]}, DIGITS),
        ("mlp", {"hidden": "32 16 8"}, MNIST),
        ("cnn", {}, DIGITS),
        ("cnn", {"channels": "4x8x16", "hidden": 8}, MNIST),
        ("transformer", {}, TEXT),  # the default: the 470k-parameter model of the README and bench
        ("transformer", {"d_model": 64, "n_layers": 3, "n_heads": 2, "context": 64}, TEXT),
    ],
)
def test_parameters_are_counted_exactly_before_building(name, options, spec):
    cfg = model_config(name, options)
    model = build_model(name, spec, options)
    n = sum(p.numel() for p in model.parameters())
    assert count_params(name, cfg, spec) == n
    assert count_params(name, cfg, None) <= n  # before the data is known: a lower bound


def test_the_default_transformer_is_admitted():
    assert count_params("transformer", model_config("transformer"), TEXT) == 478_720


@pytest.mark.parametrize(
    ("name", "options", "words"),
    [
        ("transformer", {"d_model": 1 << 20}, ["d_model", "[1, 8192]"]),
        ("transformer", {"n_layers": 10_000}, ["n_layers", "[1, 48]"]),
        ("transformer", {"context": 1 << 20}, ["context", "[1, 8192]"]),
        ("transformer", {"n_heads": 256, "d_model": 128}, ["n_heads", "[1, 128]"]),
        ("transformer", {"d_model": 8192, "n_layers": 48, "n_heads": 8}, ["parameters", f"{MAX_PARAMS:,}"]),
        ("transformer", {"command": "touch /tmp/x"}, ["unknown model 'transformer' option 'command'", "d_model"]),
        ("transformer", {"d_model": "wide"}, ["d_model='wide' must be int"]),
        ("transformer", {"d_model": True}, ["d_model=True must be int"]),
        ("mlp", {"hidden": [8] * 49}, ["hidden", "1 to 48 layers"]),
        ("mlp", {"hidden": [100_000]}, ["hidden", "[1, 8192]"]),
        ("cnn", {"hidden": 0}, ["hidden", "[1, 8192]"]),
    ],
)
def test_out_of_range_options_are_refused_naming_the_option_and_range(name, options, words):
    with pytest.raises(UsageError) as e:
        check_model(name, options)
    for w in words:
        assert w in str(e.value)


def test_a_sample_past_the_activation_bound_is_refused_naming_the_option_and_range():
    """One sample's evaluation is counted from the config (context x width, plus the logits):
    the issue's transformer (context 8192 at d_model 128, 1.5M parameters) fits one sample in
    MAX_SAMPLE_BYTES; twice the width at that context does not, and the refusal says which
    contexts would."""
    issue = {"d_model": 128, "n_layers": 2, "n_heads": 4, "context": 8192}
    assert sample_bytes("transformer", model_config("transformer", issue), None) <= MAX_SAMPLE_BYTES
    wide = {**issue, "d_model": 256}
    most = MAX_SAMPLE_BYTES // (4 * (16 * 256 + 2 * 256))
    with pytest.raises(UsageError) as e:
        check_model("transformer", wide)
    assert "context must be in [1, 7281]" in str(e.value) and most == 7281, str(e.value)
    assert "\n" not in str(e.value)
    check_model("transformer", {**wide, "context": most})  # the top of the range is admitted
    with pytest.raises(UsageError, match=r"context must be in \[1, 1985\] at this d_model"):
        check_model("transformer", {"d_model": 1024, "n_heads": 8, "context": 8192, "n_layers": 1})


def test_a_cnn_whose_sample_is_past_the_bound_for_its_data_is_refused_before_it_is_built():
    check_model("cnn", {"channels": [512], "hidden": 8})  # the options alone are within bounds
    big = DataSpec("classification", (3, 512, 512), 10)  # 512 channels of 512 x 512 floats: 1.5 GB a sample
    with pytest.raises(UsageError, match="make channels smaller or the inputs smaller"):
        build_model("cnn", big, {"channels": [512], "hidden": 8})


def test_a_model_too_big_for_its_data_is_refused_before_it_is_built():
    """An mlp over a huge input would allocate 8192 x 10^6 floats (32 GB); refused at once."""
    spec = DataSpec("classification", (1000, 1000), 10)
    check_model("mlp", {"hidden": [8192]})  # the options alone are within bounds
    with pytest.raises(UsageError, match="parameters for this data; at most"):
        build_model("mlp", spec, {"hidden": [8192]})


# --- code ------------------------------------------------------------------------------------

SENTINEL_MODULE = "aitbc_test_sentinel_model"


@pytest.fixture
def sentinel_module(tmp_path, monkeypatch):
    """A module whose import writes a file: importing it at all is running the owner's code."""
    sentinel = tmp_path / "IMPORTED"
    (tmp_path / f"{SENTINEL_MODULE}.py").write_text(
        textwrap.dedent(
            f"""
            import pathlib
            pathlib.Path({str(sentinel)!r}).write_text("owner code ran here")
            from torch import nn

            def build(spec, width=4):
                return nn.Linear(2, width)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield sentinel
    sys.modules.pop(SENTINEL_MODULE, None)


@pytest.mark.parametrize("allow", [(), ["other"], ["aitbc_test"], ["aitbc_test_sentinel_model.sub"]])
def test_code_not_allowed_is_never_imported(sentinel_module, allow):
    for check in (
        lambda: check_model(f"{SENTINEL_MODULE}:build", {}, allow_code=allow),
        lambda: build_model(f"{SENTINEL_MODULE}:build", DIGITS, {}, allow_code=allow),
    ):
        with pytest.raises(CodeNotAllowed) as e:
            check()
        assert "--allow-code" in str(e.value) and "cnn, mlp, transformer" in str(e.value)
    assert SENTINEL_MODULE not in sys.modules
    assert not sentinel_module.exists()


def test_os_system_is_refused_by_default(tmp_path):
    target = tmp_path / "pwned"
    with pytest.raises(CodeNotAllowed, match="'os:system' is code"):
        build_model("os:system", DIGITS, {"command": f"touch {target}"})
    assert not target.exists()


def test_allowed_code_is_built(sentinel_module):
    model = build_model(f"{SENTINEL_MODULE}:build", DIGITS, {"width": 3}, allow_code=[SENTINEL_MODULE])
    assert model.out_features == 3 and sentinel_module.exists()


def test_prefixes_match_whole_module_names():
    assert code_allowed("mypkg:f", ["mypkg"]) and code_allowed("mypkg.models.x:f", ["mypkg"])
    assert not code_allowed("mypkgx:f", ["mypkg"]) and not code_allowed("my:f", ["mypkg"])
    assert code_allowed("anything:f", True) and not code_allowed("mypkg:f", ())


@pytest.mark.parametrize("bad", ["*", "", "os:system", "a..b", ".a", "1pkg", "a b"])
def test_bad_prefixes_are_refused(bad):
    with pytest.raises(ValueError, match="not a dotted module path"):
        check_prefixes([bad])
