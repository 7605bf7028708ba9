"""Hugging Face families by configuration (``hf:llama``, ``hf:gpt2``, ``hf:qwen2``,
``hf:mistral``): built from the library's own classes, every field on an allow-list with
ranges, parameters counted on the meta device before anything is allocated, configs from a
model directory's ``config.json`` refused unless they name the library's own class, and LoRA
models whose parameters and state are the adapter's alone."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from aitbc.errors import UsageError
from aitbc.training.data_spec import DataSpec
from aitbc.training.hf_models import (
    FAMILIES,
    BadModel,
    HFCausalLM,
    LoraCausalLM,
    is_hf,
    load_base_weights,
    options_from_hf_config,
    parse_lora,
)
from aitbc.training.models import TooManyParams, build_model, check_model, count_params, model_config

TEXT = DataSpec("language", (16,), 300)  # 16-token windows of a 300-token vocabulary
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
GQA = TINY | {"num_key_value_heads": 2}  # grouped-query attention: two heads share keys
OPTIONS = {"llama": GQA, "gpt2": TINY, "qwen2": GQA, "mistral": GQA}
CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"  # any CID-shaped name


def one_line(e: pytest.ExceptionInfo[BaseException], *words: str) -> str:
    """The error's message: a single line holding every one of ``words``."""
    text = str(e.value)
    assert "\n" not in text, text
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"
    return text


def unique_params(model: nn.Module) -> int:
    return sum(p.numel() for p in nn.Module.parameters(model))


# --- the families ------------------------------------------------------------------------------


def test_names():
    assert [n for n in ("hf:llama", "hf:gpt2", "transformer", "pkg.mod:build") if is_hf(n)] == ["hf:llama", "hf:gpt2"]
    assert FAMILIES == ("llama", "gpt2", "qwen2", "mistral")
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # importing the module keeps transformers off the network


@pytest.mark.parametrize("family", FAMILIES)
def test_family_builds_counts_exactly_and_maps_tokens_to_logits(family):
    name, options = f"hf:{family}", OPTIONS[family]
    torch.manual_seed(0)

    model = build_model(name, TEXT, options)

    assert isinstance(model, HFCausalLM) and not isinstance(model, LoraCausalLM)
    assert type(model.lm).__module__.startswith(f"transformers.models.{family}.")  # the library's own class
    cfg = model_config(name, options)
    assert count_params(name, cfg, TEXT) == unique_params(model) == sum(p.numel() for p in model.parameters())
    assert count_params(name, cfg, None) <= unique_params(model)  # before the data's vocabulary is known
    assert model.lm.config.vocab_size == 300  # from the data, not a default
    assert model.context == cfg.context == 64  # min(128, max_position_embeddings)
    model.eval()
    ids = torch.randint(0, 256, (3, 16))
    with torch.no_grad():
        outs = [model(ids.to(dtype)) for dtype in (torch.int64, torch.int32, torch.uint8)]
    for out in outs:
        assert out.shape == (3, 16, 300)  # (B, T) -> (B, T, V)
        assert out.dtype == torch.float32 and torch.isfinite(out).all()
        assert torch.equal(out, outs[0])  # the same ids, whatever their integer dtype


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_same_seed_same_weights(family):
    def weights(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build_model(f"hf:{family}", TEXT, OPTIONS[family]).state_dict()

    a, b, c = weights(3), weights(3), weights(4)

    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_config_fields_reach_the_library_config():
    torch.manual_seed(0)
    options = GQA | {"rope_theta": 500000.0, "rms_norm_eps": 1e-5, "hidden_act": "gelu", "tie_word_embeddings": True}

    lm = build_model("hf:llama", TEXT, options).lm

    c = lm.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (32, 2, 4, 2)
    assert (c.intermediate_size, c.max_position_embeddings, c.hidden_act, c.rms_norm_eps) == (64, 64, "gelu", 1e-5)
    assert c.tie_word_embeddings is True and lm.lm_head.weight is lm.model.embed_tokens.weight
    assert lm.model.layers[0].self_attn.k_proj.out_features == 2 * 8  # 2 kv heads of 32 / 4


def test_string_options_from_the_command_line_are_typed():
    cfg = model_config("hf:llama", {k: str(v) for k, v in GQA.items()} | {"tie_word_embeddings": "true"})

    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.tie_word_embeddings) == (32, 2, True)


