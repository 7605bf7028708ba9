"""A run's model as a Hugging Face directory that loads with nothing of aitbc installed.

``export_hf`` writes what ``AutoModelForCausalLM.from_pretrained(DIR)`` and
``AutoTokenizer.from_pretrained(DIR)`` read: ``config.json`` (its ``bos``/``eos`` ids the
tokenizer's end-of-text token), ``model.safetensors``, ``generation_config.json``,
``tokenizer.json`` and ``tokenizer_config.json``. A LoRA run's model is written merged into
its base; with ``adapter_only`` the adapter alone (``adapter_config.json`` and
``adapter_model.safetensors``, which ``peft`` loads onto the base the run started from).

The directory appears whole or not at all: it is written beside its destination and renamed.
Only safetensors are written, never a pickle.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from aitbc.errors import UsageError
from aitbc.training.hf_models import HFCausalLM, LoraCausalLM, is_hf

# ``safetensors``: the run's checkpoint as stored (a built-in model loads it in plain PyTorch:
# docs/owner.md, "Use your model"); ``hf``: a Hugging Face model's directory.
FORMATS = ("safetensors", "hf")


def formats_of(model_type: str) -> tuple[str, ...]:
    """The ``download-model --format`` values a model of ``model_type`` has."""
    return FORMATS if is_hf(model_type) else ("safetensors",)


def check_format(model_type: str, fmt: str, *, adapter_only: bool = False, lora: bool = False) -> None:
    """A one-line :class:`UsageError` for a format the model does not have."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not one of: {', '.join(FORMATS)}")
    have = formats_of(model_type)
    if fmt not in have:
        raise UsageError(f"--format {fmt}: model {model_type!r} has only the format {', '.join(have)}")
    if adapter_only and (fmt != "hf" or not lora):
        raise UsageError("--adapter-only needs --format hf and a run that trains a LoRA adapter (init --lora)")


@dataclass(frozen=True, slots=True)
class Exported:
    """What :func:`export_hf` wrote: the directory and its files (names, sorted)."""

    path: Path
    files: tuple[str, ...]


def export_hf(model: nn.Module, tokenizer_json: bytes | None, out: Path, *, adapter_only: bool = False) -> Exported:
    """Write ``model`` (an :class:`~aitbc.training.hf_models.HFCausalLM`) and its tokenizer
    (``tokenizer.json`` bytes; None: no tokenizer files) into the new or empty folder ``out``."""
    if not isinstance(model, HFCausalLM):
        raise UsageError(f"--format hf needs a Hugging Face model (hf:...), not {type(model).__name__}")
    if adapter_only and not isinstance(model, LoraCausalLM):
        raise UsageError("--adapter-only needs a run that trains a LoRA adapter (init --lora)")
    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not an empty folder; give a new or empty folder")
    if not out.parent.is_dir():
        raise UsageError(f"no such folder: {out.parent}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        from transformers.utils import logging

        logging.disable_progress_bar()  # a library's bars on the CLI's output
        eos = None
        if tokenizer_json is not None:
            eos = _write_tokenizer(tokenizer_json, tmp)
            _portable_tokenizer_config(tmp, model.cfg.max_position_embeddings)
        if adapter_only:
            assert isinstance(model, LoraCausalLM)
            model.adapter().save_pretrained(str(tmp), safe_serialization=True)
        else:
            _write_model(model, tmp, eos)
        _readable(tmp)
        if out.exists():
            out.rmdir()  # empty, checked above
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Exported(out, tuple(sorted(p.name for p in out.iterdir())))


def _write_model(model: HFCausalLM, out: Path, eos: int | None) -> None:
    from transformers import GenerationConfig

    lm: Any = model.base_model()
    cfg = lm.config
    cfg.use_cache = True  # generation reuses keys and values (training turned it off)
    cfg.bos_token_id = cfg.eos_token_id = eos
    cfg.architectures = [type(lm).__name__]
    lm.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    lm.save_pretrained(str(out), safe_serialization=True)


def _write_tokenizer(data: bytes, out: Path) -> int | None:
    """``tokenizer.json`` and ``tokenizer_config.json`` as transformers writes them; returns
    the end-of-text id (None when the tokenizer has none)."""
    from transformers import PreTrainedTokenizerFast

    from aitbc.training.tokenizer import EOT_NAMES, parse_tokenizer

    tok = parse_tokenizer(data, "the run's tokenizer")
    found = [(n, i) for n in EOT_NAMES if (i := tok.token_to_id(n)) is not None]
    special = {"bos_token": found[0][0], "eos_token": found[0][0], "pad_token": found[0][0]} if found else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **special)
    fast.save_pretrained(str(out))
    return int(found[0][1]) if found else None


def _portable_tokenizer_config(out: Path, max_length: int) -> None:
    """Name the tokenizer's class as every transformers release since 4 reads it
    (``PreTrainedTokenizerFast``, not 5's own backend name), and its longest input."""
    path = out / "tokenizer_config.json"
    doc = json.loads(path.read_text())
    doc["tokenizer_class"] = "PreTrainedTokenizerFast"
    doc["model_max_length"] = max_length
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _readable(out: Path) -> None:
    """The folder and files as the user's umask makes new ones (a temporary folder is 0700)."""
    umask = os.umask(0)
    os.umask(umask)
    out.chmod(0o777 & ~umask)
    for f in out.iterdir():
        f.chmod(0o666 & ~umask)
