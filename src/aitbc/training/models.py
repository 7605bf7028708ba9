"""Model registry: ``mlp``, ``cnn``, ``transformer``, a Hugging Face family (``hf:llama``,
``hf:gpt2``, ``hf:qwen2``, ``hf:mistral``: :mod:`aitbc.training.hf_models`), or a user's
``package.module:callable``.

A model is named by a registry name plus a typed config, never shipped as code: a
provider builds it locally (see DESIGN.md, trust boundaries). Every model maps a batch
of inputs to logits: ``(B, C)`` for classification, ``(B, T, V)`` for language data.

Trust: a built-in model's options are bounded (:data:`MAX_LAYERS`, :data:`MAX_WIDTH`,
:data:`MAX_CONTEXT`, and :data:`MAX_SAMPLE_BYTES` of activations for one sample's forward
pass) and every model's parameters by the caller's ``max_params`` (the run's limit, the
coordinator's ``--max-params``; the provider's own), each counted from the config before
anything is built. A ``module:callable`` is imported only where this machine's operator
allowed its module prefix (``allow_code``; ``True`` for ``aitbc simulate``, the user's own
code on the user's own machine); otherwise it is refused without importing anything.

Shape letters: B batch, T sequence length, C channels or classes, V vocabulary (256),
D model width, H attention heads.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aitbc import run_defaults
from aitbc.core.options import build_config
from aitbc.core.registry import Registry
from aitbc.errors import UsageError
from aitbc.training.allow_code import AllowCode, code_allowed
from aitbc.training.data_spec import DataSpec
from aitbc.training.hf_models import (
    HFConfig,
    Weights,
    build_hf,
    count_hf_params,
    hf_config,
    hf_sample_bytes,
    is_hf,
)

MODELS: Registry[Any] = Registry("model")

# Bounds on a built-in model (documented in docs/trust-model.md). They admit every
# model the project's tests, examples and benchmarks use (the largest, the default
# 470k-parameter transformer) with room to spare; what they refuse is an owner making
# every hired machine allocate gigabytes.
MAX_LAYERS = 48  # mlp hidden layers, cnn stages, transformer blocks
MAX_WIDTH = 8192  # mlp hidden size, cnn channels and hidden size, transformer d_model
MAX_CONTEXT = 8192  # transformer context (tokens)
# Activations one sample's evaluation forward pass may need (float32, counted by
# sample_bytes): the coordinator evaluates and scores in batches cut to its eval_memory_mb
# (at least this), so however long the sequences or wide the layers, one pass fits it. The
# largest transformer context at the default width fits (8192 tokens at d_model 128: 80 MiB).
MAX_SAMPLE_BYTES = 128 << 20
VOCAB = 256  # a language model's classes: bytes


class CodeNotAllowed(UsageError):
    """A ``module:callable`` model this machine's operator did not allow (nothing imported)."""


def _bounded(name: str, value: int, hi: int) -> None:
    if not 1 <= value <= hi:
        raise ValueError(f"{name} must be in [1, {hi}], got {value}")


def _bounded_layers(name: str, values: tuple[int, ...]) -> None:
    if not 1 <= len(values) <= MAX_LAYERS:
        raise ValueError(f"{name} must list 1 to {MAX_LAYERS} layers, got {len(values)}")
    for v in values:
        _bounded(f"each of {name}", v, MAX_WIDTH)


@dataclass(kw_only=True, slots=True)
class MLPConfig:
    hidden: tuple[int, ...] = (128, 64)

    def __post_init__(self) -> None:
        _bounded_layers("hidden", self.hidden)