# --- refusals: one line naming the field and its range -------------------------------------------


@pytest.mark.parametrize(
    ("name", "options", "words"),
    [
        ("hf:bert", {}, ["'bert'", "hf:llama, hf:gpt2, hf:qwen2, hf:mistral"]),
        ("hf:", {}, ["unknown Hugging Face family", "hf:llama"]),
        ("hf:llama", {"trust_remote_code": True}, ["'trust_remote_code'", "allowed: hidden_size"]),
        ("hf:llama", {"auto_map": {"AutoModelForCausalLM": "x.Y"}}, ["'auto_map'", "allowed:"]),
        ("hf:llama", {"n_embd": 32}, ["'n_embd'", "allowed:"]),
        ("hf:llama", {"family": "gpt2"}, ["'family'"]),
        ("hf:llama", {"hidden_size": 0}, ["hidden_size", "[1, 16384]", "got 0"]),
        ("hf:llama", {"hidden_size": 16385}, ["hidden_size", "[1, 16384]"]),
        ("hf:llama", {"hidden_size": "wide"}, ["hidden_size", "must be int"]),
        ("hf:llama", {"num_hidden_layers": 129}, ["num_hidden_layers", "[1, 128]"]),
        ("hf:llama", {"num_attention_heads": 257, "hidden_size": 514}, ["num_attention_heads", "[1, 256]"]),
        ("hf:llama", {"intermediate_size": 65537}, ["intermediate_size", "[1, 65536]"]),
        ("hf:llama", {"max_position_embeddings": 32769}, ["max_position_embeddings", "[1, 32768]"]),
        ("hf:llama", {"vocab_size": 1}, ["vocab_size", "[2, 262144]"]),
        ("hf:llama", {"head_dim": 2048}, ["head_dim", "[1, 1024]"]),
        ("hf:llama", {"rope_theta": 0.5}, ["rope_theta", "[1, 1e9]"]),
        ("hf:llama", {"rms_norm_eps": 0}, ["rms_norm_eps", "(0, 0.1]"]),
        ("hf:llama", {"hidden_act": "tanh_of_doom"}, ["hidden_act", "silu"]),
        ("hf:llama", {"hidden_size": 30, "num_attention_heads": 4}, ["hidden_size (30)", "num_attention_heads (4)"]),
        ("hf:llama", {"num_key_value_heads": 3}, ["num_attention_heads (4)", "num_key_value_heads (3)"]),
        ("hf:llama", {"num_key_value_heads": 8}, ["num_key_value_heads", "[1, 4]"]),
        ("hf:llama", {"context": 600}, ["context", "[1, 512]", "600"]),
        ("hf:llama", {"max_position_embeddings": 64, "context": 65}, ["context", "[1, 64]"]),
        ("hf:llama", {"init_weights": "../../etc/passwd"}, ["init_weights", "CID"]),
        ("hf:llama", {"tokenizer": "x y"}, ["tokenizer", "CID"]),
        ("hf:gpt2", {"num_key_value_heads": 2}, ["num_key_value_heads", "hf:gpt2"]),
    ],
)
def test_bad_config_is_one_line_naming_the_field(name, options, words):
    with pytest.raises(BadModel) as e:
        check_model(name, options)
    one_line(e, *words)


def test_unknown_option_lists_only_options_a_run_may_set():
    with pytest.raises(BadModel) as e:
        model_config("hf:llama", {"hiden_size": 64})

    text = one_line(e, "'hiden_size'", "hidden_size", "num_key_value_heads", "lora")
    assert "family" not in text.partition("allowed:")[2]  # the model type sets it, never an option


