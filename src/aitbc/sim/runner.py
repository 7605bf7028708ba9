"""Whole trainings in one process: N virtual workers, one virtual clock.

The simulation drives the same parts the live system does -- datasets and shards,
the local training loop, the update codec, the aggregator, the outer optimizer, the
content-addressed store -- with the network replaced by a cost model
(:mod:`aitbc.sim.network`). Same seed, same numbers.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from aitbc.core.aggregation import aggregate
from aitbc.core.compression import build_codec
from aitbc.core.compression import decode as decode_update
from aitbc.core.outer import build_outer
from aitbc.errors import AitbcError, UsageError
from aitbc.sim.network import build_profiles, step_seconds
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.training.checkpoint import checkpoint_bytes, flat_params, set_flat_params, shard_bytes
from aitbc.training.datasets import DataOptions, load_dataset
from aitbc.training.local import LocalConfig, LocalTrainer, evaluate
from aitbc.training.models import build_model, model_config
from aitbc.training.sharding import shard_indices


@dataclass(kw_only=True)
class SimConfig:
    model: str = "mlp"
    model_options: dict[str, Any] = field(default_factory=dict)
    dataset: str = "digits"
    workers: int = 8
    rounds: int = 30
    local_steps: int = 20
    batch_size: int = 32
    lr: float = 1e-3
    inner_opt: str = "adamw"
    outer: str = "fedavg"
    outer_options: dict[str, Any] = field(default_factory=dict)
    aggregator: str = "mean"
    codec: str = "none"
    alpha: float | None = None
    seed: int = 0
    speeds: str = "1"
    bandwidth: str = "100"  # Mbit/s per worker
    latency: str = "20"  # ms per transfer
    ref_tflops: float = 25.0  # reference device (speed 1.0) effective throughput
    step_overhead_ms: float = 1.0  # fixed cost of one inner step at speed 1.0
    eval_samples: int = 1024
    max_bytes: int = 4 << 20  # language corpora cap

    def __post_init__(self) -> None:
        for name in ("workers", "rounds", "eval_samples", "max_bytes"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not self.ref_tflops > 0:
            raise UsageError(f"--ref-tflops must be > 0, got {self.ref_tflops}")
        if not self.step_overhead_ms >= 0:
            raise UsageError(f"--step-overhead-ms must be >= 0, got {self.step_overhead_ms}")


@dataclass(kw_only=True)
class SimResult:
    final_val_loss: float
    final_val_accuracy: float | None
    initial_val_loss: float
    rounds: int
    workers: int
    params: int
    bytes_up: int
    bytes_down: int
    virtual_seconds: float
    wall_seconds: float
    metrics_path: str
    manifest_cid: str
    final_model_cid: str
    config: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


ProgressFn = Callable[[dict[str, Any]], None]


class Simulation:
    """A prepared simulation: everything is built (and every option checked) by
    :meth:`build`, so a bad option fails before any training starts; :meth:`run`
    then plays the rounds."""

    def __init__(self, cfg: SimConfig, *, home: Path, out_dir: Path) -> None:
        self.cfg, self.out_dir = cfg, out_dir
        self.t0 = time.perf_counter()
        torch.manual_seed(cfg.seed)  # model init and any dropout draw from the seeded global RNG
        local_cfg = _local_config(cfg)
        mcfg = model_config(cfg.model, cfg.model_options)
        self.model_opts = {} if mcfg is None else asdict(mcfg)
        seq_len = getattr(mcfg, "context", 128)
        data = load_dataset(cfg.dataset, DataOptions(seed=cfg.seed, seq_len=seq_len, max_bytes=cfg.max_bytes))
        self.model = build_model(cfg.model, data.spec, cfg.model_options)
        self.profiles = build_profiles(cfg.workers, speeds=cfg.speeds, bandwidth=cfg.bandwidth, latency=cfg.latency)
        self.outer = build_outer(cfg.outer, cfg.outer_options)
        self.codec = build_codec(cfg.codec)
        self.store = LocalBlobStore(home)

        # Shards, each a blob; the manifest naming them is a blob too (as upload-data does).
        parts = shard_indices(data.train_x.shape[0], cfg.workers, seed=cfg.seed, labels=data.labels, alpha=cfg.alpha)
        shard_cids = [
            self.store.put_bytes(
                shard_bytes(data.train_x[p], data.train_y[p], dataset=data.name, index=i, count=len(parts))
            )
            for i, p in enumerate(parts)
        ]
        manifest = {
            "format": "aitbc.manifest/1", "dataset": data.name, "seed": cfg.seed, "alpha": cfg.alpha,
            "shards": [{"cid": c, "samples": len(p)} for c, p in zip(shard_cids, parts)],
        }
        self.manifest_cid = self.store.put_bytes(json.dumps(manifest, sort_keys=True).encode())

        self.trainers = [
            LocalTrainer(copy.deepcopy(self.model), data.train_x[p], data.train_y[p], local_cfg,
                         seed=cfg.seed * 100_003 + i)
            for i, p in enumerate(parts)
        ]
        self.weights = torch.tensor([float(len(p)) for p in parts])  # (n,) sample counts
        self.val_x, self.val_y = data.val_x[: cfg.eval_samples], data.val_y[: cfg.eval_samples]
        self.params = flat_params(self.model)  # (d,)
        tokens = seq_len if data.spec.task == "language" else 1
        self.t_step = step_seconds(
            self.params.numel(), cfg.batch_size * tokens, cfg.ref_tflops, cfg.step_overhead_ms
        )

    def _checkpoint(self, round: int) -> bytes:
        return checkpoint_bytes(self.model, model_name=self.cfg.model, model_options=self.model_opts, round=round)

    def run(self, progress: ProgressFn | None = None) -> SimResult:
        cfg, model = self.cfg, self.model
        self.out_dir.mkdir(parents=True, exist_ok=True)
        metrics_path = self.out_dir / "metrics.jsonl"
        initial_loss, _ = evaluate(model, self.val_x, self.val_y)
        bytes_up = bytes_down = 0
        clock = 0.0
        val_loss, val_acc = initial_loss, None
        params = self.params
        with metrics_path.open("w") as metrics:
            for r in range(1, cfg.rounds + 1):
                set_flat_params(model, params)
                down = len(self._checkpoint(r - 1))  # every worker downloads the global model blob
                blobs, losses, durations = [], [], []
                for trainer, prof in zip(self.trainers, self.profiles):
                    res = trainer.train_round(params)
                    blob = self.codec.encode(res.delta)
                    blobs.append(blob)
                    losses.append(res.loss)
                    durations.append(
                        prof.transfer_seconds(down)
                        + prof.compute_seconds(res.steps, self.t_step)
                        + prof.transfer_seconds(len(blob))
                    )
                round_up = sum(len(b) for b in blobs)
                updates = torch.stack([decode_update(b) for b in blobs])  # (n, d)
                delta = aggregate(cfg.aggregator, updates, self.weights)  # (d,)
                params = self.outer.step(params, delta)
                set_flat_params(model, params)
                val_loss, val_acc = evaluate(model, self.val_x, self.val_y)
                if not math.isfinite(val_loss):
                    raise AitbcError(f"training diverged at round {r} (validation loss {val_loss}); lower --lr")
                bytes_up += round_up
                bytes_down += down * cfg.workers
                clock += max(durations)  # sync round: everyone waits for the slowest worker
                row = {
                    "round": r, "val_loss": val_loss, "val_accuracy": val_acc,
                    "train_loss": sum(losses) / len(losses), "bytes_up": round_up,
                    "bytes_down": down * cfg.workers, "virtual_time": clock,
                }
                metrics.write(json.dumps(row) + "\n")
                if progress:
                    progress(row)
        self.params = params
        final_cid = self.store.put_bytes(self._checkpoint(cfg.rounds))
        return SimResult(
            final_val_loss=val_loss,
            final_val_accuracy=val_acc,
            initial_val_loss=initial_loss,
            rounds=cfg.rounds,
            workers=cfg.workers,
            params=params.numel(),
            bytes_up=bytes_up,
            bytes_down=bytes_down,
            virtual_seconds=clock,
            wall_seconds=time.perf_counter() - self.t0,
            metrics_path=str(metrics_path),
            manifest_cid=self.manifest_cid,
            final_model_cid=final_cid,
            config=asdict(cfg),
        )


def run_simulation(cfg: SimConfig, *, home: Path, out_dir: Path, progress: ProgressFn | None = None) -> SimResult:
    return Simulation(cfg, home=home, out_dir=out_dir).run(progress)


def _local_config(cfg: SimConfig) -> LocalConfig:
    try:
        return LocalConfig(steps=cfg.local_steps, batch_size=cfg.batch_size, optimizer=cfg.inner_opt, lr=cfg.lr)
    except ValueError as e:
        raise UsageError(str(e)) from None
