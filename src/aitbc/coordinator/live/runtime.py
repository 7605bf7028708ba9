"""What the coordinator keeps in memory for a live run, and the checks that build it.

:class:`RunRuntime` holds the model (for evaluation and checkpoints), the validation data,
the aggregation pipeline and the outer optimizer's state; ``ctx.runtimes`` caches one per
run, rebuilt from the database and the blob store after a restart.
:func:`check_training_config` builds everything a config names once, so a bad option is
a 422 at ``distribute``, not a failure at round 1.

Shape letters: ``d`` parameters.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import select
from torch import Tensor

from aitbc import run_defaults
from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import unprocessable
from aitbc.coordinator.live.mode_config import MODE_CHECKS
from aitbc.coordinator.schemas import Distribute
from aitbc.coordinator.store.models import RoundRecord, Run
from aitbc.coordinator.store.run_config import RunConfig
from aitbc.core.aggregation import parse_aggregator
from aitbc.core.compression import ErrorFeedback, build_codec, check_outer
from aitbc.core.norms import NormBound
from aitbc.core.options import parse_spec
from aitbc.core.outer import build_outer
from aitbc.core.staleness import build_staleness
from aitbc.errors import AitbcError, NotFoundError
from aitbc.run_mode import RunMode
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.allow_code import AllowCode
from aitbc.training.checkpoint import (
    bytes_to_tensors,
    checkpoint_bytes,
    flat_params,
    load_checkpoint,
    load_shard,
    set_flat_params,
)
from aitbc.training.data_spec import DataSpec
from aitbc.training.hf_models import Weights
from aitbc.training.local import GLOBAL_RNG, LocalConfig, evaluate
from aitbc.training.models import build_model, model_config, sample_bytes, step_bytes

OUTER_FORMAT = "aitbc.outer-state/1"
# Activations a spot check's replay of one training step may hold (a step of batch_size samples
# runs whole: cut in pieces it would not be the step the worker took). With eval_memory_mb for
# the books thread's pass and the close's guard pass beside it, the coordinator's passes stay
# inside its documented bound (docs/ARCHITECTURE.md, "The coordinator's memory on a large model").
MAX_STEP_BYTES = 512 << 20
# A code model's (module:callable) activations cannot be counted: a pass takes at most this
# many input values (a batch of digits: 1024 rows; of 512-token sequences: 128).
CODE_CHUNK_ELEMENTS = 1 << 16
# A run's model was held to this coordinator's --max-params when it was made and when its data
# was attached (runs/owner.py); the config is read here with no cap of its own (models.py's
# default is run_defaults.MAX_PARAMS, which an operator may have raised).
UNCAPPED = None
# Writes the rounds' checkpoints behind their closes (RunRuntime.checkpoint_behind): one
# thread, so the writes land in the order they were made.
_WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")


def data_spec(manifest: dict[str, Any]) -> DataSpec:
    s = manifest["spec"]
    return DataSpec(s["task"], tuple(int(v) for v in s["input_shape"]), int(s["num_classes"]))


def store_weights(store: LocalBlobStore) -> Weights:
    """Resolves a pretrained-weights CID to its file in ``store`` (checked at the run's
    creation and kept for its life by retention)."""

    def path(cid: str) -> Path:
        if not store.has(cid):
            raise NotFoundError(f"pretrained weights {cid} are not on this coordinator")
        return store.dir / cid

    return path


def build_initial_model(run: Run, allow_code: AllowCode, weights: Weights | None = None) -> torch.nn.Module:
    """The run's model at its seed; code only under a prefix this coordinator's operator
    allowed, a built-in model only within its bounds (counted before it is built).
    ``weights``: where a fine-tune's pretrained base is read (:func:`store_weights`).
    Its parameters were held to this coordinator's ``--max-params`` at init and when its
    data was attached (:data:`UNCAPPED` here: no second, other cap)."""
    with GLOBAL_RNG:  # not while a replay's seeded step draws its dropout (another thread)
        torch.manual_seed(run.seed)  # the initial weights are a function of the run's seed
        return build_model(
            run.model_type,
            data_spec(run.data_manifest),
            run.model_options,
            allow_code=allow_code,
            max_params=UNCAPPED,
            weights=weights,
        )


def eval_rows(run: Run, budget_bytes: int) -> int:
    """Samples one evaluation or scoring forward pass of ``run``'s model takes: as many as
    fit ``budget_bytes`` of activations (``Settings.eval_memory_mb``), at least one (the
    model bounds keep one sample within every coordinator's budget)."""
    spec = data_spec(run.data_manifest)
    cfg = model_config(run.model_type, run.model_options, max_params=UNCAPPED)
    if cfg is None:
        return max(1, CODE_CHUNK_ELEMENTS // max(1, math.prod(spec.input_shape)))
    return max(1, budget_bytes // sample_bytes(run.model_type, cfg, spec))


def check_replay_batch(run: Run, verify_rate: float, batch_size: int) -> None:
    """422 when a spot check's replay of one step of ``batch_size`` samples would hold
    more than :data:`MAX_STEP_BYTES` of activations on the coordinator: the run's
    ``distribute`` and every job's own ``batch_size`` (a manual job's config, job control's
    ``set_config``) are held to it."""
    cfg = model_config(run.model_type, run.model_options, max_params=UNCAPPED)
    if verify_rate <= 0 or cfg is None:
        return
    spec = data_spec(run.data_manifest)
    fixed = step_bytes(run.model_type, cfg, spec, 0)  # gradients and optimizer state
    per_sample = sample_bytes(run.model_type, cfg, spec, training=True)
    most = max(0, MAX_STEP_BYTES - fixed) // per_sample
    if batch_size > most:
        need = step_bytes(run.model_type, cfg, spec, batch_size)
        raise unprocessable(
            "bad_config",
            f"batch_size {batch_size}: a spot check replays a step of it on the coordinator, "
            f"{need / 2**20:.0f} MiB for this model and data, more than the {MAX_STEP_BYTES >> 20} MiB allowed; "
            + (f"batch_size must be in [1, {most}] with verify_rate > 0" if most else "give verify_rate 0"),
        )


def default_f(workers: int) -> int:
    """Attackers a rule that takes ``f`` tolerates when the owner gave none: the most
    Bulyan allows (n >= 4f + 3), so every rule's condition holds with all workers in."""
    return max(0, (workers - 3) // 4)


# Distribute's fields the run's config holds as resolved here (or not at all), not as given
RESOLVED = {"max_cost", "min_workers", "max_workers", "quorum", "error_feedback", "buffer", "topology", "aggregator"}


def build_run_config(
    run: Run, body: Distribute, *, workers: int, allow_code: AllowCode, weights: Weights | None = None
) -> RunConfig:
    """The run's config from a distribute request: defaults resolved (workers, quorum), and
    everything the config names built once, so a bad name or option is a 422 now, not a
    failure at round 1. ``workers``: how many will train at the start."""
    min_workers = body.min_workers or 1
    max_workers = body.max_workers or max(run.target_workers, min_workers)
    if min_workers > max_workers:
        raise unprocessable("bad_config", f"min_workers ({min_workers}) exceeds max_workers ({max_workers})")
    quorum = body.quorum or min_workers
    if body.precision == "bf16" and body.verify_rate > 0:
        # bfloat16 steps do not replay within the spot check's tolerance on another layout
        # (a two-rank worker's half batches against the coordinator's whole ones: 0.023 > 0.01,
        # tests/e2e/test_gpu_workers.py), so an honest bf16 worker would be slashed
        raise unprocessable(
            "bad_config",
            "precision bf16 cannot be verified (its steps do not replay within tolerance): give verify_rate 0 or precision fp32",
        )
    shape = MODE_CHECKS[RunMode(body.mode)](body, workers=workers, max_workers=max_workers)
    try:
        LocalConfig(
            steps=body.local_steps,
            batch_size=body.batch_size,
            optimizer=body.inner_opt,
            lr=body.lr,
            precision=body.precision,
        )
        model = build_initial_model(run, allow_code, weights)
        check_replay_batch(run, body.verify_rate, body.batch_size)
        layout = [tuple(p.shape) for p in model.parameters()]
        f = default_f(workers)
        aggregator = body.aggregator or run_defaults.default_aggregator(body.compression)
        agg = parse_aggregator(aggregator, default_f=f)
        agg.check(shape.group(workers=workers, quorum=quorum, deadline=body.deadline))
        name, opts = parse_spec(body.compression, what="codec")
        codec = build_codec(name, opts, layout=layout, error_feedback=body.error_feedback)
        check_outer(codec, body.outer)  # decayed error feedback is the outer momentum: fedavg only
        build_outer(body.outer, body.outer_options)
    except (AitbcError, ValueError) as e:
        raise unprocessable("bad_config", str(e)) from None
    mcfg = model_config(run.model_type, run.model_options, max_params=UNCAPPED)
    return RunConfig(
        **body.model_dump(exclude=RESOLVED),
        aggregator=aggregator,
        # on when the flag or the codec spec asks for it (error_feedback_decay=...): workers, the
        # spot checks' residual and the run's views all read this one flag
        error_feedback=isinstance(codec, ErrorFeedback),
        buffer=shape.buffer,
        topology=shape.topology,
        min_workers=min_workers,
        max_workers=max_workers,
        quorum=quorum,
        d=sum(p.numel() for p in model.parameters()),
        f=f,
        model_options_full={} if mcfg is None else asdict(mcfg),
    )


class RunRuntime:
    """What the driver keeps in memory for one run: the model (for evaluation and
    checkpoints), validation data, the aggregation pipeline and the outer optimizer with
    the state that produced ``params``. Rebuilt from the database after a restart."""

    def __init__(self, ctx: Context, run: Run) -> None:
        cfg = run.cfg
        self.model = build_initial_model(run, ctx.settings.allow_code, store_weights(ctx.store))
        self.aggregator = parse_aggregator(cfg.aggregator, default_f=cfg.f)
        self.outer_name, self.outer_options = cfg.outer, cfg.outer_options
        self._staleness_specs = cfg.staleness, cfg.overlap_staleness
        # checked as the workers check theirs: an id past the vocabulary fails here, in one line
        val = load_shard(ctx.store.get_bytes(run.data_manifest["val"]["cid"]), data_spec(run.data_manifest))
        k = ctx.settings.eval_samples
        self.val_x, self.val_y = val[0][:k], val[1][:k]
        g = ctx.settings.guard_samples  # what the divergence check scores before a round commits
        self.guard_x, self.guard_y = val[0][:g], val[1][:g]
        # samples a forward pass takes (evaluation, the guard, scoring): within eval_memory_mb
        self.eval_rows = eval_rows(run, int(ctx.settings.eval_memory_mb * 2**20))
        self.guard_cache: tuple[str | None, float] | None = None  # (params cid, its guard loss)
        self.norm_bound = NormBound(clip=ctx.settings.norm_clip, reject=ctx.settings.norm_reject)
        self.divergence_factor = ctx.settings.divergence_factor
        self.d = cfg.d
        self.params_cid: str | None = None
        self.params: Tensor | None = None  # (d,)
        self.outer_cid: str | None = None
        self.outer_state: dict[str, Tensor] = {}
        self.steps: dict[int, Tensor] = {}  # round r -> the trend its updates are compared with (last few)
        self.lock = threading.Lock()

    @cached_property
    def staleness(self) -> Callable[[int], float]:
        """Async: how much an update counts at its lag in versions (the run's ``staleness``
        rule), parsed once for the run. Built when first asked: a sync run never reads it."""
        return build_staleness(*parse_spec(self._staleness_specs[0], what="staleness rule"))

    @cached_property
    def overlap_staleness(self) -> Callable[[int], float]:
        """Sync with overlap: how much an update trained from a model before its round's
        counts at its lag in rounds (``overlap_staleness``), parsed once for the run."""
        return build_staleness(*parse_spec(self._staleness_specs[1], what="staleness rule"))

    def load(self, ctx: Context, run: Run) -> None:
        """Bring params and outer state to those the run's database row names."""
        if run.global_cid is None:
            raise RuntimeError(f"run {run.id} has no global model yet (round 0 is written when training starts)")
        if self.params_cid != run.global_cid:
            load_checkpoint(self.model, ctx.store.get_bytes(run.global_cid))
            self.params, self.params_cid = flat_params(self.model), run.global_cid
        if self.outer_cid != run.outer_state_cid:
            self.outer_state = bytes_to_tensors(ctx.store.get_bytes(run.outer_state_cid)) if run.outer_state_cid else {}
            self.outer_cid = run.outer_state_cid

    def trend(self, ctx: Context, run_id: str, r: int) -> Tensor | None:
        """The reference a ``trend`` stage compares round ``r``'s updates with, and
        ``centered-clip:start=previous`` starts from: the global model's last step before
        the round, round ``r - 2``'s checkpoint minus round ``r - 1``'s (``(d,)``, the sign
        of an update). ``None`` when the rule reads no reference, before round 2, or when
        one of those checkpoints' bytes are gone (retention keeps the last
        ``keep_checkpoints``): every update then passes, and the clipping starts from the
        medoid. Remembered for the last
        rounds (:meth:`remember_step`), rebuilt from the checkpoints after a restart, so the
        close and the scoring of a round see the same one. Call with ``lock`` held."""
        if not self.aggregator.uses_reference or r < 2:
            return None
        if r in self.steps:
            return self.steps[r]
        with ctx.session() as s:
            cids = dict(
                s.execute(
                    select(RoundRecord.round, RoundRecord.checkpoint_cid).where(
                        RoundRecord.run_id == run_id, RoundRecord.round.in_((r - 2, r - 1))
                    )
                ).all()
            )
        if len(cids) < 2:
            return None
        try:
            older, newer = (self._params_at(ctx, cids[k]) for k in (r - 2, r - 1))
        except NotFoundError:
            return None
        step = older - newer  # (d,)
        self.remember_step(r, step)
        return step

    def remember_step(self, r: int, step: Tensor) -> None:
        """Keep ``step`` ``(d,)`` as round ``r``'s trend (and the two rounds before it)."""
        if not self.aggregator.uses_reference:
            return
        self.steps[r] = step
        for old in [k for k in self.steps if k < r - 2]:
            del self.steps[old]

    def _params_at(self, ctx: Context, cid: str) -> Tensor:
        load_checkpoint(self.model, ctx.store.get_bytes(cid))  # every use of the model sets its params first
        return flat_params(self.model)

    def checkpoint(self, ctx: Context, run: Run, params: Tensor, round: int) -> tuple[str, int]:
        set_flat_params(self.model, params)
        blob = checkpoint_bytes(
            self.model, model_name=run.model_type, model_options=run.cfg.model_options_full, round=round
        )
        return ctx.store.put_bytes(blob), len(blob)

    def checkpoint_behind(self, ctx: Context, run: Run, params: Tensor, round: int) -> tuple[str, int, Future[str]]:
        """:meth:`checkpoint`, with the blob's write (fsynced file and folder) handed to a
        thread of its own: its CID and size now, and the write to wait for before any row
        names the CID (:func:`.rounds.commit_round` waits for it before its commit). A
        round's close then does its database work while the disk syncs (a median 9 ms
        here, more under load): the write stands between every worker and its next round."""
        set_flat_params(self.model, params)
        blob = checkpoint_bytes(
            self.model, model_name=run.model_type, model_options=run.cfg.model_options_full, round=round
        )
        cid = cid_of_bytes(blob)
        return cid, len(blob), write_behind(ctx, cid, blob)

    def evaluate(self, params: Tensor) -> tuple[float, float | None]:
        set_flat_params(self.model, params)
        return evaluate(self.model, self.val_x, self.val_y, batch_size=self.eval_rows)

    def guard_loss(self, params: Tensor, cid: str | None = None) -> float:
        """The loss of ``params`` on the guard samples (the divergence check's); cached for
        the params named ``cid``."""
        if cid is not None and self.guard_cache is not None and self.guard_cache[0] == cid:
            return self.guard_cache[1]
        set_flat_params(self.model, params)
        loss = evaluate(self.model, self.guard_x, self.guard_y, batch_size=self.eval_rows)[0]
        if cid is not None:
            self.guard_cache = (cid, loss)
        return loss


def write_behind(ctx: Context, cid: str, blob: bytes) -> Future[str]:
    """Store ``blob`` (whose CID is ``cid``) in the blob store from the writer thread; the
    caller waits for the write before any row names ``cid``."""
    return _WRITER.submit(ctx.store.put_blob, cid, blob)


def runtime(ctx: Context, run: Run) -> RunRuntime:
    rt = ctx.runtimes.get(run.id)
    if rt is None:
        rt = ctx.runtimes[run.id] = RunRuntime(ctx, run)
    return rt


def drop_runtime(ctx: Context, run_id: str) -> None:
    ctx.runtimes.pop(run_id, None)
