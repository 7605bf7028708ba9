"""A fine-tune's run (``init --from-pretrained DIR [--lora ...]``): the SDK reads the model
directory, stores its weights and tokenizer and creates the run from its config; the
coordinator refuses (422 ``bad_model``, nothing created) blobs it lacks or that are not what
the options say, and keeps the ones it accepted for the run's life. Real coordinators on
loopback, on the database under test (``AITBC_TEST_DB``)."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from tests.pretrained import CORPUS, tiny_pretrained_dir

from aitbc.client import ApiError
from aitbc.coordinator.live.runtime import build_initial_model, store_weights
from aitbc.coordinator.storage import retention
from aitbc.coordinator.store.models import Run
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.checkpoint import flat_params
from aitbc.training.pretrained import read_pretrained, run_options
from aitbc_agent_sdk import Agent, AgentConfig, InvalidArgument


@pytest.fixture(scope="module")
def coord(tmp_path_factory, databases, api):
    """A coordinator whose driver never collects blobs (the tests collect, at grace 0)."""
    c, stop = api.start_on(databases, tmp_path_factory.mktemp("coord"), gc_grace_seconds=0, gc_interval_seconds=1e12)
    yield c
    stop()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_pretrained_dir(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def pretrained(model_dir):
    return read_pretrained(model_dir)


def agent(coord, tmp_path, name: str) -> Agent:
    a = Agent(AgentConfig(name=name, wallet_name=name, coordinator_url=coord.url, home=tmp_path / name))
    a.start()
    return a


def age(coord, *cids: str) -> None:
    """Make blobs look long untouched, past every grace period."""
    stamp = time.time() - 10 * retention.IN_FLIGHT_SECONDS
    for cid in cids:
        os.utime(coord.ctx.store.dir / cid, (stamp, stamp))


def test_an_sdk_fine_tune_uploads_the_directory_and_the_run_keeps_its_blobs(coord, tmp_path, model_dir, pretrained):
    with agent(coord, tmp_path, "tuner") as a:
        run = a.initialize_distributed_training(
            None, "1MB", 2, from_pretrained=model_dir, lora="r=4,alpha=8,targets=q_proj,v_proj"
        )
        detail = a.get_training_status(run["training_id"])
    opts = detail["model_options"]
    weights, tokenizer = cid_of_bytes(pretrained.weights), cid_of_bytes(pretrained.tokenizer)
    assert detail["model_type"] == "hf:llama" and opts["init_weights"] == weights and opts["tokenizer"] == tokenizer
    assert opts["lora"] == {"r": 4, "alpha": 8, "dropout": 0.05, "targets": ["q_proj", "v_proj"]}
    assert opts["hidden_size"] == 32 and opts["vocab_size"] == pretrained.options["vocab_size"]
    stray = cid_of_bytes(b"nobody names this")
    coord.client("stray").put_blob(stray, b"nobody names this")
    age(coord, weights, tokenizer, stray)
    report = retention.run(coord.ctx)
    assert stray in report.deleted  # collection ran, and the run's blobs stay for its life
    assert coord.ctx.store.has(weights) and coord.ctx.store.has(tokenizer)
    # the coordinator builds the run's model on those weights: the adapter is its parameters
    row = Run(
        model_type=detail["model_type"],
        model_options=opts,
        seed=0,
        manifest={"spec": {"task": "language", "input_shape": [16], "num_classes": opts["vocab_size"]}},
    )
    model = build_initial_model(row, (), store_weights(coord.ctx.store))
    assert flat_params(model).numel() == 2 * 2 * (4 * 32 + 32 * 4)


def test_the_sdk_refuses_lora_without_weights_and_a_family_that_is_not_the_config(coord, tmp_path, model_dir):
    before = coord.snapshot()
    with agent(coord, tmp_path, "confused") as a:
        with pytest.raises(InvalidArgument, match="lora adapts pretrained weights"):
            a.initialize_distributed_training("hf:llama", "1MB", 2, lora="r=4")
        with pytest.raises(InvalidArgument, match="the model in .* is hf:llama"):
            a.initialize_distributed_training("hf:gpt2", "1MB", 2, from_pretrained=model_dir)
        with pytest.raises(InvalidArgument, match="lora r must be"):
            a.initialize_distributed_training(None, "1MB", 2, from_pretrained=model_dir, lora="r=0")
        with pytest.raises(InvalidArgument, match="lora targets c_attn: no such linear module in hf:llama; it has"):
            a.initialize_distributed_training(None, "1MB", 2, from_pretrained=model_dir, lora="targets=c_attn")
    assert coord.snapshot() == before


def refused(coord, owner, options: dict, *detail: str) -> None:
    """POST /runs with ``options`` is a 422 bad_model naming ``detail``, and nothing changes."""
    before = coord.snapshot()
    body = {"model_type": "hf:llama", "model_options": options, "dataset_size": "1MB", "target_workers": 1}
    with pytest.raises(ApiError) as e:
        owner.post("/runs", body)
    assert e.value.status == 422 and e.value.code == "bad_model", e.value
    for part in detail:
        assert part in e.value.detail, e.value.detail
    assert "\n" not in e.value.detail
    assert coord.snapshot() == before


def test_blobs_that_are_missing_or_not_what_the_options_say_are_refused(coord, tmp_path):
    pretrained = read_pretrained(tiny_pretrained_dir(tmp_path, seed=1))  # blobs this coordinator lacks
    owner = coord.client("griefer")
    weights, tokenizer = cid_of_bytes(pretrained.weights), cid_of_bytes(pretrained.tokenizer)
    good = run_options(pretrained, weights, tokenizer, None)
    refused(coord, owner, good, f"init_weights names blob {weights}", "not on this coordinator")
    owner.put_blob(weights, pretrained.weights)
    absent = cid_of_bytes(b"never uploaded")
    refused(coord, owner, good | {"tokenizer": absent}, f"tokenizer names blob {absent}", "upload it first")
    owner.put_blob(tokenizer, pretrained.tokenizer)
    # someone else's blob (here: the tokenizer) as the weights every worker would fetch
    refused(coord, owner, good | {"init_weights": tokenizer}, "not a safetensors blob")
    # real weights, but of another model than the options claim
    refused(coord, owner, good | {"num_hidden_layers": 1}, "do not fit the config", "unexpected")
    refused(coord, owner, good | {"intermediate_size": 48}, "has shape", "the config's is")
    # the weights as the tokenizer
    refused(coord, owner, good | {"tokenizer": weights}, f"tokenizer blob {weights}: not JSON")
    lora = {"r": 2, "alpha": 4, "dropout": 0.0, "targets": ["k_proj", "nope"]}
    refused(coord, owner, good | {"lora": lora}, "lora targets nope: no such linear module", "q_proj")
    refused(coord, owner, good | {"vocab_size": 260}, "lm_head.weight has shape (300, 32); the config's is (260, 32)")
    assert owner.post(
        "/runs", {"model_type": "hf:llama", "model_options": good, "dataset_size": "1MB", "target_workers": 1}
    )


def test_the_cli_refuses_pickled_weights_and_creates_a_fine_tune_from_a_directory(coord, aitbc, tmp_path, model_dir):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_bytes((model_dir / "config.json").read_bytes())
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04never unpickled")
    base = ["distributed-training", "init", "--wallet", "cli-tuner", "--dataset-size", "1MB", "--target-workers", "1"]
    base += ["--coordinator", coord.url]
    p = aitbc(*base, "--from-pretrained", str(pickled))
    assert p.returncode != 0
    err = p.stderr.strip()
    assert "pytorch_model.bin, a pickle, which aitbc never opens" in err and len(err.splitlines()) == 1, err
    p = aitbc(*base, "--lora", "r=4")
    assert p.returncode != 0 and "--lora" in p.stderr and "--from-pretrained" in p.stderr, p.stderr
    p = aitbc(*base, "--from-pretrained", str(model_dir), "--lora", "r=4,alpha=8,targets=q_proj,v_proj", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    run = json.loads(p.stdout)
    assert run["model_type"] == "hf:llama", run
    detail = coord.client("reader").get(f"/runs/{run['training_id']}")
    assert detail["model_options"]["lora"]["r"] == 4 and detail["model_options"]["init_weights"], detail


def token_data(owner, tokenizer: bytes, vocab: int, shards: int, context: int = 16) -> str:
    """The tiny corpus as token windows (x, and y shifted by one) in ``shards`` shards and a
    validation split, uploaded; the manifest's CID."""
    from aitbc.training.checkpoint import shard_bytes
    from aitbc.training.tokenizer import encode_text, load_tokenizer

    ids = torch.tensor(encode_text(load_tokenizer(tokenizer), " ".join(CORPUS) * 4))
    n = (ids.numel() - 1) // context
    x, y = ids[: n * context].view(n, context), ids[1 : n * context + 1].view(n, context)
    cut = [x.shape[0] * i // (shards + 1) for i in range(shards + 2)]
    pieces = [
        shard_bytes(x[a:b], y[a:b], dataset="tiny", index=i, count=shards) for i, (a, b) in enumerate(zip(cut, cut[1:]))
    ]
    for blob in pieces:
        owner.put_blob(cid_of_bytes(blob), blob)
    spec = {"task": "language", "input_shape": [context], "num_classes": vocab}
    manifest = {
        "format": "aitbc.manifest/1",
        "dataset": "tiny",
        "seed": 0,
        "alpha": None,
        "spec": spec,
        "shards": [{"cid": cid_of_bytes(b), "samples": cut[i + 1] - cut[i]} for i, b in enumerate(pieces[:-1])],
        "val": {"cid": cid_of_bytes(pieces[-1]), "samples": cut[-1] - cut[-2]},
    }
    blob = json.dumps(manifest, sort_keys=True).encode()
    owner.put_blob(cid := cid_of_bytes(blob), blob)
    return cid


def test_a_lora_round_aggregates_evaluates_and_checkpoints_the_adapter_alone(new_coordinator, api, tmp_path):
    """Two workers train the adapter on the pretrained base and send it; the round closes,
    its checkpoint holds the adapter's tensors alone and loads onto the base from init_weights."""
    from aitbc.training.checkpoint import load_checkpoint, load_shard, tensor_shapes
    from aitbc.training.data_spec import DataSpec
    from aitbc.training.local import LocalConfig, LocalTrainer
    from aitbc.training.models import build_model

    coord = new_coordinator()
    p = read_pretrained(tiny_pretrained_dir(tmp_path, seed=2))
    workers = [api.register_worker(coord, f"lora{i}") for i in range(2)]
    owner = coord.client("lora-owner")
    owner.post("/wallets/fund", {"amount": "1000"})
    weights, tokenizer = cid_of_bytes(p.weights), cid_of_bytes(p.tokenizer)
    owner.put_blob(weights, p.weights)
    owner.put_blob(tokenizer, p.tokenizer)
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "targets": ["q_proj", "v_proj"]}
    opts = run_options(p, weights, tokenizer, lora) | {"context": 16}
    body = {"model_type": p.model_type, "model_options": opts, "dataset_size": "1MB", "target_workers": 2}
    run_id = owner.post("/runs", body | {"budget": "100"})["training_id"]
    vocab = opts["vocab_size"]
    manifest = token_data(owner, p.tokenizer, vocab, 2)
    owner.post(f"/runs/{run_id}/data", {"manifest_cid": manifest, "source": "tiny"})
    assert owner.post(f"/runs/{run_id}/discover", {"required_workers": 2})["count"] == 2
    owner.post(f"/runs/{run_id}/distribute", {"rounds": 1, "local_steps": 5, "batch_size": 4, "verify_rate": 0})
    run = api.wait_status(owner, run_id, "training")
    d = run["config"]["d"]
    assert d == 2 * 2 * (4 * 32 + 32 * 4)  # the adapter's parameters: what every update carries

    def model():
        spec = DataSpec("language", (16,), vocab)
        return build_model(p.model_type, spec, opts, weights=lambda cid: tmp_path / "pretrained" / "model.safetensors")

    assert (tmp_path / "pretrained" / "model.safetensors").is_file()
    for w in workers:
        order = api.job_order(w)
        m = model()
        load_checkpoint(m, w.get_blob(order["global_model_cid"]))
        x, y = load_shard(w.get_blob(order["shard_cid"]))
        tr = LocalTrainer(m, x, y, LocalConfig(steps=5, batch_size=4, optimizer="sgd", lr=0.5), seed=1)
        delta = tr.train_round(flat_params(m)).delta
        assert delta.shape == (d,)
        w.post(f"/jobs/{order['job_id']}/updates", api.update_body(1, api.put_update(w, delta), steps=5))
    api.wait_status(owner, run_id, "complete", timeout=60)
    coord.settled()
    rounds = owner.get(f"/runs/{run_id}/rounds")["data"]
    final = owner.get_blob(rounds[-1]["checkpoint_cid"])
    assert set(tensor_shapes(final)) == {n for n, _ in model().named_parameters()}
    assert all("lora_" in n for n in tensor_shapes(final))
    m = model()
    load_checkpoint(m, final)
    assert not torch.equal(flat_params(m), flat_params(model()))  # the adapter moved
    assert rounds[-1]["val_loss"] is not None


def test_upload_data_tokenizes_with_the_pretrained_models_tokenizer(coord, tmp_path, model_dir, pretrained):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS * 20))
    with agent(coord, tmp_path, "tokens") as a:
        run = a.initialize_distributed_training(
            None, "1MB", 2, from_pretrained=model_dir, model_options={"context": 16}
        )
        up = a.upload_data(run["training_id"], data_path=str(corpus))
        detail = a.get_training_status(run["training_id"])
    assert up["tokenizer_cid"] == cid_of_bytes(pretrained.tokenizer) == detail["model_options"]["tokenizer"]
    assert up["vocab_size"] == pretrained.options["vocab_size"]
