"""The simulated workers and coordinator a round mode drives (:class:`Cluster`).

It uses the same parts the live system does -- datasets and shards, the local training
loop, update codecs (with error feedback), robust aggregators, attacks, outer optimizers,
the content-addressed store -- with the network replaced by a cost model
(:mod:`aitbc.sim.network`)."""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

import torch
from torch import Tensor

from aitbc.core.aggregation import parse_aggregator
from aitbc.core.attacks import Attack, AttackView, build_attack
from aitbc.core.compression import Codec, build_codec, check_outer
from aitbc.core.compression import decode as decode_update
from aitbc.core.compression.feedback import ErrorFeedback
from aitbc.core.gossip import GOSSIP_CODECS, robust_combine
from aitbc.core.norms import NormBound
from aitbc.core.options import parse_spec
from aitbc.core.outer import build_outer
from aitbc.core.staleness import build_staleness
from aitbc.errors import AitbcError, IntegrityError, UsageError
from aitbc.json_value import JSONObject
from aitbc.run_mode import RunMode
from aitbc.sim.config import SimConfig
from aitbc.sim.network import build_profiles, step_seconds
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.training.checkpoint import checkpoint_bytes, flat_params, set_flat_params, shard_bytes
from aitbc.training.datasets import DataOptions, Dataset, load_dataset
from aitbc.training.local import LocalTrainer, evaluate
from aitbc.training.models import build_model, model_config
from aitbc.training.sharding import shard_indices


@dataclass(slots=True)
class Sent:
    """One update as it left a worker: the encoded blob and what it cost."""

    worker: int
    update: Tensor  # (d,) what the worker meant to send, before encoding
    blob: bytes
    loss: float | None  # training loss (None if the worker did not train)
    seconds: float  # virtual: download + compute + upload
    accuracy: float | None = None  # share of its own batches it predicted right (classifiers; None otherwise)


@dataclass(frozen=True, slots=True)
class TargetReached:
    """Where the run first reached its target loss or accuracy."""

    bytes: int  # uploaded by then
    seconds: float  # virtual
    round: int


# Called with each round's metrics row: fixed columns and the mode's own (any JSON).
ProgressFn = Callable[[JSONObject], None]