@MODELS.register("mlp")
class MLP(nn.Module):
    Config = MLPConfig

    def __init__(self, cfg: MLPConfig, spec: DataSpec) -> None:
        super().__init__()
        if spec.task != "classification":
            raise UsageError("model 'mlp' needs a classification dataset; use 'transformer' for text")
        d_in = math.prod(spec.input_shape)
        layers: list[nn.Module] = []
        for h in cfg.hidden:
            layers += [nn.Linear(d_in, h), nn.ReLU()]
            d_in = h
        layers.append(nn.Linear(d_in, spec.num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.flatten(1).float())  # (B, *S) -> (B, prod S) -> (B, C)


@dataclass(kw_only=True, slots=True)
class CNNConfig:
    channels: tuple[int, ...] = (16, 32)
    hidden: int = 64

    def __post_init__(self) -> None:
        _bounded_layers("channels", self.channels)
        _bounded("hidden", self.hidden, MAX_WIDTH)


@MODELS.register("cnn")
class CNN(nn.Module):
    """3x3 conv + ReLU per stage, 2x2 max-pool while the image is at least 4 pixels
    wide, then global average pooling: works for 8x8 digits and 28x28 MNIST alike."""

    Config = CNNConfig

    def __init__(self, cfg: CNNConfig, spec: DataSpec) -> None:
        super().__init__()
        shape = spec.input_shape
        if spec.task != "classification" or len(shape) not in (2, 3):
            raise UsageError(f"model 'cnn' needs image inputs of shape (C,H,W) or (H,W); the dataset gives {shape}")
        self.add_channel = len(shape) == 2
        c_in, size = (1 if self.add_channel else shape[0]), min(shape[-2:])
        stages: list[nn.Module] = []
        for c in cfg.channels:
            stages += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU()]
            if size >= 4:
                stages.append(nn.MaxPool2d(2))
                size //= 2
            c_in = c
        self.features = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.Linear(c_in, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, spec.num_classes))

    def forward(self, x: Tensor) -> Tensor:
        x = x.float()
        if self.add_channel:
            x = x.unsqueeze(1)  # (B, H, W) -> (B, 1, H, W)
        h = self.features(x).mean(dim=(2, 3))  # (B, C', H', W') -> (B, C')
        return self.head(h)  # (B, classes)


@dataclass(kw_only=True, slots=True)
class TransformerConfig:
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    context: int = 128
    dropout: float = 0.0

    def __post_init__(self) -> None:
        _bounded("d_model", self.d_model, MAX_WIDTH)
        _bounded("n_layers", self.n_layers, MAX_LAYERS)
        _bounded("n_heads", self.n_heads, self.d_model)
        _bounded("context", self.context, MAX_CONTEXT)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


class _Block(nn.Module):
    """Pre-norm decoder block (GPT-2 style): x + attn(ln(x)), x + mlp(ln(x))."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.n_heads, self.dropout = cfg.n_heads, cfg.dropout
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)  # 3 x (B, T, D)
        q, k, v = (t.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D/H)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )  # (B, H, T, D/H)
        y = y.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


@MODELS.register("transformer")
class Transformer(nn.Module):
    """Decoder-only byte-level language model (the nanoGPT shape, untied head)."""

    Config = TransformerConfig

    def __init__(self, cfg: TransformerConfig, spec: DataSpec) -> None:
        super().__init__()
        if spec.task != "language":
            raise UsageError("model 'transformer' needs a text dataset (text:PATH or stdlib)")
        if spec.input_shape[0] > cfg.context:
            raise UsageError(f"sequences of {spec.input_shape[0]} bytes exceed the model context {cfg.context}")
        self.context = cfg.context
        self.tok = nn.Embedding(spec.num_classes, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, spec.num_classes, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: Tensor) -> Tensor:
        idx = idx.long()  # byte corpora are stored as uint8
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.tok(idx) + self.pos(pos)  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, T, V)


def model_config(
    name: str, options: Mapping[str, object] | None = None, *, max_params: int | None = run_defaults.MAX_PARAMS
) -> Any:
    """The typed config of a registered or Hugging Face model (``None`` for a user model, not
    imported); unknown keys, wrong types and out-of-range sizes -> ``UsageError`` naming the
    option; a model of more than ``max_params`` parameters (None: no cap) refused."""
    if is_hf(name):
        cfg: Any = hf_config(name, options)
    elif ":" in name:
        return None
    else:
        cfg = build_config(MODELS.get(name).Config, options, what=f"model {name!r}")
    check_params(name, count_params(name, cfg, None), max_params, lower_bound=True)  # before the data is known
    check_sample_bytes(name, cfg, None)  # a transformer's at its full context; the others' once the data is known
    return cfg


class TooManyParams(UsageError):
    """A model over the parameter cap it was checked against (the run's or the offer's)."""

    def __init__(self, message: str, params: int, cap: int) -> None:
        super().__init__(message)
        self.params, self.cap = params, cap


def check_params(name: str, n: int, max_params: int | None, *, lower_bound: bool = False) -> None:
    """A :class:`TooManyParams` when model ``name``'s ``n`` parameters pass ``max_params``."""
    if max_params is not None and n > max_params:
        what = "at least " if lower_bound else ""
        where = "" if lower_bound else " for this data"
        raise TooManyParams(
            f"model {name!r} has {what}{n:,} parameters{where}; at most {max_params:,} are allowed here (--max-params)",
            n,
            max_params,
        )


