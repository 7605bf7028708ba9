"""prepare_run_data: the manifest records what was measured and, for a model with a
tokenizer, names the tokenizer blob uploaded with the shards; token shards are int32
safetensors windows of the model's context that the loss and evaluation take as they are."""

from __future__ import annotations

import json

import pytest
import torch
from tests.corpora import WORDS

from aitbc.errors import UsageError
from aitbc.run_data import TextOptions, prepare_run_data
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.checkpoint import flat_params, load_shard, set_flat_params
from aitbc.training.local import LocalConfig, LocalTrainer, evaluate, loss_fn
from aitbc.training.models import build_model
from aitbc.training.tokenizer import train_tokenizer

TINY_LLAMA = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "context": 16,
}


def write_corpus(path, n: int = 80) -> list[str]:
    docs = [" ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(25 + i % 7)) for i in range(n)]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return docs


def hf_run(**options) -> dict:
    return {"model_type": "hf:llama", "model_options": {**TINY_LLAMA, **options}, "seed": 3}


def test_hf_run_data_names_the_tokenizer_and_the_measured_size(tmp_path):
    docs = write_corpus(tmp_path / "c.jsonl")

    rd = prepare_run_data(hf_run(), str(tmp_path / "c.jsonl"), shards=2, text=TextOptions(vocab_size=300))

    manifest = json.loads(rd.manifest)
    assert rd.tokenizer is not None and rd.tokenizer_blob is not None
    assert manifest["tokenizer"] == {"cid": cid_of_bytes(rd.tokenizer), "vocab_size": rd.tokenizer_blob.vocab_size}
    assert manifest["spec"] == {"task": "language", "input_shape": [16], "num_classes": rd.tokenizer_blob.vocab_size}
    m = manifest["measured"]
    assert m["bytes"] == sum(len(d.encode()) for d in docs) and m["documents"] == 80
    assert m["samples"] == sum(rd.packaged.samples) and m["tokens"] > m["samples"] * 16
    cids = [c for c, _ in rd.blobs()]
    assert cids[-1] == rd.manifest_cid and manifest["tokenizer"]["cid"] in cids
    assert all(cid_of_bytes(b) == c for c, b in rd.blobs())
    x, y = load_shard(rd.packaged.shards[0])
    assert x.dtype == y.dtype == torch.int32 and x.shape[1:] == (16,) and y.shape == x.shape


def test_same_corpus_and_seed_same_blobs(tmp_path):
    write_corpus(tmp_path / "c.jsonl")
    a = prepare_run_data(hf_run(), str(tmp_path / "c.jsonl"), shards=2, text=TextOptions(vocab_size=300))
    b = prepare_run_data(hf_run(), str(tmp_path / "c.jsonl"), shards=2, text=TextOptions(vocab_size=300))

    assert a.blobs() == b.blobs()


def test_token_shards_feed_the_loss_and_evaluation(tmp_path):
    write_corpus(tmp_path / "c.jsonl")
    rd = prepare_run_data(hf_run(), str(tmp_path / "c.jsonl"), shards=2, text=TextOptions(vocab_size=300))
    x, y = load_shard(rd.packaged.val)
    torch.manual_seed(0)
    model = build_model("hf:llama", rd.dataset.spec, {**TINY_LLAMA})

    loss, acc = evaluate(model, x, y, batch_size=4)
    step = loss_fn(model(x[:2]), y[:2])

    assert acc is None and 0 < loss < 10 and torch.isfinite(step)


def test_a_worker_round_trains_on_token_shards(tmp_path):
    write_corpus(tmp_path / "c.jsonl")
    rd = prepare_run_data(hf_run(), str(tmp_path / "c.jsonl"), shards=2, text=TextOptions(vocab_size=300))
    x, y = load_shard(rd.packaged.shards[0])
    vx, vy = load_shard(rd.packaged.val)
    torch.manual_seed(0)
    model = build_model("hf:llama", rd.dataset.spec, {**TINY_LLAMA})
    start = flat_params(model)
    trainer = LocalTrainer(model, x, y, LocalConfig(optimizer="adamw", lr=1e-2, steps=20, batch_size=8), seed=0)

    result = trainer.train_round(start)

    set_flat_params(model, start - result.delta)
    assert evaluate(model, vx, vy)[0] < evaluate(build_model_at(rd, start), vx, vy)[0]


def build_model_at(rd, params):
    model = build_model("hf:llama", rd.dataset.spec, {**TINY_LLAMA})
    set_flat_params(model, params)
    return model


def test_users_tokenizer_and_the_runs_tokenizer(tmp_path):
    docs = write_corpus(tmp_path / "c.jsonl")
    tok = train_tokenizer(docs, 280)
    (tmp_path / "tokenizer.json").write_bytes(tok.data)

    own = prepare_run_data(
        hf_run(), str(tmp_path / "c.jsonl"), shards=2, text=TextOptions(tokenizer=str(tmp_path / "tokenizer.json"))
    )
    pretrained = prepare_run_data(
        hf_run(), str(tmp_path / "c.jsonl"), shards=2, text=TextOptions(run_tokenizer=tok.data)
    )

    assert own.tokenizer == pretrained.tokenizer == tok.data
    assert own.blobs() == pretrained.blobs()


@pytest.mark.parametrize(
    ("run", "text", "message"),
    [
        ({"model_type": "transformer", "model_options": {}, "seed": 0}, TextOptions(vocab_size=300), "reads bytes"),
        (None, TextOptions(vocab_size=300, run_tokenizer=b"{}"), "brings its own vocabulary"),
        (None, TextOptions(tokenizer="t.json", run_tokenizer=b"{}"), "drop --tokenizer"),
        (None, TextOptions(vocab_size=100_000), "from 256 to 65536"),
        (hf_run(vocab_size=257), TextOptions(vocab_size=300), "has vocab_size 257; the data.s tokenizer has"),
    ],
    ids=["byte-model", "vocab-and-own", "two-tokenizers", "vocab-range", "vocab-mismatch"],
)
def test_refusals(tmp_path, run, text, message):
    write_corpus(tmp_path / "c.jsonl")

    with pytest.raises(UsageError, match=message):
        prepare_run_data(run or hf_run(), str(tmp_path / "c.jsonl"), shards=2, text=text)


def test_byte_model_manifest_records_the_measured_size(tmp_path):
    (tmp_path / "c.txt").write_bytes(b"hello world " * 200)
    run = {
        "model_type": "transformer",
        "model_options": {"context": 16, "d_model": 16, "n_layers": 1, "n_heads": 2},
        "seed": 0,
    }

    rd = prepare_run_data(run, str(tmp_path / "c.txt"), shards=2)

    m = json.loads(rd.manifest)
    assert "tokenizer" not in m and rd.tokenizer is None
    assert m["measured"] == {"bytes": 2400, "documents": 1, "tokens": 2400, "samples": 134, "val_samples": 14}
