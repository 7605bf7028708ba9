"""Pretrained weights for a fine-tune (``init --from-pretrained DIR``).

On the owner's machine :func:`read_pretrained` reads a local Hugging Face model directory:
its ``config.json`` checked against the allow-list (:func:`~aitbc.training.hf_models.options_from_hf_config`),
its safetensors weights (one file, or the shards ``model.safetensors.index.json`` names)
checked name by name and shape by shape against the model that config builds, and its
``tokenizer.json``. The weights become ONE safetensors blob with the HF model's own key
names and deterministic bytes, so every machine loads the same base by one CID. Never a
pickle: a directory whose weights are ``.bin``/``.pt``/``.pth``/``.ckpt`` is refused
without opening them.

On the coordinator :func:`check_weights_file` judges such a blob from its header alone
(names, shapes, float dtypes, offsets that tile the file), so a run cannot point workers at
an unrelated blob or at one larger than its parameters.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from aitbc.training.hf_models import BadModel, hf_config, library_config, options_from_hf_config

FORMAT = "aitbc.pretrained/1"  # the weights blob's metadata "format"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
INDEX = "model.safetensors.index.json"
MAX_CONFIG_BYTES = 1 << 20
MAX_HEADER_BYTES = 16 << 20  # a header lists names, dtypes, shapes and offsets: kilobytes per layer
# what a weights blob may store: a float dtype of at most 4 bytes (the size bound below counts on it)
DTYPE_BYTES = {"F16": 2, "BF16": 2, "F32": 4}
# buffers older checkpoints saved that today's library computes (never parameters)
_DERIVED = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")
_KEPT = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True, slots=True)
class Pretrained:
    """A model directory made ready to upload: ``model_type`` and ``options`` from its
    config, ``weights`` (one safetensors blob) and ``tokenizer`` (``tokenizer.json``
    bytes). ``params``: the values the weights hold."""

    model_type: str
    options: dict[str, Any]
    weights: bytes
    tokenizer: bytes
    params: int


@dataclass(frozen=True, slots=True)
class Expected:
    """The tensors a config's model holds (name -> shape); ``tied`` may be absent (they share
    another's storage, e.g. ``lm_head.weight`` with tied embeddings)."""

    shapes: dict[str, tuple[int, ...]]
    tied: frozenset[str]
    linear: frozenset[str]  # the linear modules' own names (q_proj, c_attn): what LoRA may target


def expected_tensors(model_type: str, options: Mapping[str, object]) -> Expected:
    """The state of ``model_type`` with ``options`` (its ``vocab_size`` included), built on the
    meta device: nothing is allocated. A ``BadModel`` for a config that does not build."""
    from transformers import AutoModelForCausalLM

    base = {k: v for k, v in options.items() if k not in ("lora", "init_weights", "tokenizer")}
    cfg = hf_config(model_type, base)
    if cfg.vocab_size is None:
        raise BadModel(f"model {model_type!r} starts from pretrained weights, so its options must give vocab_size")
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(library_config(cfg, cfg.vocab_size))
    names: dict[int, list[str]] = {}
    for n, p in lm.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    tied = frozenset(n for group in names.values() for n in group[1:])
    linear = frozenset(
        n.rsplit(".", 1)[-1]
        for n, m in lm.named_modules()
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
    )
    return Expected({k: tuple(v.shape) for k, v in lm.state_dict().items()}, tied, linear)


def check_lora_targets(model_type: str, options: Mapping[str, object], want: Expected | None = None) -> None:
    """The ``lora`` option's targets are linear modules of the model (a ``BadModel`` naming
    those it has otherwise): checked before anything is uploaded or any worker hired."""
    lora = hf_config(model_type, options).lora
    if lora is None:
        return
    want = want or expected_tensors(model_type, options)
    missing = [t for t in lora.targets if t not in want.linear]
    if missing:
        raise BadModel(
            f"lora targets {', '.join(missing)}: no such linear module in {model_type}; "
            f"it has {', '.join(sorted(want.linear))}"
        )


