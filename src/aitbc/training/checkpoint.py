"""Tensors on disk and on the wire: safetensors, never pickle.

A *checkpoint* is a model's state dict plus string metadata (model name, config,
round). A *shard* is one worker's samples (``x``, ``y``). Both become plain bytes that
the content-addressed store names by CID.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor, nn

from aitbc.errors import IntegrityError
from aitbc.training.data_spec import DataSpec

META_KEY = "aitbc"


def tensors_to_bytes(tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """Serialize deterministically: the same tensors and metadata give the same bytes,
    so the same content gets the same CID. safetensors writes its ``__metadata__`` map
    in hash order, so all our metadata travels as one sorted-JSON string under one key."""
    meta = {META_KEY: json.dumps(metadata, sort_keys=True)} if metadata else None
    # clone(): safetensors refuses tensors that share storage (views, tied weights).
    return st_save({k: v.detach().contiguous().clone() for k, v in tensors.items()}, metadata=meta)


def bytes_to_tensors(data: bytes) -> dict[str, Tensor]:
    """Parse a safetensors blob; floating tensors must be finite (blobs come from others)."""
    try:
        tensors = st_load(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise IntegrityError(f"not a valid safetensors blob: {e}") from None
    for name, t in tensors.items():
        _finite(name, t)
    return tensors


def _finite(name: str, t: Tensor) -> None:
    """A floating tensor from others' bytes must be finite (an IntegrityError naming it)."""
    if t.is_floating_point() and not torch.isfinite(t).all():
        raise IntegrityError(f"tensor {name!r} in blob contains NaN or Inf")


def _header_bytes(data: bytes) -> bytes:
    """The JSON header of a safetensors blob (after its 8-byte LE length), unparsed."""
    if len(data) < 8:
        raise IntegrityError("not a valid safetensors blob: shorter than its 8-byte header length")
    (n,) = struct.unpack_from("<Q", data)
    if 8 + n > len(data):
        raise IntegrityError(f"not a valid safetensors blob: header length {n} exceeds blob size {len(data)}")
    return data[8 : 8 + n]


def read_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors blob (8-byte LE header length, JSON header)."""
    raw_header = _header_bytes(data)
    try:
        header = json.loads(raw_header)
        raw = header.get("__metadata__", {}).get(META_KEY)
        meta = json.loads(raw) if raw is not None else {}
    except (ValueError, AttributeError, TypeError) as e:  # TypeError: a metadata value that is not a string
        raise IntegrityError(f"not a valid safetensors blob: {e}") from None
    if not isinstance(meta, dict):
        raise IntegrityError("safetensors metadata is not a JSON object")
    return {str(k): str(v) for k, v in meta.items()}


def tensor_shapes(data: bytes) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape from a safetensors blob's header alone (nothing is loaded)."""
    raw_header = _header_bytes(data)
    try:
        header = json.loads(raw_header)
        return {str(k): tuple(int(x) for x in v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise IntegrityError(f"not a valid safetensors blob: {e}") from None


def checkpoint_bytes(model: nn.Module, *, model_name: str, model_options: dict, round: int) -> bytes:
    meta = {
        "format": "aitbc.checkpoint/1",
        "model": model_name,
        "model_options": json.dumps(model_options, sort_keys=True),
        "round": str(round),
    }
    return tensors_to_bytes(model.state_dict(), meta)


def load_checkpoint(model: nn.Module, data: bytes) -> dict[str, str]:
    """Load a checkpoint's weights into ``model`` (shapes must match); return its metadata."""
    state = bytes_to_tensors(data)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = str(e).splitlines()[0]
        raise IntegrityError(f"checkpoint does not fit this model: {first}") from None
    return read_metadata(data)


def _same_names(names: set[str], model: set[str]) -> None:
    if names != model:
        missing, extra = sorted(model - names), sorted(names - model)
        raise IntegrityError(f"checkpoint does not fit this model: missing {missing[:3]}, unexpected {extra[:3]}")


def _same_shape(name: str, shape: tuple[int, ...], model: tuple[int, ...]) -> None:
    if shape != model:
        raise IntegrityError(f"checkpoint does not fit this model: {name} has shape {shape}, the model's is {model}")


def load_checkpoint_file(model: nn.Module, path: Path) -> dict[str, str]:
    """:func:`load_checkpoint` from a file, one tensor at a time: each is read (memory-mapped)
    and copied into its parameter, so no second whole copy of the model is ever held (a
    25M-parameter model is 100 MB). The names and shapes must be the model's exactly, and
    floating tensors finite; otherwise an ``IntegrityError`` and the model is left as it was."""
    state = model.state_dict()
    try:
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            _same_names(names, set(state))
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in names}
            for k, t in state.items():
                _same_shape(k, shapes[k], tuple(t.shape))
            checked: list[str] = []
            for k in sorted(names):  # all checked before any is copied: a bad file changes nothing
                _finite(k, f.get_tensor(k))
                checked.append(k)
            with torch.no_grad():
                for k in checked:
                    state[k].copy_(f.get_tensor(k))
            raw = (f.metadata() or {}).get(META_KEY)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise IntegrityError(f"not a valid safetensors blob: {e}") from None
    return _metadata(raw)


def _metadata(raw: str | None) -> dict[str, str]:
    """Our metadata string (sorted JSON under META_KEY) as a dict; an IntegrityError if it
    is not a JSON object."""
    try:
        meta = json.loads(raw) if raw is not None else {}
    except ValueError as e:
        raise IntegrityError(f"not a valid safetensors blob: {e}") from None
    if not isinstance(meta, dict):
        raise IntegrityError("safetensors metadata is not a JSON object")
    return {str(k): str(v) for k, v in meta.items()}


def shard_bytes(x: Tensor, y: Tensor, *, dataset: str, index: int, count: int) -> bytes:
    meta = {"format": "aitbc.shard/1", "dataset": dataset, "index": str(index), "count": str(count)}
    return tensors_to_bytes({"x": x, "y": y}, meta)


def load_shard(data: bytes, spec: DataSpec | None = None) -> tuple[Tensor, Tensor]:
    """A shard's ``x`` and ``y``; with ``spec``, checked to be data of that spec
    (:func:`check_shard`)."""
    t = bytes_to_tensors(data)
    if set(t) != {"x", "y"} or t["x"].shape[0] != t["y"].shape[0]:
        raise IntegrityError(f"shard blob must hold x and y with equal first dimension; got {sorted(t)}")
    if spec is not None:
        check_shard(t["x"], t["y"], spec)
    return t["x"], t["y"]


def check_shard(x: Tensor, y: Tensor, spec: DataSpec) -> None:
    """An ``IntegrityError`` unless ``x``/``y`` are data of ``spec``: a language shard's
    token ids integers in ``[0, vocabulary)`` in windows of the spec's length, a
    classification shard's labels integers in ``[0, classes)`` for inputs of the spec's
    shape. An owner's shard is someone else's input: an id past the embedding would be an
    IndexError on a CPU and a device-side assert that kills a GPU worker's process."""
    n = spec.num_classes
    if spec.task == "language":
        if tuple(x.shape[1:]) != tuple(spec.input_shape) or tuple(y.shape) != tuple(x.shape):
            raise IntegrityError(
                f"shard holds windows of shape {tuple(x.shape[1:])} and {tuple(y.shape[1:])}; the data's are "
                f"{tuple(spec.input_shape)}"
            )
        _ids("token ids", x, n)
        _ids("token ids", y, n)
        return
    if tuple(x.shape[1:]) != tuple(spec.input_shape) or y.dim() != 1:
        raise IntegrityError(
            f"shard holds inputs of shape {tuple(x.shape[1:])} and labels of shape {tuple(y.shape[1:])}; "
            f"the data's inputs are {tuple(spec.input_shape)} with one label each"
        )
    _ids("labels", y, n)


def _ids(what: str, t: Tensor, n: int) -> None:
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise IntegrityError(f"shard {what} must be integers, got {t.dtype}")
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= n):
        raise IntegrityError(f"shard {what} must be in [0, {n}), found {int(t.min())}..{int(t.max())}")


