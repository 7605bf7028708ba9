"""Benchmark: training throughput of the byte-level transformer on GPUs (issue 18 part 5).

For each model size (10M to 350M parameters, ``--sizes``) and precision (fp32, bf16
autocast), the worker's own training path (:class:`aitbc.training.local.LocalTrainer`:
AdamW inner steps from a shard in pinned host memory, batches copied with non_blocking)
runs ``--steps`` timed steps after ``--warmup`` untimed ones:

- ``single``: one process on ``cuda:0``;
- ``data-parallel``: one process per visible GPU (``--world``, default all of them), as
  ``aitbc worker start --gpus N`` trains (:mod:`aitbc.training.parallel`: nccl, each rank
  its slice of every global batch, DDP-averaged gradients), ``--batch`` sequences per rank.

Reported: tokens per second (sequences x context x steps / wall time, all ranks together)
and achieved FLOP/s by the usual ``6 x parameters x tokens`` for a forward and backward
pass (attention's own ``T^2`` term is left out, so it understates long contexts a little).
Models are built from the transformer class directly: the 50M parameter bound of a
*job's* model (training/models.py MAX_PARAMS) is the coordinator's, not this bench's.

A machine without a CUDA GPU prints one line saying so and exits 0 (nothing is written).
``--device cpu`` runs the same path on the CPU as a smoke test (``--world 2``: two gloo
processes); figures are written to bench/results/gpu.{txt,json} only when measured on
CUDA. ``--dry``: a tiny model, two steps, on the CPU, nothing written (the unit test).

Usage: python bench/gpu.py [--sizes 10M,50M,125M,350M] [--precisions fp32,bf16]
       [--steps 10] [--warmup 3] [--batch 8] [--context 512] [--world N] [--device cuda|cpu] [--dry]
A full run on one 8-GPU node takes about 2-4 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
sys.path.insert(0, str(ROOT))
from _sims import machine  # noqa: E402
from aitbc.training.data_spec import DataSpec  # noqa: E402
from aitbc.training.local import LocalConfig, LocalTrainer  # noqa: E402
from aitbc.training.models import Transformer, TransformerConfig  # noqa: E402
from aitbc.training.parallel import HOST, join_group, loopback_store  # noqa: E402

# name -> (d_model, n_layers, n_heads): GPT-like shapes, 64-wide heads
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (32, 1, 2),
    "2M": (256, 2, 4),
    "10M": (384, 6, 6),
    "50M": (512, 16, 8),
    "125M": (768, 18, 12),
    "350M": (1024, 28, 16),
}
DEFAULT_SIZES = "10M,50M,125M,350M"


def _configs(a: argparse.Namespace) -> list[tuple[str, str]]:
    return [(s, p) for s in a.sizes.split(",") for p in a.precisions.split(",")]


def _model(size: str, context: int) -> Transformer:
    d, layers, heads = SIZES[size]
    torch.manual_seed(0)
    return Transformer(TransformerConfig(d_model=d, n_layers=layers, n_heads=heads, context=context), _SPEC(context))


def _SPEC(context: int) -> DataSpec:
    return DataSpec("language", (context,), 256)


def _measure(a: argparse.Namespace, device: torch.device, group: Any, size: str, precision: str) -> dict[str, Any]:
    """One (size, precision): warm-up steps, then timed ones, in this rank; every rank of a
    group calls it with the same arguments."""
    world = group.world if group is not None else 1
    model = _model(size, a.context)
    params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(1)
    n = a.batch * world * 4
    x = torch.randint(0, 256, (n, a.context), generator=gen, dtype=torch.uint8)
    y = torch.randint(0, 256, (n, a.context), generator=gen, dtype=torch.uint8)
    cfg = LocalConfig(steps=a.warmup, batch_size=a.batch * world, lr=1e-4, precision=precision)
    trainer = LocalTrainer(model, x, y, cfg, seed=0, device=device, group=group)
    start = torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu()
    trainer.train_round(start, round=0)  # warm-up: kernels chosen, memory allocated
    trainer.cfg.steps = a.steps
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    res = trainer.train_round(start, round=1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    tokens = a.steps * a.batch * world * a.context
    out = {
        "size": size,
        "precision": precision,
        "world": world,
        "params": params,
        "batch_per_rank": a.batch,
        "context": a.context,
        "steps": a.steps,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "flops_per_s": 6 * params * tokens / seconds,
        "loss": res.loss,
        "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None,
    }
    del trainer, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _rank_main(a: argparse.Namespace) -> None:
    """A data-parallel rank other than 0 (started by rank 0): the same measurements."""
    device = torch.device(a.device if a.device == "cpu" else f"cuda:{a.rank}")
    store = dist.TCPStore(HOST, a.port, a.world, is_master=False, timeout=timedelta(seconds=120))
    group = join_group(a.rank, a.world, device, store)
    for size, precision in _configs(a):
        _measure(a, device, group, size, precision)
    dist.destroy_process_group()


def _data_parallel(a: argparse.Namespace, world: int) -> list[dict[str, Any]]:
    store, _listener = loopback_store(world)
    argv = [sys.executable, __file__, "--sizes", a.sizes, "--precisions", a.precisions, "--steps", str(a.steps)]
    argv += ["--warmup", str(a.warmup), "--batch", str(a.batch), "--context", str(a.context), "--device", a.device]
    argv += ["--world", str(world), "--port", str(store.port)]
    procs = [subprocess.Popen([*argv, "--rank", str(r)]) for r in range(1, world)]
    try:
        device = torch.device("cpu") if a.device == "cpu" else torch.device("cuda", 0)
        group = join_group(0, world, device, store)
        rows = [_measure(a, device, group, s, p) for s, p in _configs(a)]
        dist.destroy_process_group()
        for p in procs:
            p.wait(timeout=120)
        return rows
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def _table(rows: list[dict[str, Any]], title: str) -> str:
    head = f"{'size':>5} {'params':>12} {'precision':>9} {'mode':>14} {'ranks':>5} {'tokens/s':>12} {'TFLOP/s':>9} {'peak GB':>8}"
    lines = [title, head, "-" * len(head)]
    for r in rows:
        mode = "single" if r["world"] == 1 else "data-parallel"
        mem = "-" if r["peak_memory_gb"] is None else f"{r['peak_memory_gb']:.1f}"
        lines.append(
            f"{r['size']:>5} {r['params']:>12,} {r['precision']:>9} {mode:>14} {r['world']:>5} "
            f"{r['tokens_per_s']:>12,.0f} {r['flops_per_s'] / 1e12:>9.3f} {mem:>8}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma-separated, of: {', '.join(SIZES)}")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10 on CUDA, 2 on the CPU)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3 on CUDA, 1 on the CPU)")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--context", type=int, default=512, help="tokens per sequence")
    p.add_argument("--world", type=int, default=None, help="data-parallel ranks (default: every visible GPU; CPU: 1)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if torch sees one")
    p.add_argument("--dry", action="store_true", help="a tiny model, two steps, on the CPU; nothing written")
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for s in a.sizes.split(","):
        if s not in SIZES:
            p.error(f"unknown size {s!r}; known: {', '.join(SIZES)}")
    for q in a.precisions.split(","):
        if q not in ("fp32", "bf16"):
            p.error(f"unknown precision {q!r}; known: fp32, bf16")
    if a.dry:
        a.device, a.sizes, a.context, a.batch = "cpu", "tiny", 16, 4
        a.steps, a.warmup = a.steps or 2, a.warmup or 1
    if a.device is None:
        if not torch.cuda.is_available():
            print("bench/gpu.py: no CUDA GPU visible to torch; nothing measured (--device cpu for a CPU smoke run)")
            return 0
        a.device = "cuda"
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU visible to torch")
    on_gpu = a.device == "cuda"
    a.steps = a.steps or (10 if on_gpu else 2)
    a.warmup = a.warmup or (3 if on_gpu else 1)
    if a.rank:
        _rank_main(a)
        return 0

    visible = torch.cuda.device_count() if on_gpu else 1
    world = a.world or visible
    if on_gpu and world > visible:
        p.error(f"--world {world}: {visible} GPUs visible")
    rows: list[dict[str, Any]] = []
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    for size, precision in _configs(a):
        rows.append(_measure(a, device, None, size, precision))
        print(f"  {size} {precision} single: {rows[-1]['tokens_per_s']:,.0f} tokens/s", flush=True)
    if world > 1:
        rows += _data_parallel(a, world)
    rows.sort(key=lambda r: (list(SIZES).index(r["size"]), r["precision"], r["world"]))
    name = torch.cuda.get_device_name(0) if on_gpu else machine()["cpu"]
    title = (
        f"Byte-level transformer training on {visible if on_gpu else world} x {name} ({a.device}), "
        f"context {a.context}, {a.batch} sequences per rank, AdamW, {a.steps} timed steps after {a.warmup}; "
        f"FLOP/s = 6 x params x tokens / s"
    )
    text = _table(rows, title)
    print(text)
    if on_gpu and not a.dry:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "gpu.txt").write_text(text + "\n")
        info = machine() | {"gpu": name, "gpus": visible, "cuda": torch.version.cuda}
        payload = {
            "machine": info,
            "results": rows,
            "args": {k: v for k, v in vars(a).items() if k not in ("rank", "port")},
        }
        (RESULTS / "gpu.json").write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
        print(f"wrote {RESULTS / 'gpu.txt'} and {RESULTS / 'gpu.json'}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
