"""Real models on real data, end to end (a real coordinator, real workers, the owner's CLI as
processes, a corpus the test writes): the README's workflow with ``hf:llama`` on a ``.jsonl``
corpus trains a 2-layer Llama whose validation perplexity falls, and the folder
``download-model --format hf`` writes loads and generates in a fresh process that imports
``transformers`` and nothing of aitbc; a fine-tune of a model saved with ``save_pretrained``
does the same, in full and with LoRA, whose updates are smaller on the wire by the adapter's
share of the model; and every refusal of a model, weights, tokenizer or corpus is one line,
a non-zero exit, and changes nothing."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.pretrained import tiny_pretrained_dir

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

pytestmark = pytest.mark.long  # minutes of real processes: make test-long

# What the test changes in the README's commands to stay small: a 2-layer Llama of width 64
# on a few hundred KB, 2 workers, 3 rounds.
TINY_LLAMA = "hidden_size=64,num_hidden_layers=2,num_attention_heads=4,intermediate_size=128,context=32"
SMALLER = {
    "--model-opt": TINY_LLAMA,
    "--vocab-size": "384",
    "--dataset-size": "1MB",
    "--target-workers": "2",
    "--required-workers": "2",
    "--rounds": "3",
    "--local-steps": "15",
    "--max-new-tokens": "8",
}

# A deterministic corpus of varied, learnable text.
NAMES = [
    "Ada",
    "Grace",
    "Alan",
    "Edsger",
    "Barbara",
    "Donald",
    "Ken",
    "Dennis",
    "Margaret",
    "Linus",
    "Guido",
    "Niklaus",
]
VERBS = ["writes", "reads", "compiles", "tests", "sorts", "merges", "parses", "builds", "ships", "reviews", "fixes"]
ADJECTIVES = ["small", "quick", "careful", "lazy", "recursive", "sorted", "broken", "elegant", "tiny", "old", "new"]
THINGS = ["program", "list", "tree", "compiler", "kernel", "parser", "queue", "table", "proof", "function", "graph"]
PLACES = ["at dawn", "in the lab", "on the train", "before lunch", "after the meeting", "by the window", "at night"]


def documents(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        sentences = [
            f"{rng.choice(NAMES)} {rng.choice(VERBS)} the {rng.choice(ADJECTIVES)} {rng.choice(THINGS)} "
            f"{rng.choice(PLACES)}."
            for _ in range(rng.randint(3, 9))
        ]
        docs.append(" ".join(sentences))
    return docs


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    with path.open("w") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"id": i, field: doc, "source": "generated"}) + "\n")
    return path


# --- the README's commands ---------------------------------------------------------------------


def readme_commands(heading: str) -> list[list[str]]:
    """The ``aitbc ...`` commands of the first fenced block under ``heading`` in README.md, as
    argument lists (continuation lines joined, comments dropped, ``&&`` split)."""
    text = README.read_text()
    section = text[text.index(heading) :]
    block = section.split("```", 2)[1].split("\n", 1)[1]
    joined = re.sub(r"\\\n\s*", " ", block)
    commands = []
    for line in joined.splitlines():
        for part in line.split("&&"):
            args = shlex.split(part, comments=True)
            if args and args[0] == "aitbc":
                commands.append(args[1:])
    return commands


def readme_python(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(heading) :]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def smaller(args: list[str], **values: str) -> list[str]:
    """``args`` with each flag of SMALLER (and ``values``: ``data_path="x"`` for --data-path)
    given the test's value, and ``<id>`` its run."""
    table = SMALLER | {"--" + k.replace("_", "-"): v for k, v in values.items() if k not in ("o", "id")}
    if "o" in values:
        table["-o"] = values["o"]
    out = list(args)
    for i, a in enumerate(out):
        if a == "<id>":
            out[i] = values["id"]
        elif i > 0 and out[i - 1] in table:
            out[i] = table[out[i - 1]]
    return out


