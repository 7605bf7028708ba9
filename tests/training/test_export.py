"""A run's Hugging Face model written as a directory that loads with nothing of aitbc: a
tiny hf:llama trained a few steps here, rebuilt from its checkpoint as the owner's machine
rebuilds it, exported, then loaded by a fresh Python process in which importing aitbc fails
(``transformers`` alone; ``peft`` for an adapter), its logits compared with ours."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from aitbc.errors import UsageError
from aitbc.training.checkpoint import checkpoint_bytes, tensors_to_bytes
from aitbc.training.data_spec import DataSpec
from aitbc.training.export import check_format, export_hf
from aitbc.training.models import build_model
from aitbc.training.tokenizer import EOT, train_tokenizer
from aitbc.training.use import RunParts, load_run_model

T = 16
OPTS = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "max_position_embeddings": 64,
    "context": T,
}
DOCS = [f"the quick brown fox {i} jumps over the lazy dog, and the cat sat on the mat" for i in range(120)]
BASE_CID = "bafkreibaseweightsfortests"
PROBE = [[5, 17, 42, 7, 99, 3]]

# Run in a fresh interpreter: aitbc cannot be imported there, so what loads is the
# directory alone.
LOADER = r"""
import importlib.abc, json, sys
class NoAitbc(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("aitbc", "aitbc_agent_sdk"):
            raise ImportError("the export must load without aitbc: " + name)
sys.meta_path.insert(0, NoAitbc())
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
out = {}
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
probe = torch.tensor(json.loads(sys.argv[2]))
with torch.no_grad():
    out["logits"] = model(probe).logits[0, -1, :8].tolist()
if len(sys.argv) > 3:  # the adapter alone, onto its base
    from peft import PeftModel
    base = AutoModelForCausalLM.from_pretrained(sys.argv[3])
    adapted = PeftModel.from_pretrained(base, sys.argv[4]).eval()
    with torch.no_grad():
        out["adapter_logits"] = adapted(probe).logits[0, -1, :8].tolist()
else:
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    ids = tok("the quick brown", return_tensors="pt").input_ids
    gen = model.generate(ids, max_new_tokens=6, do_sample=False)
    out["generated"] = gen.shape[1] - ids.shape[1]
    out["eos"] = [model.config.eos_token_id, tok.eos_token, tok.convert_tokens_to_ids(tok.eos_token)]
    out["roundtrip"] = tok.decode(tok("the lazy dog").input_ids)
print(json.dumps(out))
"""


def _load_elsewhere(*args: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", LOADER, *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _train(model: torch.nn.Module, vocab: int, steps: int = 3) -> None:
    """A few optimizer steps on random tokens: the weights move away from their start."""
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        x = torch.randint(0, vocab, (4, T + 1), generator=gen)
        logits = model(x[:, :-1])  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(DOCS, 300)


def _probe_logits(model: torch.nn.Module) -> list[float]:
    with torch.no_grad():
        return model(torch.tensor(PROBE))[0, -1, :8].tolist()


def test_a_trained_llama_loads_in_a_fresh_transformers_process(tmp_path, tok):
    spec = DataSpec("language", (T,), tok.vocab_size)
    torch.manual_seed(0)
    model = build_model("hf:llama", spec, OPTS, max_params=None)
    _train(model, tok.vocab_size)
    ck = checkpoint_bytes(model, model_name="hf:llama", model_options=OPTS, round=3)
    rm = load_run_model(RunParts("hf:llama", OPTS, spec, ck, tok.data))  # as the owner's machine does
    assert rm.round == 3
    done = export_hf(rm.model, tok.data, tmp_path / "llama")
    assert set(done.files) >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    }
    assert not any(f.endswith((".bin", ".pt", ".pkl")) for f in done.files)  # never a pickle
    got = _load_elsewhere(str(done.path), json.dumps(PROBE))
    assert got["logits"] == pytest.approx(_probe_logits(model), abs=1e-4)
    assert got["generated"] >= 1
    eot = tok.eot_id
    assert got["eos"] == [eot, EOT, eot]
    assert got["roundtrip"] == "the lazy dog"


def test_a_lora_run_exports_merged_and_the_adapter_alone(tmp_path, tok):
    spec = DataSpec("language", (T,), tok.vocab_size)
    torch.manual_seed(1)
    base_model = build_model("hf:llama", spec, OPTS, max_params=None)
    base_dir = tmp_path / "base"  # the folder the owner gave init --from-pretrained
    base_model.lm.save_pretrained(str(base_dir))
    base = tensors_to_bytes(dict(base_model.lm.state_dict()))
    lora_opts = OPTS | {"init_weights": BASE_CID, "lora": {"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]}}
    # the run's model: the base's weights, a LoRA adapter trained a few steps
    (tmp_path / "w").write_bytes(base)
    model = build_model("hf:llama", spec, lora_opts, max_params=None, weights=lambda cid: tmp_path / "w")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # B starts at zero; move it so the adapter changes something
    _train(model, tok.vocab_size)
    ck = checkpoint_bytes(model, model_name="hf:llama", model_options=lora_opts, round=2)
    rm = load_run_model(RunParts("hf:llama", lora_opts, spec, ck, tok.data, base))
    ours = _probe_logits(rm.model)
    assert ours != pytest.approx(_probe_logits(base_model), abs=1e-4)  # the adapter is there
    merged = export_hf(rm.model, tok.data, tmp_path / "merged")
    adapter = export_hf(rm.model, tok.data, tmp_path / "adapter", adapter_only=True)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(adapter.files)
    assert "model.safetensors" not in adapter.files
    got = _load_elsewhere(str(merged.path), json.dumps(PROBE), str(base_dir), str(adapter.path))
    assert got["logits"] == pytest.approx(ours, abs=1e-4)
    assert got["adapter_logits"] == pytest.approx(ours, abs=1e-4)


def test_formats_each_model_has_and_the_refusals(tmp_path, tok):
    check_format("hf:llama", "hf")
    check_format("transformer", "safetensors")
    with pytest.raises(UsageError, match="model 'transformer' has only the format safetensors"):
        check_format("transformer", "hf")
    with pytest.raises(UsageError, match="model 'pkg.mod:make' has only the format safetensors"):
        check_format("pkg.mod:make", "hf")
    with pytest.raises(UsageError, match="is not one of: safetensors, hf"):
        check_format("hf:llama", "onnx")
    with pytest.raises(UsageError, match="--adapter-only needs"):
        check_format("hf:llama", "hf", adapter_only=True, lora=False)
    spec = DataSpec("language", (T,), tok.vocab_size)
    model = build_model("hf:llama", spec, OPTS, max_params=None)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="not an empty folder"):
        export_hf(model, tok.data, tmp_path / "full")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    with pytest.raises(UsageError, match="--adapter-only needs a run that trains a LoRA adapter"):
        export_hf(model, tok.data, tmp_path / "x", adapter_only=True)
    transformer = build_model("transformer", DataSpec("language", (T,), 256), {"d_model": 16, "n_layers": 1})
    with pytest.raises(UsageError, match="needs a Hugging Face model"):
        export_hf(transformer, None, tmp_path / "y")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # nothing half-written left behind
