"""Tiny pretrained Hugging Face model directories for fine-tuning tests: written with the
``transformers`` library's own ``save_pretrained`` (safetensors) and a byte-level BPE
``tokenizer.json`` trained with ``tokenizers``, as a user's would be.

    from tests.pretrained import tiny_pretrained_dir
    d = tiny_pretrained_dir(tmp_path)            # hf:llama, q_proj/v_proj for --lora
    d = tiny_pretrained_dir(tmp_path, family="gpt2")
"""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "the quick brown fox jumps over the lazy dog. " * 3,
    "a fine tune of a tiny model on a tiny corpus, for tests. " * 3,
    "pack my box with five dozen liquor jugs; the dog sleeps. " * 3,
]


def tiny_tokenizer(vocab_size: int = 300) -> bytes:
    """A byte-level BPE (the 256 bytes, ``<|endoftext|>``, a few merges) as tokenizer.json bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok.to_str().encode()


def tiny_pretrained_dir(
    tmp_path: Path,
    *,
    family: str = "llama",
    lora_ready: bool = True,
    hidden_size: int = 32,
    layers: int = 2,
    seed: int = 0,
    name: str = "pretrained",
) -> Path:
    """``tmp_path/name``: config.json, model.safetensors and tokenizer.json of a tiny
    ``family`` (llama, gpt2, qwen2, mistral) model whose vocabulary is the tokenizer's.
    ``lora_ready``: its attention has the linear modules LoRA's default targets name
    (q_proj, v_proj; GPT-2's fused c_attn otherwise)."""
    import json

    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    tok = tiny_tokenizer()
    doc = json.loads(tok)
    vocab = max(doc["model"]["vocab"].values()) + 1
    vocab = max([vocab, *(t["id"] + 1 for t in doc.get("added_tokens", []))])
    heads = 4
    if family == "gpt2":
        cfg = CONFIG_MAPPING["gpt2"](
            vocab_size=vocab, n_embd=hidden_size, n_layer=layers, n_head=heads, n_positions=64, n_inner=2 * hidden_size
        )
    else:
        cfg = CONFIG_MAPPING[family](
            vocab_size=vocab,
            hidden_size=hidden_size,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads if lora_ready else heads // 2,
            intermediate_size=2 * hidden_size,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        )
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(cfg, k, None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    out = tmp_path / name
    model.save_pretrained(out)  # safetensors by default
    (out / "tokenizer.json").write_bytes(tok)
    return out