def sample_bytes(name: str, cfg: Any, spec: DataSpec | None, *, training: bool = False) -> int:
    """Bytes of float32 activations one sample of built-in model ``name`` holds at most in
    a forward pass (``training``: a training step's, whose backward pass keeps every
    layer's), counted from the config without building anything; with ``spec`` None, a
    transformer's at its full context and the others' for a one-value input (a lower
    bound). An upper estimate of what torch allocates (measured on the CPU: a transformer's
    evaluation holds about 15 x T x D values at its peak, counted here as 16 x T x D plus
    2 x T x V for the logits and their loss; tests/training/test_model_bounds.py)."""
    if is_hf(name):
        tokens = spec.input_shape[0] if spec is not None else cfg.context
        vocab = spec.num_classes if spec is not None else (cfg.vocab_size or VOCAB)
        return hf_sample_bytes(cfg, tokens, vocab, training=training)
    shape = spec.input_shape if spec is not None else (1,)
    classes = spec.num_classes if spec is not None else (VOCAB if name == "transformer" else 1)
    if name == "mlp":
        values = math.prod(shape) + sum(2 * h for h in cfg.hidden) + 3 * classes
        return 4 * values * (3 if training else 1)
    if name == "cnn":
        c, size = (shape[0] if len(shape) == 3 else 1), min(shape[-2:]) if len(shape) >= 2 else 1
        h, w = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, 1)
        values = c * h * w
        for ch in cfg.channels:
            values += 3 * ch * h * w  # conv, ReLU, pool (or the next stage's input)
            if size >= 4:
                h, w, size = h // 2, w // 2, size // 2
        values += 2 * cfg.hidden + 3 * classes
        return 4 * values * (3 if training else 1)
    if name == "transformer":
        t = shape[0] if spec is not None else cfg.context
        d = cfg.d_model
        if training:  # every block's activations kept for the backward pass
            return 4 * t * (cfg.n_layers * 16 * d + 8 * d + 4 * classes)
        return 4 * t * (16 * d + 2 * classes)
    raise UsageError(f"unknown model {name!r}; allowed: {', '.join(MODELS.names())}")


def step_bytes(name: str, cfg: Any, spec: DataSpec, batch: int) -> int:
    """Bytes one training step of ``batch`` samples holds at most: each sample's kept
    activations, and the parameters' gradients with an optimizer's state (Adam's two
    moments) and one spare copy, 4 x the parameters in float32."""
    return batch * sample_bytes(name, cfg, spec, training=True) + 16 * count_params(name, cfg, spec)