def load_shard_file(path: Path, spec: DataSpec | None = None) -> tuple[Tensor, Tensor]:
    """:func:`load_shard` from a file (read once, memory-mapped, into the two tensors)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())  # a safe_open handle is not iterable
            t = {k: f.get_tensor(k) for k in names}
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise IntegrityError(f"not a valid safetensors blob: {e}") from None
    for name, v in t.items():
        _finite(name, v)
    if set(t) != {"x", "y"} or t["x"].shape[0] != t["y"].shape[0]:
        raise IntegrityError(f"shard blob must hold x and y with equal first dimension; got {sorted(t)}")
    if spec is not None:
        check_shard(t["x"], t["y"], spec)
    return t["x"], t["y"]


Layout = tuple[tuple[str, tuple[int, ...]], ...]


def param_layout(model: nn.Module) -> Layout | None:
    """The model's parameters as (name, shape), in :func:`flat_params` order, when they are
    its whole state, all float32 (no buffers, no shared or other-typed tensors): then
    :func:`params_from_file` reads a checkpoint's flat parameters without the model. None
    otherwise."""
    named = list(model.named_parameters())
    state = model.state_dict()
    if set(state) != {n for n, _ in named} or len(state) != len(named):
        return None
    if any(p.dtype != torch.float32 for _, p in named):
        return None
    return tuple((n, tuple(p.shape)) for n, p in named)


def params_from_file(path: Path, layout: Layout) -> Tensor:
    """(d,) float32: what :func:`flat_params` gives after :func:`load_checkpoint_file` of
    ``path`` into a model whose :func:`param_layout` is ``layout``, read without that
    model, so a thread other than the one training on it can ready the next round's start.
    Checked as that load is: the names and shapes exactly the layout's, every tensor
    finite; otherwise an ``IntegrityError``."""
    expected = dict(layout)
    parts: list[Tensor] = []
    try:
        with safe_open(str(path), framework="pt") as f:
            _same_names(set(f.keys()), set(expected))
            for k, shape in layout:
                t = f.get_tensor(k)
                _same_shape(k, tuple(t.shape), shape)
                _finite(k, t)
                parts.append(t.reshape(-1).to(torch.float32))
            _metadata((f.metadata() or {}).get(META_KEY))  # refused as a load refuses it
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise IntegrityError(f"not a valid safetensors blob: {e}") from None
    return torch.cat(parts) if parts else torch.zeros(0)


def flat_params(model: nn.Module) -> Tensor:
    """All parameters as one ``(d,)`` float32 vector (the unit updates are made of)."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


@torch.no_grad()
def set_flat_params(model: nn.Module, flat: Tensor) -> None:
    """Copy ``flat`` ``(d,)`` into the parameters. (torch's ``vector_to_parameters``
    would make them *views* of ``flat``, so training would overwrite the caller's tensor.)"""
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    if flat.shape != (total,):
        raise ValueError(f"flat parameters have shape {tuple(flat.shape)}, model needs ({total},)")
    offset = 0
    for p in params:
        n = p.numel()
        p.copy_(flat[offset : offset + n].view_as(p))  # (n,) -> p.shape
        offset += n