def test_vocab_size_must_cover_the_datas():
    """The embedding may have more rows than the tokenizer has tokens (a pretrained Qwen2's
    151,936 for 151,665), never fewer: a token id past the rows would index nothing."""
    with pytest.raises(BadModel) as e:
        build_model("hf:llama", TEXT, GQA | {"vocab_size": 299})
    one_line(e, "vocab_size 299", "300 tokens", "leave vocab_size unset", "at least 300")

    torch.manual_seed(0)
    assert build_model("hf:llama", TEXT, GQA | {"vocab_size": 300}).lm.config.vocab_size == 300
    wide = build_model("hf:llama", TEXT, GQA | {"vocab_size": 320})
    assert wide.lm.config.vocab_size == 320
    assert count_params("hf:llama", model_config("hf:llama", GQA | {"vocab_size": 320}), TEXT) == unique_params(wide)
    assert wide(torch.randint(0, 300, (2, 16))).shape == (2, 16, 320)


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2", "mistral"])
def test_no_family_draws_dropout(family):
    """A spot check replays a worker's steps; GPT-2's library default would drop 10%."""
    options = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 16}
    model = build_model(f"hf:{family}", TEXT, options).train()
    x = torch.randint(0, 300, (2, 16))
    assert torch.equal(model(x), model(x))


def test_sequences_longer_than_the_positions_are_refused():
    with pytest.raises(UsageError) as e:
        build_model("hf:llama", DataSpec("language", (65,), 300), GQA)
    one_line(e, "65 tokens", "max_position_embeddings 64")


def test_needs_language_data():
    with pytest.raises(UsageError) as e:
        build_model("hf:llama", DataSpec("classification", (8, 8), 10), GQA)
    one_line(e, "'hf:llama'", "text dataset")


def test_one_samples_activations_are_bounded():
    with pytest.raises(UsageError) as e:
        check_model(
            "hf:llama",
            {
                "hidden_size": 8192,
                "num_attention_heads": 64,
                "max_position_embeddings": 32768,
                "context": 32768,
                "num_hidden_layers": 1,
            },
            max_params=None,
        )
    one_line(e, "context must be in [1, ", "MiB")


# --- the parameter cap: counted before anything is allocated -------------------------------------


def test_a_huge_model_is_refused_fast_without_allocating():
    # 128 layers of width 16384: about 550 billion parameters, 2 TB of float32. Building it
    # would exhaust memory long before it finished; counting it on the meta device does not.
    huge = {"hidden_size": 16384, "num_hidden_layers": 128, "num_attention_heads": 128, "max_position_embeddings": 64}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    start = time.monotonic()

    with pytest.raises(TooManyParams) as e:
        build_model("hf:llama", TEXT, huge, max_params=10**9)

    seconds = time.monotonic() - start
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    one_line(e, "'hf:llama'", "parameters", "at most 1,000,000,000", "--max-params")
    assert e.value.params > 500 * 10**9 and e.value.cap == 10**9
    assert grown_mib < 512, f"the refusal allocated {grown_mib:.0f} MiB"
    assert seconds < 60, f"counting took {seconds:.0f} s"


def test_cap_is_the_callers_exact_count():
    cfg = model_config("hf:llama", GQA)
    n = count_params("hf:llama", cfg, TEXT)
    torch.manual_seed(0)

    assert unique_params(build_model("hf:llama", TEXT, GQA, max_params=n)) == n  # exactly at the cap: built
    with pytest.raises(TooManyParams) as e:
        build_model("hf:llama", TEXT, GQA, max_params=n - 1)
    one_line(e, f"{n:,} parameters for this data", f"at most {n - 1:,}")
    with pytest.raises(TooManyParams) as e:  # before the data: the smallest vocabulary's count is a lower bound
        model_config("hf:llama", GQA, max_params=count_params("hf:llama", cfg, None) - 1)
    one_line(e, "at least")
    assert model_config("hf:llama", GQA | {"num_hidden_layers": 128, "hidden_size": 4096}, max_params=None)


# --- config.json of a local model directory ------------------------------------------------------


