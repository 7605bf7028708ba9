"""Checkpoints, shards and flat parameter vectors: safetensors bytes, never pickle."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from torch import nn

from aitbc.errors import IntegrityError
from aitbc.training.checkpoint import (
    bytes_to_tensors,
    checkpoint_bytes,
    flat_params,
    load_checkpoint,
    load_checkpoint_file,
    load_shard,
    load_shard_file,
    param_layout,
    params_from_file,
    read_metadata,
    set_flat_params,
    shard_bytes,
    tensors_to_bytes,
)
from aitbc.training.data_spec import DataSpec
from aitbc.training.models import build_model

SPEC = DataSpec("classification", (1, 8, 8), 10)


def mlp(seed: int, hidden: str = "8") -> nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", SPEC, {"hidden": hidden})


def linear_2_1() -> nn.Linear:
    """Linear(2, 1) with weight [[1, 2]] and bias [3]."""
    m = nn.Linear(2, 1)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([[1.0, 2.0]]))
        m.bias.copy_(torch.tensor([3.0]))
    return m


# --- checkpoints ------------------------------------------------------------------------------


def test_checkpoint_round_trip_is_exact():
    src, dst = mlp(0), mlp(1)
    data = checkpoint_bytes(src, model_name="mlp", model_options={"hidden": "8"}, round=3)

    load_checkpoint(dst, data)

    for (k1, v1), (k2, v2) in zip(src.state_dict().items(), dst.state_dict().items(), strict=True):
        assert k1 == k2 and torch.equal(v1, v2)


def test_checkpoint_metadata_is_readable():
    data = checkpoint_bytes(mlp(0), model_name="mlp", model_options={"hidden": "8"}, round=3)
    expected = {"format": "aitbc.checkpoint/1", "model": "mlp", "model_options": '{"hidden": "8"}', "round": "3"}

    assert load_checkpoint(mlp(1), data) == expected
    assert read_metadata(data) == expected
    assert json.loads(read_metadata(data)["model_options"]) == {"hidden": "8"}


@pytest.mark.parametrize("other", [lambda: mlp(0, hidden="16"), lambda: mlp(0, hidden="8x8"), lambda: nn.Linear(2, 1)])
def test_checkpoint_into_a_different_model_is_an_integrity_error(other):
    data = checkpoint_bytes(mlp(0), model_name="mlp", model_options={}, round=0)

    with pytest.raises(IntegrityError, match="checkpoint does not fit this model"):
        load_checkpoint(other(), data)


@pytest.mark.parametrize("data", [b"", b"garbage bytes that are not safetensors", b"\xff" * 64])
def test_garbage_bytes_are_integrity_errors(data):
    with pytest.raises(IntegrityError, match="not a valid safetensors blob"):
        load_checkpoint(mlp(0), data)
    with pytest.raises(IntegrityError, match="not a valid safetensors blob"):
        load_shard(data)
    with pytest.raises(IntegrityError, match="not a valid safetensors blob"):
        bytes_to_tensors(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x01\x00", "shorter than its 8-byte header length"),
        (struct.pack("<Q", 100) + b"{}", "header length 100 exceeds blob size 10"),
        (struct.pack("<Q", 3) + b"{x}", "not a valid safetensors blob"),
    ],
)
def test_read_metadata_errors(data, message):
    with pytest.raises(IntegrityError) as exc:
        read_metadata(data)

    assert message in str(exc.value)


def test_serialization_is_deterministic():
    # same content -> same bytes -> same CID, whatever the metadata's insertion order
    a = tensors_to_bytes({"w": torch.arange(3.0), "b": torch.ones(2)}, {"round": "1", "model": "mlp", "x": "y"})
    b = tensors_to_bytes({"b": torch.ones(2), "w": torch.arange(3.0)}, {"x": "y", "model": "mlp", "round": "1"})

    assert a == b
    assert checkpoint_bytes(mlp(0), model_name="mlp", model_options={}, round=1) == checkpoint_bytes(
        mlp(0), model_name="mlp", model_options={}, round=1
    )


def test_metadata_absent_reads_as_empty():
    assert read_metadata(tensors_to_bytes({"a": torch.zeros(2)})) == {}


def test_tensors_sharing_storage_can_be_saved():
    t = torch.arange(4.0)

    out = bytes_to_tensors(tensors_to_bytes({"a": t, "b": t[:2]}))

    assert torch.equal(out["a"], t) and torch.equal(out["b"], t[:2])


# --- the same from files (the worker streams blobs to disk, then loads them once) ---------------


def _file(tmp_path, data: bytes):
    path = tmp_path / "blob"
    path.write_bytes(data)
    return path


def _state(m: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in m.state_dict().items()}


def test_checkpoint_file_loads_exactly_as_the_bytes_do(tmp_path):
    src, via_bytes, via_file = mlp(0), mlp(1), mlp(1)
    data = checkpoint_bytes(src, model_name="mlp", model_options={"hidden": "8"}, round=3)
    assert load_checkpoint_file(via_file, _file(tmp_path, data)) == load_checkpoint(via_bytes, data)
    for k, v in src.state_dict().items():
        assert torch.equal(via_file.state_dict()[k], v) and torch.equal(via_bytes.state_dict()[k], v)


@pytest.mark.parametrize("other", [lambda: mlp(0, hidden="16"), lambda: mlp(0, hidden="8x8"), lambda: nn.Linear(2, 1)])
def test_checkpoint_file_into_a_different_model_is_refused_and_changes_nothing(tmp_path, other):
    data = checkpoint_bytes(mlp(0), model_name="mlp", model_options={}, round=0)
    model = other()
    before = _state(model)
    with pytest.raises(IntegrityError, match="checkpoint does not fit this model"):
        load_checkpoint_file(model, _file(tmp_path, data))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_checkpoint_file_with_a_nan_is_refused_and_changes_nothing(tmp_path):
    src, model = mlp(0), mlp(1)
    state = _state(src)
    last = sorted(state)[-1]  # checked last: every other tensor would already fit
    state[last].view(-1)[0] = float("nan")
    before = _state(model)
    with pytest.raises(IntegrityError, match=f"tensor {last!r} in blob contains NaN or Inf"):
        load_checkpoint_file(model, _file(tmp_path, tensors_to_bytes(state)))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


@pytest.mark.parametrize(
    "build",
    [
        lambda: mlp(0, hidden="8x8"),
        lambda: build_model("transformer", DataSpec("language", (16,), 64), {"context": 16, "d_model": 16}),
    ],
)
def test_flat_parameters_read_from_a_file_are_the_loaded_models(tmp_path, build):
    """The look-ahead thread's read of the next model: without the model, exactly the
    flat parameters a load into it would give."""
    src, model = build(), build()
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn_like(p))
    layout = param_layout(model)
    assert layout is not None
    path = _file(tmp_path, checkpoint_bytes(src, model_name="m", model_options={}, round=1))
    read = params_from_file(path, layout)
    load_checkpoint_file(model, path)
    assert read.dtype == torch.float32 and torch.equal(read, flat_params(model))


def test_a_model_with_buffers_has_no_layout_and_a_file_that_does_not_fit_is_refused(tmp_path):
    assert param_layout(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))) is None  # running stats
    assert param_layout(nn.Linear(2, 1).to(torch.float64)) is None
    layout = param_layout(mlp(0))
    assert layout is not None
    with pytest.raises(IntegrityError, match="checkpoint does not fit this model"):
        params_from_file(
            _file(tmp_path, checkpoint_bytes(mlp(0, hidden="16"), model_name="m", model_options={}, round=0)), layout
        )
    with pytest.raises(IntegrityError, match="checkpoint does not fit this model: missing"):
        params_from_file(_file(tmp_path, tensors_to_bytes({"w": torch.zeros(2)})), layout)
    state = _state(mlp(0))
    last = sorted(state)[-1]
    state[last].view(-1)[0] = float("inf")
    with pytest.raises(IntegrityError, match=f"tensor {last!r} in blob contains NaN or Inf"):
        params_from_file(_file(tmp_path, tensors_to_bytes(state)), layout)
    with pytest.raises(IntegrityError, match="not a valid safetensors blob"):
        params_from_file(_file(tmp_path, b"garbage"), layout)


@pytest.mark.parametrize("data", [b"", b"garbage bytes that are not safetensors", b"\xff" * 64])
def test_garbage_files_are_integrity_errors(tmp_path, data):
    with pytest.raises(IntegrityError, match="not a valid safetensors blob"):
        load_checkpoint_file(mlp(0), _file(tmp_path, data))
    with pytest.raises(IntegrityError, match="not a valid safetensors blob"):
        load_shard_file(_file(tmp_path, data))


def test_shard_file_round_trip_and_refusals(tmp_path):
    x, y = torch.randint(0, 256, (3, 16), dtype=torch.uint8), torch.randint(0, 256, (3, 16), dtype=torch.uint8)
    x2, y2 = load_shard_file(_file(tmp_path, shard_bytes(x, y, dataset="t", index=0, count=1)))
    assert torch.equal(x2, x) and torch.equal(y2, y)
    with pytest.raises(IntegrityError, match="shard blob must hold x and y"):
        load_shard_file(_file(tmp_path, tensors_to_bytes({"x": torch.zeros(3, 2), "y": torch.zeros(4)})))
    with pytest.raises(IntegrityError, match="NaN or Inf"):
        load_shard_file(_file(tmp_path, tensors_to_bytes({"x": torch.full((2, 2), float("inf")), "y": torch.zeros(2)})))


# --- shards -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "y"),
    [
        (torch.rand(5, 1, 8, 8), torch.arange(5)),
        (torch.randint(0, 256, (3, 16), dtype=torch.uint8), torch.randint(0, 256, (3, 16), dtype=torch.uint8)),
    ],
    ids=["images", "bytes"],
)
def test_shard_round_trip(x, y):
    data = shard_bytes(x, y, dataset="digits", index=1, count=4)

    x2, y2 = load_shard(data)

    assert x2.dtype == x.dtype and y2.dtype == y.dtype
    assert torch.equal(x2, x) and torch.equal(y2, y)
    assert read_metadata(data) == {"format": "aitbc.shard/1", "dataset": "digits", "index": "1", "count": "4"}


@pytest.mark.parametrize(
    "tensors",
    [
        {"x": torch.zeros(3, 2)},
        {"x": torch.zeros(3, 2), "y": torch.zeros(3), "z": torch.zeros(1)},
        {"x": torch.zeros(3, 2), "y": torch.zeros(4)},
    ],
    ids=["missing-y", "extra-tensor", "length-mismatch"],
)
def test_malformed_shards_are_integrity_errors(tensors):
    with pytest.raises(IntegrityError, match="shard blob must hold x and y"):
        load_shard(tensors_to_bytes(tensors))


# --- flat parameters --------------------------------------------------------------------------


def test_flat_params_order_and_values():
    assert torch.equal(flat_params(linear_2_1()), torch.tensor([1.0, 2.0, 3.0]))


def test_flat_params_is_a_copy():
    model = linear_2_1()

    flat = flat_params(model)
    flat.zero_()

    assert torch.equal(flat_params(model), torch.tensor([1.0, 2.0, 3.0]))
    assert not flat.requires_grad


def test_set_flat_params_copies_in_and_does_not_alias():
    model = nn.Linear(2, 1)
    flat = torch.tensor([1.0, 2.0, 3.0])

    set_flat_params(model, flat)
    flat.zero_()

    assert torch.equal(model.weight.detach(), torch.tensor([[1.0, 2.0]]))
    assert torch.equal(model.bias.detach(), torch.tensor([3.0]))


def test_flat_round_trip_on_an_mlp():
    src, dst = mlp(0), mlp(1)

    set_flat_params(dst, flat_params(src))

    assert torch.equal(flat_params(dst), flat_params(src))


@pytest.mark.parametrize("flat", [torch.zeros(4), torch.zeros(2), torch.zeros(1, 3)])
def test_set_flat_params_shape_error(flat):
    with pytest.raises(ValueError) as exc:
        set_flat_params(nn.Linear(2, 1), flat)

    assert f"flat parameters have shape {tuple(flat.shape)}, model needs (3,)" in str(exc.value)
