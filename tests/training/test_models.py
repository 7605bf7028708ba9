"""Model registry: built-in mlp / cnn / transformer, and user ``module:callable`` models."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

from aitbc.errors import UsageError
from aitbc.training.data_spec import DataSpec
from aitbc.training.models import MODELS, MLPConfig, build_model, model_config

DIGITS = DataSpec("classification", (1, 8, 8), 10)
TEXT = DataSpec("language", (16,), 256)
TINY_TRANSFORMER = {"d_model": "16", "n_layers": "1", "n_heads": "2", "context": "16"}


def test_registry_names():
    assert MODELS.names() == ["cnn", "mlp", "transformer"]


def test_model_config_is_typed():
    assert model_config("mlp", {"hidden": "32x16"}) == MLPConfig(hidden=(32, 16))
    assert model_config("pkg.mod:build") is None


# --- mlp -------------------------------------------------------------------------------------


def test_mlp_logits_shape_and_layer_sizes():
    torch.manual_seed(0)
    model = build_model("mlp", DIGITS, {"hidden": "16 8"})

    logits = model(torch.rand(5, 1, 8, 8))

    assert logits.shape == (5, 10)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64, 16), (16, 8), (8, 10)]


def test_mlp_default_hidden():
    model = build_model("mlp", DataSpec("classification", (3,), 2))

    assert model(torch.rand(4, 3)).shape == (4, 2)
    assert [m.out_features for m in model.modules() if isinstance(m, nn.Linear)] == [128, 64, 2]


# --- cnn -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("input_shape", "classes"),
    [((1, 8, 8), 10), ((1, 28, 28), 10), ((28, 28), 10), ((3, 8, 8), 4), ((1, 2, 2), 3)],
)
def test_cnn_logits_shape(input_shape, classes):
    torch.manual_seed(0)
    model = build_model("cnn", DataSpec("classification", input_shape, classes), {"channels": "4x8", "hidden": 8})

    logits = model(torch.rand(3, *input_shape))

    assert logits.shape == (3, classes)
    assert torch.isfinite(logits).all()


def test_cnn_accepts_integer_images():
    model = build_model("cnn", DataSpec("classification", (28, 28), 10), {"channels": "4", "hidden": 8})

    assert model(torch.randint(0, 255, (2, 28, 28), dtype=torch.uint8)).shape == (2, 10)


@pytest.mark.parametrize("input_shape", [(64,), (1, 1, 8, 8)])
def test_cnn_needs_image_shapes(input_shape):
    with pytest.raises(UsageError, match="model 'cnn' needs image inputs"):
        build_model("cnn", DataSpec("classification", input_shape, 10))


# --- transformer -----------------------------------------------------------------------------


def test_transformer_logits_shape():
    torch.manual_seed(0)
    model = build_model("transformer", TEXT, TINY_TRANSFORMER)

    logits = model(torch.randint(0, 256, (2, 16), dtype=torch.uint8))

    assert logits.shape == (2, 16, 256)


def test_transformer_accepts_sequences_shorter_than_context():
    model = build_model("transformer", DataSpec("language", (8,), 256), TINY_TRANSFORMER)

    assert model(torch.randint(0, 256, (3, 5))).shape == (3, 5, 256)


def test_transformer_is_causal():
    torch.manual_seed(0)
    model = build_model("transformer", TEXT, TINY_TRANSFORMER).eval()
    x = torch.randint(0, 256, (2, 16))
    x2 = x.clone()
    x2[:, 10] = (x[:, 10] + 1) % 256  # change token 10 only

    with torch.no_grad():
        a, b = model(x), model(x2)

    torch.testing.assert_close(a[:, :10], b[:, :10], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_transformer_context_must_hold_the_sequence():
    with pytest.raises(UsageError, match="sequences of 32 bytes exceed the model context 16"):
        build_model("transformer", DataSpec("language", (32,), 256), TINY_TRANSFORMER)


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "spec", "message"),
    [
        ("mlp", TEXT, "model 'mlp' needs a classification dataset"),
        ("cnn", TEXT, "model 'cnn' needs image inputs"),
        ("transformer", DIGITS, "model 'transformer' needs a text dataset"),
    ],
)
def test_wrong_task(name, spec, message):
    with pytest.raises(UsageError, match=message):
        build_model(name, spec, TINY_TRANSFORMER if name == "transformer" else None)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("mlp", {"hidden": "0"}, "each of hidden must be in [1, 8192], got 0"),
        ("mlp", {"hidden": ""}, "hidden must list 1 to 48 layers, got 0"),
        ("mlp", {"hiden": "8"}, "unknown model 'mlp' option 'hiden'; allowed: hidden"),
        ("cnn", {"channels": "4x-1"}, "each of channels must be in [1, 8192], got -1"),
        ("cnn", {"hidden": "wide"}, "hidden='wide' must be int"),
        ("transformer", {"d_model": "10", "n_heads": "4"}, "d_model (10) must be divisible by n_heads (4)"),
        ("transformer", {"n_layers": "0"}, "n_layers must be in [1, 48], got 0"),
        ("transformer", {"dropout": "1"}, "dropout must be in [0, 1)"),
    ],
)
def test_bad_model_options(name, options, message):
    spec = TEXT if name == "transformer" else DIGITS

    with pytest.raises(UsageError) as exc:
        build_model(name, spec, options)

    assert message in str(exc.value)


def test_unknown_model_name_lists_names():
    with pytest.raises(UsageError, match="unknown model 'resnet'; allowed: cnn, mlp, transformer"):
        build_model("resnet", DIGITS)


# --- user models -----------------------------------------------------------------------------

USER_MODULE = "aitbc_test_user_models"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A real module file on sys.path, removed from sys.modules afterwards."""
    (tmp_path / f"{USER_MODULE}.py").write_text(
        textwrap.dedent(
            """
            from torch import nn

            def with_spec(spec, width=4):
                model = nn.Linear(spec.input_shape[0], width)
                model.got = {"spec": spec, "width": width}
                return model

            def without_spec(width):
                return nn.Linear(2, width)

            def not_a_model():
                return 42

            WIDTH = 4
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield USER_MODULE
    sys.modules.pop(USER_MODULE, None)


def test_user_model_gets_options_and_spec(user_module):
    spec = DataSpec("classification", (3,), 2)

    model = build_model(f"{user_module}:with_spec", spec, {"width": 5}, allow_code=[user_module])

    assert isinstance(model, nn.Linear)
    assert model.got == {"spec": spec, "width": 5}
    assert model(torch.zeros(1, 3)).shape == (1, 5)


def test_user_model_without_spec_parameter(user_module):
    model = build_model(f"{user_module}:without_spec", DIGITS, {"width": 3}, allow_code=[user_module])

    assert model.out_features == 3


def test_user_model_rejecting_options(user_module):
    with pytest.raises(UsageError, match="rejected its options"):
        build_model(f"{user_module}:with_spec", DIGITS, {"depth": 2}, allow_code=[user_module])


def test_user_model_must_return_a_module(user_module):
    with pytest.raises(UsageError, match="returned int, not a torch.nn.Module"):
        build_model(f"{user_module}:not_a_model", DIGITS, allow_code=[user_module])


def test_user_model_must_be_callable(user_module):
    with pytest.raises(UsageError, match="names a int, not a callable"):
        build_model(f"{user_module}:WIDTH", DIGITS, allow_code=[user_module])


def test_user_model_missing_callable(user_module):
    with pytest.raises(UsageError, match="AttributeError"):
        build_model(f"{user_module}:nope", DIGITS, allow_code=[user_module])


def test_user_model_missing_module_lists_builtin_models():
    with pytest.raises(UsageError) as exc:
        build_model("aitbc_no_such_module_xyz:build", DIGITS, allow_code=True)

    message = str(exc.value)
    assert "cannot load user model 'aitbc_no_such_module_xyz:build'" in message
    assert "ModuleNotFoundError" in message
    assert "cnn, mlp, transformer" in message


@pytest.mark.parametrize("name", ["pkg.mod:", ":build"])
def test_user_model_name_must_have_both_parts(name):
    with pytest.raises(UsageError, match="must look like package.module:callable"):
        build_model(name, DIGITS, allow_code=True)
