"""Model registry: ``mlp``, ``cnn``, ``transformer``, or a user's ``package.module:callable``.

A model is named by a registry name plus a typed config, never shipped as code: a
provider builds it locally (see DESIGN.md, trust boundaries). Every model maps a batch
of inputs to logits: ``(B, C)`` for classification, ``(B, T, V)`` for language data.

Shape letters: B batch, T sequence length, C channels or classes, V vocabulary (256),
D model width, H attention heads.
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aitbc.core.options import build_config
from aitbc.core.registry import Registry
from aitbc.errors import UsageError
from aitbc.training.data_spec import DataSpec

MODELS: Registry[Any] = Registry("model")


@dataclass(kw_only=True, slots=True)
class MLPConfig:
    hidden: tuple[int, ...] = (128, 64)

    def __post_init__(self) -> None:
        if not self.hidden or any(h <= 0 for h in self.hidden):
            raise ValueError(f"hidden sizes must be positive, got {self.hidden}")


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
        if not self.channels or any(c <= 0 for c in self.channels) or self.hidden <= 0:
            raise ValueError(f"channels and hidden must be positive, got {self.channels}, {self.hidden}")


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
        for name in ("d_model", "n_layers", "n_heads", "context"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
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


def model_config(name: str, options: dict[str, Any] | None = None) -> Any:
    """The typed config of a registered model (``None`` for a user model)."""
    if ":" in name:
        return None
    cls = MODELS.get(name)
    return build_config(cls.Config, options, what=f"model {name!r}")


def build_model(name: str, spec: DataSpec, options: dict[str, Any] | None = None) -> nn.Module:
    """Build model ``name`` for data described by ``spec``.

    ``name`` is a registry name or ``package.module:callable``; a user callable gets the
    options as keyword arguments, plus ``spec`` when its signature takes it."""
    if ":" in name:
        return _build_user_model(name, spec, options or {})
    cls = MODELS.get(name)
    return cls(model_config(name, options), spec)


def _build_user_model(name: str, spec: DataSpec, options: dict[str, Any]) -> nn.Module:
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
