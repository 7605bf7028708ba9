"""A manifest naming a tokenizer and the measured size: the coordinator checks both when the
data is attached (the tokenizer uploaded, its vocabulary the data's classes; the measured
counts non-negative integers), shows the measured size in the run's detail, keeps the
tokenizer blob from retention as long as the run is recorded, and still takes a manifest
that has neither."""

from __future__ import annotations

import json
import os

import pytest
from sqlalchemy import update

from aitbc.client import ApiError
from aitbc.coordinator.storage import retention
from aitbc.coordinator.store.models import Run
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.corpus import Measured
from aitbc.training.packaging import TokenizerBlob, manifest_bytes, package
from aitbc.training.token_data import pack_documents
from aitbc.training.tokenizer import train_tokenizer

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "context": 8}
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"]
DOCS = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(20 + i % 5)) for i in range(40)]


@pytest.fixture(scope="module")
def token_data():
    tok = train_tokenizer(DOCS, 280)
    data = pack_documents(DOCS, tok, name="docs:c.jsonl", seq_len=8, measured=Measured(bytes=999, documents=40))
    return tok, data, package(data, 2, seed=0)


def hf_run(owner) -> str:
    owner.post("/wallets/fund", {"amount": "1000"})
    body = {"model_type": "hf:llama", "model_options": TINY, "dataset_size": "1GB", "target_workers": 2, "budget": "10"}
    return owner.post("/runs", body)["training_id"]


def upload(owner, token_data, *, tokenizer: bool = True, edit=None) -> str:
    """Upload the shards, validation split, tokenizer (unless not) and a manifest (changed
    by ``edit``); the manifest's CID."""
    tok, data, packaged = token_data
    cids = [cid_of_bytes(b) for b in packaged.shards]
    for c, b in zip(cids, packaged.shards):
        owner.put_blob(c, b)
    val = cid_of_bytes(packaged.val)
    owner.put_blob(val, packaged.val)
    blob = TokenizerBlob(cid_of_bytes(tok.data), tok.vocab_size)
    if tokenizer:
        owner.put_blob(blob.cid, tok.data)
    m = json.loads(manifest_bytes(data, packaged, cids, val, seed=0, alpha=None, tokenizer=blob))
    if edit:
        edit(m)
    raw = json.dumps(m).encode()
    owner.put_blob(cid_of_bytes(raw), raw)
    return cid_of_bytes(raw)


def attach(owner, run_id: str, manifest_cid: str) -> dict:
    return owner.post(f"/runs/{run_id}/data", {"manifest_cid": manifest_cid, "source": "c.jsonl"})


def test_measured_size_and_tokenizer_in_the_run(server, token_data):
    owner = server.client("data-owner")
    run_id = hf_run(owner)
    tok, data, _ = token_data

    run = attach(owner, run_id, upload(owner, token_data))

    assert run["measured"] == data.measured.as_dict() and run["measured"]["documents"] == 40
    assert run["vocab_size"] == tok.vocab_size
    page = server.http().get(f"/v1/dashboard/runs/{run_id}").json()
    assert (page["data_bytes"], page["data_documents"], page["data_tokens"]) == (999, 40, data.measured.tokens)


def _set(key, value):
    def edit(m):
        m[key] = value

    return edit


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"edit": lambda m: m["tokenizer"].update(cid=cid_of_bytes(os.urandom(32)))}, "missing_blob"),
        ({"edit": lambda m: m["tokenizer"].update(vocab_size=m["tokenizer"]["vocab_size"] + 1)}, "bad_manifest"),
        ({"edit": lambda m: m["tokenizer"].update(cid="not-a-cid")}, "bad_manifest"),
        ({"edit": _set("tokenizer", "bafy")}, "bad_manifest"),
        ({"edit": lambda m: m["measured"].update(tokens=-1)}, "bad_manifest"),
        ({"edit": lambda m: m["measured"].update(bytes=None)}, "bad_manifest"),
        ({"edit": lambda m: m["measured"].update(tokens=2**63)}, "bad_manifest"),
        ({"edit": lambda m: m["measured"].update(documents=1.5)}, "bad_manifest"),
        ({"edit": lambda m: m["measured"].update(extra=1)}, "bad_manifest"),
        ({"edit": _set("measured", [1])}, "bad_manifest"),
    ],
    ids=[
        "tokenizer-not-uploaded",
        "vocab-not-the-classes",
        "tokenizer-cid",
        "tokenizer-not-object",
        "negative",
        "no-bytes",
        "huge",
        "float",
        "unknown-key",
        "not-object",
    ],
)
def test_bad_manifests_are_refused_and_change_nothing(server, token_data, api, kwargs, code):
    owner = server.client("data-bad")
    run_id = hf_run(owner)

    with pytest.raises(ApiError) as e:
        attach(owner, run_id, upload(owner, token_data, **kwargs))

    api.assert_api_error(e, 422, code)
    run = owner.get(f"/runs/{run_id}")
    assert run["manifest_cid"] is None and run["measured"] is None


def test_a_manifest_without_the_newer_keys_still_loads(server, token_data):
    owner = server.client("data-old")
    run_id = hf_run(owner)

    def old(m):
        del m["measured"], m["tokenizer"]

    run = attach(owner, run_id, upload(owner, token_data, tokenizer=False, edit=old))

    assert run["manifest_cid"] is not None and run["measured"] is None and run["vocab_size"] is None


def test_the_tokenizer_outlives_the_runs_other_data(server, token_data):
    owner = server.client("data-keep")
    run_id = hf_run(owner)
    tok = token_data[0]
    attach(owner, run_id, upload(owner, token_data))
    with server.ctx.session() as s:
        s.execute(update(Run).where(Run.id == run_id).values(finalized=True))
        s.commit()
    with server.ctx.session() as s:
        live = retention.live_cids(s, keep_checkpoints=1)

    assert cid_of_bytes(tok.data) in live  # sampling and downloading the result read it