def check_sample_bytes(name: str, cfg: Any, spec: DataSpec | None) -> None:
    """Refuse (``UsageError`` naming the option and its allowed range) a built-in model one
    of whose samples needs more than :data:`MAX_SAMPLE_BYTES` of activations to evaluate."""
    need = sample_bytes(name, cfg, spec)
    if need <= MAX_SAMPLE_BYTES:
        return
    cap = f"{MAX_SAMPLE_BYTES >> 20} MiB"
    if is_hf(name):
        t = spec.input_shape[0] if spec is not None else cfg.context
        most = max(1, MAX_SAMPLE_BYTES * t // need)
        raise UsageError(
            f"model {name!r}: one sample of {t} tokens needs {need / 2**20:.0f} MiB of activations to evaluate, "
            f"more than the {cap} allowed; context must be in [1, {most}] at this width and vocabulary"
        )
    if name == "transformer":
        t = spec.input_shape[0] if spec is not None else cfg.context
        per_token = 4 * (16 * cfg.d_model + 2 * (spec.num_classes if spec is not None else VOCAB))
        most = MAX_SAMPLE_BYTES // per_token
        what = "context" if spec is None else "the data's sequence length (and so context)"
        raise UsageError(
            f"model 'transformer': one sample of {t} tokens at d_model {cfg.d_model} needs {need / 2**20:.0f} MiB "
            f"of activations to evaluate, more than the {cap} allowed; {what} must be in [1, {most}] at this "
            "d_model (the width bound keeps that range from being empty)"
        )
    shape = spec.input_shape if spec is not None else (1,)
    option = "hidden" if name == "mlp" else "channels"
    raise UsageError(
        f"model {name!r}: one sample of shape {tuple(shape)} needs {need / 2**20:.0f} MiB of activations to "
        f"evaluate with these options, more than the {cap} allowed; make {option} smaller or the inputs smaller"
    )


def count_params(name: str, cfg: Any, spec: DataSpec | None) -> int:
    """Parameters of built-in model ``name`` with config ``cfg``, counted without building
    it (a Hugging Face model on the meta device); with ``spec`` None, a lower bound (one
    input value, one class; the smallest vocabulary)."""
    if is_hf(name):
        return count_hf_params(name, cfg, spec.num_classes if spec is not None else None)
    shape = spec.input_shape if spec is not None else (1,)
    classes = spec.num_classes if spec is not None else 1

    def linear(a: int, b: int) -> int:
        return a * b + b

    if name == "mlp":
        sizes = [math.prod(shape), *cfg.hidden]
        return sum(linear(a, b) for a, b in zip(sizes, sizes[1:])) + linear(sizes[-1], classes)
    if name == "cnn":
        c_in = shape[0] if len(shape) == 3 else 1
        n = 0
        for c in cfg.channels:
            n += c_in * c * 9 + c  # 3x3 conv
            c_in = c
        return n + linear(c_in, cfg.hidden) + linear(cfg.hidden, classes)
    if name == "transformer":
        d = cfg.d_model
        block = 2 * 2 * d + linear(d, 3 * d) + linear(d, d) + linear(d, 4 * d) + linear(4 * d, d)
        return classes * d + cfg.context * d + cfg.n_layers * block + 2 * d + d * classes
    raise UsageError(f"unknown model {name!r}; allowed: {', '.join(MODELS.names())}")


def check_model(
    name: str,
    options: Mapping[str, object] | None,
    *,
    allow_code: AllowCode = (),
    max_params: int | None = run_defaults.MAX_PARAMS,
) -> Any:
    """Refuse what this machine will not build, without importing or building anything:
    a ``module:callable`` its operator did not allow (:class:`CodeNotAllowed`), or a
    built-in or Hugging Face model's bad or out-of-range options or too many parameters.
    Returns the config (None for code)."""
    if ":" in name and not is_hf(name):
        module, _, attr = name.partition(":")
        if not module or not attr:
            raise UsageError(f"user model {name!r} must look like package.module:callable")
        if not code_allowed(name, allow_code):
            allowed = ", ".join(allow_code) if not isinstance(allow_code, bool) else ""
            raise CodeNotAllowed(
                f"model {name!r} is code (module:callable), and this machine's operator allows "
                f"{'only modules under ' + allowed if allowed else 'no code'} (--allow-code PREFIX); "
                f"use one of the built-in models: {', '.join(MODELS.names())}"
            )
        return None
    return model_config(name, options, max_params=max_params)


def build_model(
    name: str,
    spec: DataSpec,
    options: Mapping[str, object] | None = None,
    *,
    allow_code: AllowCode = (),
    max_params: int | None = run_defaults.MAX_PARAMS,
    weights: Weights | None = None,
) -> nn.Module:
    """Build model ``name`` for data described by ``spec``.

    ``name`` is a registry name, a Hugging Face family (``hf:llama``) or
    ``package.module:callable`` (imported only if ``allow_code`` allows it); a user callable
    gets the options as keyword arguments, plus ``spec`` when its signature takes it. A
    built-in or Hugging Face model's parameters are counted first: past ``max_params`` (None:
    no cap) it is refused before any tensor is allocated. ``weights`` resolves a blob's CID
    to a local file: a model that starts from pretrained weights (``init_weights``) needs it."""
    cfg = check_model(name, options, allow_code=allow_code, max_params=max_params)
    if cfg is None:
        return _build_user_model(name, spec, options or {})
    check_params(name, count_params(name, cfg, spec), max_params)
    check_sample_bytes(name, cfg, spec)
    if isinstance(cfg, HFConfig):
        return _build_hf_model(name, cfg, spec, weights)
    return MODELS.get(name)(cfg, spec)


def _build_hf_model(name: str, cfg: HFConfig, spec: DataSpec, weights: Weights | None) -> nn.Module:
    if spec.task != "language":
        raise UsageError(f"model {name!r} needs a text dataset (a .txt, .jsonl or .parquet corpus, or stdlib)")
    if spec.input_shape[0] > cfg.max_position_embeddings:
        raise UsageError(
            f"sequences of {spec.input_shape[0]} tokens exceed the model's max_position_embeddings "
            f"{cfg.max_position_embeddings}"
        )
    return build_hf(name, cfg, spec.num_classes, weights)


def _build_user_model(name: str, spec: DataSpec, options: Mapping[str, object]) -> nn.Module:
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise UsageError(f"user model {name!r} must look like package.module:callable")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise UsageError(
            f"cannot load user model {name!r} ({type(e).__name__}: {e}); "
            f"install the module on this machine or use one of: {', '.join(MODELS.names())}"
        ) from None
    if not callable(fn):
        raise UsageError(f"user model {name!r} names a {type(fn).__name__}, not a callable returning a torch.nn.Module")
    kwargs = dict(options)
    params = inspect.signature(fn).parameters
    if "spec" in params:
        kwargs["spec"] = spec
    try:
        model = fn(**kwargs)
    except TypeError as e:
        raise UsageError(f"user model {name!r} rejected its options: {e}") from None
    if not isinstance(model, nn.Module):
        raise UsageError(f"user model {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model
