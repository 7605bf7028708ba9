"""Benchmark: a Hugging Face model against the built-in transformer of its size, live; a
LoRA fine-tune's bytes against the full model's.

Two parts (``--parts``, default both):

- ``live``: for each model, one ``aitbc coordinator serve`` and three ``aitbc worker start``
  processes on loopback (``OMP_NUM_THREADS=1`` each), the owner's CLI driving the run as a
  user types it (the end-to-end tests' harness, ``tests/e2e/conftest.py``): ``init``,
  ``upload-data`` (the Llama's text through a byte-level BPE trained on the corpus,
  ``--vocab-size``; the transformer's as bytes), ``discover-workers``, ``distribute`` with
  dense updates (``--compression none``). Models: ``hf:llama`` and the built-in
  ``transformer``, each about 25M parameters at ``--size 25m``. Reported per model: tokens
  per second per worker (over its compute seconds, and over the run's training wall
  time), the text bytes those tokens cover, utilization (the workers' compute seconds
  over 3 x the training wall time), and each round's time by phase: per worker its own
  clocks (download and load of the round's model, the local steps, the update's
  encoding, its upload and the message naming it), and the coordinator's close
  (``aitbc_round_close_seconds``: aggregation, outer step, divergence guard, checkpoint,
  commit), sampled from its ``/metrics`` while the run trains.
- ``lora``: the full Llama run's final model saved as a Hugging Face folder
  (``config.json``, ``model.safetensors``, ``tokenizer.json``), then ``init
  --from-pretrained DIR --lora r=..`` on it and the same live run: bytes per worker per
  round, up (its update) and down (the round's model), against the full model's.
SparseLoCo on a Llama of the transformer's size (the simulator, bytes per worker to the
dense baseline's loss +2%, over seeds 0-4) is ``python bench/communication.py --tasks
llama``: its seeds run in parts and combine as the other communication rows do.

The coordinator scores on 8 samples (``--eval-samples``, ``--guard-samples``,
``--score-samples``), as ``bench/live_large.py`` does: a 25M model's forward pass on 512
sequences would be most of a round on a CPU. The machine is shared: the load average before
and after each run goes with its figures.

Usage: python bench/models.py [--size 25m|small] [--parts live,lora] [--keep DIR]
Writes bench/results/models.json (print to bench/results/models.txt with tee).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import RESULTS, print_table, write_json
from _sims import machine

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 3
PHASES = ("download", "compute", "encode", "upload")


@dataclass(frozen=True)
class Size:
    """One scale of the benchmark: the models' options and the live runs' settings."""

    llama: dict[str, int]
    transformer: dict[str, int]
    vocab_size: int  # the Llama's BPE, trained on the corpus
    max_bytes: int  # corpus bytes read
    rounds: int
    local_steps: int
    batch_size: int
    lora: str
    lr: float = 6e-4


SIZES = {
    # ~25M parameters each: Llama 6 x (attention 4 x 512^2 + gated MLP 3 x 512 x 1152) + two
    # 8192 x 512 embeddings; the transformer 8 x 12 x 512^2 + its byte embeddings.
    "25m": Size(
        llama=dict(
            hidden_size=512,
            num_hidden_layers=6,
            num_attention_heads=8,
            intermediate_size=1152,
            max_position_embeddings=128,
            context=128,
        ),
        transformer=dict(d_model=512, n_layers=8, n_heads=8, context=128),
        vocab_size=8192,
        max_bytes=1 << 20,
        # a step of 8 x 128 tokens is ~3 s on one core and each round moves 100 MB each way
        # per worker: 2 rounds of 4 steps keep a run to 3-4 minutes on this machine
        rounds=2,
        local_steps=4,
        batch_size=8,
        lora="r=8,alpha=16,targets=q_proj,v_proj",
    ),
    "small": Size(
        llama=dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=172,
            max_position_embeddings=32,
            context=32,
        ),
        transformer=dict(d_model=64, n_layers=2, n_heads=4, context=32),
        vocab_size=512,
        max_bytes=256 << 10,
        rounds=2,
        local_steps=2,
        batch_size=4,
        lora="r=4,alpha=8,targets=q_proj,v_proj",
        lr=3e-3,
    ),
}


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Live:
    """What one live run measured."""

    label: str
    model: str
    run_id: str
    status: str
    params_total: int
    params_trained: int
    rounds: int
    local_steps: int
    batch_size: int
    context: int
    training_wall_s: float
    compute_s: list[float]  # per worker, the run's total
    utilization: float
    tokens_per_s_compute: float  # per worker: its tokens over its compute seconds (mean of workers)
    tokens_per_s_wall: float  # per worker: all tokens / workers / training wall
    bytes_per_token: float  # text bytes one token covers (1 for bytes)
    # the coordinator's own count (the run's bytes_up, bytes_down) per worker per round
    update_bytes: float  # up: the worker's update
    model_bytes: float  # down: the round's model, once per answering worker
    phases: dict[str, dict[str, float]]  # "round N" -> mean seconds of each phase, close, wall
    val_loss: tuple[float | None, float | None]
    load_before: float
    load_after: float
    wall_s: float
    upload: dict[str, Any]
    lora: str | None = None  # the --lora spec of a fine-tune


def _cli(stack: Any, *args: str, timeout: float = 900) -> str:
    r = stack.cli(*args, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(
            f"aitbc {' '.join(args[:2])} failed ({r.returncode}): {r.stderr[-3000:] or r.stdout[-3000:]}"
        )
    return r.stdout


def live_run(
    e2e: Any,
    large: Any,
    root: Path,
    *,
    label: str,
    model: str,
    init_args: list[str],
    upload_args: list[str],
    size: Size,
    context: int,
    timeout: float,
) -> Live:
    """One run: a coordinator and three workers, the owner's CLI from init to the run's end."""
    root.mkdir(parents=True)
    (root / "coordinator").mkdir()
    stack = e2e.Stack(root, f"sqlite:///{root / 'coordinator' / 'coordinator.db'}")
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    try:
        stack.env.update(large.SMALL_EVAL)
        stack.start_coordinator(lease=30.0)
        for i in range(WORKERS):
            stack.start_worker(f"w{i}")
        stack.wait_offers(WORKERS, timeout=180)
        run_id = stack.init_run(*init_args, model=model, workers=WORKERS)
        up = json.loads(
            _cli(stack, "distributed-training", "upload-data", "--training-id", run_id, *upload_args, "--json")
        )
        _cli(
            stack,
            "distributed-training",
            "discover-workers",
            "--training-id",
            run_id,
            "--min-gpu",
            "RTX3090",
            "--required-workers",
            str(WORKERS),
        )
        with large.Closes(stack.url) as closes:
            _cli(
                stack,
                "distributed-training",
                "distribute",
                "--training-id",
                run_id,
                "--strategy",
                "data-parallel",
                f"--rounds={size.rounds}",
                f"--local-steps={size.local_steps}",
                f"--batch-size={size.batch_size}",
                f"--lr={size.lr}",
                "--compression=none",
            )
            run = stack.wait_run(
                run_id, lambda r: r["status"] in ("complete", "failed", "cancelled"), timeout=timeout, what="run end"
            )
            deadline = time.monotonic() + 60  # the last close is observed as the run completes
            while len(closes.seen["close"]) < size.rounds and time.monotonic() < deadline:
                time.sleep(0.2)
        rounds = [r for r in stack.api(f"/runs/{run_id}/rounds")["data"] if r["round"] > 0]
        workers = {
            f"w{i}": large.worker_rounds((root / f"w{i}.log").read_text(errors="replace"), run_id)
            for i in range(WORKERS)
        }
        final = rounds[-1]["checkpoint_cid"] if rounds else None
        trained = large.model_params(stack, final, root) if final else 0  # fetched to root/fetched
        _keep_tokenizer(stack, up.get("tokenizer_cid"), root / "tokenizer.json")
    finally:
        stack.close()
    if run["status"] != "complete":
        raise RuntimeError(f"{label}: run ended {run['status']}: {run.get('error')}\n{stack.log('coordinator')}")
    return _measure(
        label, model, run_id, run, rounds, workers, closes.seen["close"], up, size, context, trained,
        load_before, time.monotonic() - t0,
    )  # fmt: skip


def _keep_tokenizer(stack: Any, cid: str | None, path: Path) -> None:
    """The run's tokenizer.json (token data), kept for a fine-tune of the run's model."""
    if not cid:
        return
    from aitbc.client import CoordinatorClient

    with CoordinatorClient(stack.url) as c:
        path.write_bytes(c.get_blob(cid))


def final_model(root: Path) -> Path:
    """The last round's model a live run in ``root`` fetched (``large.model_params``)."""
    found = [p for p in (root / "fetched").rglob("*") if p.is_file()]
    if len(found) != 1:
        raise RuntimeError(f"expected one fetched model under {root / 'fetched'}, found {len(found)}")
    return found[0]