def saved_config(tmp_path: Path, family: str) -> tuple[dict, nn.Module, Path]:
    """A tiny model of ``family`` written by ``save_pretrained``: its config.json, the model,
    and its directory."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    if family == "gpt2":
        kw = {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "bos_token_id": 0, "eos_token_id": 0}
    else:
        kw = dict(GQA)
    torch.manual_seed(1)
    lm = AutoModelForCausalLM.from_config(CONFIG_MAPPING[family](vocab_size=300, **kw))
    lm.save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text()), lm, tmp_path


@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_models_config_gives_the_same_model(tmp_path, family):
    config, lm, directory = saved_config(tmp_path, family)

    name, options = options_from_hf_config(config)

    assert name == f"hf:{family}"
    assert options["vocab_size"] == 300 and options["context"] == 64
    cfg = model_config(name, options)
    assert count_params(name, cfg, TEXT) == unique_params(lm)
    torch.manual_seed(0)
    ours = build_model(name, TEXT, options)
    load_base_weights(ours.lm, directory / "model.safetensors")
    ours.eval(), lm.eval()
    ids = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        assert torch.allclose(ours(ids), lm(input_ids=ids).logits, atol=1e-5)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"auto_map": {"AutoModelForCausalLM": "modeling_evil.Evil"}}, ["'auto_map'", "code"]),
        ({"trust_remote_code": True}, ["'trust_remote_code'", "code"]),
        ({"custom_pipelines": {}}, ["'custom_pipelines'"]),
        ({"model_type": "bert"}, ["'model_type'", "'bert'", "llama, gpt2, qwen2, mistral"]),
        ({"model_type": None}, ["'model_type'", "None"]),
        ({"architectures": ["EvilForCausalLM"]}, ["'architectures'", "EvilForCausalLM", "LlamaForCausalLM"]),
        ({"architectures": ["LlamaForCausalLM", "X"]}, ["'architectures'", "LlamaForCausalLM"]),
        ({"rope_scaling": {"type": "linear", "factor": 4.0}}, ["'rope_scaling'", "default"]),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, ["'rope_scaling'", "default"]),
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, ["'quantization_config'", "allowed:"]),
        ({"hidden_size": 0}, ["hidden_size", "[1, 16384]"]),
        ({"num_hidden_layers": 10_000}, ["num_hidden_layers", "[1, 128]"]),
        ({"hidden_act": "eval(open('x').read())"}, ["hidden_act"]),
        ({"mlp_bias": True}, ["'mlp_bias'"]),
    ],
)
def test_config_json_refusals(tmp_path, change, words):
    config, _, _ = saved_config(tmp_path, "llama")

    with pytest.raises(BadModel) as e:
        options_from_hf_config(config | change)
    one_line(e, *words)


def test_config_json_must_be_an_object():
    with pytest.raises(BadModel) as e:
        options_from_hf_config(["llama"])  # type: ignore[arg-type]
    one_line(e, "JSON object")


# --- LoRA --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("r=16,alpha=32,dropout=0.05,targets=q_proj,v_proj", (16, 32, 0.05, ["q_proj", "v_proj"])),
        ("r=4", (4, 32, 0.05, ["q_proj", "v_proj"])),
        ("", (16, 32, 0.05, ["q_proj", "v_proj"])),
        ("targets=q_proj+k_proj+v_proj, r=8", (8, 32, 0.05, ["q_proj", "k_proj", "v_proj"])),
        ("alpha=8,targets=c_attn", (16, 8, 0.05, ["c_attn"])),
        ("dropout=0", (16, 32, 0.0, ["q_proj", "v_proj"])),
    ],
)
def test_parse_lora(text, expected):
    lora = parse_lora(text)
    assert (lora["r"], lora["alpha"], lora["dropout"], lora["targets"]) == expected
    json.dumps(lora)  # a model option: JSON as it is


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("r=0", ["r must be in [1, 1024]"]),
        ("r=x", ["r='x'", "int"]),
        ("dropout=1", ["dropout must be in [0, 1)"]),
        ("rank=4", ["'rank'", "r, alpha, dropout, targets"]),
        ("q_proj", ["'q_proj'", "KEY=VALUE"]),
        ("targets=q_proj;import os", ["'q_proj;import'", "module name"]),
        ("targets=" + ",".join(f"m{i}" for i in range(17)), ["1 to 16 modules"]),
    ],
)
def test_parse_lora_refusals(text, words):
    with pytest.raises(UsageError) as e:
        parse_lora(text)
    one_line(e, *words)


@pytest.fixture
def pretrained(tmp_path) -> dict:
    """A tiny hf:llama's weights in a safetensors file, and the options and resolver to
    adapt it (the run's init_weights names the blob by CID)."""
    torch.manual_seed(5)
    base = build_model("hf:llama", TEXT, GQA)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in base.lm.state_dict().items()}, str(path))
    asked: list[str] = []

    def resolve(cid: str) -> Path:
        asked.append(cid)
        return path

    return {"base": base, "path": path, "resolve": resolve, "asked": asked, "options": GQA | {"init_weights": CID}}


