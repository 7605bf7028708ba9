"""Run tokenizers: a byte-level BPE trained deterministically within its vocabulary bounds,
or the owner's tokenizer.json parsed as data and refused in one line when malformed; token
data packed into windows of the model's context."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch
from tests.corpora import WORDS

from aitbc.errors import UsageError
from aitbc.training.corpus import Measured
from aitbc.training.token_data import TOKEN_DTYPE, TokenOptions, pack_documents, source_documents, tokenized_dataset
from aitbc.training.tokenizer import (
    EOT,
    VocabCapped,
    decode,
    encode_text,
    eot_id,
    load_tokenizer,
    read_tokenizer,
    tokenizer_cid,
    train_tokenizer,
)


def corpus(n: int = 60, words: int = 40, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(WORDS), (n, words), generator=g)
    return [" ".join(WORDS[i] for i in row) for row in idx.tolist()]


TRAIN = """
import json, sys
from aitbc.training.tokenizer import train_tokenizer
docs = json.load(sys.stdin)
sys.stdout.buffer.write(train_tokenizer(docs, 300).data)
"""


def test_training_is_deterministic_across_processes():
    docs = corpus()
    runs = [
        subprocess.run([sys.executable, "-c", TRAIN], input=json.dumps(docs).encode(), capture_output=True, check=True)
        for _ in range(2)
    ]

    assert runs[0].stdout == runs[1].stdout == train_tokenizer(docs, 300).data


def test_trained_tokenizer_round_trips_and_has_the_end_of_text_token():
    tok = train_tokenizer(corpus(), 300)
    t = load_tokenizer(tok.data)

    ids = encode_text(t, "the lazy dog, é ✓")

    assert decode(t, ids) == "the lazy dog, é ✓"  # byte-level: any text, no unknown token
    assert eot_id(t) == tok.eot_id == t.token_to_id(EOT)
    assert max(ids) < tok.vocab_size <= 300


def test_vocab_is_capped_by_what_the_corpus_supports_and_said():
    with pytest.warns(VocabCapped, match="the corpus supports \\d+ tokens"):
        tok = train_tokenizer(["ab ab ab"], 5000)

    assert 257 <= tok.vocab_size < 5000


@pytest.mark.parametrize("n", [0, 255, 65537, True])
def test_vocab_size_bounds(n):
    with pytest.raises(UsageError, match="--vocab-size must be an integer from 256 to 65536"):
        train_tokenizer(corpus(), n)


def test_vocab_256_cannot_hold_the_bytes_and_end_of_text():
    with pytest.raises(UsageError, match="at least 257"):
        train_tokenizer(corpus(), 256)


def test_users_tokenizer_is_read(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(train_tokenizer(corpus(), 300).data)

    tok = read_tokenizer(path)

    assert tok.data == path.read_bytes() and 257 <= tok.vocab_size <= 300


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"{", "not JSON"),
        (b"[]", "not a tokenizer.json"),
        (b'{"model": {"type": "Nope"}}', "not a tokenizer the tokenizers library reads"),
    ],
    ids=["binary", "truncated", "array", "unknown-model"],
)
def test_malformed_tokenizer_is_one_line_naming_the_file(tmp_path, content, message):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)

    with pytest.raises(UsageError) as exc:
        read_tokenizer(path)

    assert str(exc.value).startswith(f"--tokenizer {path}: {message}") and "\n" not in str(exc.value)


def test_users_tokenizer_outside_the_vocab_bounds(tmp_path):
    from tokenizers import Tokenizer, models

    small = Tokenizer(models.WordLevel({"a": 0, "</s>": 1}, unk_token="a"))
    path = tmp_path / "tokenizer.json"
    path.write_text(small.to_str())

    with pytest.raises(UsageError, match="its vocabulary size must be an integer from 256 to 262144, got 2"):
        read_tokenizer(path)


def test_a_pretrained_models_large_tokenizer_is_taken(tmp_path):
    """A user's tokenizer may be larger than any trained here (Llama 3's has 128,256 tokens)."""
    from tokenizers import Tokenizer, models

    vocab = {f"w{i}": i for i in range(128_255)} | {"<|end_of_text|>": 128_255}
    path = tmp_path / "tokenizer.json"
    path.write_text(Tokenizer(models.WordLevel(vocab, unk_token="w0")).to_str())
    tok = read_tokenizer(path)
    assert (tok.vocab_size, tok.eot_id) == (128_256, 128_255)


def test_users_tokenizer_without_end_of_text(tmp_path):
    from tokenizers import Tokenizer, models

    vocab = {f"w{i}": i for i in range(300)}
    path = tmp_path / "tokenizer.json"
    path.write_text(Tokenizer(models.WordLevel(vocab, unk_token="w0")).to_str())

    with pytest.raises(UsageError, match="has no end-of-text token"):
        read_tokenizer(path)


def test_tokenizer_cid_of_old_and_new_manifests():
    assert tokenizer_cid({"shards": []}) is None
    assert tokenizer_cid({"tokenizer": {"cid": "bafy", "vocab_size": 300}}) == "bafy"


# --- packed token windows ----------------------------------------------------------------------


def test_packed_windows_shapes_dtype_shift_and_document_boundaries():
    docs = corpus(80)
    tok = train_tokenizer(docs, 300)
    t = load_tokenizer(tok.data)
    stream = []
    for d in docs:
        stream += [*encode_text(t, d), tok.eot_id]

    ds = pack_documents(docs, tok, name="c", seq_len=16, measured=Measured(bytes=1, documents=80))

    n_val = int(len(stream) * 0.1)
    train = torch.tensor(stream[: len(stream) - n_val])
    n = (len(train) - 1) // 16
    assert ds.spec.task == "language" and ds.spec.input_shape == (16,) and ds.spec.num_classes == tok.vocab_size
    assert ds.train_x.shape == ds.train_y.shape == (n, 16) and ds.train_x.dtype == ds.train_y.dtype == TOKEN_DTYPE
    assert ds.train_x.flatten().tolist() == train[: n * 16].tolist()
    assert ds.train_y.flatten().tolist() == train[1 : n * 16 + 1].tolist()  # shifted by one token
    assert ds.val_x.flatten().tolist()[:16] == stream[len(stream) - n_val :][:16]  # the stream's tail
    assert (ds.train_x == tok.eot_id).sum() >= 60  # each document ends with its boundary
    m = ds.measured
    assert m is not None and (m.documents, m.tokens, m.samples, m.val_samples) == (80, len(stream), n, len(ds.val_x))


def test_too_few_tokens_for_the_context():
    docs = corpus(3, 5)
    tok = train_tokenizer(corpus(), 300)

    with pytest.raises(UsageError, match="tokens; need at least 1290 for sequences of 128 tokens"):
        pack_documents(docs, tok, name="c", seq_len=128, measured=Measured(bytes=1))


def test_tokenized_dataset_from_a_jsonl_trains_or_takes_the_users_tokenizer(tmp_path):
    docs = corpus(60)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    src = f"docs:{tmp_path / 'c.jsonl'}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VocabCapped)
        trained = tokenized_dataset(src, TokenOptions(seq_len=8, max_bytes=1 << 20, vocab_size=300))
    (tmp_path / "tokenizer.json").write_bytes(trained.tokenizer.data)

    own = tokenized_dataset(src, TokenOptions(seq_len=8, max_bytes=1 << 20, tokenizer=str(tmp_path / "tokenizer.json")))

    assert torch.equal(own.dataset.train_x, trained.dataset.train_x)
    with pytest.raises(UsageError, match="is not text"):
        tokenized_dataset("digits", TokenOptions(seq_len=8, max_bytes=1 << 20))


def test_stdlib_is_a_text_source_of_documents():
    docs, measured = source_documents("stdlib", TokenOptions(seq_len=8, max_bytes=20_000))

    assert measured.bytes == 20_000 and measured.documents == len(docs) >= 1
    assert any("import" in d for d in docs)