def _measure(
    label: str,
    model: str,
    run_id: str,
    run: dict[str, Any],
    rounds: list[dict[str, Any]],
    workers: dict[str, dict[int, dict[str, float]]],
    closes: list[float],
    up: dict[str, Any],
    size: Size,
    context: int,
    trained: int,
    load_before: float,
    wall: float,
) -> Live:
    W, H, B = WORKERS, size.local_steps, size.batch_size
    train_wall = run["finished_at"] - run["started_at"]
    compute = [float(j["compute_seconds"]) for j in run["workers"]]
    tokens_worker = size.rounds * H * B * context  # one worker's tokens over the run
    # each worker's tokens over its own compute seconds (the local steps and the encoding)
    steps_s = [sum(p["compute"] for p in per.values()) for per in workers.values()]
    measured = up.get("measured") or {}
    per_token = (measured["bytes"] / measured["tokens"]) if measured.get("tokens") else 1.0
    phases: dict[str, dict[str, float]] = {}
    for i, r in enumerate(rounds):
        n = r["round"]
        rows = [per[n] for per in workers.values() if n in per]
        ph = {k: statistics.mean(p[k] for p in rows) for k in (*PHASES, "total")} if rows else {}
        ph["close"] = closes[i] if i < len(closes) else float("nan")
        ph["wall"] = r["closed_at"] - r["started_at"]
        phases[f"round {n}"] = ph
    answers = W * size.rounds
    from aitbc.training.models import count_params, model_config

    spec = _spec(run, up, context)
    total = count_params(model, model_config(model, _plain(run["model_options"])), spec)
    return Live(
        label=label,
        model=model,
        run_id=run_id,
        status=run["status"],
        params_total=total,
        params_trained=trained,
        rounds=size.rounds,
        local_steps=H,
        batch_size=B,
        context=context,
        training_wall_s=train_wall,
        compute_s=compute,
        utilization=sum(compute) / (W * train_wall),
        tokens_per_s_compute=statistics.mean(tokens_worker / s for s in steps_s if s > 0),
        tokens_per_s_wall=tokens_worker / train_wall,
        bytes_per_token=per_token,
        update_bytes=run["bytes_up"] / answers,
        model_bytes=run["bytes_down"] / answers,
        phases=phases,
        val_loss=(run.get("initial_val_loss"), run.get("val_loss")),
        load_before=load_before,
        load_after=os.getloadavg()[0],
        wall_s=wall,
        upload=up,
    )


