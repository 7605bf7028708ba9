"""End to end: the owner uses a trained run's model on their own machine, through the CLI
and the SDK, against real coordinator and worker processes: ``sample`` and ``evaluate`` on
a byte-level transformer and a classifier, ``download-model`` and its refusals; a language
run's tokens seen and perplexity in its results, on the dashboard and in its report."""

from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.long  # two trained runs of real processes: make test-long

TINY = ["--model-opt", "context=32,d_model=32,n_layers=1,n_heads=2"]
DT = "distributed-training"


def _corpus(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    import json as _json  # any real text: the standard library's json package sources
    from pathlib import Path

    for f in sorted(Path(_json.__file__).parent.glob("*.py")):
        (corpus / f.name).write_bytes(f.read_bytes())
    return corpus


def _trained(stack, run_id: str, data: str) -> None:
    stack.start_run(run_id, workers=1, data=data, rounds=2, local_steps=5)
    r = stack.cli(DT, "monitor", "--training-id", run_id, "--timeout", "240")
    assert r.returncode == 0 and f"Run {run_id} complete" in r.stdout, r.stderr + r.stdout


def test_sample_evaluate_and_download_a_trained_transformer_and_a_classifier(stack, tmp_path):
    from aitbc_agent_sdk import Agent, AgentConfig

    stack.start_coordinator()
    stack.start_worker("w0")
    stack.wait_offers(1)
    run_id = stack.init_run(*TINY, model="transformer", workers=1)
    _trained(stack, run_id, str(_corpus(tmp_path)))

    # tokens seen (each accepted update's steps x batch x context) and perplexity, in the
    # results, on the dashboard and in the report
    cfg = stack.api(f"/runs/{run_id}")["config"]
    res = json.loads(stack.cli(DT, "results", "--training-id", run_id, "--json").stdout)
    seen = res["updates_accepted"] * cfg["local_steps"] * cfg["batch_size"] * 32
    assert res["updates_accepted"] == 2 and res["tokens_seen"] == seen > 0
    assert res["final_val_perplexity"] == pytest.approx(math.exp(res["final_val_loss"]))
    detail = stack.api(f"/runs/{run_id}")
    assert detail["tokens_seen"] == seen and detail["val_perplexity"] == pytest.approx(res["final_val_perplexity"])
    r = stack.cli(DT, "status", "--training-id", run_id)
    assert r.returncode == 0 and f"tokens seen {seen:,}" in r.stdout and "perplexity" in r.stdout, r.stdout
    page = stack.api(f"/dashboard/runs/{run_id}")
    assert page["tokens_seen"] == seen and page["val_perplexity"] == pytest.approx(res["final_val_perplexity"])
    r = stack.cli(DT, "report", "--training-id", run_id, "-o", str(tmp_path / "report"))
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "report" / "report.html").read_text()
    assert f"<th>tokens seen</th><td>{seen:,}</td>" in html and "final validation perplexity" in html

    # sample: the same seed, the same text; through the CLI and the SDK alike
    ask = [DT, "sample", "--training-id", run_id, "--prompt", "def ", "--max-new-tokens", "12", "--seed", "3"]
    r = stack.cli(*ask, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["round"] == 2 and got["new_tokens"] == 12 and got["stopped"] == "length" and not got["prompt_cut"]
    assert json.loads(stack.cli(*ask, "--json").stdout)["text"] == got["text"]
    config = AgentConfig(name="t", wallet_name="my-agent-wallet", coordinator_url=stack.url, home=stack.root / "owner")
    with Agent(config) as agent:
        sdk = agent.sample(run_id, "def ", max_new_tokens=12, seed=3)
        assert sdk.text == got["text"] and sdk.cid == got["cid"]
        first = agent.sample(run_id, "def ", max_new_tokens=12, seed=3, round=1)
        assert first.round == 1 and first.cid != got["cid"]
        long = agent.sample(run_id, "x" * 100, max_new_tokens=1, temperature=0)
        assert long.prompt_cut and (long.prompt_tokens, long.prompt_tokens_used) == (100, 32)
        held = tmp_path / "held.jsonl"
        held.write_text("\n".join(json.dumps({"body": f"def f{i}(x):\n    return x + {i}\n"}) for i in range(20)))
        ev = agent.evaluate(run_id, held, text_field="body")
        assert ev.perplexity == pytest.approx(math.exp(ev.loss)) and ev.context == 32 and ev.documents == 20
    r = stack.cli(*ask)  # as the owner reads it: the prompt, then the new text
    assert r.returncode == 0 and r.stdout.startswith("def " + got["text"][:4]), r.stdout
    r = stack.cli(DT, "evaluate", "--training-id", run_id, "--data-path", str(held), "--text-field", "body")
    assert r.returncode == 0 and f"perplexity {ev.perplexity:.2f}" in r.stdout, r.stderr + r.stdout

    # refusals, each one line, before anything is fetched
    r = stack.cli(*ask[:-4], "--max-new-tokens", "0")
    assert r.returncode == 2 and "--max-new-tokens must be an integer from 1 to 4096, got 0" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = stack.cli(DT, "sample", "--training-id", run_id, "--prompt", "")
    assert r.returncode == 2 and "--prompt must be non-empty text" in r.stderr, r.stderr
    r = stack.cli(DT, "evaluate", "--training-id", run_id, "--data-path", str(held))
    assert r.returncode == 2 and "no text field 'text' (it has: body)" in r.stderr, r.stderr
    r = stack.cli(DT, "download-model", "--training-id", run_id, "--format", "hf", "-o", str(tmp_path / "hf"))
    assert r.returncode == 2 and "model 'transformer' has only the format safetensors" in r.stderr, r.stderr
    assert not (tmp_path / "hf").exists()

    # a classifier: evaluate on labelled arrays; sample refused
    stack.start_worker("w1")
    stack.wait_offers(2)
    mlp = stack.init_run(model="mlp", workers=1)
    _trained(stack, mlp, "digits")
    r = stack.cli(DT, "sample", "--training-id", mlp, "--prompt", "hi")
    assert r.returncode == 2 and "sample: model 'mlp' is a classifier" in r.stderr, r.stderr
    r = stack.cli(DT, "evaluate", "--training-id", mlp, "--data-path", "digits", "--json")
    assert r.returncode == 0, r.stderr
    ev = json.loads(r.stdout)
    assert ev["samples"] == 1797 and 0 <= ev["accuracy"] <= 1 and ev["perplexity"] is None
    res = json.loads(stack.cli(DT, "results", "--training-id", mlp, "--json").stdout)
    assert res["tokens_seen"] is None and res["final_val_perplexity"] is None  # a classifier has neither
    detail = stack.api(f"/runs/{mlp}")
    assert detail["tokens_seen"] is None and detail["val_perplexity"] is None
