"""A LoRA fine-tune on real worker processes, every update spot-checked: the owner's CLI
creates the run from a local pretrained directory (``init --from-pretrained DIR --lora``)
and tokenizes a ``.jsonl`` corpus with the model's own tokenizer; a worker with two
data-parallel ranks and a single-process worker train the adapter alone on that base; the
coordinator re-runs every update's steps on the same base (``--verify-rate 1``) and every
one passes. The adapter draws dropout, whose masks a split batch cannot reproduce, so the
two-rank worker trains this spot-checked job on one rank (it was slashed when it did not);
without dropout its second rank trains too, on the base rank 0 fetched."""

from __future__ import annotations

import json
import re

import pytest
from tests.pretrained import CORPUS, tiny_pretrained_dir

pytestmark = pytest.mark.long

ROUNDS = 2


@pytest.mark.parametrize("dropout", ["0.1", "0"])
def test_a_lora_fine_tune_trains_on_two_workers_and_every_update_replays(stack, tmp_path, dropout):
    model_dir = tiny_pretrained_dir(tmp_path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS * 30))
    stack.start_coordinator()
    stack.start_worker("dp", extra=("--gpus", "2", "--device", "cpu"))
    stack.start_worker("single")
    stack.wait_offers(2)
    r = stack.cli(
        "distributed-training",
        "init",
        "--wallet",
        "my-agent-wallet",
        "--from-pretrained",
        str(model_dir),
        "--lora",
        f"r=4,alpha=8,dropout={dropout},targets=q_proj,v_proj",
        "--model-opt",
        "context=16",
        "--dataset-size",
        "1MB",
        "--target-workers",
        "2",
    )
    assert r.returncode == 0, r.stderr
    stack.fund_owner()
    run_id = re.search(r"Training ID: (training_\w+)", r.stdout).group(1)
    stack.start_run(run_id, workers=2, data=str(corpus), rounds=ROUNDS, local_steps=6, batch_size=4, verify_rate=1)
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=400, what="the end")
    assert run["status"] == "complete", run["error"]
    assert run["config"]["d"] == 2 * 2 * (4 * 32 + 32 * 4)  # the adapter alone travels
    ups = stack.rows(
        "SELECT worker_id, round, status, verification FROM updates WHERE run_id = :r ORDER BY round", r=run_id
    )
    names = {stack.worker_id(n): n for n in ("dp", "single")}
    assert len(ups) == 2 * ROUNDS and all(u[2:] == ("accepted", "passed") for u in ups), [
        (names[u[0]], *u[1:]) for u in ups
    ]
    log = (stack.root / "dp.log").read_text()
    assert "data parallel over 2 ranks (gloo)" in log
    assert ("draws dropout and its updates are spot-checked: trained on one rank" in log) == (dropout != "0"), log[
        -3000:
    ]
