"""A run of a Hugging Face family (``hf:llama``) is created only from the library's own
classes with allow-listed config fields: anything naming code to run, an unknown field or a
value out of range is a 422 ``bad_model`` naming the field, and nothing is created. A real
coordinator on loopback."""

from __future__ import annotations

import pytest

RUN = {"model_type": "hf:llama", "dataset_size": "1MB", "target_workers": 1}
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}


@pytest.mark.parametrize(
    ("model_type", "options", "words"),
    [
        ("hf:llama", TINY | {"trust_remote_code": True}, ["'trust_remote_code'", "allowed: hidden_size"]),
        ("hf:llama", TINY | {"auto_map": {"AutoModelForCausalLM": "evil.Model"}}, ["'auto_map'"]),
        ("hf:llama", TINY | {"quantization_config": {"quant_method": "x"}}, ["'quantization_config'"]),
        ("hf:llama", TINY | {"family": "gpt2"}, ["'family'"]),
        ("hf:bert", TINY, ["'bert'", "hf:llama, hf:gpt2, hf:qwen2, hf:mistral"]),
        ("hf:llama", TINY | {"hidden_size": 1 << 20}, ["hidden_size", "[1, 16384]"]),
        ("hf:llama", TINY | {"num_hidden_layers": 0}, ["num_hidden_layers", "[1, 128]"]),
        ("hf:llama", TINY | {"num_key_value_heads": 3}, ["num_key_value_heads (3)"]),
        ("hf:llama", TINY | {"context": 65}, ["context", "[1, 64]"]),
        ("hf:llama", TINY | {"hidden_size": "big"}, ["hidden_size", "int"]),
        ("hf:llama", TINY | {"lora": {"r": 8}}, ["lora needs pretrained weights"]),
        ("hf:llama", TINY | {"init_weights": "../../../etc/passwd"}, ["init_weights", "CID"]),
        ("hf:gpt2", TINY | {"num_key_value_heads": 2}, ["num_key_value_heads"]),
    ],
)
def test_bad_hf_model_is_a_422_naming_the_field(server, api, model_type, options, words):
    owner = server.client("o")
    before = server.snapshot()

    with server.http() as h:
        r = api.signed_post(h, owner.wallet, "/v1/runs", {**RUN, "model_type": model_type, "model_options": options})

    api.assert_error(r, 422, "bad_model", *words)
    assert server.snapshot() == before


def test_a_good_hf_model_is_created(server):
    owner = server.client("o")

    run = owner.post("/runs", {**RUN, "model_options": TINY})

    assert run["model_type"] == "hf:llama"
    assert owner.get(f"/runs/{run['training_id']}")["model_options"] == TINY