def _plain(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


def _spec(run: dict[str, Any], up: dict[str, Any], context: int) -> Any:
    from aitbc.training.data_spec import DataSpec

    return DataSpec("language", (context,), int(up.get("vocab_size") or 256))


def pretrained_dir(run_root: Path, size: Size, vocab: int, out: Path) -> Path:
    """The full Llama run's final model as a Hugging Face folder: ``config.json`` and
    ``model.safetensors`` (the library's own writer) and the run's ``tokenizer.json``."""
    import shutil

    from transformers.utils import logging

    from aitbc.training.checkpoint import load_checkpoint_file
    from aitbc.training.data_spec import DataSpec
    from aitbc.training.models import build_model

    logging.disable_progress_bar()  # the library's bar in the benchmark's printed output
    model = build_model("hf:llama", DataSpec("language", (size.llama["context"],), vocab), size.llama)
    load_checkpoint_file(model, final_model(run_root))
    out.mkdir(parents=True)
    model.lm.save_pretrained(str(out), safe_serialization=True)
    shutil.copyfile(run_root / "tokenizer.json", out / "tokenizer.json")
    return out


def live_part(e2e: Any, large: Any, root: Path, size: Size, lora: bool, timeout: float) -> list[Live]:
    """The Llama, its LoRA fine-tune (``lora``) and the transformer, one live run each."""
    llama_opts = [a for k, v in size.llama.items() for a in ("--model-opt", f"{k}={v}")]
    corpus = ["--data-path", "stdlib", "--max-bytes", str(size.max_bytes)]
    out = []
    llama = live_run(
        e2e, large, root / "llama", label="hf:llama", model="hf:llama", init_args=llama_opts,
        upload_args=[*corpus, "--vocab-size", str(size.vocab_size)], size=size, context=size.llama["context"],
        timeout=timeout,
    )  # fmt: skip
    out.append(llama)
    _say(llama)
    if lora:
        vocab = int(llama.upload["vocab_size"])
        base = pretrained_dir(root / "llama", size, vocab, root / "llama-hf")
        tuned = live_run(
            e2e, large, root / "lora", label="hf:llama + LoRA", model="hf:llama",
            init_args=["--from-pretrained", str(base), "--lora", size.lora],
            upload_args=corpus, size=size,  # the tokenizer: the one the pretrained folder came with
            context=size.llama["context"], timeout=timeout,
        )  # fmt: skip
        tuned.lora = size.lora
        out.append(tuned)
        _say(tuned)
    t_opts = [a for k, v in size.transformer.items() for a in ("--model-opt", f"{k}={v}")]
    transformer = live_run(
        e2e, large, root / "transformer", label="transformer", model="transformer", init_args=t_opts,
        upload_args=corpus, size=size, context=size.transformer["context"], timeout=timeout,
    )  # fmt: skip
    out.append(transformer)
    _say(transformer)
    return out


def _say(r: Live) -> None:
    print(
        f"  {r.label}: {r.params_total:,} parameters, {r.tokens_per_s_compute:.0f} tokens/s per worker computing, "
        f"utilization {r.utilization:.1%}, run {r.wall_s:.0f} s (load average {r.load_before:.2f} -> "
        f"{r.load_after:.2f})",
        flush=True,
    )


def _ms(v: float) -> str:
    return f"{v:.2f}"


def print_live(rows: list[Live]) -> None:
    print_table(
        f"Live: {WORKERS} worker processes + coordinator on loopback, dense updates",
        [
            "model",
            "parameters (trained)",
            "rounds x H x batch x T",
            "tokens/s/worker computing",
            "tokens/s/worker wall",
            "text bytes/token",
            "text bytes/s/worker computing",
            "utilization",
            "training wall s",
            "val loss start -> end",
            "end: bits per text byte",
        ],
        [
            [
                r.label,
                f"{r.params_total:,} ({r.params_trained:,})",
                f"{r.rounds} x {r.local_steps} x {r.batch_size} x {r.context}",
                f"{r.tokens_per_s_compute:.0f}",
                f"{r.tokens_per_s_wall:.0f}",
                f"{r.bytes_per_token:.2f}",
                f"{r.tokens_per_s_compute * r.bytes_per_token:.0f}",
                f"{r.utilization:.1%}",
                f"{r.training_wall_s:.1f}",
                " -> ".join("-" if v is None else f"{v:.4f}" for v in r.val_loss),
                "-" if r.val_loss[1] is None else f"{r.val_loss[1] / math.log(2) / r.bytes_per_token:.3f}",
            ]
            for r in rows
        ],
    )
    print_table(
        "Round time by phase (seconds; per worker: mean of the three workers' own clocks)",
        ["model, round", *PHASES, "other", "worker total", "close", "round wall"],
        [
            [
                f"{r.label}, {name}",
                *(_ms(ph[k]) for k in PHASES),
                _ms(max(0.0, ph["total"] - sum(ph[k] for k in PHASES))),  # the clocks' rounding aside
                _ms(ph["total"]),
                _ms(ph["close"]),
                _ms(ph["wall"]),
            ]
            for r in rows
            for name, ph in r.phases.items()
            if "total" in ph
        ],
    )
    full = next((r for r in rows if r.label == "hf:llama"), None)
    tuned = next((r for r in rows if "LoRA" in r.label), None)
    if full is not None and tuned is not None:
        print_table(
            f"Bytes per worker per round: LoRA (--lora {tuned.lora}) against the full model",
            ["model", "trained parameters", "up (update) bytes", "down (model) bytes", "up+down", "fewer than full"],
            [
                [
                    r.label,
                    f"{r.params_trained:,}",
                    f"{r.update_bytes:,.0f}",
                    f"{r.model_bytes:,.0f}",
                    f"{r.update_bytes + r.model_bytes:,.0f}",
                    f"{(full.update_bytes + full.model_bytes) / (r.update_bytes + r.model_bytes):,.1f}x",
                ]
                for r in (full, tuned)
            ],
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="25m", help="25m: the benchmark; small: a quick check")
    ap.add_argument("--parts", default="live,lora", help="comma-separated: live, lora")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one live run may take")
    ap.add_argument("--keep", type=Path, help="run the live parts in this new folder and keep it (logs, stores)")
    ap.add_argument("--no-write", action="store_true", help="print only: leave bench/results/models.json as it is")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if "sparseloco" in parts:
        ap.error("--parts sparseloco moved: python bench/communication.py --tasks llama runs it over seeds 0-4")
    bad = [p for p in parts if p not in ("live", "lora")]
    if bad or not parts:
        ap.error(f"--parts takes live and lora, comma-separated; got {args.parts!r}")
    if "lora" in parts and "live" not in parts:
        ap.error("--parts lora fine-tunes the live part's Llama: add live")
    size = SIZES[args.size]
    os.environ["OMP_NUM_THREADS"] = "1"  # the processes it starts
    import torch

    torch.set_num_threads(1)  # this process's own torch work (the LoRA base's save), as the workers'
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(f"started {started}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}", flush=True)
    live: list[Live] = []
    if "live" in parts:
        e2e = _load("e2e_stack", ROOT / "tests" / "e2e" / "conftest.py")
        large = _load("e2e_live_large", ROOT / "tests" / "e2e" / "test_live_large.py")
        with tempfile.TemporaryDirectory(prefix="aitbc-models-") as tmp:
            root = args.keep or Path(tmp)
            live = live_part(e2e, large, root, size, "lora" in parts, args.timeout)
        print_live(live)
    ended = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(f"started {started}, ended {ended}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    if not args.no_write:
        args_seen = {k: str(v) for k, v in vars(args).items()}
        when = {"started": started, "ended": ended, "args": args_seen, "size": asdict(size)}
        got: dict[str, Any] = {}
        if live:
            got["live"] = {**when, "rows": [asdict(r) for r in live]}
        _write(got)
    return 0


def _write(parts: dict[str, Any]) -> None:
    """bench/results/models.json: the parts run now, and those kept from an earlier run (each
    part says when it ran and with which flags)."""
    from coordinator_load import source_state

    path = RESULTS / "models.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    out = {k: kept[k] for k in ("live",) if k in kept and k not in parts}
    write_json(
        "models",
        {
            **out,
            **parts,
            "machine": {**machine(), "cores": os.cpu_count()},
            "source": source_state(),
            "coordinator_samples": 8,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
