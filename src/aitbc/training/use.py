"""Using a run's model on the owner's machine: rebuild it from what the coordinator stores
(the model's name and options, the data's spec, a round's checkpoint, the tokenizer, a LoRA
run's base weights), then ``sample`` text from it or ``evaluate`` it on held-out data.

A language model reads token ids: the run's tokenizer's for a Hugging Face model, UTF-8
bytes for the built-in ``transformer``. A classifier (``mlp``, ``cnn``) evaluates on
labelled arrays (``.npz`` with ``x`` and ``y``, or ``digits``) and cannot sample.

Shape letters: B batch, T tokens, V vocabulary.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from aitbc.errors import UsageError
from aitbc.training.checkpoint import load_checkpoint, read_metadata
from aitbc.training.data_spec import DataSpec
from aitbc.training.hf_models import is_hf

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MAX_NEW_TOKENS = 4096
MAX_TEMPERATURE = 100.0
EVAL_BATCH = 16  # windows per forward pass
# Held-out text read at most (UTF-8 bytes): more is cut, and a warning says so.
MAX_EVAL_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class RunParts:
    """What rebuilding a run's model takes, as the coordinator stores it: ``checkpoint`` is
    a round's safetensors, ``tokenizer`` the run's ``tokenizer.json`` (token data), and
    ``base_weights`` a LoRA run's pretrained base (its ``init_weights`` blob)."""

    model_type: str
    model_options: Mapping[str, Any]
    spec: DataSpec
    checkpoint: bytes
    tokenizer: bytes | None = None
    base_weights: bytes | None = None


def spec_of_manifest(manifest: Mapping[str, Any]) -> DataSpec:
    """The data spec a run's manifest records (what every machine builds the model for)."""
    bad = UsageError("the run's data manifest has no valid spec (task, input_shape, num_classes)")
    try:
        s = manifest["spec"]
        task, shape, classes = s["task"], tuple(int(v) for v in s["input_shape"]), int(s["num_classes"])
    except (KeyError, TypeError, ValueError):
        raise bad from None
    if task == "language":
        return DataSpec("language", shape, classes)
    if task == "classification":
        return DataSpec("classification", shape, classes)
    raise bad


def base_weights_cid(model_type: str, options: Mapping[str, Any]) -> str | None:
    """The blob a run's checkpoint needs beside it: a LoRA run's base weights (its
    checkpoint holds the adapter alone); None for every other model."""
    if is_hf(model_type) and options.get("lora") is not None and options.get("init_weights"):
        return str(options["init_weights"])
    return None


def _local_options(model_type: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options to rebuild with: a full fine-tune's checkpoint holds every weight, so its
    pretrained start is not fetched again."""
    opts = dict(options)
    if is_hf(model_type) and opts.get("lora") is None:
        opts.pop("init_weights", None)
    return opts


@dataclass(slots=True)
class RunModel:
    """A run's model with its round's weights, ready to use on this machine."""

    model: nn.Module
    model_type: str
    spec: DataSpec
    round: int | None
    tokenizer: Tokenizer | None = None
    eot: int | None = None

    @property
    def language(self) -> bool:
        return self.spec.task == "language"

    @property
    def context(self) -> int:
        """Tokens the model reads at once: what it was trained on."""
        return int(getattr(self.model, "context", self.spec.input_shape[0]))

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:  # the built-in transformer reads bytes
            return list(text.encode("utf-8", errors="surrogatepass"))
        from aitbc.training.tokenizer import encode_text

        return encode_text(self.tokenizer, text)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return bytes(ids).decode("utf-8", errors="replace")
        from aitbc.training.tokenizer import decode

        return decode(self.tokenizer, ids)


def load_run_model(parts: RunParts) -> RunModel:
    """The run's model, built as every machine builds it (the library's own classes, no
    code from the coordinator), its weights the checkpoint's (checked: names, shapes, finite)."""
    name = parts.model_type
    check_usable(name, "load")
    from aitbc.training.models import build_model

    opts = _local_options(name, parts.model_options)
    with tempfile.TemporaryDirectory(prefix="aitbc-model-") as tmp:

        def weights(cid: str) -> Path:
            if parts.base_weights is None:
                raise UsageError(f"model {name!r} needs its base weights {cid}, and none were given")
            path = Path(tmp) / "base.safetensors"
            path.write_bytes(parts.base_weights)
            return path

        torch.manual_seed(0)  # every weight is the checkpoint's or the base's: the draw is overwritten
        model = build_model(name, parts.spec, opts, max_params=None, weights=weights)
    meta = load_checkpoint(model, parts.checkpoint)
    model.eval()
    rm = RunModel(model, name, parts.spec, _round(meta))
    if parts.tokenizer is not None:
        from aitbc.training.tokenizer import eot_id, load_tokenizer

        rm.tokenizer = load_tokenizer(parts.tokenizer)
        rm.eot = eot_id(rm.tokenizer)
    elif is_hf(name):
        raise UsageError(f"model {name!r} reads tokens, and the run's data names no tokenizer")
    return rm


