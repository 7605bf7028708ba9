"""Fine-tuning from local weights (training/pretrained.py): a Hugging Face model directory
read as safetensors only into one deterministic blob, checked against its config; the model
built on those weights, with or without a LoRA adapter whose parameters alone train, travel
and replay."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from tests.pretrained import tiny_pretrained_dir

from aitbc.errors import UsageError
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.batches import data_seed
from aitbc.training.checkpoint import checkpoint_bytes, flat_params, load_checkpoint, tensors_to_bytes
from aitbc.training.checks import Replay, check_interval
from aitbc.training.data_spec import DataSpec
from aitbc.training.hf_models import BadModel, parse_lora
from aitbc.training.local import LocalConfig, LocalTrainer
from aitbc.training.models import build_model
from aitbc.training.pretrained import check_weights_file, read_pretrained, run_options
from aitbc.training.proof import Recorder

LORA = parse_lora("r=4,alpha=8,dropout=0.1,targets=q_proj,v_proj")


@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory) -> Path:
    return tiny_pretrained_dir(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def blobs(pretrained_dir, tmp_path_factory):
    """The directory read as the owner's machine does: (Pretrained, weights file, resolver)."""
    p = read_pretrained(pretrained_dir)
    store = tmp_path_factory.mktemp("blobs")
    files = {}
    for data in (p.weights, p.tokenizer):
        cid = cid_of_bytes(data)
        (store / cid).write_bytes(data)
        files[cid] = store / cid
    return p, files, lambda cid: files[cid]


def spec_of(p) -> DataSpec:
    return DataSpec("language", (16,), p.options["vocab_size"])


def options(p, lora=None) -> dict:
    return run_options(p, cid_of_bytes(p.weights), cid_of_bytes(p.tokenizer), lora) | {"context": 16}


def test_a_model_directory_becomes_one_deterministic_blob_that_builds_the_same_model(pretrained_dir, blobs):
    from transformers import AutoModelForCausalLM

    p, _, weights = blobs
    assert p.model_type == "hf:llama" and p.options["hidden_size"] == 32 and p.options["num_hidden_layers"] == 2
    assert read_pretrained(pretrained_dir).weights == p.weights  # the same bytes, the same CID on every read
    assert json.loads(p.tokenizer)["model"]["type"] == "BPE"
    torch.manual_seed(5)  # the run's seed must not matter: the weights are the directory's
    model = build_model(p.model_type, spec_of(p), options(p), weights=weights)
    original = AutoModelForCausalLM.from_pretrained(pretrained_dir).eval()
    model.eval()
    ids = torch.randint(0, p.options["vocab_size"], (2, 16))
    assert torch.allclose(model(ids), original(input_ids=ids).logits, atol=1e-5)
    assert p.params == sum(t.numel() for t in original.state_dict().values())


def test_sharded_weights_read_as_the_single_file(tmp_path, pretrained_dir, blobs):
    from transformers import AutoModelForCausalLM

    d = tmp_path / "sharded"
    model = AutoModelForCausalLM.from_pretrained(pretrained_dir)
    model.save_pretrained(d, max_shard_size="20KB")
    assert (d / "model.safetensors.index.json").is_file() and len(list(d.glob("*.safetensors"))) > 1
    shutil.copy(pretrained_dir / "tokenizer.json", d)
    assert read_pretrained(d).weights == blobs[0].weights


def test_tied_embeddings_may_be_absent_and_lora_wraps_gpt2s_fused_attention(tmp_path):
    from transformers import AutoModelForCausalLM

    d = tiny_pretrained_dir(tmp_path, family="gpt2")
    p = read_pretrained(d)
    assert p.model_type == "hf:gpt2" and p.options["tie_word_embeddings"] is True
    files = {cid_of_bytes(p.weights): tmp_path / "w"}
    (tmp_path / "w").write_bytes(p.weights)
    lora = parse_lora("r=2,alpha=4,dropout=0,targets=c_attn")
    opts = run_options(p, cid_of_bytes(p.weights), cid_of_bytes(p.tokenizer), lora) | {"context": 16}
    assert check_weights_file(tmp_path / "w", p.model_type, opts) == p.params  # lm_head is wte: stored once
    model = build_model(p.model_type, spec_of(p), opts, weights=files.__getitem__).eval()
    assert sum(t.numel() for t in model.parameters()) == 2 * (2 * 32 + 96 * 2)  # c_attn: 32 -> 96, per layer
    ids = torch.randint(0, p.options["vocab_size"], (1, 16))
    original = AutoModelForCausalLM.from_pretrained(d).eval()
    assert torch.allclose(model(ids), original(input_ids=ids).logits, atol=1e-5)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_pickled_weights_are_refused_unopened(tmp_path, pretrained_dir):
    d = _copy(pretrained_dir, tmp_path / "pickled")
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not even a real pickle")  # never opened
    with pytest.raises(BadModel, match=r"pytorch_model\.bin, a pickle, which aitbc never opens"):
        read_pretrained(d)
    (d / "pytorch_model.bin").unlink()
    with pytest.raises(BadModel, match=r"no \*\.safetensors weights"):
        read_pretrained(d)


def test_a_directory_that_does_not_fit_its_config_is_refused(tmp_path, pretrained_dir):
    d = _copy(pretrained_dir, tmp_path / "wrong")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 48}))
    with pytest.raises(BadModel, match=r"mlp\.\w+_proj\.weight has shape \(\d+, \d+\); the config's is"):
        read_pretrained(d)
    (d / "config.json").write_text(json.dumps(cfg | {"auto_map": {"AutoModel": "evil.Model"}}))
    with pytest.raises(BadModel, match="'auto_map' names code to run"):
        read_pretrained(d)
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "tokenizer.json").unlink()
    with pytest.raises(BadModel, match="no tokenizer.json; a fine-tune trains on the model's own tokens"):
        read_pretrained(d)


