"""Whole trainings in one process: N virtual workers, one virtual clock.

A :class:`Simulation` is the :class:`~aitbc.sim.cluster.Cluster` (the same parts the live
system drives, with the network replaced by a cost model) played round by round by the
loop of its mode (:mod:`aitbc.sim.modes`: ``sync``, ``async``, ``gossip``). Same seed,
same numbers.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from aitbc.sim.cluster import Cluster, ProgressFn
from aitbc.sim.config import SimConfig
from aitbc.sim.modes import MODE_LOOPS


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
    compression_ratio: float  # dense fp32 bytes of the updates sent / real bytes sent
    bytes_to_target: int | None
    virtual_seconds_to_target: float | None
    rounds_to_target: int | None
    virtual_seconds: float
    wall_seconds: float
    rejected_updates: int  # failed decoding or checks (shape, NaN/Inf)
    dropped_updates: int  # past the deadline or max staleness
    skipped_rounds: int  # too few updates for the aggregator's conditions
    byzantine_workers: list[int]
    spread: float | None  # gossip: mean distance of worker models to their average
    metrics_path: str
    manifest_cid: str
    final_model_cid: str
    config: SimConfig

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


class Simulation(Cluster):
    """A prepared simulation: everything is built (and every option checked) by the
    constructor, so a bad option fails before any training or output; :meth:`run` then
    plays the rounds of the configured mode."""

    def run(self, progress: ProgressFn | None = None) -> SimResult:
        cfg = self.cfg
        self.out_dir.mkdir(parents=True, exist_ok=True)
        metrics_path = self.out_dir / "metrics.jsonl"
        self.initial_loss, _ = self.evaluate(self.params)
        self.val_loss = self.initial_loss
        self._progress = progress
        with metrics_path.open("w") as self._metrics:
            MODE_LOOPS[cfg.mode](self)
        self._metrics = None
        final_cid = self.store.put_bytes(self.checkpoint(self.params, self.round))
        return SimResult(
            final_val_loss=self.val_loss,
            final_val_accuracy=self.val_acc,
            initial_val_loss=self.initial_loss,
            rounds=self.round,
            workers=cfg.workers,
            params=self.d,
            bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
            compression_ratio=(4 * self.d * self.updates_sent / self.bytes_up) if self.bytes_up else 1.0,
            bytes_to_target=self.target.bytes if self.target else None,
            virtual_seconds_to_target=self.target.seconds if self.target else None,
            rounds_to_target=self.target.round if self.target else None,
            virtual_seconds=self.clock,
            wall_seconds=time.perf_counter() - self.t0,
            rejected_updates=self.rejected,
            dropped_updates=self.dropped,
            skipped_rounds=self.skipped,
            byzantine_workers=self.byzantine,
            spread=self.spread,
            metrics_path=str(metrics_path),
            manifest_cid=self.manifest_cid,
            final_model_cid=final_cid,
            config=cfg,
        )


def run_simulation(cfg: SimConfig, *, home: Path, out_dir: Path, progress: ProgressFn | None = None) -> SimResult:
    return Simulation(cfg, home=home, out_dir=out_dir).run(progress)
