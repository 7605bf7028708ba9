"""A run's model used on the owner's machine: rebuilt from its parts, sampled from and
evaluated on held-out data, and the refusals, each one line, before any work."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from aitbc.errors import UsageError
from aitbc.training.checkpoint import checkpoint_bytes
from aitbc.training.data_spec import DataSpec
from aitbc.training.models import build_model
from aitbc.training.tokenizer import train_tokenizer
from aitbc.training.use import (
    MAX_NEW_TOKENS,
    RunParts,
    SampleOptions,
    check_usable,
    evaluate,
    load_run_model,
    read_heldout,
    sample,
    spec_of_manifest,
)

T = 16
HF = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32, "context": T}
TRANSFORMER = {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": T}
DOCS = [f"a small corpus line number {i} about foxes and dogs" for i in range(80)]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(DOCS, 300)


@pytest.fixture(scope="module")
def llama(tok):
    spec = DataSpec("language", (T,), tok.vocab_size)
    torch.manual_seed(0)
    model = build_model("hf:llama", spec, HF, max_params=None)
    ck = checkpoint_bytes(model, model_name="hf:llama", model_options=HF, round=5)
    return load_run_model(RunParts("hf:llama", HF, spec, ck, tok.data))


@pytest.fixture(scope="module")
def transformer():
    spec = DataSpec("language", (T,), 256)
    torch.manual_seed(0)
    model = build_model("transformer", spec, TRANSFORMER)
    ck = checkpoint_bytes(model, model_name="transformer", model_options=TRANSFORMER, round=2)
    return load_run_model(RunParts("transformer", TRANSFORMER, spec, ck))


def test_the_model_is_the_checkpoints(tok, llama):
    assert llama.round == 5 and llama.context == T and llama.eot == tok.eot_id
    spec = DataSpec("language", (T,), tok.vocab_size)
    torch.manual_seed(123)  # another draw: the checkpoint's weights must win
    other = build_model("hf:llama", spec, HF, max_params=None)
    other.load_state_dict(llama.model.state_dict())
    x = torch.randint(0, tok.vocab_size, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(other.eval()(x), llama.model(x))


def test_sampling_is_seeded_and_cuts_a_long_prompt(llama):
    a = sample(llama, "foxes and dogs", SampleOptions(max_new_tokens=8, seed=1))
    assert a == sample(llama, "foxes and dogs", SampleOptions(max_new_tokens=8, seed=1))
    assert a.new_tokens <= 8 and not a.prompt_cut
    draws = {sample(llama, "foxes and dogs", SampleOptions(max_new_tokens=8, seed=s)).text for s in range(6)}
    assert len(draws) > 1  # an untrained model's distribution is wide: seeds differ
    long = sample(llama, "foxes and dogs " * 40, SampleOptions(max_new_tokens=3, temperature=0))
    assert long.prompt_cut and long.prompt_tokens > T and long.prompt_tokens_used == T


def test_greedy_sampling_takes_the_most_likely_token(transformer):
    out = sample(transformer, "hello", SampleOptions(max_new_tokens=4, temperature=0))
    seq = torch.tensor([list(b"hello")])
    with torch.no_grad():
        for _ in range(4):
            seq = torch.cat([seq, transformer.model(seq[:, -T:])[0, -1].argmax().view(1, 1)], dim=1)
    assert out.text == bytes(seq[0, 5:].tolist()).decode("utf-8", errors="replace")
    assert out.new_tokens == 4 and out.stopped == "length"


def test_sampling_stops_at_the_end_of_text(tok):
    spec = DataSpec("language", (T,), tok.vocab_size)
    model = build_model("hf:llama", spec, HF, max_params=None)
    with torch.no_grad():
        model.lm.lm_head.weight.zero_()  # every logit 0: the first id, end-of-text, is the most likely
    assert tok.eot_id == 0
    ck = checkpoint_bytes(model, model_name="hf:llama", model_options=HF, round=1)
    rm = load_run_model(RunParts("hf:llama", HF, spec, ck, tok.data))
    out = sample(rm, "foxes", SampleOptions(max_new_tokens=50, temperature=0))
    assert (out.stopped, out.new_tokens, out.text) == ("end_of_text", 0, "")


@pytest.mark.parametrize("n", [0, -1, MAX_NEW_TOKENS + 1, True, 2.5])
def test_max_new_tokens_out_of_range_is_refused(n):
    with pytest.raises(UsageError, match=r"--max-new-tokens must be an integer from 1 to 4096"):
        SampleOptions(max_new_tokens=n)


def test_bad_temperature_seed_and_prompt_are_refused(llama):
    with pytest.raises(UsageError, match="--temperature must be a number from 0 to 100"):
        SampleOptions(temperature=-0.5)
    with pytest.raises(UsageError, match="--seed must be a non-negative integer"):
        SampleOptions(seed=-1)
    with pytest.raises(UsageError, match="--prompt must be non-empty text"):
        sample(llama, "")


def test_a_classifier_or_code_cannot_sample():
    with pytest.raises(UsageError, match="sample: model 'mlp' is a classifier; sample needs a language model"):
        check_usable("mlp", "sample")
    with pytest.raises(UsageError, match="is code"):
        check_usable("mypkg.models:make", "evaluate")
    check_usable("cnn", "evaluate")  # a classifier evaluates


def test_evaluate_text_gives_loss_per_token_and_perplexity(tmp_path, tok, llama):
    held = tmp_path / "held.jsonl"
    held.write_text("\n".join(json.dumps({"body": d}) for d in DOCS[:10]))
    res = evaluate(llama, read_heldout("hf:llama", str(held), "body"))
    stream = []
    for d in DOCS[:10]:
        stream += tok_ids(tok, d) + [tok.eot_id]
    n = (len(stream) - 1) // T
    x = torch.tensor(stream[: n * T]).view(n, T)
    y = torch.tensor(stream[1 : n * T + 1]).view(n, T)
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(llama.model(x).flatten(0, 1), y.flatten()).item()
    assert res.loss == pytest.approx(want, rel=1e-5)
    assert res.perplexity == pytest.approx(math.exp(want), rel=1e-5)
    assert (res.samples, res.tokens, res.documents, res.context, res.accuracy) == (n, n * T, 10, T, None)


def tok_ids(tok, text):
    from aitbc.training.tokenizer import encode_text, load_tokenizer

    return encode_text(load_tokenizer(tok.data), text)


def test_evaluate_bytes_for_the_transformer_and_a_short_text(tmp_path, transformer):
    (tmp_path / "short.txt").write_text("tiny")  # shorter than one window: one shorter window
    res = evaluate(transformer, read_heldout("transformer", str(tmp_path / "short.txt")))
    assert (res.samples, res.tokens, res.context) == (1, 3, 3) and res.perplexity == pytest.approx(math.exp(res.loss))
    (tmp_path / "one.txt").write_text("x")
    with pytest.raises(UsageError, match="at least 2 are needed"):
        evaluate(transformer, read_heldout("transformer", str(tmp_path / "one.txt")))


def test_a_jsonl_without_the_text_field_is_refused_naming_it(tmp_path):
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"content": "hello"}) + "\n")
    with pytest.raises(
        UsageError, match=r"held.jsonl:1: no text field 'text' \(it has: content\); choose it with --text-field"
    ):
        read_heldout("hf:llama", str(held), "text")


def test_a_classifier_evaluates_on_arrays(tmp_path):
    spec = DataSpec("classification", (4,), 3)
    model = build_model("mlp", spec, {"hidden": [8]})
    ck = checkpoint_bytes(model, model_name="mlp", model_options={"hidden": [8]}, round=1)
    rm = load_run_model(RunParts("mlp", {"hidden": [8]}, spec, ck))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "held.npz", x=rng.random((20, 4)).astype(np.float32), y=rng.integers(0, 3, 20))
    res = evaluate(rm, read_heldout("mlp", str(tmp_path / "held.npz")))
    assert 0 <= res.accuracy <= 1 and res.samples == 20 and res.perplexity is None and res.loss > 0
    np.savez(tmp_path / "wide.npz", x=rng.random((20, 5)).astype(np.float32), y=rng.integers(0, 3, 20))
    with pytest.raises(UsageError, match=r"samples of shape \(5,\); the model takes \(4,\)"):
        evaluate(rm, read_heldout("mlp", str(tmp_path / "wide.npz")))
    np.savez(tmp_path / "labels.npz", x=rng.random((20, 4)).astype(np.float32), y=np.full(20, 7))
    with pytest.raises(UsageError, match=r"label 7; the model has classes 0..2"):
        evaluate(rm, read_heldout("mlp", str(tmp_path / "labels.npz")))


def test_the_manifest_spec_and_a_bad_one():
    assert spec_of_manifest({"spec": {"task": "language", "input_shape": [8], "num_classes": 300}}) == DataSpec(
        "language", (8,), 300
    )
    with pytest.raises(UsageError, match="no valid spec"):
        spec_of_manifest({"spec": {"task": "language"}})