def one_line_error(r: subprocess.CompletedProcess, *words: str) -> str:
    """A refusal: a non-zero exit and one ``error:`` line on stderr holding every word."""
    assert r.returncode in (1, 2), (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# --- a fresh process with transformers and nothing of aitbc ------------------------------------

NO_AITBC = """
import importlib.abc, sys
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("aitbc", "aitbc_agent_sdk", "tests"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, _NotInstalled())
"""
CHECK_NO_AITBC = """
assert not [m for m in sys.modules if m.split(".")[0] in ("aitbc", "aitbc_agent_sdk")], "aitbc was imported"
"""


def fresh_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter where importing aitbc fails, as on a machine without it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AITBC", "PYTHONPATH"))}
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    program = NO_AITBC + code + CHECK_NO_AITBC
    return subprocess.run(
        [sys.executable, "-I", "-c", program], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def generates(directory: Path, prompt: str, cwd: Path) -> str:
    """Load ``directory`` with transformers' Auto classes alone and continue ``prompt``."""
    code = f"""
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained({str(directory)!r})
tokenizer = AutoTokenizer.from_pretrained({str(directory)!r})
ids = tokenizer({prompt!r}, return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=12, do_sample=False)
assert out.shape[1] > ids.shape[1], out.shape
print(tokenizer.decode(out[0]))
"""
    r = fresh_python(code, cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith(prompt) and len(r.stdout.strip()) > len(prompt), r.stdout
    return r.stdout


# --- helpers on a stack ------------------------------------------------------------------------


def training_id(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stderr
    return re.search(r"Training ID: (training_\w+)", r.stdout).group(1)


def results(stack, run_id: str) -> dict:
    r = stack.cli("distributed-training", "results", "--training-id", run_id, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def perplexity_fell(res: dict) -> tuple[float, float]:
    first, last = math.exp(res["initial_val_loss"]), math.exp(res["final_val_loss"])
    assert last < first, (first, last)
    return first, last


def state(stack) -> dict:
    """What a refusal must not change: runs, their data and contracts, and stored blobs."""
    blobs = stack.root / "coordinator" / "blobs"
    return {
        "runs": stack.rows("SELECT id, status, manifest_cid, data_bytes, model_options FROM runs ORDER BY id"),
        "contracts": stack.rows("SELECT id, run_id, worker_id, status FROM contracts ORDER BY id"),
        "blobs": sorted(str(p.relative_to(blobs)) for p in blobs.rglob("*") if p.is_file()) if blobs.exists() else [],
    }


def hire_and_train(stack, run_id: str, *, rounds: int = 2, local_steps: int = 10) -> dict:
    for args in (
        ("discover-workers", "--training-id", run_id, "--required-workers", "2"),
        (
            "distribute",
            "--training-id",
            run_id,
            "--rounds",
            str(rounds),
            "--local-steps",
            str(local_steps),
            "--lr",
            "0.005",
        ),
        ("monitor", "--training-id", run_id),
    ):
        r = stack.cli("distributed-training", *args)
        assert r.returncode == 0, (args, r.stderr, stack.log("coordinator"))
    res = results(stack, run_id)
    assert res["status"] == "complete" and res["rounds_completed"] == rounds, res
    return res


@pytest.fixture
def two_workers(stack):
    stack.start_coordinator()
    for name in ("w1", "w2"):
        stack.start_worker(name)
    stack.wait_offers(2)
    return stack


# --- (a) the README's workflow with hf:llama on a .jsonl corpus --------------------------------


def test_the_readme_workflow_trains_a_llama_that_loads_in_transformers(two_workers, tmp_path):
    stack = two_workers
    corpus = write_jsonl(tmp_path / "corpus.jsonl", documents(1500, seed=0))
    held_out = write_jsonl(tmp_path / "held-out.jsonl", documents(60, seed=1))
    assert 200_000 < corpus.stat().st_size < 1_000_000
    out = tmp_path / "my-llama"
    commands = readme_commands("## Train a small Llama")
    flags = {a for args in commands for a in args if a.startswith("-")}
    assert {"--model-type", "--data-path", "--format", "-o", *SMALLER} - {"--max-new-tokens"} <= flags
    assert commands[0] == ["up", "--workers", "3"] and commands[-1] == ["down"]

    run_id = ""
    for args in commands[1:-1]:  # up and down: the stack is the test's own processes
        if args[:1] != ["distributed-training"]:
            r = stack.cli(*args)  # wallet create, wallet fund
            assert r.returncode == 0, (args, r.stderr)
            continue
        args = smaller(args, id=run_id, data_path=str(corpus), o=str(out))
        r = stack.cli(*args)
        assert r.returncode == 0, (args, r.stderr, stack.log("coordinator")[-2000:])
        if args[1] == "init":
            assert args[args.index("--model-type") + 1] == "hf:llama"
            run_id = training_id(r)
        if args[1] == "upload-data":
            assert "Tokenizer: 384 tokens" in r.stdout, r.stdout
            assert re.search(r"Size: .*1,500 documents", r.stdout), r.stdout

    run = stack.api(f"/runs/{run_id}")
    assert run["model_type"] == "hf:llama" and run["vocab_size"] == 384
    assert run["measured"]["documents"] == 1500 and run["measured"]["tokens"] > 10_000
    res = results(stack, run_id)
    assert res["status"] == "complete" and res["rounds_completed"] == 3
    first, last = perplexity_fell(res)
    assert first > 100  # a model that starts near the uniform 384 tokens, and learns
    assert res["final_val_perplexity"] == pytest.approx(last)
    assert res["tokens_seen"] == res["updates_accepted"] * 15 * 32 * 32  # updates x local steps x batch x context
    assert res["updates_accepted"] == 6
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 384
    assert (config["hidden_size"], config["num_hidden_layers"]) == (64, 2)

    # The README's own snippet, in a process where aitbc is not importable.
    snippet = readme_python("## Use your model").replace('"my-llama"', repr(str(out)))
    r = fresh_python(snippet, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("def main(") and len(r.stdout) > len("def main(") + 5, r.stdout
    generates(out, "Ada writes the", tmp_path)

    # sample and evaluate, as the README types them
    for args in readme_commands("## Use your model"):
        args = smaller(args, id=run_id, data_path=str(held_out))
        r = stack.cli(*args)
        assert r.returncode == 0, (args, r.stderr)
        if args[1] == "sample":
            assert r.stdout.startswith("def main("), r.stdout
        if args[1] == "evaluate":
            m = re.search(r"perplexity ([\d.]+)", r.stdout + r.stderr)
            assert m and float(m.group(1)) < first, r.stdout + r.stderr


# --- (b) fine-tuning a model saved with save_pretrained, in full and with LoRA -----------------


def test_fine_tune_in_full_and_with_lora(two_workers, tmp_path):
    from aitbc.training.data_spec import DataSpec
    from aitbc.training.hf_models import options_from_hf_config
    from aitbc.training.models import build_model

    stack = two_workers
    base = tiny_pretrained_dir(tmp_path)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", documents(400, seed=2))
    runs = {}
    for name, extra in (("full", ()), ("lora", ("--lora", "r=4,alpha=8,dropout=0,targets=q_proj,v_proj"))):
        r = stack.cli(
            "distributed-training", "init", "--wallet", "my-agent-wallet", "--from-pretrained", str(base),
            "--dataset-size", "1MB", "--target-workers", "2", "--model-opt", "context=32", *extra,
        )  # fmt: skip
        runs[name] = training_id(r)
        stack.fund_owner()
        r = stack.cli("distributed-training", "upload-data", "--training-id", runs[name], "--data-path", str(corpus))
        assert r.returncode == 0, r.stderr
    full = hire_and_train(stack, runs["full"], rounds=2, local_steps=15)
    lora = hire_and_train(stack, runs["lora"], rounds=2, local_steps=15)
    perplexity_fell(full)
    perplexity_fell(lora)  # the adapter alone moves the frozen base's predictions

    # Bytes on the wire: the adapter's share of the model (uncompressed float32 updates).
    _, options = options_from_hf_config(json.loads((base / "config.json").read_text()))
    for run_id in runs.values():  # the corpus tokenized with the model's own tokenizer
        assert stack.api(f"/runs/{run_id}")["vocab_size"] == options["vocab_size"]
    spec = DataSpec("language", (32,), options["vocab_size"])
    weights = base / "model.safetensors"
    whole = build_model("hf:llama", spec, options | {"context": 32})
    adapter = build_model(
        "hf:llama",
        spec,
        options | {"context": 32, "init_weights": "bafkreiaaaaaaaa", "lora": {"r": 4, "targets": ["q_proj", "v_proj"]}},
        weights=lambda _: weights,
    )
    n_full = sum(p.numel() for p in whole.parameters())
    n_adapter = sum(p.numel() for p in adapter.parameters())
    assert n_adapter == 2 * 2 * 4 * (32 + 32)  # 2 layers x (q, v) x r x (in + out)
    per_update = {
        k: v["bytes_up"] / (v["updates_accepted"] + v["updates_rejected"]) for k, v in (("full", full), ("lora", lora))
    }
    assert full["updates_accepted"] == lora["updates_accepted"] == 4
    assert per_update["full"] >= 4 * n_full
    assert per_update["lora"] >= 4 * n_adapter
    ratio = per_update["lora"] / per_update["full"]
    assert ratio == pytest.approx(n_adapter / n_full, rel=0.25), (per_update, n_adapter, n_full)

    # Each result loads in transformers alone and generates; a LoRA run's merged, and its
    # adapter alone onto the base with peft.
    for name, run_id in runs.items():
        out = tmp_path / f"{name}-hf"
        r = stack.cli(
            "distributed-training", "download-model", "--training-id", run_id, "--format", "hf", "-o", str(out)
        )
        assert r.returncode == 0, r.stderr
        assert not list(out.glob("adapter_*"))
        generates(out, "the quick brown", tmp_path)
    adapter_dir = tmp_path / "adapter"
    r = stack.cli(
        "distributed-training", "download-model", "--training-id", runs["lora"], "--format", "hf", "--adapter-only",
        "-o", str(adapter_dir),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter_dir.iterdir()}
    code = f"""
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
merged = AutoModelForCausalLM.from_pretrained({str(tmp_path / "lora-hf")!r}).eval()
adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({str(base)!r}), {str(adapter_dir)!r}).eval()
ids = torch.arange(20).view(1, 20)
with torch.no_grad():
    a, b = merged(input_ids=ids).logits, adapted(input_ids=ids).logits
assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
print("same")
"""
    r = fresh_python(code, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "same", r.stderr[-3000:]


# --- (c) refusals: one line, a non-zero exit, nothing changed ----------------------------------


def edited_copy(src: Path, dest: Path, **config_changes: object) -> Path:
    shutil.copytree(src, dest)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps(config | config_changes))
    return dest


def test_refusals_are_one_line_and_change_nothing(stack, tmp_path):
    stack.start_coordinator(extra=("--max-params", "200000"))
    stack.start_worker("small", extra=("--max-params", "1000"))
    stack.wait_offers(1)
    base = tiny_pretrained_dir(tmp_path)
    init = ("distributed-training", "init", "--wallet", "my-agent-wallet", "--dataset-size", "1MB", "--target-workers")

    def refused(args: tuple[str, ...], *words: str) -> None:
        before = state(stack)
        one_line_error(stack.cli(*args), *words)
        assert state(stack) == before, args

    # Model directories that name code, hold pickles or another architecture.
    bad_dirs = {
        "remote": (edited_copy(base, tmp_path / "remote", trust_remote_code=True), ["trust_remote_code"]),
        "auto_map": (
            edited_copy(base, tmp_path / "auto_map", auto_map={"AutoModelForCausalLM": "modeling_x.Evil"}),
            ["auto_map"],
        ),
        "bert": (edited_copy(base, tmp_path / "bert", model_type="bert", architectures=["BertModel"]), ["bert"]),
        "arch": (edited_copy(base, tmp_path / "arch", architectures=["EvilForCausalLM"]), ["EvilForCausalLM"]),
        "range": (edited_copy(base, tmp_path / "range", num_hidden_layers=100_000), ["num_hidden_layers", "128"]),
    }
    pickled = shutil.copytree(base, tmp_path / "pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    bad_dirs["bin"] = (pickled, [".bin"])
    for directory, words in bad_dirs.values():
        refused((*init, "1", "--from-pretrained", str(directory)), *words)
    refused((*init, "1", "--from-pretrained", str(base), "--lora", "r=4,targets=c_attn"), "c_attn")

    # Config fields out of range, an unknown family, and a model over the coordinator's cap.
    refused((*init, "1", "--model-type", "hf:bert"), "hf:bert", "hf:llama")
    refused((*init, "1", "--model-type", "hf:llama", "--model-opt", "hidden_size=100000"), "hidden_size", "16384")
    refused((*init, "1", "--model-type", "hf:llama", "--model-opt", "trust_remote_code=true"), "trust_remote_code")
    assert not (stack.root / "owner" / "wallets").exists()  # refused before init made the owner's wallet
    assert stack.cli("wallet", "create", "my-agent-wallet").returncode == 0  # as the README's workflow begins
    refused(
        (*init, "1", "--model-type", "hf:llama", "--model-opt", "hidden_size=256,num_hidden_layers=4"),
        "200,000",
        "parameters",
    )

    # A run the coordinator takes, then a tokenizer and a corpus it must not take.
    run_id = training_id(
        stack.cli(*init, "1", "--model-type", "hf:llama", "--model-opt", TINY_LLAMA.replace("64", "32", 1))
    )
    stack.fund_owner()
    bad_tokenizer = tmp_path / "tokenizer.json"
    bad_tokenizer.write_text('{"model": {"type": "BPE", "vocab": ')
    no_text = write_jsonl(tmp_path / "no-text.jsonl", documents(50, seed=3), field="body")
    corpus = write_jsonl(tmp_path / "corpus.jsonl", documents(300, seed=4))
    upload = ("distributed-training", "upload-data", "--training-id", run_id, "--data-path")
    refused((*upload, str(corpus), "--tokenizer", str(bad_tokenizer)), "tokenizer")
    refused((*upload, str(no_text)), "text")
    refused((*upload, str(no_text), "--text-field", "title"), "title")

    # The data attached, the only offer is too small for the model: nobody is hired.
    r = stack.cli(*upload, str(corpus), "--vocab-size", "300")
    assert r.returncode == 0, r.stderr
    refused(
        ("distributed-training", "discover-workers", "--training-id", run_id, "--required-workers", "1"), "too small"
    )


# --- the SDK guide's example -------------------------------------------------------------------


def test_the_sdk_guides_language_model_example(two_workers, tmp_path):
    stack = two_workers
    guide = (ROOT / "docs" / "sdk-guide.md").read_text()
    section = guide[guide.index("## A language model on your corpus") :]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    small = {
        '{"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "context": 128}': (
            '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, '
            '"context": 32}'
        ),
        "vocab_size=4096": "vocab_size=384",
        "rounds=10, local_steps=20": "rounds=2, local_steps=10",
    }
    for documented, tested in small.items():
        assert documented in example, documented
        example = example.replace(documented, tested)
    write_jsonl(tmp_path / "my-corpus.jsonl", documents(600, seed=5))  # the names the example uses
    write_jsonl(tmp_path / "held-out.jsonl", documents(40, seed=6))

    r = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, cwd=tmp_path, env=stack.env, timeout=900
    )

    assert r.returncode == 0, (r.stderr[-3000:], stack.log("coordinator")[-2000:])
    sampled, _, perplexity = r.stdout.rstrip("\n").rpartition("\n")  # the continuation may hold newlines
    assert sampled.strip(), r.stdout  # 40 new tokens of text
    assert 1 < float(perplexity) < 384, r.stdout  # better than uniform over the vocabulary
    generates(tmp_path / "my-llama", "Grace reads the", tmp_path)
