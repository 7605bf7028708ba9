"""Hugging Face causal language models by configuration: ``hf:llama``, ``hf:gpt2``,
``hf:qwen2``, ``hf:mistral``.

A run names a family and its config fields (``--model-opt hidden_size=256,...``); every
machine builds the model from the ``transformers`` library's own, installed classes. Never
``trust_remote_code``, never a config's ``auto_map``, never a pickle: a config naming
anything else is refused (:func:`options_from_hf_config`). Every field is checked against an
allow-list with ranges, and the parameters are counted on the meta device before any
tensor is allocated (:func:`count_hf_params`).

The module a run trains is an :class:`HFCausalLM`: token ids ``(B, T)`` -> logits
``(B, T, V)``, the HF model at ``.lm``. With LoRA (``peft``) it is a :class:`LoraCausalLM`,
whose ``parameters()`` and ``state_dict()`` are the adapter's alone, so updates, codecs,
aggregation, checkpoints and proofs carry only the adapter; the frozen base comes from the
run's ``init_weights`` blob (safetensors, the HF model's own key names).

Shape letters: B batch, T tokens, V vocabulary, D hidden size, I intermediate size,
L layers.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from aitbc.core.options import build_config
from aitbc.errors import UsageError

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

# Our code paths never reach the Hub: a missing file is an error, not a download.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

PREFIX = "hf:"
FAMILIES = ("llama", "gpt2", "qwen2", "mistral")
# The library class each family's config must name (config.json "architectures").
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
# Bounds on a config's sizes (docs/trust-model.md): what an owner may make every hired
# machine build. The parameter cap itself is the run's (the coordinator's --max-params) and
# the offer's.
MAX_LAYERS = 128
MAX_HIDDEN = 16384
MAX_INTERMEDIATE = 65536
MAX_HEADS = 256
MAX_POSITIONS = 32768
MAX_VOCAB = 262144
DEFAULT_CONTEXT = 128  # tokens per training sample when the run does not say
ACTIVATIONS = ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "swish")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_CID = re.compile(r"^[a-z0-9]{8,128}$")


class BadModel(UsageError):
    """A model config this machine will not build (the API's 422 ``bad_model``)."""


def is_hf(name: str) -> bool:
    """``name`` is a Hugging Face family (``hf:llama``), not a built-in or user code."""
    return name.startswith(PREFIX)


def family_of(name: str) -> str:
    fam = name[len(PREFIX) :]
    if fam not in FAMILIES:
        raise BadModel(
            f"model {name!r}: unknown Hugging Face family {fam!r}; allowed: {', '.join(PREFIX + f for f in FAMILIES)}"
        )
    return fam


def _bounded(name: str, value: int | None, lo: int, hi: int) -> None:
    if value is not None and not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")


@dataclass(kw_only=True, slots=True)
class LoraSpec:
    """A LoRA adapter: rank ``r``, scale ``alpha / r``, dropout on its input, and the names
    of the linear modules it wraps (e.g. ``q_proj``, ``v_proj``; GPT-2's ``c_attn``)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    targets: tuple[str, ...] = ("q_proj", "v_proj")

    def __post_init__(self) -> None:
        _bounded("lora r", self.r, 1, 1024)
        _bounded("lora alpha", self.alpha, 1, 65536)
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora dropout must be in [0, 1), got {self.dropout}")
        if not 1 <= len(self.targets) <= 16:
            raise ValueError(f"lora targets must name 1 to 16 modules, got {len(self.targets)}")
        for t in self.targets:
            if not _NAME.match(t):
                raise ValueError(f"lora target {t!r} must be a module name (letters, digits, _)")


def parse_lora(text: str) -> dict[str, Any]:
    """``"r=16,alpha=32,dropout=0.05,targets=q_proj,v_proj"`` -> the ``lora`` model option
    (a bare item after ``targets=`` is one more target). A ``UsageError`` names a bad key."""
    out: dict[str, Any] = {}
    targets: list[str] = []
    key = ""
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        k, sep, v = part.partition("=")
        if sep:
            key = k.strip().replace("-", "_")
            if key == "targets":
                targets += [t for t in re.split(r"[+ ]", v.strip()) if t]
            else:
                out[key] = v.strip()
        elif key == "targets":
            targets.append(part)
        else:
            raise UsageError(f"--lora item {part!r} must be KEY=VALUE (keys: r, alpha, dropout, targets)")
    if targets:
        out["targets"] = targets
    spec = build_config(LoraSpec, out, what="--lora")
    return asdict(spec) | {"targets": list(spec.targets)}


@dataclass(kw_only=True, slots=True)
class HFConfig:
    """The config fields a run may set (the rest are the family's defaults). ``context`` is
    the tokens per training sample (at most ``max_position_embeddings``); ``vocab_size`` is
    normally left unset and taken from the data's tokenizer. ``init_weights`` and
    ``tokenizer`` name blobs (a pretrained model's weights, its ``tokenizer.json``) that
    ``init --from-pretrained`` uploaded and pinned to the run."""

    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    intermediate_size: int | None = None
    max_position_embeddings: int = 512
    context: int | None = None
    vocab_size: int | None = None
    head_dim: int | None = None
    rope_theta: float | None = None
    rms_norm_eps: float | None = None
    hidden_act: str | None = None
    tie_word_embeddings: bool | None = None
    attention_bias: bool | None = None
    init_weights: str | None = None
    tokenizer: str | None = None
    lora: LoraSpec | None = None
    family: str = field(default="llama")

    def __post_init__(self) -> None:
        _bounded("hidden_size", self.hidden_size, 1, MAX_HIDDEN)
        _bounded("num_hidden_layers", self.num_hidden_layers, 1, MAX_LAYERS)
        _bounded("num_attention_heads", self.num_attention_heads, 1, MAX_HEADS)
        _bounded("num_key_value_heads", self.num_key_value_heads, 1, self.num_attention_heads)
        _bounded("intermediate_size", self.intermediate_size, 1, MAX_INTERMEDIATE)
        _bounded("max_position_embeddings", self.max_position_embeddings, 1, MAX_POSITIONS)
        _bounded("context", self.context, 1, self.max_position_embeddings)
        _bounded("vocab_size", self.vocab_size, 2, MAX_VOCAB)
        _bounded("head_dim", self.head_dim, 1, 1024)
        if self.context is None:
            self.context = min(DEFAULT_CONTEXT, self.max_position_embeddings)
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({self.num_attention_heads})"
            )
        kv = self.num_key_value_heads
        if kv is not None and self.num_attention_heads % kv:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by num_key_value_heads ({kv})"
            )
        if self.rope_theta is not None and not 1 <= self.rope_theta <= 1e9:
            raise ValueError(f"rope_theta must be in [1, 1e9], got {self.rope_theta}")
        if self.rms_norm_eps is not None and not 0 < self.rms_norm_eps <= 0.1:
            raise ValueError(f"rms_norm_eps must be in (0, 0.1], got {self.rms_norm_eps}")
        if self.hidden_act is not None and self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {', '.join(ACTIVATIONS)}, got {self.hidden_act!r}")
        if self.init_weights is not None and not _CID.match(self.init_weights):
            raise ValueError(f"init_weights must be a blob's CID, got {self.init_weights!r}")
        if self.tokenizer is not None and not _CID.match(self.tokenizer):
            raise ValueError(f"tokenizer must be a blob's CID, got {self.tokenizer!r}")
        if self.lora is not None and self.init_weights is None:
            raise ValueError("lora needs pretrained weights to adapt (init --from-pretrained DIR)")
        if self.family == "gpt2" and self.num_key_value_heads is not None:
            raise ValueError("num_key_value_heads: hf:gpt2 has none (every head has its own keys)")


# What a run may set: every config field but the family, which the model type names.
OPTION_NAMES = tuple(f.name for f in fields(HFConfig) if f.name != "family")


def hf_config(name: str, options: Mapping[str, object] | None) -> HFConfig:
    """The typed config of ``hf:FAMILY`` with ``options``; a ``BadModel`` naming the field
    for an unknown field, a wrong type or a value out of range."""
    fam = family_of(name)
    opts = dict(options or {})
    if "family" in opts:
        raise BadModel(f"model {name!r}: 'family' is set by the model type, not an option")
    unknown = sorted(set(opts) - set(OPTION_NAMES))
    if unknown:
        raise BadModel(f"unknown model {name!r} option {unknown[0]!r}; allowed: {', '.join(OPTION_NAMES)}")
    raw = opts.pop("lora", None)
    lora: LoraSpec | None = None
    try:
        if raw is not None:
            if isinstance(raw, str):
                raw = parse_lora(raw)
            if not isinstance(raw, Mapping):
                raise UsageError(f"model {name!r} option lora must be an object (r, alpha, dropout, targets)")
            lora = build_config(LoraSpec, raw, what=f"model {name!r} lora")
        cfg = build_config(HFConfig, opts | {"family": fam}, what=f"model {name!r}")
    except BadModel:
        raise
    except UsageError as e:
        raise BadModel(str(e)) from None
    if lora is not None:
        cfg.lora = lora
        try:
            cfg.__post_init__()
        except ValueError as e:
            raise BadModel(f"model {name!r}: {e}") from None
    return cfg


def config_options(cfg: HFConfig) -> dict[str, Any]:
    """``cfg`` as the JSON-able model options it was built from (``family`` left out)."""
    out = asdict(cfg)
    out.pop("family")
    if cfg.lora is not None:
        out["lora"] = asdict(cfg.lora) | {"targets": list(cfg.lora.targets)}
    return out


def library_config(cfg: HFConfig, vocab_size: int) -> PretrainedConfig:
    """The ``transformers`` config of ``cfg`` for data of a ``vocab_size``-token tokenizer:
    its embedding rows are the config's ``vocab_size`` where it gives one (a pretrained
    model often has more rows than its tokenizer has tokens: Qwen2's 151,936 for 151,665),
    else the tokenizer's. Dropout is off in every family: a spot check replays a worker's
    steps, and a data-parallel worker's ranks would each draw their own masks."""
    from transformers import CONFIG_MAPPING

    if cfg.vocab_size is not None and cfg.vocab_size < vocab_size:
        raise BadModel(
            f"vocab_size {cfg.vocab_size} is smaller than the data's tokenizer ({vocab_size} tokens); "
            f"leave vocab_size unset to take the tokenizer's, or give at least {vocab_size}"
        )
    kw: dict[str, Any] = {
        "vocab_size": cfg.vocab_size or vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "max_position_embeddings": cfg.max_position_embeddings,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "use_cache": False,
    }
    optional = {
        "num_key_value_heads": cfg.num_key_value_heads if cfg.family != "gpt2" else None,
        "head_dim": cfg.head_dim,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.attention_bias,
    }
    if cfg.family == "gpt2":
        kw |= {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
        kw["n_inner"] = cfg.intermediate_size
        if cfg.hidden_act is not None:
            kw["activation_function"] = cfg.hidden_act
        optional["rms_norm_eps"] = optional["attention_bias"] = optional["rope_theta"] = optional["head_dim"] = None
    else:
        kw["intermediate_size"] = cfg.intermediate_size or 4 * cfg.hidden_size
        kw["num_key_value_heads"] = cfg.num_key_value_heads or cfg.num_attention_heads
        kw["attention_dropout"] = 0.0
        if cfg.hidden_act is not None:
            kw["hidden_act"] = cfg.hidden_act
    kw |= {k: v for k, v in optional.items() if v is not None}
    return CONFIG_MAPPING[cfg.family](**kw)


@functools.lru_cache(maxsize=64)
def _meta_counts(name: str, key: str, vocab_size: int) -> tuple[int, int]:
    """(all parameters, trained parameters) of the model, built on the meta device."""
    import json

    cfg = hf_config(name, json.loads(key))
    with torch.device("meta"):
        model = _assemble(cfg, vocab_size)
    total = sum(p.numel() for p in model.all_parameters())
    trained = sum(p.numel() for p in model.parameters())
    return total, trained


def count_hf_params(name: str, cfg: HFConfig, vocab_size: int | None) -> int:
    """Parameters of the model (base and adapter alike), counted on the meta device: no
    memory is allocated. With ``vocab_size`` None, for the smallest vocabulary the run can
    have (256 tokens, or the config's own): a lower bound before the data is known."""
    import json

    vocab = max(vocab_size or 0, cfg.vocab_size or 0) or 256
    return _meta_counts(name, json.dumps(config_options(cfg), sort_keys=True), vocab)[0]


def hf_sample_bytes(cfg: HFConfig, tokens: int, vocab_size: int, *, training: bool = False) -> int:
    """Bytes of float32 activations one sample of ``tokens`` holds at most in a forward pass
    (``training``: every layer's kept for the backward pass), counted from the config: per
    token and layer about 12 x D (norms, q/k/v, attention output, residuals) plus 4 x I (the
    gated MLP's branches), plus the logits and their loss (2 x V)."""
    d, i = cfg.hidden_size, cfg.intermediate_size or 4 * cfg.hidden_size
    per_layer = 12 * d + 4 * i
    layers = cfg.num_hidden_layers if training else 1
    return 4 * tokens * (layers * per_layer + 4 * d + 2 * vocab_size)


class HFCausalLM(nn.Module):
    """A ``transformers`` causal LM as a run's model: token ids ``(B, T)`` of any integer
    dtype -> logits ``(B, T, V)``."""

    def __init__(self, lm: PreTrainedModel, cfg: HFConfig) -> None:
        super().__init__()
        self.lm = lm
        self.cfg = cfg
        self.context = cfg.context

    def forward(self, idx: Tensor) -> Tensor:
        out = self.lm(input_ids=idx.long(), use_cache=False)
        return out.logits  # (B, T, V)

    def all_parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter, trained or frozen (for counting)."""
        return nn.Module.parameters(self)

    def base_model(self) -> PreTrainedModel:
        """The plain ``transformers`` model (a LoRA run's with its adapter merged, a copy)."""
        return self.lm


class LoraCausalLM(HFCausalLM):
    """An :class:`HFCausalLM` with a LoRA adapter: its parameters and state are the
    adapter's alone (the frozen base is the run's ``init_weights``)."""

    def __init__(self, lm: Any, cfg: HFConfig) -> None:
        super().__init__(lm, cfg)
        self._trained = frozenset(n for n, p in nn.Module.named_parameters(self) if p.requires_grad)

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        cut = len(prefix) + 1 if prefix else 0
        for n, p in super().named_parameters(prefix, recurse, remove_duplicate):
            if n[cut:] in self._trained:
                yield n, p

    def all_parameters(self) -> Iterator[nn.Parameter]:
        for _, p in super().named_parameters():
            yield p

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        full = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        return type(full)((k, v) for k, v in full.items() if k[len(prefix) :] in self._trained)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        names = set(state_dict)
        if strict and names != self._trained:
            missing, extra = sorted(self._trained - names), sorted(names - self._trained)
            raise RuntimeError(f"Error(s) in loading state_dict: missing {missing[:3]}, unexpected {extra[:3]}")
        return super().load_state_dict(state_dict, strict=False, assign=assign)

    def base_model(self) -> PreTrainedModel:
        import copy

        peft_model: Any = copy.deepcopy(self.lm)
        return peft_model.merge_and_unload()

    def adapter(self) -> Any:
        """The ``peft`` model (``save_pretrained`` writes the adapter alone)."""
        return self.lm


def _assemble(cfg: HFConfig, vocab_size: int, base_weights: Path | None = None) -> HFCausalLM:
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_config(library_config(cfg, vocab_size), attn_implementation="sdpa")
    if base_weights is not None:
        load_base_weights(lm, base_weights)
    if cfg.lora is None:
        return HFCausalLM(lm, cfg)
    from peft import LoraConfig, get_peft_model

    present = {
        n.rsplit(".", 1)[-1] for n, m in lm.named_modules() if isinstance(m, nn.Linear) or "Conv1D" in type(m).__name__
    }
    missing = [t for t in cfg.lora.targets if t not in present]
    if missing:
        raise BadModel(
            f"lora targets {', '.join(missing)}: no such linear module in hf:{cfg.family}; it has {', '.join(sorted(present))}"
        )
    lora = LoraConfig(
        r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout, target_modules=list(cfg.lora.targets)
    )
    return LoraCausalLM(get_peft_model(lm, lora), cfg)


Weights = Callable[[str], Path]


def build_hf(name: str, cfg: HFConfig, vocab_size: int, weights: Weights | None = None) -> HFCausalLM:
    """The model, its weights drawn from the torch RNG (the caller seeds it) or, with
    ``init_weights``, read from that blob (``weights`` resolves its CID to a local file)."""
    path = None
    if cfg.init_weights is not None:
        if weights is None:
            raise UsageError(
                f"model {name!r} starts from pretrained weights {cfg.init_weights}, and nothing here can fetch them"
            )
        path = weights(cfg.init_weights)
    return _assemble(cfg, vocab_size, path)


def load_base_weights(lm: nn.Module, path: Path) -> None:
    """Copy a safetensors file of an HF model's weights (its own key names, any float dtype)
    into ``lm``, checked first: every name the model's, every shape equal, every value
    finite; only tied weights may be absent. Otherwise a ``BadModel`` and ``lm`` unchanged."""
    state = lm.state_dict()
    tied = {k for k, v in state.items() for k2, v2 in state.items() if k != k2 and v.data_ptr() == v2.data_ptr()}
    try:
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            extra = sorted(names - set(state))
            missing = sorted(set(state) - names - tied)
            if extra or missing:
                raise BadModel(
                    f"pretrained weights do not fit the config: missing {missing[:3]}, unexpected {extra[:3]}"
                )
            for k in sorted(names):
                t = f.get_slice(k)
                if tuple(t.get_shape()) != tuple(state[k].shape):
                    raise BadModel(
                        f"pretrained weight {k} has shape {tuple(t.get_shape())}, the config's is {tuple(state[k].shape)}"
                    )
            for k in sorted(names):  # all checked before any is copied
                t = f.get_tensor(k)
                if not t.is_floating_point() or not torch.isfinite(t).all():
                    raise BadModel(f"pretrained weight {k} is not finite floating point")
            with torch.no_grad():
                for k in sorted(names):
                    state[k].copy_(f.get_tensor(k).to(state[k].dtype))
    except (SafetensorError, OSError) as e:
        raise BadModel(f"pretrained weights are not a safetensors file: {e}") from None


# config.json fields taken into the options; the rest of this list is metadata that does
# not change the architecture. Anything else is refused, naming the field.
_TAKEN = {
    "hidden_size": "hidden_size",
    "n_embd": "hidden_size",
    "num_hidden_layers": "num_hidden_layers",
    "n_layer": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "n_head": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
    "n_inner": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings",
    "n_positions": "max_position_embeddings",
    "vocab_size": "vocab_size",
    "head_dim": "head_dim",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "rms_norm_eps",
    "hidden_act": "hidden_act",
    "activation_function": "hidden_act",
    "tie_word_embeddings": "tie_word_embeddings",
    "attention_bias": "attention_bias",
}
_METADATA = {
    "architectures",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "_name_or_path",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "initializer_range",
    "attention_dropout",
    "pretraining_tp",
    "layer_norm_epsilon",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "summary_type",
    "summary_use_proj",
    "summary_activation",
    "summary_proj_to_labels",
    "summary_first_dropout",
    "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx",
    "reorder_and_upcast_attn",
    "n_ctx",
    "use_sliding_window",
    "sliding_window",
    "max_window_layers",
    "layer_types",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
    "is_encoder_decoder",
    "id2label",
    "label2id",
    "problem_type",
    "chunk_size_feed_forward",
    "tokenizer_class",
    "task_specific_params",
    "rope_scaling",
    "rope_parameters",
}
# Metadata fields that would change the architecture away from their default: a config
# that sets one otherwise is refused rather than built without it.
_DEFAULT_ONLY = {"add_cross_attention": False, "mlp_bias": False}
_FORBIDDEN = ("auto_map", "trust_remote_code", "custom_pipelines")


def options_from_hf_config(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A local model directory's ``config.json`` (parsed JSON) -> ``(model_type, options)``,
    e.g. ``("hf:llama", {"hidden_size": 64, ...})``. A ``BadModel`` naming the field for
    remote code (``auto_map``, ``trust_remote_code``), an unknown family or architecture,
    a field outside the allow-list, or a value out of range."""
    if not isinstance(config, Mapping):
        raise BadModel("config.json must be a JSON object")
    for key in _FORBIDDEN:
        if key in config:
            raise BadModel(f"config.json field {key!r} names code to run; aitbc builds only the library's own classes")
    fam = config.get("model_type")
    if fam not in FAMILIES:
        raise BadModel(f"config.json field 'model_type' is {fam!r}; allowed: {', '.join(FAMILIES)}")
    archs = config.get("architectures") or [ARCHITECTURES[fam]]
    if archs != [ARCHITECTURES[fam]]:
        raise BadModel(
            f"config.json field 'architectures' is {archs!r}; a {fam} model must be [{ARCHITECTURES[fam]!r}]"
        )
    rope = config.get("rope_scaling") or {}
    params = config.get("rope_parameters") or {}
    if rope or (isinstance(params, Mapping) and params.get("rope_type", "default") != "default"):
        raise BadModel("config.json field 'rope_scaling': only the default rotary embedding is supported")
    options: dict[str, Any] = {}
    for key, value in config.items():
        if key in _TAKEN:
            if value is not None:
                options[_TAKEN[key]] = value
        elif key in _DEFAULT_ONLY:
            if value not in (None, _DEFAULT_ONLY[key]):
                raise BadModel(
                    f"config.json field {key!r} is {value!r}; aitbc builds only {key}={_DEFAULT_ONLY[key]!r}"
                )
        elif key not in _METADATA:
            raise BadModel(f"config.json field {key!r} is not one aitbc takes; allowed: {', '.join(sorted(_TAKEN))}")
    if isinstance(params, Mapping) and "rope_theta" in params:
        options["rope_theta"] = params["rope_theta"]
    if fam == "gpt2":
        options.setdefault("tie_word_embeddings", True)
    options["context"] = min(DEFAULT_CONTEXT, int(options.get("max_position_embeddings", DEFAULT_CONTEXT)))
    name = PREFIX + fam
    hf_config(name, options)  # every value in its range, or a BadModel naming it
    return name, options