def lora_model(pretrained: dict, **lora: object) -> LoraCausalLM:
    options = pretrained["options"] | {"lora": {"r": 4, "alpha": 8, "dropout": 0.0} | lora}
    torch.manual_seed(0)
    model = build_model("hf:llama", TEXT, options, weights=pretrained["resolve"])
    assert isinstance(model, LoraCausalLM)
    return model


def test_pretrained_weights_are_loaded_from_the_resolved_blob(pretrained):
    torch.manual_seed(99)  # a different seed: every weight must come from the file

    model = build_model("hf:llama", TEXT, pretrained["options"], weights=pretrained["resolve"])

    assert pretrained["asked"] == [CID]
    base = pretrained["base"].state_dict()
    assert all(torch.equal(v, base[k]) for k, v in model.state_dict().items())


def test_pretrained_weights_need_a_resolver(pretrained):
    with pytest.raises(UsageError) as e:
        build_model("hf:llama", TEXT, pretrained["options"])
    one_line(e, CID, "nothing here can fetch them")


def test_lora_parameters_and_state_are_the_adapters_alone(pretrained):
    model = lora_model(pretrained)

    names = [n for n, _ in model.named_parameters()]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert {n.split(".")[-4] for n in names} == {"q_proj", "v_proj"}
    assert len(names) == 2 * 2 * 2  # 2 layers x 2 targets x (A, B)
    assert list(model.state_dict()) == names
    assert [n for n, _ in model.named_parameters(prefix="run")] == [f"run.{n}" for n in names]
    assert list(model.state_dict(prefix="run.")) == [f"run.{n}" for n in names]
    adapter = sum(p.numel() for p in model.parameters())
    assert adapter == 2 * ((4 * 32 + 32 * 4) + (4 * 32 + 16 * 4))  # per layer: q (32 -> 32), v (32 -> 2 x 8), r = 4
    total = sum(p.numel() for p in model.all_parameters())
    assert total == unique_params(pretrained["base"]) + adapter
    cfg = model_config("hf:llama", pretrained["options"] | {"lora": {"r": 4}})
    assert count_params("hf:llama", cfg, TEXT) == total  # the cap counts the base too
    model.eval()
    ids = torch.randint(0, 300, (2, 16))
    with torch.no_grad():  # B starts at zero: the adapted model starts as the base
        assert torch.allclose(model(ids), pretrained["base"].eval()(ids), atol=1e-6)


def test_lora_load_state_dict_is_strict(pretrained):
    model = lora_model(pretrained)
    state = {k: torch.full_like(v, 0.5) for k, v in model.state_dict().items()}

    model.load_state_dict(state)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())

    missing = dict(list(state.items())[1:])
    with pytest.raises(RuntimeError, match="missing"):
        model.load_state_dict(missing)
    base_key = next(k for k in nn.Module.state_dict(model) if k not in state)
    with pytest.raises(RuntimeError, match="unexpected"):
        model.load_state_dict(state | {base_key: torch.zeros(1)})
    model.load_state_dict(missing, strict=False)
    first = next(iter(state))
    with pytest.raises(RuntimeError, match="size mismatch"):  # shapes are checked even when names are not
        model.load_state_dict(state | {first: torch.zeros(3, 3)}, strict=False)


