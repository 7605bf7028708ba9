"""upload-data on the corpora users have, against a real coordinator: a .jsonl corpus for an
hf:llama run trains a tokenizer that the manifest names and the coordinator stores; the run,
the CLI and the dashboard show the measured size; a malformed tokenizer.json and a .jsonl
without its text field are refused in one line with nothing uploaded."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from tests.corpora import WORDS

TINY_LLAMA = [
    "--model-opt",
    "hidden_size=32",
    "--model-opt",
    "num_hidden_layers=2",
    "--model-opt",
    "num_attention_heads=2",
    "--model-opt",
    "intermediate_size=64",
    "--model-opt",
    "context=16",
]


def documents(n: int) -> list[str]:
    return [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(30 + i % 11)) for i in range(n)]


def blob_count(stack) -> int:
    return sum(1 for p in (stack.root / "coordinator" / "blobs").rglob("*") if p.is_file())


@pytest.fixture
def coordinator(stack):
    stack.start_coordinator()
    return stack


@pytest.mark.long  # six CLI processes, each importing torch
def test_jsonl_corpus_for_an_hf_model(coordinator, tmp_path):
    stack = coordinator
    corpus = tmp_path / "corpus.jsonl"
    docs = documents(120)
    corpus.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    run_id = stack.init_run(*TINY_LLAMA, model="hf:llama", workers=2)
    refuse_and_change_nothing(stack, run_id, corpus, tmp_path)

    r = stack.cli(
        "distributed-training",
        "upload-data",
        "--training-id",
        run_id,
        "--data-path",
        str(corpus),
        "--vocab-size",
        "300",
    )

    assert r.returncode == 0, r.stderr
    size = re.search(r"Size: (.*)", r.stdout).group(1)
    n_bytes = sum(len(d.encode()) for d in docs)
    assert "120 documents" in size and " tokens measured (declared 100GB)" in size, r.stdout
    vocab = int(re.search(r"Tokenizer: (\d+) tokens", r.stdout).group(1))
    assert 257 <= vocab <= 300
    run = stack.api(f"/runs/{run_id}")
    measured = run["measured"]
    assert measured["bytes"] == n_bytes and measured["documents"] == 120 and measured["tokens"] > 120
    assert run["vocab_size"] == vocab
    manifest = httpx.get(f"{stack.url}/v1/blobs/{run['manifest_cid']}", timeout=10).json()
    assert manifest["spec"] == {"task": "language", "input_shape": [16], "num_classes": vocab}
    assert manifest["tokenizer"]["vocab_size"] == vocab and manifest["measured"] == measured
    tok = httpx.get(f"{stack.url}/v1/blobs/{manifest['tokenizer']['cid']}", timeout=10)
    assert tok.status_code == 200 and json.loads(tok.content)["model"]["type"] == "BPE"
    page = httpx.get(f"{stack.url}/v1/dashboard/runs/{run_id}", timeout=10).json()
    assert (page["data_bytes"], page["data_documents"], page["data_tokens"]) == (n_bytes, 120, measured["tokens"])
    status = stack.cli("distributed-training", "status", "--training-id", run_id)
    assert "120 documents" in status.stdout and "declared 100GB" in status.stdout, status.stdout


def refuse_and_change_nothing(stack, run_id: str, good, tmp_path) -> None:
    """A malformed tokenizer.json, a .jsonl without its text field, a vocabulary out of
    range: each one line on stderr, no blob stored, no manifest attached."""
    bad_tok = tmp_path / "tokenizer.json"
    bad_tok.write_text('{"model": {"type": "Nope"}}')
    no_field = tmp_path / "no_field.jsonl"
    no_field.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "oops"}) + "\n")
    before = blob_count(stack)
    cases = [
        (["--data-path", str(good), "--tokenizer", str(bad_tok)], f"{bad_tok}: not a tokenizer"),
        (["--data-path", str(no_field)], f"{no_field}:2: no text field 'text' (it has: body)"),
        (["--data-path", str(good), "--vocab-size", "70000"], "--vocab-size must be an integer from 256 to 65536"),
    ]
    for args, message in cases:
        r = stack.cli("distributed-training", "upload-data", "--training-id", run_id, *args)
        assert r.returncode != 0 and message in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr

    assert blob_count(stack) == before
    run = stack.api(f"/runs/{run_id}")
    assert run["manifest_cid"] is None and run["measured"] is None