def check_names(found: Mapping[str, tuple[int, ...]], want: Expected) -> None:
    """Every name of ``found`` the model's, with its shape; only tied ones may be absent."""
    extra = sorted(set(found) - set(want.shapes))
    missing = sorted(set(want.shapes) - set(found) - want.tied)
    if extra or missing:
        raise BadModel(
            f"pretrained weights do not fit the config: missing {missing[:3]}, unexpected {extra[:3]}"
            + (f" ({len(missing)} missing, {len(extra)} unexpected in all)" if len(missing) + len(extra) > 6 else "")
        )
    for k in sorted(found):
        if tuple(found[k]) != want.shapes[k]:
            raise BadModel(f"pretrained weight {k} has shape {tuple(found[k])}; the config's is {want.shapes[k]}")


# --- the coordinator's check of an uploaded blob --------------------------------------------


def check_weights_file(path: Path, model_type: str, options: Mapping[str, object]) -> int:
    """Refuse (``BadModel``) a weights blob that is not safetensors, whose tensors do not fit
    the config by name and shape, are not float (at most 4 bytes a value), or whose data is not
    exactly those tensors' bytes; read from the header alone. Returns the values it holds."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise BadModel("pretrained weights are not a safetensors blob: shorter than its header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise BadModel(f"pretrained weights are not a safetensors blob: header length {n} for {size} bytes")
        raw = f.read(n)
    try:
        header = json.loads(raw)
        entries = {k: v for k, v in header.items() if k != "__metadata__"}
        found = {k: tuple(int(x) for x in v["shape"]) for k, v in entries.items()}
        spans = sorted((int(v["data_offsets"][0]), int(v["data_offsets"][1]), k) for k, v in entries.items())
        dtypes = {k: str(v["dtype"]) for k, v in entries.items()}
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
        raise BadModel(f"pretrained weights are not a safetensors blob: {e}") from None
    check_names(found, expected_tensors(model_type, options))
    end = 0
    for start, stop, k in spans:
        if dtypes[k] not in DTYPE_BYTES:
            raise BadModel(f"pretrained weight {k} is {dtypes[k]}; allowed: {', '.join(DTYPE_BYTES)}")
        if start != end or stop - start != _numel(found[k]) * DTYPE_BYTES[dtypes[k]]:
            raise BadModel(f"pretrained weight {k}: its bytes do not match its shape and dtype")
        end = stop
    if 8 + n + end != size:
        raise BadModel(f"pretrained weights: {size - 8 - n - end} bytes beyond the tensors the header lists")
    return sum(_numel(s) for s in found.values())


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


# --- the owner's machine: reading a model directory -----------------------------------------


def read_pretrained(path: str | Path) -> Pretrained:
    """The model directory at ``path`` checked and made ready to upload (see the module's
    docstring); a one-line ``UsageError`` (``BadModel`` for the model itself) otherwise."""
    d = Path(path).expanduser()
    where = f"--from-pretrained {path}"
    if not d.is_dir():
        raise BadModel(f"{where}: not a directory (a Hugging Face model directory: config.json, *.safetensors)")
    model_type, options = options_from_hf_config(read_config(d, where))
    want = expected_tensors(model_type, options)
    tensors = _read_weights(d, where)
    check_names({k: tuple(t.shape) for k, t in tensors.items()}, want)
    for k, t in tensors.items():
        if not torch.isfinite(t).all():
            raise BadModel(f"{where}: weight {k} holds NaN or Inf")
    from aitbc.training.checkpoint import tensors_to_bytes

    blob = tensors_to_bytes(dict(sorted(tensors.items())), {"format": FORMAT, "model": model_type})
    return Pretrained(
        model_type, options, blob, _tokenizer(d, where, options), sum(t.numel() for t in tensors.values())
    )


def read_config(d: Path, where: str) -> Any:
    """The directory's config.json, parsed (a one-line ``BadModel`` otherwise)."""
    p = d / "config.json"
    if not p.is_file():
        raise BadModel(f"{where}: no config.json (save the model with save_pretrained)")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise BadModel(f"{where}: config.json is {p.stat().st_size:,} bytes; at most {MAX_CONFIG_BYTES:,}")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise BadModel(f"{where}: config.json is not JSON ({' '.join(str(e).split())[:200]})") from None