def test_the_coordinator_judges_a_weights_blob_from_its_header(tmp_path, blobs):
    p, files, _ = blobs
    opts = options(p)
    path = files[cid_of_bytes(p.weights)]
    assert check_weights_file(path, p.model_type, opts) == p.params
    with pytest.raises(BadModel, match="do not fit the config"):  # an unrelated blob: another model's
        check_weights_file(path, p.model_type, opts | {"num_hidden_layers": 1})
    padded = tmp_path / "padded"
    padded.write_bytes(p.weights + b"\0" * 1024)  # larger than the tensors it lists
    with pytest.raises(BadModel, match="1024 bytes beyond the tensors"):
        check_weights_file(padded, p.model_type, opts)
    junk = tmp_path / "junk"
    junk.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(BadModel, match="not a safetensors blob"):
        check_weights_file(junk, p.model_type, opts)
    ints = tmp_path / "ints"  # right names and shapes, but integers: not weights
    state = {k: torch.zeros(v.shape, dtype=torch.int32) for k, v in _state(path).items()}
    ints.write_bytes(tensors_to_bytes(state))
    with pytest.raises(BadModel, match="is I32; allowed: F16, BF16, F32"):
        check_weights_file(ints, p.model_type, opts)


def _state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def test_building_needs_the_weights_resolver(blobs):
    p, _, _ = blobs
    with pytest.raises(UsageError, match="starts from pretrained weights"):
        build_model(p.model_type, spec_of(p), options(p))


def lora_model(blobs, seed: int = 0):
    p, _, weights = blobs
    torch.manual_seed(seed)
    return build_model(p.model_type, spec_of(p), options(p, LORA), weights=weights)


def test_a_lora_round_trains_the_adapter_alone_on_the_pretrained_base(blobs):
    p, files, _ = blobs
    model = lora_model(blobs)
    names = [n for n, _ in model.named_parameters()]
    assert names and all("lora_" in n for n in names)
    assert set(model.state_dict()) == set(names)  # checkpoints carry the adapter alone
    d = sum(t.numel() for t in model.parameters())
    # per layer: q_proj and v_proj, each A (r x 32) and B (out x r)
    assert d == 2 * (4 * 32 + 32 * 4 + 4 * 32 + 32 * 4)
    base = {k: v.clone() for k, v in model.base_model().state_dict().items()}
    pretrained = _state(files[cid_of_bytes(p.weights)])
    assert all(torch.equal(base[k], pretrained[k]) for k in pretrained)  # B starts at zero: merged is the base
    x = torch.randint(0, p.options["vocab_size"], (32, 16))
    tr = LocalTrainer(copy.deepcopy(model), x, x.roll(-1, 1), LocalConfig(steps=3, batch_size=8, lr=1e-2), seed=1)
    start = flat_params(model)
    res = tr.train_round(start, round=1)
    assert res.delta.shape == (d,) and res.delta.abs().sum() > 0
    frozen = {n: t for n, t in tr.model.lm.named_parameters() if "lora_" not in n}
    assert len(frozen) == len(pretrained)
    for n, t in frozen.items():  # peft names the wrapped linear's own weight base_layer.weight
        assert torch.equal(t, pretrained[n.removeprefix("base_model.model.").replace(".base_layer.", ".")]), n
    blob = checkpoint_bytes(tr.model, model_name=p.model_type, model_options=options(p, LORA), round=1)
    fresh = lora_model(blobs, seed=9)
    load_checkpoint(fresh, blob)  # an adapter checkpoint loads onto the base from init_weights
    assert torch.equal(flat_params(fresh), flat_params(tr.model))


def test_a_lora_adapters_dropout_is_seen_by_the_data_parallel_check(blobs):
    from aitbc.training.parallel import draws_dropout

    assert draws_dropout(lora_model(blobs))  # LORA's dropout 0.1: a spot-checked job trains on one rank
    p, _, weights = blobs
    quiet = options(p, LORA | {"dropout": 0.0})
    assert not draws_dropout(build_model(p.model_type, spec_of(p), quiet, weights=weights))


def test_a_lora_step_replays_bit_exact_with_its_dropout(blobs):
    p, _, _ = blobs
    model = lora_model(blobs)
    x = torch.randint(0, p.options["vocab_size"], (32, 16))
    cfg = LocalConfig(steps=4, batch_size=8, lr=1e-2)
    tr = LocalTrainer(copy.deepcopy(model), x, x.roll(-1, 1), cfg, seed=3)
    rec = Recorder(4)
    torch.manual_seed(123)  # the worker's global RNG does not matter
    start = flat_params(model) + 0.01  # B nonzero: the adapter's path (and its dropout) counts
    tr.train_round(start, round=5, recorder=rec)
    c = rec.commitment(None, None)
    r = Replay(lora_model(blobs, seed=7), tr.x, tr.y, copy.deepcopy(cfg), data_seed(3, 5))
    torch.manual_seed(999)
    for i in range(c.intervals):
        v = check_interval(c, i, rec.states[c.boundaries[i]], rec.states[c.boundaries[i + 1]], r)
        assert v.ok and v.error == 0.0, v
    honest = rec.states[c.boundaries[1]]
    forged = dataclasses.replace(honest, params=honest.params + 1e-2)
    assert not check_interval(c, 0, rec.states[0], forged, r).ok