def _round(meta: Mapping[str, str]) -> int | None:
    r = meta.get("round", "")
    return int(r) if r.isdigit() else None


def checkpoint_round(data: bytes) -> int | None:
    """The round a checkpoint says it is (None if it does not)."""
    return _round(read_metadata(data))


# --- sample --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SampleOptions:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0: the most likely token each step
    seed: int = 0

    def __post_init__(self) -> None:
        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NEW_TOKENS:
            raise UsageError(f"--max-new-tokens must be an integer from 1 to {MAX_NEW_TOKENS}, got {n!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= MAX_TEMPERATURE:
            raise UsageError(f"--temperature must be a number from 0 to {MAX_TEMPERATURE:g}, got {t!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise UsageError(f"--seed must be a non-negative integer, got {self.seed!r}")


@dataclass(frozen=True, slots=True)
class Sampled:
    """A continuation of a prompt: ``text`` (the new tokens only), how many tokens the
    prompt had and how many of them the model read (its last ``context``), and why it
    stopped (``length``: max_new_tokens; ``end_of_text``: the model ended the text)."""

    text: str
    prompt_tokens: int
    prompt_tokens_used: int
    new_tokens: int
    stopped: str
    context: int

    @property
    def prompt_cut(self) -> bool:
        return self.prompt_tokens_used < self.prompt_tokens


def check_prompt(prompt: object) -> None:
    if not isinstance(prompt, str) or not prompt:
        raise UsageError(f"--prompt must be non-empty text, got {prompt!r}")


def needs_language(rm: RunModel, what: str) -> None:
    if not rm.language:
        raise UsageError(
            f"{what}: model {rm.model_type!r} is a classifier; {what} needs a language model (transformer or hf:...)"
        )


@torch.no_grad()
def sample(rm: RunModel, prompt: str, opts: SampleOptions | None = None) -> Sampled:
    """Continue ``prompt`` token by token: each step reads the last ``context`` tokens and
    draws the next from the softmax of its logits / temperature (a generator seeded with
    ``seed``: the same seed, the same text), or takes the most likely at temperature 0."""
    opts = opts or SampleOptions()
    needs_language(rm, "sample")
    check_prompt(prompt)
    ids = rm.encode(prompt)
    if not ids:
        raise UsageError("--prompt encodes to no tokens")
    T = rm.context
    used = min(len(ids), T)
    seq = torch.tensor([ids[-used:]], dtype=torch.long)  # (1, t)
    gen = torch.Generator().manual_seed(opts.seed)
    new: list[int] = []
    stopped = "length"
    for _ in range(opts.max_new_tokens):
        logits = rm.model(seq[:, -T:])[0, -1].float()  # (1, t, V) -> (V,)
        if opts.temperature == 0:
            nxt = int(logits.argmax())
        else:
            probs = torch.softmax(logits / opts.temperature, dim=-1)
            nxt = int(torch.multinomial(probs, 1, generator=gen))
        if rm.eot is not None and nxt == rm.eot:
            stopped = "end_of_text"
            break
        new.append(nxt)
        seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)  # (1, t + 1)
    return Sampled(rm.decode(new), len(ids), used, len(new), stopped, T)


# --- evaluate ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Evaluated:
    """Mean loss over held-out data; for a language model per predicted token (``tokens``
    of them, in ``samples`` windows of at most ``context``) with its ``perplexity``
    (exp(loss)); for a classifier per sample, with ``accuracy``."""

    loss: float
    perplexity: float | None
    accuracy: float | None
    samples: int
    tokens: int | None
    documents: int | None
    context: int | None


def language_model(model_type: str) -> bool:
    """Whether ``model_type`` reads text (a Hugging Face family, the built-in transformer)."""
    return is_hf(model_type) or model_type == "transformer"


def check_usable(model_type: str, what: str) -> None:
    """Refuse, before anything is fetched, a model ``what`` (sample, evaluate) cannot use:
    code, and for ``sample`` a classifier."""
    if ":" in model_type and not is_hf(model_type):
        raise UsageError(
            f"{what}: model {model_type!r} is code (module:callable); build it yourself and load the "
            "downloaded safetensors file (download-model)"
        )
    if what == "sample" and not language_model(model_type):
        raise UsageError(f"sample: model {model_type!r} is a classifier; sample needs a language model")


@dataclass(frozen=True, slots=True)
class HeldOut:
    """The owner's held-out data, read before the model is fetched: ``documents`` for a
    language model, labelled arrays ``x`` ``(N, *S)`` and ``y`` ``(N,)`` for a classifier."""

    source: str
    documents: list[str] | None = None
    x: Tensor | None = None
    y: Tensor | None = None


def read_heldout(model_type: str, path: str, text_field: str = "text") -> HeldOut:
    """What ``evaluate`` reads at ``path``: text for a language model (a text file,
    ``.jsonl``/``.parquet`` with ``text_field``, a folder of them, a saved dataset; at most
    :data:`MAX_EVAL_BYTES`), labelled arrays for a classifier (``digits``, or an ``.npz``
    with ``x`` and ``y``)."""
    check_usable(model_type, "evaluate")
    if language_model(model_type):
        from aitbc.training.corpus import read_documents

        documents, _ = read_documents(path, text_field, max_bytes=MAX_EVAL_BYTES)
        return HeldOut(path, documents=documents)
    from aitbc.training.datasets import load_dataset

    data = load_dataset(path if path == "digits" else f"npz:{path}")
    x = torch.cat([data.train_x, data.val_x])  # (N, *S): the split is for training; all is held out here
    y = torch.cat([data.train_y, data.val_y])  # (N,)
    return HeldOut(path, x=x, y=y)


def evaluate(rm: RunModel, data: HeldOut) -> Evaluated:
    """The run's model on the owner's held-out ``data`` (:func:`read_heldout`)."""
    if data.documents is not None:
        return evaluate_text(rm, data.documents)
    assert data.x is not None and data.y is not None
    return evaluate_arrays(rm, data.source, data.x, data.y)


def evaluate_text(rm: RunModel, documents: list[str]) -> Evaluated:
    """``documents`` as the run's training data was made (ids, end-of-text after each; bytes
    joined by newlines for the built-in transformer), cut into windows of ``context`` tokens
    (a stream shorter than one window is one shorter window); loss per predicted token."""
    needs_language(rm, "evaluate")
    if rm.tokenizer is not None and rm.eot is not None:
        from aitbc.training.tokenizer import encode_documents

        stream = encode_documents(rm.tokenizer, documents, rm.eot)
    else:
        stream = list("\n".join(documents).encode("utf-8", errors="surrogatepass"))
    if len(stream) < 2:
        raise UsageError(f"the held-out text is {len(stream)} token(s); at least 2 are needed to predict one")
    from aitbc.training.datasets import windows

    T = min(rm.context, len(stream) - 1)
    x, y = windows(torch.tensor(stream, dtype=torch.long), T)  # (N, T) each
    loss = _language_loss(rm.model, x, y)
    return Evaluated(loss, _perplexity(loss), None, len(x), y.numel(), len(documents), T)


@torch.no_grad()
def _language_loss(model: nn.Module, x: Tensor, y: Tensor) -> float:
    total = 0.0
    for i in range(0, len(x), EVAL_BATCH):
        logits = model(x[i : i + EVAL_BATCH])  # (B, T, V)
        yb = y[i : i + EVAL_BATCH]  # (B, T)
        total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), yb.flatten(), reduction="sum"))
    return total / y.numel()


def _perplexity(loss: float) -> float | None:
    return math.exp(loss) if loss < 700 else None  # exp overflows a float past ~709: no number to give


def evaluate_arrays(rm: RunModel, source: str, x: Tensor, y: Tensor) -> Evaluated:
    """A classifier on every sample ``x`` ``(N, *S)``, ``y`` ``(N,)``: mean loss and accuracy."""
    if rm.language:
        raise UsageError(f"evaluate: model {rm.model_type!r} reads text; give text (--data-path a corpus)")
    from aitbc.training.local import evaluate as mean_loss

    if tuple(x.shape[1:]) != tuple(rm.spec.input_shape):
        raise UsageError(
            f"{source}: samples of shape {tuple(x.shape[1:])}; the model takes {tuple(rm.spec.input_shape)}"
        )
    if int(y.max()) >= rm.spec.num_classes:
        raise UsageError(f"{source}: label {int(y.max())}; the model has classes 0..{rm.spec.num_classes - 1}")
    with torch.no_grad():
        loss, acc = mean_loss(rm.model, x, y)
    return Evaluated(loss, None, acc, len(x), None, None, None)