def weight_files(d: Path, where: str) -> list[Path]:
    """The safetensors files holding the weights: the shards the index names, else the one
    ``*.safetensors``. A directory with only pickled weights is refused, unopened."""
    index = d / INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise BadModel(f"{where}: {INDEX} is not an index (a weight_map of shards): {e}") from None
        for name in names:
            if not isinstance(name, str) or Path(name).name != name or not name.endswith(".safetensors"):
                raise BadModel(f"{where}: {INDEX} names {name!r}; shards are .safetensors files in the directory")
            if not (d / name).is_file():
                raise BadModel(f"{where}: {INDEX} names shard {name}, which is not there")
        return [d / name for name in names]
    found = sorted(p for p in d.glob("*.safetensors") if p.is_file())
    if len(found) == 1:
        return found
    if len(found) > 1:
        raise BadModel(f"{where}: {len(found)} .safetensors files and no {INDEX} to say which hold the weights")
    pickled = sorted(p.name for p in d.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise BadModel(
            f"{where}: its weights are {pickled[0]}, a pickle, which aitbc never opens; save them as safetensors "
            "(model.save_pretrained(DIR, safe_serialization=True))"
        )
    raise BadModel(f"{where}: no *.safetensors weights")


def _read_weights(d: Path, where: str) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(d, where):
        try:
            with safe_open(str(path), framework="pt") as f:
                for k in f.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                    if k.endswith(_DERIVED):
                        continue
                    if k in tensors:
                        raise BadModel(f"{where}: weight {k} is in more than one shard")
                    t = f.get_tensor(k)
                    if not t.is_floating_point():
                        raise BadModel(f"{where}: weight {k} is {t.dtype}, not floating point")
                    tensors[k] = t if t.dtype in _KEPT else t.float()  # float64: stored as float32
        except (SafetensorError, OSError) as e:
            raise BadModel(f"{where}: {path.name} is not a safetensors file: {e}") from None
    return tensors


def _tokenizer(d: Path, where: str, options: Mapping[str, Any]) -> bytes:
    from aitbc.training.tokenizer import read_tokenizer

    p = d / "tokenizer.json"
    if not p.is_file():
        raise BadModel(
            f"{where}: no tokenizer.json; a fine-tune trains on the model's own tokens "
            "(save its fast tokenizer there: tokenizer.save_pretrained(DIR))"
        )
    tok = read_tokenizer(p)
    vocab = options.get("vocab_size")
    if isinstance(vocab, int) and tok.vocab_size > vocab:
        raise BadModel(f"{where}: tokenizer.json has {tok.vocab_size} tokens, more than the model's vocab_size {vocab}")
    return tok.data


def run_options(p: Pretrained, weights_cid: str, tokenizer_cid: str, lora: Mapping[str, Any] | None) -> dict[str, Any]:
    """The run's model options: the config's, the blobs' CIDs and the LoRA adapter if any."""
    out = dict(p.options) | {"init_weights": weights_cid, "tokenizer": tokenizer_cid}
    if lora is not None:
        out["lora"] = dict(lora)
    return out


def blob_cids(options: Mapping[str, object] | None) -> list[str]:
    """The blobs a run's model options name (``init_weights``, ``tokenizer``)."""
    opts = options or {}
    return [str(opts[k]) for k in ("init_weights", "tokenizer") if isinstance(opts.get(k), str)]
