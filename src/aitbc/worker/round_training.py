"""One round's update on the worker: the job's model and shard set up once per job
(:meth:`RoundTrainer.prepare`), then each round (:meth:`RoundTrainer.train`) the global
model loaded, H local steps, the codec, the proof if the run verifies work.

``d``: the model's parameter count; a flat model or update is ``(d,)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

from aitbc.core.compression import ErrorFeedback, build_codec
from aitbc.core.options import parse_spec
from aitbc.errors import AitbcError, IntegrityError
from aitbc.replies.jobs import JobOrder
from aitbc.run_mode import RunMode
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.batches import data_seed
from aitbc.training.checkpoint import check_shard, flat_params, load_checkpoint_file, load_shard_file, param_layout
from aitbc.training.data_spec import DataSpec
from aitbc.training.local import LocalConfig, LocalResult, LocalTrainer, eager_start, epoch_steps
from aitbc.training.parallel import Ranks, draws_dropout
from aitbc.training.pretrained import blob_cids
from aitbc.training.proof import CommitmentJSON, Recorder
from aitbc.worker.attack import Attacker
from aitbc.worker.cheats import skip_half
from aitbc.worker.config import WorkerSettings
from aitbc.worker.fetcher import ModelFetcher
from aitbc.worker.metrics import WorkerMetrics
from aitbc.worker.model_cap import build_within
from aitbc.worker.progress import Reporter, progress_body
from aitbc.worker.records import BadShard, JobState, OwnUpdate, Trained, ahead_key
from aitbc.worker.spot_checks import SpotChecks

log = logging.getLogger("aitbc.worker")

OnStep = Callable[[int, float], None]
T = TypeVar("T")


def known(value: T | None, what: str, job: JobOrder) -> T:
    """A setting a train order carries (None only in a view of a run not yet configured)."""
    if value is None:
        raise AitbcError(f"job {job.job_id}: its order to train has no {what}")
    return value


def _spec(job: JobOrder) -> DataSpec:
    d = known(job.data_spec, "data_spec", job)
    return DataSpec(d["task"], tuple(d["input_shape"]), int(d["num_classes"]))


def local_steps(job: JobOrder, samples: int) -> int:
    """The round's local steps: ``epochs`` passes over this shard if the owner set them
    (the shard's own size decides the steps), else ``local_steps``."""
    epochs = job.epochs
    batch_size = known(job.batch_size, "batch_size", job)
    return epoch_steps(int(epochs), samples, batch_size) if epochs else known(job.local_steps, "local_steps", job)


class RoundTrainer:
    """Trains this worker's rounds. ``devices``: one per data-parallel rank; ``ranks``
    (set once started, with ``--gpus N``): the ranks 1..N-1 that train beside this one."""

    def __init__(
        self,
        cfg: WorkerSettings,
        *,
        fetcher: ModelFetcher,
        spot_checks: SpotChecks,
        metrics: WorkerMetrics,
        reporter: Reporter,
        devices: list[torch.device],
        attacker: Attacker | None,
        max_params: int | None = None,
    ) -> None:
        self.cfg, self.fetcher, self.spot_checks = cfg, fetcher, spot_checks
        self.metrics, self.reporter = metrics, reporter
        self.devices, self.attacker = devices, attacker
        self.max_params = max_params  # the offer's: larger models are refused (None: no limit)
        self.ranks: Ranks | None = None

    # --- the job ----------------------------------------------------------------------------

    def prepare(self, job: JobOrder, current: JobState | None) -> JobState:
        """The state of ``job``: ``current`` brought up to the job's settings if it is that
        job's (the owner may have changed its steps, batch size or lr, or split its shard),
        else built: its model (a :class:`ModelRefused` before any download if this worker
        will not build it), its shard, its trainer and codec."""
        if current is not None and current.job_id == job.job_id:
            data = None
            if job.shard_cid != current.shard_cid:
                data = self._labels(self._shard(job, _spec(job)), job)
                current.shard_cid = job.shard_cid
                log.info("job %s: now on shard %d (%d samples)", job.job_id, job.shard_index, data[0].shape[0])
            samples = int((data[0] if data is not None else current.trainer.x).shape[0])
            current.trainer.reconfigure(
                steps=local_steps(job, samples),
                batch_size=known(job.batch_size, "batch_size", job),
                lr=known(job.lr, "lr", job),
                data=data,
            )
            return current
        spec = _spec(job)
        # before any download: code this operator did not allow is never imported, a model
        # over this worker's capacity never allocated
        model = build_within(
            job.model_type,
            spec,
            job.model_options,
            allow_code=self.cfg.allow_code,
            max_params=self.max_params,
            weights=self.fetcher.shard,  # a fine-tune's pretrained base, fetched by CID as a shard is
        )
        x, y = self._labels(self._shard(job, spec), job)
        cfg = LocalConfig(
            steps=local_steps(job, int(x.shape[0])),
            batch_size=known(job.batch_size, "batch_size", job),
            optimizer=known(job.inner_opt, "inner_opt", job),
            lr=known(job.lr, "lr", job),
            precision=job.precision or "fp32",  # a coordinator before bf16 sends none
        )
        ranks = self.ranks
        if ranks is not None and job.verify_rate > 0 and draws_dropout(model):
            log.info(
                "job %s: its model draws dropout and its updates are spot-checked: trained on one rank", job.job_id
            )
            ranks = None
        if ranks is not None:
            # the other ranks read the base rank 0 fetched (the same machine's files)
            local = {cid: str(self.fetcher.shard(cid)) for cid in blob_cids(job.model_options)}
            ranks.job(job.model_type, job.model_options, spec, cfg, job.seed, x, y, weights=local)
        group = ranks.group if ranks is not None else None
        trainer = LocalTrainer(model, x, y, cfg, seed=job.seed, device=self.devices[0], group=group)
        name, opts = parse_spec(known(job.compression, "compression", job), what="codec")
        codec = build_codec(
            name, opts, layout=[tuple(p.shape) for p in model.parameters()], error_feedback=bool(job.error_feedback)
        )
        state = JobState(
            job_id=job.job_id,
            trainer=trainer,
            codec=codec,
            rounds=job.rounds,
            shard_cid=job.shard_cid,
            layout=param_layout(model),
        )
        log.info("job %s: shard %d (%d samples) of %s", job.job_id, job.shard_index, x.shape[0], job.training_id)
        return state

    def _shard(self, job: JobOrder, spec: DataSpec) -> tuple[Tensor, Tensor]:
        """The job's shard, checked to be data of its spec before anything trains on it: a
        :class:`BadShard` (the job declined) for token ids or labels out of range."""
        x, y = load_shard_file(self.fetcher.shard(job.shard_cid))
        try:
            check_shard(x, y, spec)
        except IntegrityError as e:
            raise BadShard(f"shard {job.shard_cid}: {e}") from None
        return x, y

    def _labels(self, shard: tuple[Any, Any], job: JobOrder) -> tuple[Any, Any]:
        x, y = shard
        if self.attacker is not None and self.attacker.flips_labels:
            y = (
                int(known(job.data_spec, "data_spec", job)["num_classes"]) - 1 - y
            )  # label-flip poisons the worker's own data
        return x, y

    def sent_update(self, delta: Tensor) -> Tensor:
        """What this worker sends for its update ``delta`` (``--attack``: the attack's)."""
        return delta if self.attacker is None else self.attacker.craft(delta)

    # --- one round --------------------------------------------------------------------------

    def train(self, job: JobOrder, state: JobState, round: int, priors: list[OwnUpdate] | None = None) -> Trained:
        """Round ``round``'s update from the job view's global model: H local steps, the
        codec, the proof if asked. A ``round`` past the view's is trained ahead (overlap):
        from the newest model there is (its update's ``base_cid``), less ``priors``, this
        worker's updates of the rounds since that model (newest first) as their blobs
        decode (the newest is ``prior_cid``, each names the one before): an eager start,
        where its last round ended moved by what the global model gained since, so the
        coordinator counts the update in full (``aitbc.coordinator.rounds.admission.update_prior``)."""
        base = known(job.global_model_cid, "global_model_cid", job)
        ahead = round != job.round
        steps = state.trainer.cfg.steps  # local_steps, or epochs over this shard (see local_steps)
        t_download = time.perf_counter()
        start = self._start(job, state, base)
        download = time.perf_counter() - t_download
        if ahead and priors:
            start = eager_start(start, [p.blob for p in priors])
        verify = float(job.verify_rate or 0.0) > 0
        overlap = bool(job.overlap)
        if verify or overlap:  # a round sent while the next trains, or trained ahead, may be dropped
            state.mark_round_start(round)
        t_compute = time.perf_counter()
        report = self._step_reporter(job, state, steps, t_compute)
        recorder = Recorder(steps, sink=self.spot_checks.spill(round, start.numel(), steps)) if verify else None
        res, recorder = self._steps(state, start, round, report, recorder)
        t_encode = time.perf_counter()
        blob, residual_in, proof = self._encode(job, state, res, start.numel(), round, recorder)
        t_done = time.perf_counter()
        body = {
            "round": round,
            "cid": cid_of_bytes(blob),
            "train_loss": res.loss,
            "train_accuracy": res.accuracy,
            "steps": res.steps,
            "compute_seconds": t_done - t_compute,  # local steps and encoding
            "shard_cid": state.shard_cid,
            "epoch": res.epoch,
        }
        if ahead or RunMode.named(job.mode).buffered:  # async: the version it trained from sets its weight
            body["base_cid"] = base
        if ahead and priors:
            body["prior_cid"] = priors[0].cid
        if proof is not None:
            body["proof"] = proof
        return Trained(
            key=ahead_key(job, round),
            round=round,
            blob=blob,
            body=body,
            recorder=recorder,
            residual_in=residual_in,
            start=state.round_start if verify or overlap else None,
            timings={"download": download, "compute": t_encode - t_compute, "encode": t_done - t_encode},
        )

    def _start(self, job: JobOrder, state: JobState, base: str) -> Tensor:
        """The ``(d,)`` model the round starts from: read ahead by the look-ahead thread
        (overlap 2) if it was, else loaded from the global model's file."""
        start = self.fetcher.take_ready(state.job_id, base)
        if start is None:
            model = self.fetcher.global_model(base, job.model_peers or [], inline=job.global_model)
            load_checkpoint_file(state.trainer.model, model)
            start = flat_params(state.trainer.model).cpu()  # (d,)
        return start

    def _step_reporter(self, job: JobOrder, state: JobState, steps: int, t_compute: float) -> OnStep:
        """What runs after each local step: the step's metrics and, now and then, a progress report."""
        every = max(1, min(self.cfg.progress_every, steps // 4 or 1))
        job_id = job.job_id

        def report(step: int, loss: float) -> None:
            # The first step opens the round's reports (its loss is the job's own from then on),
            # then every `every` steps; at most one report per progress_seconds after the last
            # one sent, the job's first at once (a round shorter than that, a small model's,
            # reports its first step once in progress_seconds: each report is a request the
            # coordinator serves while the workers train). The last step goes with the update
            # itself: an owner who sees the job complete reads its final step.
            if self.cfg.step_delay:
                time.sleep(self.cfg.step_delay)
            self.metrics.steps.inc()
            now = time.perf_counter()
            self.metrics.steps_per_second.set(step / max(now - t_compute, 1e-9))
            sent = self.reporter.sent_at(job_id)
            due = sent is None or now - sent >= self.cfg.progress_seconds
            if due and (step == 1 or (step % every == 0 and step < steps)):
                body = progress_body(job.round, 100.0 * step / steps, loss, state.epoch, "training", step=step)
                self.reporter.report(job.job_id, body)

        return report

    def _steps(
        self, state: JobState, start: Tensor, round: int, report: OnStep, recorder: Recorder | None
    ) -> tuple[LocalResult, Recorder | None]:
        """The round's local steps from ``start`` (the ranks beside this one, if any)."""
        if self.cfg.cheat == "skip-half":
            return skip_half(state.trainer, start, round, report)
        if self.ranks is None or state.trainer.group is None:  # one rank (see prepare)
            return state.trainer.train_round(start, on_step=report, round=round, recorder=recorder), recorder
        try:  # the other ranks train this round beside this one
            self.ranks.round(state.trainer, start, round)
            return state.trainer.train_round(start, on_step=report, round=round, recorder=recorder), recorder
        except RuntimeError as e:  # a collective failed: a rank is gone; the worker stops
            raise self.ranks.failure(e) from None

    def _encode(
        self, job: JobOrder, state: JobState, res: LocalResult, d: int, round: int, recorder: Recorder | None
    ) -> tuple[bytes, Tensor | None, CommitmentJSON | None]:
        """The update's blob, the residual it began with (error feedback) and its proof."""
        feedback = isinstance(state.codec, ErrorFeedback)
        residual_in = None
        if feedback:
            residual_in = state.codec.residual.clone() if state.codec.residual is not None else torch.zeros(d)
        blob = state.codec.encode(self.sent_update(res.delta))
        if recorder is None:
            return blob, residual_in, None
        cfg = state.trainer.cfg
        proof = recorder.commitment(
            residual_in,
            state.codec.residual if feedback else None,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            data_seed=data_seed(job.seed, round),
            threads=torch.get_num_threads(),  # the verifier re-runs on as many: bit-exact on like hardware
        ).to_json()
        return blob, residual_in, proof