def test_a_training_step_changes_only_the_adapter(pretrained):
    model = lora_model(pretrained)
    before = {k: v.clone() for k, v in nn.Module.state_dict(model).items()}
    adapter = set(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    ids = torch.randint(0, 300, (4, 17))

    for _ in range(3):  # B is zero at first, so A's gradient is too: A moves from the second step
        logits = model(ids[:, :-1])  # (B, T, V)
        loss = nn.functional.cross_entropy(logits.reshape(-1, 300), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    after = nn.Module.state_dict(model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == adapter
    assert all(not p.requires_grad for n, p in nn.Module.named_parameters(model) if n not in adapter)


def test_base_model_merges_the_adapter(pretrained):
    model = lora_model(pretrained)
    model.load_state_dict({k: torch.randn_like(v) * 0.1 for k, v in model.state_dict().items()})
    model.eval()
    ids = torch.randint(0, 300, (2, 16))

    merged = model.base_model()

    from transformers import PreTrainedModel

    assert isinstance(merged, PreTrainedModel) and type(merged).__name__ == "LlamaForCausalLM"
    assert not any("lora" in k for k in merged.state_dict())
    assert sum(p.numel() for p in merged.parameters()) == unique_params(pretrained["base"])
    merged.eval()
    with torch.no_grad():
        adapted = model(ids)
        assert torch.allclose(merged(input_ids=ids).logits, adapted, atol=1e-5)
        assert not torch.allclose(pretrained["base"].eval()(ids), adapted, atol=1e-3)
        assert torch.equal(model(ids), adapted)  # merging worked on a copy: the run's model is unchanged


def test_lora_on_gpt2_wraps_its_conv1d(tmp_path):
    torch.manual_seed(0)
    base = build_model("hf:gpt2", TEXT, TINY)
    path = tmp_path / "w.safetensors"
    tied = {"lm.lm_head.weight"}  # tied to the token embedding: saved once
    save_file({k: v.contiguous() for k, v in base.lm.state_dict().items() if f"lm.{k}" not in tied}, str(path))

    model = build_model(
        "hf:gpt2", TEXT, TINY | {"init_weights": CID, "lora": {"r": 2, "targets": ["c_attn"]}}, weights=lambda _: path
    )

    assert {n.split(".")[-4] for n, _ in model.named_parameters()} == {"c_attn"}


def test_lora_targets_missing_from_the_model_are_refused_naming_its_modules(pretrained):
    with pytest.raises(BadModel) as e:
        lora_model(pretrained, targets=["q_proj", "c_attn"])
    one_line(e, "lora targets c_attn", "hf:llama", "q_proj", "v_proj", "down_proj")


def test_lora_needs_pretrained_weights():
    for lora in ({"r": 4}, "r=4"):
        with pytest.raises(BadModel) as e:
            model_config("hf:llama", GQA | {"lora": lora})
        one_line(e, "lora needs pretrained weights", "--from-pretrained")


@pytest.mark.parametrize(
    ("lora", "words"),
    [
        ({"r": 0}, ["lora r must be in [1, 1024]"]),
        ({"rank": 4}, ["'rank'", "r, alpha, dropout, targets"]),
        (5, ["lora must be an object"]),
        ("r=4,targets=q.proj", ["module name"]),
    ],
)
def test_bad_lora_option(lora, words):
    with pytest.raises(BadModel) as e:
        model_config("hf:llama", GQA | {"init_weights": CID, "lora": lora})
    one_line(e, *words)


# --- pretrained weights: checked before any is copied --------------------------------------------


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda s: s.pop("lm_head.weight"), ["missing ['lm_head.weight']"]),
        (lambda s: s.update({"extra.weight": torch.zeros(2)}), ["unexpected ['extra.weight']"]),
        (lambda s: s.update({"lm_head.weight": torch.zeros(300, 16)}), ["lm_head.weight", "(300, 16)", "(300, 32)"]),
        (lambda s: s.update({"lm_head.weight": torch.full((300, 32), float("nan"))}), ["lm_head.weight", "finite"]),
        (lambda s: s.update({"lm_head.weight": torch.ones(300, 32, dtype=torch.int32)}), ["lm_head.weight", "float"]),
    ],
)
def test_weights_that_do_not_fit_are_refused_and_nothing_changes(tmp_path, pretrained, edit, words):
    state = {k: v.clone().contiguous() for k, v in pretrained["base"].lm.state_dict().items()}
    edit(state)
    path = tmp_path / "bad.safetensors"
    save_file(state, str(path))
    torch.manual_seed(0)
    target = build_model("hf:llama", TEXT, GQA)
    before = {k: v.clone() for k, v in target.lm.state_dict().items()}

    with pytest.raises(BadModel) as e:
        load_base_weights(target.lm, path)

    one_line(e, *words)
    assert all(torch.equal(v, before[k]) for k, v in target.lm.state_dict().items())


def test_a_pickle_is_not_weights(tmp_path, pretrained):
    path = tmp_path / "pytorch_model.bin"
    torch.save(pretrained["base"].lm.state_dict(), path)  # a zip of pickles: never unpickled

    with pytest.raises(BadModel) as e:
        build_model("hf:llama", TEXT, pretrained["options"], weights=lambda _: path)
    one_line(e, "not a safetensors file")