class Cluster:
    """N virtual workers and the coordinator's side, on one virtual clock: what a round
    mode's loop (:mod:`aitbc.sim.modes`) drives. Everything is built (and every option
    checked) by the constructor, so a bad option fails before any training or output."""

    def __init__(self, cfg: SimConfig, *, home: Path, out_dir: Path) -> None:
        self.cfg, self.out_dir = cfg, out_dir
        self.t0 = time.perf_counter()
        torch.manual_seed(cfg.seed)  # model init and any dropout draw from the seeded global RNG
        local_cfg = cfg.local_config()
        mcfg = model_config(cfg.model, cfg.model_options)
        self.model_opts = {} if mcfg is None else asdict(mcfg)
        seq_len = getattr(mcfg, "context", 128)
        data = load_dataset(cfg.dataset, DataOptions(seed=cfg.seed, seq_len=seq_len, max_bytes=cfg.max_bytes))
        # the user's own machine: a module:callable model is the user's own code
        self.model = build_model(cfg.model, data.spec, cfg.model_options, allow_code=True)
        self.layout = [tuple(p.shape) for p in self.model.parameters()]
        self.profiles = build_profiles(cfg.workers, speeds=cfg.speeds, bandwidth=cfg.bandwidth, latency=cfg.latency)
        self._build_rules(cfg, data.spec.task)
        self.store = LocalBlobStore(home)
        g = torch.Generator().manual_seed(cfg.seed + 1)
        self.byzantine = sorted(torch.randperm(cfg.workers, generator=g)[: cfg.byzantine].tolist())
        # the workers that train and send: with --attack absent the attackers' draw is left out
        self.present = [i for i in range(cfg.workers) if not (cfg.absent and i in self.byzantine)]
        self.attack_gen = torch.Generator().manual_seed(cfg.seed + 2)
        self.mode_gen = torch.Generator().manual_seed(cfg.seed + 3)  # gossip peers, etc.

        parts = shard_indices(data.train_x.shape[0], cfg.workers, seed=cfg.seed, labels=data.labels, alpha=cfg.alpha)
        self.manifest_cid = self._publish_shards(data, parts)
        self.trainers = []
        for i, p in enumerate(parts):
            y = data.train_y[p]
            if i in self.byzantine and self.attack is not None and self.attack.flips_labels:
                y = data.spec.num_classes - 1 - y  # label-flip: the attacker poisons its own data
            trainer = LocalTrainer(
                copy.deepcopy(self.model), data.train_x[p], y, local_cfg, seed=cfg.seed * 100_003 + i
            )
            self.trainers.append(trainer)
        self.samples = torch.tensor([float(len(p)) for p in parts])  # (n,) sample counts
        self.val_x, self.val_y = data.val_x[: cfg.eval_samples], data.val_y[: cfg.eval_samples]
        self.params = flat_params(self.model)  # (d,) the global model
        self.d = self.params.numel()
        tokens = seq_len if data.spec.task == "language" else 1
        self.t_step = step_seconds(self.d, cfg.batch_size * tokens, cfg.ref_tflops, cfg.step_overhead_ms)
        self.previous_update: Tensor | None = None  # last applied global update (public)
        self.last_step: Tensor | None = None  # (d,) the global model's last step, old - new (the trend)

        # Running totals, filled by the mode loops through send/receive/record.
        self.bytes_up = self.bytes_down = self.updates_sent = 0
        self.rejected = self.dropped = self.skipped = 0
        self.clock = 0.0
        self.round = 0
        self.val_loss = self.initial_loss = math.nan
        self.val_acc: float | None = None
        self.spread: float | None = None
        self.target: TargetReached | None = None
        self._metrics: IO[str] | None = None
        self._progress: ProgressFn | None = None
        # Per round, each worker's last update L2 norm (what the report's heatmap shows: the
        # simulator does not score workers); filled by work, closed by record.
        self.update_norms: list[dict[int, float]] = []
        self._round_norms: dict[int, float] = {}

    def _build_rules(self, cfg: SimConfig, task: str) -> None:
        """The run's rules, each checked against the others: outer optimizer, aggregator,
        norm bound, staleness rule, attack and the workers' codecs."""
        self.outer = build_outer(cfg.outer, cfg.outer_options)
        # A rule that takes f (updates it must tolerate) and is given none gets the attacker count.
        self.aggregator = parse_aggregator(cfg.aggregator_spec, default_f=cfg.byzantine)
        self.aggregator.check(cfg.updates_per_aggregation())  # conditions like bulyan's n >= 4f+3, up front
        try:
            self.norm_bound = NormBound(clip=cfg.norm_clip, reject=cfg.norm_reject)
        except ValueError as e:
            raise UsageError(f"--norm-clip/--norm-reject: {e}") from None
        self.staleness_weight = build_staleness(*parse_spec(cfg.staleness, what="staleness rule"))
        self.attack: Attack | None = None
        if cfg.attack and not cfg.absent:
            self.attack = build_attack(*parse_spec(cfg.attack, what="attack"))
        if self.attack is not None and self.attack.flips_labels and task != "classification":
            raise UsageError("attack 'label-flip' needs a classification dataset")
        codec_name, codec_opts = parse_spec(cfg.compression, what="codec")
        self.codecs = [self._codec(codec_name, codec_opts, cfg.error_feedback) for _ in range(cfg.workers)]
        check_outer(self.codecs[0], cfg.outer)  # decayed error feedback is the outer momentum: fedavg only
        plain = self._codec(codec_name, codec_opts, False)  # attackers skip error feedback (even one the spec asks)
        self.plain_codec = plain.codec if isinstance(plain, ErrorFeedback) else plain
        self.codec_name = codec_name
        if RunMode(cfg.mode).peer_to_peer and codec_name not in GOSSIP_CODECS:
            raise UsageError(
                f"gossip sends whole models, which codec {codec_name!r} would destroy; "
                f"use one of: {', '.join(sorted(GOSSIP_CODECS))}"
            )

    def _publish_shards(self, data: Dataset, parts: list[Tensor]) -> str:
        """Each shard a blob, and the manifest naming them a blob too (as upload-data does);
        returns the manifest's CID."""
        shard_cids = [
            self.store.put_bytes(
                shard_bytes(data.train_x[p], data.train_y[p], dataset=data.name, index=i, count=len(parts))
            )
            for i, p in enumerate(parts)
        ]
        manifest = {
            "format": "aitbc.manifest/1",
            "dataset": data.name,
            "seed": self.cfg.seed,
            "alpha": self.cfg.alpha,
            "shards": [{"cid": c, "samples": len(p)} for c, p in zip(shard_cids, parts)],
        }
        return self.store.put_bytes(json.dumps(manifest, sort_keys=True).encode())

    def _codec(self, name: str, options: Mapping[str, object], error_feedback: bool) -> Codec | ErrorFeedback:
        return build_codec(name, options, layout=self.layout, error_feedback=error_feedback)

    # ---- what workers do ------------------------------------------------------------

    def checkpoint(self, params: Tensor, round: int) -> bytes:
        set_flat_params(self.model, params)
        return checkpoint_bytes(self.model, model_name=self.cfg.model, model_options=self.model_opts, round=round)

    def work(
        self,
        ids: list[int],
        starts: dict[int, Tensor],
        down_bytes: int,
        colluding: list[Tensor] | None = None,
        *,
        count_bytes: bool = True,
        data_round: int | None = None,
    ) -> list[Sent]:
        """Workers ``ids`` each train from ``starts[i]`` and send an encoded update.

        Honest workers go first; Byzantine workers then see the honest updates of this
        batch (plus ``colluding``, e.g. recent ones in async mode) and craft theirs.
        ``data_round``: the round's own batch order (``LocalTrainer.train_round(round=)``,
        what a live worker trains on); None walks one order across rounds."""
        sent: dict[int, Sent] = {}
        honest_view: list[Tensor] = list(colluding or [])
        for i in ids:
            if i in self.byzantine:
                continue
            res = self.trainers[i].train_round(starts[i], round=data_round)
            blob = self.codecs[i].encode(res.delta)
            honest_view.append(decode_update(blob))
            sent[i] = Sent(i, res.delta, blob, res.loss, self._seconds(i, down_bytes, len(blob)), res.accuracy)
        for i in ids:
            if i not in self.byzantine:
                continue
            assert self.attack is not None
            own, loss, accuracy = None, None, None
            if self.attack.trains:
                res = self.trainers[i].train_round(starts[i], round=data_round)
                own, loss, accuracy = res.delta, res.loss, res.accuracy
            view = AttackView(
                own=own,
                honest=torch.stack(honest_view) if honest_view else torch.zeros(0, self.d),
                previous=self.previous_update,
                n=len(ids),
                f=len(self.byzantine),
                generator=self.attack_gen,
            )
            crafted = self.attack.craft(view)
            blob = self.plain_codec.encode(crafted)
            sent[i] = Sent(i, crafted, blob, loss, self._seconds(i, down_bytes, len(blob)), accuracy)
        out = [sent[i] for i in ids]
        for s in out:
            self._round_norms[s.worker] = float(s.update.norm())
        if count_bytes:
            for s in out:
                self.bytes_up += len(s.blob)
                self.updates_sent += 1
            self.bytes_down += down_bytes * len(ids)
        return out

    def _seconds(self, i: int, down: int, up: int) -> float:
        p = self.profiles[i]
        return p.transfer_seconds(down) + p.compute_seconds(self.cfg.local_steps, self.t_step) + p.transfer_seconds(up)

    # ---- what the coordinator does ----------------------------------------------------

    def receive(self, blob: bytes) -> Tensor | None:
        """Decode and check one update; ``None`` (and counted) if it must be rejected. The
        norm bound, which needs the whole round, is applied in :meth:`aggregate` (as the
        coordinator does at aggregation)."""
        try:
            u = decode_update(blob, max_numel=self.d)  # a hostile header cannot make us allocate more
        except IntegrityError:
            self.rejected += 1
            return None
        if u.shape != (self.d,) or not torch.isfinite(u).all():
            self.rejected += 1
            return None
        return u.to(torch.float32)

    def aggregate(
        self,
        updates: list[Tensor],
        weights: list[float],
        *,
        reference: Tensor | None = None,
        round_index: int | None = None,
    ) -> Tensor | None:
        """The run's rule over ``updates``; ``None`` (and counted) when too few arrived for
        its conditions (e.g. stragglers dropped below krum's n >= f+3): the round is
        skipped, as a coordinator would wait, not averaged with a weaker rule.
        ``reference``: the trend a ``trend`` stage compares with (the coordinator's: the
        global model's last step; gossip mixes models, not steps, and passes none).
        ``round_index``: the round the rule is seeded with (bucketing); default ``self.round``."""
        out = robust_combine(  # the same rule a live worker mixes with, and the coordinator judges by
            updates,
            weights,
            aggregator=self.aggregator,
            norm_bound=self.norm_bound,
            round_index=self.round if round_index is None else round_index,
            reference=reference,
        )
        self.rejected += len(out.rejected)
        if out.result is None:
            self.skipped += 1
        return out.result

    def apply(self, updates: list[Tensor], weights: list[float]) -> None:
        """Aggregate accepted updates and take one outer step on the global model. A
        skipped round leaves the model, so the next round has no trend (as live)."""
        delta = self.aggregate(updates, weights, reference=self.last_step)
        if delta is None:
            self.last_step = None
            return
        before = self.params
        self.params = self.outer.step(self.params, delta)
        self.last_step = before - self.params  # (d,)
        self.previous_update = delta

    # ---- bookkeeping --------------------------------------------------------------------

    def evaluate(self, params: Tensor) -> tuple[float, float | None]:
        set_flat_params(self.model, params)
        return evaluate(self.model, self.val_x, self.val_y)

    def record(
        self,
        *,
        train_losses: list[float],
        accepted: int,
        train_accuracies: list[float] | None = None,
        extra: JSONObject | None = None,
        eval_params: Tensor | None = None,
    ) -> bool:
        """Close round ``self.round``: evaluate, track the target, write a metrics row.
        Returns True when the run should stop early (target reached and ``stop_at_target``)."""
        cfg = self.cfg
        if self.round % cfg.eval_every == 0 or self.round == cfg.rounds:
            self.val_loss, self.val_acc = self.evaluate(self.params if eval_params is None else eval_params)
            if not math.isfinite(self.val_loss):
                raise AitbcError(
                    f"training diverged at round {self.round} (validation loss {self.val_loss}); "
                    "lower --lr or use a robust --aggregator"
                )
            self._check_target()
        row = {
            "round": self.round,
            "val_loss": self.val_loss,
            "val_accuracy": self.val_acc,
            "train_loss": sum(train_losses) / len(train_losses) if train_losses else None,
            "train_accuracy": sum(train_accuracies) / len(train_accuracies) if train_accuracies else None,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "virtual_time": self.clock,
            "accepted": accepted,
            "rejected": self.rejected,
            "dropped": self.dropped,
            "skipped": self.skipped,
            **(extra or {}),
        }
        self.update_norms.append(self._round_norms)
        self._round_norms = {}
        assert self._metrics is not None
        self._metrics.write(json.dumps(row) + "\n")
        if self._progress:
            self._progress(row)
        return cfg.stop_at_target and self.target is not None

    def _check_target(self) -> None:
        cfg = self.cfg
        if self.target is not None or (cfg.target_loss is None and cfg.target_accuracy is None):
            return
        hit_loss = cfg.target_loss is not None and self.val_loss <= cfg.target_loss
        hit_acc = cfg.target_accuracy is not None and self.val_acc is not None and self.val_acc >= cfg.target_accuracy
        if hit_loss or hit_acc:
            self.target = TargetReached(bytes=self.bytes_up, seconds=self.clock, round=self.round)
