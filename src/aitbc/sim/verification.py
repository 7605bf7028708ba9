"""Verification of work in simulation: honest workers, cheaters, and the coordinator's spot checks.

Every worker commits to its round's states (:mod:`aitbc.training.proof`) and sends an
encoded update; the verifier runs the coordinator's protocol on each update -- the free
:func:`~aitbc.training.checks.check_start`, then :func:`~aitbc.training.checks.choose_intervals`
at the verification rate and :func:`~aitbc.training.checks.check_interval` on each chosen
interval with the states the worker *reveals* (as bytes, parsed as a coordinator would), and
:func:`~aitbc.training.checks.check_update` whenever the last interval is among the chosen.
A check that fails with proof (a fault: :data:`~aitbc.training.checks.FAULT`) ejects the worker
(the coordinator slashes it); one that missed within its drift bound
(:data:`~aitbc.training.checks.DRIFT`) only leaves the update out, unpaid: the worker stays.
Either is a detected update; only faults count against honest workers (false accusations).
The verifier also re-runs every interval whose committed end is its start
(:func:`~aitbc.training.checks.null_intervals`), as the coordinator does. Workers train on
``worker_threads`` torch threads, the verifier re-runs on ``verify_threads`` (or on the
count the commitment states, with ``state_threads``). The verifier knows only what a coordinator knows (each worker's assigned shard, job seed,
the round's model and the codec); nothing here tells it who cheats.

The cheats (``CHEATS``) each fabricate the whole commitment consistently, so that only a
replayed interval (or the first state) gives them away:

- ``skip``: trains honestly on a random half of the intervals (``skip_fraction`` faked) and
  commits each other interval's start state as its end (no steps), continuing from there;
- ``skip-naive``: trains half of each interval's steps and commits the result as its end;
- ``wrong-shard``: trains honestly on another worker's shard; ``wrong-random``: on random
  data of the shard's shape;
- ``copy``: sends another (honest) worker's update of this round plus small Gaussian noise,
  with states interpolated linearly from the start to ``start - update`` and the optimizer
  state it holds;
- ``stale``: trains honestly from the global model ``stale_by`` rounds old;
- ``noise``: Gaussian noise scaled to the round's mean honest update norm, chain as copy;
- ``zero``: an all-zero update, every committed state the start state.

Each cheater encodes ``first state - last state`` of its own chain (with its own error
feedback residual, committed), so :func:`check_update` holds whenever its last state is
revealed: a cheater is never caught by an inconsistency it could have avoided.

Accepted updates are decoded, averaged (mean) and applied with FedAvg (lr 1), so training
proceeds as in a live run. Same seed, same numbers (the verifier's choices come from a
generator seeded from the config).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from aitbc import run_defaults
from aitbc.core.compression import Codec, build_codec
from aitbc.core.compression import decode as decode_update
from aitbc.core.compression.feedback import ErrorFeedback
from aitbc.core.options import parse_spec
from aitbc.core.outer import build_outer
from aitbc.errors import IntegrityError, UsageError
from aitbc.training.batches import data_seed
from aitbc.training.checkpoint import flat_params, set_flat_params
from aitbc.training.checks import (
    Replay,
    Verdict,
    check_interval,
    check_start,
    check_update,
    choose_intervals,
    fault,
    null_intervals,
    replay,
    replay_threads,
)
from aitbc.training.datasets import DataOptions, load_dataset
from aitbc.training.local import LocalConfig, LocalTrainer, evaluate
from aitbc.training.models import build_model
from aitbc.training.proof import Commitment, Recorder, TrainState, boundaries, commit_every
from aitbc.training.sharding import shard_indices

CHEATS = ("skip", "skip-naive", "wrong-shard", "wrong-random", "copy", "stale", "noise", "zero")


@dataclass(kw_only=True)
class VerifyConfig:
    """One simulated verified run: ``cheaters`` of the ``workers`` cheat with ``cheat``."""

    model: str = "mlp"
    dataset: str = "digits"
    workers: int = 16
    cheat: str | None = None  # one of CHEATS; None: every worker is honest
    cheaters: int = 4
    rate: float = 0.1  # verification rate: expected share of each update's steps re-run
    rounds: int = 50
    local_steps: int = run_defaults.LOCAL_STEPS
    batch_size: int = run_defaults.BATCH_SIZE
    lr: float = run_defaults.LR
    inner_opt: str = run_defaults.INNER_OPT
    compression: str = "int8"  # codec spec NAME[:k=v,...]
    error_feedback: bool = False
    skip_fraction: float = 0.5  # skip: share of the intervals faked (at least one)
    stale_by: int = 2  # stale: rounds behind the global model
    copy_noise: float = 0.01  # copy: noise norm as a share of the copied update's norm
    eval_samples: int = 1024
    seed: int = 0
    stop_when_caught: bool = False  # end the run once every cheater is caught (detection trials)
    worker_threads: int = 1  # torch threads each worker trains on
    verify_threads: int = 1  # torch threads the verifier re-runs on ...
    state_threads: bool = True  # ... unless the commitment states the worker's (then on those: bit-exact)

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise UsageError(f"workers must be at least 2, got {self.workers}")
        if self.rounds < 1 or self.local_steps < 1 or self.batch_size < 1:
            raise UsageError("rounds, local_steps and batch_size must be at least 1")
        if self.cheat is not None and self.cheat not in CHEATS:
            raise UsageError(f"unknown cheat {self.cheat!r}; allowed: {', '.join(CHEATS)}")
        n_cheat = 0 if self.cheat is None else self.cheaters
        if not 0 <= n_cheat < self.workers:
            raise UsageError(f"cheaters must be between 0 and workers-1 ({self.workers - 1}), got {self.cheaters}")
        if not 0 <= self.rate <= 1:
            raise UsageError(f"verification rate must be in [0, 1], got {self.rate}")
        if not 0 < self.skip_fraction <= 1:
            raise UsageError(f"skip_fraction must be in (0, 1], got {self.skip_fraction}")
        if self.stale_by < 1:
            raise UsageError(f"stale_by must be at least 1, got {self.stale_by}")
        if not self.copy_noise >= 0:
            raise UsageError(f"copy_noise must be >= 0, got {self.copy_noise}")
        if self.worker_threads < 1 or self.verify_threads < 1:
            raise UsageError("worker_threads and verify_threads must be at least 1")


@dataclass(slots=True)
class Submission:
    """One worker's round as the verifier receives it: the signed commitment and blob, the
    residual it started from (error feedback), and the states it reveals on request."""

    worker: int
    commitment: Commitment
    blob: bytes
    residual_in: Tensor | None
    states: list[TrainState]  # the worker's own, by boundary index: revealed as bytes only

    def reveal(self, index: int) -> bytes:
        return self.states[index].to_bytes()


@dataclass(kw_only=True)
class VerifyResult:
    config: dict[str, Any]
    cheaters: list[int]
    rounds: int  # rounds played
    caught_round: dict[int, int]  # cheater -> first round an update of it was detected (absent: never)
    caught_by: dict[int, str]  # cheater -> the check that detected it ("start", "interval", "reveal", "update")
    proved_round: dict[int, int]  # cheater -> round a check proved it (a fault: slashed, ejected)
    false_accusations: list[dict[str, Any]]  # honest workers a check faulted (would be slashed: must be none)
    honest_drift: list[dict[str, Any]]  # honest updates left out unpaid as possible drift (not slashed)
    cheater_updates: int  # cheaters' updates received (until ejected)
    cheater_updates_caught: int
    cheater_updates_accepted: int  # aggregated before their cheater was caught
    honest_updates: int
    honest_trained_steps: int
    honest_replayed_steps: int
    replayed_steps: int  # on every update, cheaters' included
    update_checks: int  # check_update runs (one encode each)
    train_seconds: float  # honest workers: training, commitment and encoding
    honest_verify_seconds: float  # verifying honest workers' updates
    verify_seconds: float  # verifying every update
    initial_val_accuracy: float | None
    final_val_accuracy: float | None
    final_val_loss: float
    wall_seconds: float

    def caught_within(self, rounds: int) -> int:
        return sum(1 for r in self.caught_round.values() if r <= rounds)

    def proved_within(self, rounds: int) -> int:
        return sum(1 for r in self.proved_round.values() if r <= rounds)

    @property
    def mean_detection_round(self) -> float | None:
        rs = list(self.caught_round.values())
        return sum(rs) / len(rs) if rs else None

    @property
    def replay_share(self) -> float:
        """Replayed steps on honest updates / steps honest workers trained."""
        return self.honest_replayed_steps / self.honest_trained_steps if self.honest_trained_steps else 0.0

    @property
    def wall_share(self) -> float:
        """Seconds verifying honest updates / seconds honest workers spent producing them."""
        return self.honest_verify_seconds / self.train_seconds if self.train_seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["caught_round"] = {str(k): v for k, v in self.caught_round.items()}
        out["caught_by"] = {str(k): v for k, v in self.caught_by.items()}
        out["proved_round"] = {str(k): v for k, v in self.proved_round.items()}
        out["mean_detection_round"] = self.mean_detection_round
        out["replay_share"] = self.replay_share
        out["wall_share"] = self.wall_share
        return out


@dataclass(slots=True)
class RoundView:
    """What a worker sees of round ``round``: the global model, older ones (a stale
    worker's), and the honest updates of this round already sent (a copier's, decoded)."""

    round: int
    params: Tensor  # (d,)
    history: list[Tensor]  # global models of rounds 1..round, history[r - 1] of round r
    honest: list[Tensor] = field(default_factory=list)  # (d,) each


Fabricate = Callable[["Worker", RoundView], list[TrainState]]


class Worker:
    """A worker: its assigned shard and job seed, a trainer (whose data may be other than
    the assigned shard: a wrong-data cheater), a codec and, for a cheater, the fabrication
    that makes its committed states."""

    def __init__(
        self,
        index: int,
        trainer: LocalTrainer,
        codec: Codec | ErrorFeedback,
        *,
        cheat: str | None,
        gen: torch.Generator,
        cfg: VerifyConfig,
        replay_on: Replay,
    ) -> None:
        self.index, self.trainer, self.codec, self.cheat, self.gen, self.cfg = index, trainer, codec, cheat, gen, cfg
        self.replay_on = replay_on  # the assigned shard; data_seed set per round
        self.optim: dict[str, Tensor] = {}  # carried inner optimizer state (cheaters that do not train)

    @property
    def honest(self) -> bool:
        return self.cheat is None

    def submit(self, view: RoundView) -> Submission:
        fabricate = _FABRICATIONS["honest" if self.cheat is None else self.cheat]
        with replay_threads(self.cfg.worker_threads):
            states = fabricate(self, view)
        res_in: Tensor | None = None
        if isinstance(self.codec, ErrorFeedback):
            if self.codec.residual is None:  # the first round starts from a zero residual, committed as such
                self.codec.residual = torch.zeros_like(view.params)
            res_in = self.codec.residual.clone()
        delta = states[0].params - states[-1].params  # (d,) the pseudo-gradient its chain claims
        blob = self.codec.encode(delta)
        res_out = self.codec.residual if isinstance(self.codec, ErrorFeedback) else None
        rec = Recorder(self.cfg.local_steps)
        rec.states = {s.step: s for s in states}
        threads = self.cfg.worker_threads if self.cfg.state_threads else None
        return Submission(self.index, rec.commitment(res_in, res_out, threads=threads), blob, res_in, states)

    # helpers for fabrications

    def recorded_round(self, start: Tensor, round: int) -> list[TrainState]:
        """Train the round honestly (on the trainer's data) from ``start``; the recorded states."""
        rec = Recorder(self.cfg.local_steps)
        self.trainer.train_round(start, round=round, recorder=rec)
        return [rec.states[b] for b in sorted(rec.states)]

    def replay_for(self, round: int) -> Replay:
        r = self.replay_on
        return Replay(r.model, r.x, r.y, r.cfg, data_seed(r.seed, round))

    def chain(self, start: Tensor, delta: Tensor) -> list[TrainState]:
        """States interpolated linearly from ``start`` to ``start - delta``, each with the
        optimizer state the worker holds (what a worker that did not train can show)."""
        steps = boundaries(self.cfg.local_steps, commit_every(self.cfg.local_steps))
        h = self.cfg.local_steps
        return [
            TrainState(b, start.clone() if b == 0 else start - (b / h) * delta, copy.deepcopy(self.optim))
            for b in steps
        ]


def _honest(w: Worker, v: RoundView) -> list[TrainState]:
    return w.recorded_round(v.params, v.round)


def _wrong_data(w: Worker, v: RoundView) -> list[TrainState]:
    return w.recorded_round(v.params, v.round)  # its trainer holds the other data


def _stale(w: Worker, v: RoundView) -> list[TrainState]:
    old = v.history[max(0, v.round - 1 - w.cfg.stale_by)]
    return w.recorded_round(old, v.round)


def _skip(w: Worker, v: RoundView) -> list[TrainState]:
    """Honest steps on a random half (``skip_fraction``) of the intervals; on the others the
    start state is committed as the end, and training continues from there."""
    steps = boundaries(w.cfg.local_steps, commit_every(w.cfg.local_steps))
    n = len(steps) - 1
    k = max(1, min(n, round(n * w.cfg.skip_fraction)))
    faked = set(torch.randperm(n, generator=w.gen)[:k].tolist())
    r = w.replay_for(v.round)
    states = [TrainState(0, v.params.clone(), copy.deepcopy(w.optim))]
    for i in range(n):
        s = states[-1]
        if i in faked:
            states.append(TrainState(steps[i + 1], s.params.clone(), copy.deepcopy(s.optim)))
        else:
            states.append(replay(r, s, steps[i + 1] - steps[i]))
    w.optim = copy.deepcopy(states[-1].optim)
    return states


def _skip_naive(w: Worker, v: RoundView) -> list[TrainState]:
    """Half of each interval's steps (H/2 in all), committed as the interval's end."""
    steps = boundaries(w.cfg.local_steps, commit_every(w.cfg.local_steps))
    r = w.replay_for(v.round)
    states = [TrainState(0, v.params.clone(), copy.deepcopy(w.optim))]
    for i in range(len(steps) - 1):
        s = replay(r, states[-1], (steps[i + 1] - steps[i]) // 2)
        states.append(TrainState(steps[i + 1], s.params, s.optim))
    w.optim = copy.deepcopy(states[-1].optim)
    return states


def _copy(w: Worker, v: RoundView) -> list[TrainState]:
    if not v.honest:
        return w.chain(v.params, torch.zeros_like(v.params))
    u = v.honest[int(torch.randint(len(v.honest), (), generator=w.gen))]
    noise = torch.randn(u.shape, generator=w.gen)
    noise *= w.cfg.copy_noise * float(u.norm()) / max(float(noise.norm()), 1e-12)
    return w.chain(v.params, u + noise)


def _noise(w: Worker, v: RoundView) -> list[TrainState]:
    typical = sum(float(u.norm()) for u in v.honest) / len(v.honest) if v.honest else 1e-3
    noise = torch.randn(v.params.shape, generator=w.gen)
    return w.chain(v.params, noise * (typical / max(float(noise.norm()), 1e-12)))


def _zero(w: Worker, v: RoundView) -> list[TrainState]:
    return w.chain(v.params, torch.zeros_like(v.params))


_FABRICATIONS: dict[str, Fabricate] = {
    "honest": _honest,
    "skip": _skip,
    "skip-naive": _skip_naive,
    "wrong-shard": _wrong_data,
    "wrong-random": _wrong_data,
    "copy": _copy,
    "stale": _stale,
    "noise": _noise,
    "zero": _zero,
}
assert set(_FABRICATIONS) == {"honest", *CHEATS}


class Verifier:
    """The coordinator's side: what it assigned (shards, job seeds), the round's model and
    a seeded generator for its choices."""

    def __init__(self, cfg: VerifyConfig, replays: list[Replay], codec: Callable[[], Codec | ErrorFeedback]) -> None:
        self.cfg, self.replays, self.fresh_codec = cfg, replays, codec
        self.gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + 17)
        self.update_checks = 0
        self.reveal_seconds = 0.0  # the workers' side: serializing the states they reveal

    def _reveal(self, sub: Submission, index: int) -> TrainState:
        t = time.perf_counter()
        data = sub.reveal(index)
        self.reveal_seconds += time.perf_counter() - t
        return TrainState.from_bytes(data, numel=sub.states[0].params.numel())

    def verify(self, sub: Submission, params: Tensor, round: int) -> tuple[Verdict | None, int]:
        """The verdict that decides (a fault, else a drift miss; None: the update passed)
        and the steps replayed."""
        with replay_threads(self.cfg.verify_threads):
            return self._verify(sub, params, round)

    def _verify(self, sub: Submission, params: Tensor, round: int) -> tuple[Verdict | None, int]:
        c = sub.commitment
        v = check_start(c, params)
        if not v.ok:
            return v, 0
        chosen = sorted(set(choose_intervals(c.intervals, self.cfg.rate, self.gen)) | set(null_intervals(c)))
        a = self.replays[sub.worker]
        r = Replay(a.model, a.x, a.y, a.cfg, data_seed(a.seed, round))
        replayed = 0
        drift: Verdict | None = None
        try:
            for i in chosen:
                start, end = self._reveal(sub, i), self._reveal(sub, i + 1)
                v = check_interval(c, i, start, end, r)
                replayed += v.steps_replayed
                if v.provable:
                    return v, replayed
                if not v.ok and drift is None:  # a drift miss goes on: a fault elsewhere is still proof
                    drift = v
            if chosen and chosen[-1] == c.intervals - 1:
                final = self._reveal(sub, c.intervals)
                self.update_checks += 1
                v = check_update(c, sub.blob, params, final, sub.residual_in, self.fresh_codec())
                if not v.ok:
                    return v, replayed
        except IntegrityError as e:  # a revealed blob that does not parse is a failed reveal
            return fault("reveal", None, str(e)), replayed
        return drift, replayed


@dataclass(slots=True)
class Cohort:
    """The workers of one verified run, their cheaters, and the verifier with its own copy
    of the model (what it replays and evaluates on)."""

    model: torch.nn.Module
    workers: list[Worker]
    cheaters: list[int]
    verifier: Verifier
    verifier_model: torch.nn.Module
    val_x: Tensor
    val_y: Tensor


def build_cohort(cfg: VerifyConfig) -> Cohort:
    """Data, model, shards and workers (cheaters drawn from the seed), and the verifier."""
    torch.manual_seed(cfg.seed)  # model init
    data = load_dataset(cfg.dataset, DataOptions(seed=cfg.seed))
    model = build_model(cfg.model, data.spec, {})
    layout = [tuple(p.shape) for p in model.parameters()]
    local = LocalConfig(steps=cfg.local_steps, batch_size=cfg.batch_size, optimizer=cfg.inner_opt, lr=cfg.lr)
    codec_name, codec_opts = parse_spec(cfg.compression, what="codec")

    def new_codec() -> Codec | ErrorFeedback:
        return build_codec(codec_name, codec_opts, layout=layout, error_feedback=cfg.error_feedback)

    parts = shard_indices(data.train_x.shape[0], cfg.workers, seed=cfg.seed, labels=data.labels)
    seeds = [cfg.seed * 100_003 + i for i in range(cfg.workers)]
    pick = torch.Generator().manual_seed(cfg.seed + 1)
    n_cheat = 0 if cfg.cheat is None else cfg.cheaters
    cheaters = sorted(torch.randperm(cfg.workers, generator=pick)[:n_cheat].tolist())
    data_gen = torch.Generator().manual_seed(cfg.seed + 2)

    verifier_model = copy.deepcopy(model)
    replays = [Replay(verifier_model, data.train_x[p], data.train_y[p], local, seeds[i]) for i, p in enumerate(parts)]
    workers: list[Worker] = []
    for i, p in enumerate(parts):
        cheat = cfg.cheat if i in cheaters else None
        x, y = data.train_x[p], data.train_y[p]
        if cheat == "wrong-shard":
            q = parts[(i + 1) % cfg.workers]
            x, y = data.train_x[q], data.train_y[q]
        elif cheat == "wrong-random":
            x = torch.randn(x.shape, generator=data_gen)
            y = torch.randint(data.spec.num_classes, y.shape, generator=data_gen)
        trainer = LocalTrainer(copy.deepcopy(model), x, y, copy.deepcopy(local), seed=seeds[i])
        own = Replay(copy.deepcopy(model), replays[i].x, replays[i].y, local, seeds[i])
        gen = torch.Generator().manual_seed(cfg.seed * 7_919 + 1_000 + i)
        workers.append(Worker(i, trainer, new_codec(), cheat=cheat, gen=gen, cfg=cfg, replay_on=own))
    verifier = Verifier(cfg, replays, new_codec)
    val_x, val_y = data.val_x[: cfg.eval_samples], data.val_y[: cfg.eval_samples]
    return Cohort(model, workers, cheaters, verifier, verifier_model, val_x, val_y)


@dataclass(slots=True)
class Tally:
    """What the verifier has found so far, and what it cost."""

    ejected: set[int] = field(default_factory=set)
    caught_round: dict[int, int] = field(default_factory=dict)
    caught_by: dict[int, str] = field(default_factory=dict)
    proved_round: dict[int, int] = field(default_factory=dict)
    false_accusations: list[dict[str, Any]] = field(default_factory=list)
    honest_drift: list[dict[str, Any]] = field(default_factory=list)
    cheater_updates: int = 0
    cheater_updates_caught: int = 0
    cheater_updates_accepted: int = 0
    honest_updates: int = 0
    honest_trained_steps: int = 0
    honest_replayed_steps: int = 0
    replayed_steps: int = 0
    train_seconds: float = 0.0
    honest_verify_seconds: float = 0.0
    verify_seconds: float = 0.0

    def judged(self, sub: Submission, honest: bool, verdict: Verdict | None, round: int) -> bool:
        """Count one update's verdict; True if the update goes into the round."""
        if verdict is None:
            if not honest:
                self.cheater_updates_accepted += 1
            return True
        # left out of the round, unpaid
        seen = {"round": round, "worker": sub.worker, "check": verdict.check, "detail": verdict.detail}
        if verdict.provable:  # proof: slashed and ejected
            self.ejected.add(sub.worker)
        if honest:
            (self.false_accusations if verdict.provable else self.honest_drift).append(seen)
        else:
            self.cheater_updates_caught += 1
            self.caught_round.setdefault(sub.worker, round)
            self.caught_by.setdefault(sub.worker, verdict.check)
            if verdict.provable:
                self.proved_round[sub.worker] = round
        return False


def _submissions(workers: list[Worker], view: RoundView, tally: Tally) -> list[Submission]:
    """Every worker still in sends its round: honest workers first, so cheaters may see
    their updates (decoded, in ``view.honest``)."""
    subs: list[Submission] = []
    d = view.params.numel()
    for w in workers:
        if w.honest and w.index not in tally.ejected:
            t = time.perf_counter()
            subs.append(w.submit(view))
            tally.train_seconds += time.perf_counter() - t
            view.honest.append(decode_update(subs[-1].blob, max_numel=d).to(torch.float32))
    for w in workers:
        if not w.honest and w.index not in tally.ejected:
            subs.append(w.submit(view))
    return subs


def _verified(
    cfg: VerifyConfig, c: Cohort, subs: list[Submission], params: Tensor, rnd: int, tally: Tally
) -> list[Tensor]:
    """Verify each submission; the updates accepted (decoded), in worker order."""
    accepted: list[Tensor] = []
    for s in sorted(subs, key=lambda s: s.worker):
        honest = c.workers[s.worker].honest
        t, shown = time.perf_counter(), c.verifier.reveal_seconds
        verdict, replayed = c.verifier.verify(s, params, rnd)
        dt = time.perf_counter() - t - (c.verifier.reveal_seconds - shown)  # the verifier's own time
        tally.verify_seconds += dt
        tally.replayed_steps += replayed
        if honest:
            tally.honest_verify_seconds += dt
            tally.honest_updates += 1
            tally.honest_trained_steps += cfg.local_steps
            tally.honest_replayed_steps += replayed
        else:
            tally.cheater_updates += 1
        if tally.judged(s, honest, verdict, rnd):
            accepted.append(decode_update(s.blob, max_numel=params.numel()).to(torch.float32))
    return accepted


def run_verification(cfg: VerifyConfig) -> VerifyResult:
    """Play ``cfg.rounds`` verified rounds; see the module docstring."""
    t0 = time.perf_counter()
    c = build_cohort(cfg)
    outer = build_outer("fedavg", {"lr": 1.0})
    params = flat_params(c.model)  # (d,) the global model
    set_flat_params(c.verifier_model, params)
    _, acc0 = evaluate(c.verifier_model, c.val_x, c.val_y)

    history: list[Tensor] = []
    tally = Tally()
    rounds_run = 0
    for rnd in range(1, cfg.rounds + 1):
        history.append(params)
        subs = _submissions(c.workers, RoundView(rnd, params, history), tally)
        accepted = _verified(cfg, c, subs, params, rnd, tally)
        if accepted:
            params = outer.step(params, torch.stack(accepted).mean(dim=0))  # (n, d) -> (d,)
        rounds_run = rnd
        if cfg.stop_when_caught and len(tally.caught_round) == len(c.cheaters):
            break
    set_flat_params(c.verifier_model, params)
    loss, acc = evaluate(c.verifier_model, c.val_x, c.val_y)
    return VerifyResult(
        config=asdict(cfg),
        cheaters=c.cheaters,
        rounds=rounds_run,
        caught_round=tally.caught_round,
        caught_by=tally.caught_by,
        proved_round=tally.proved_round,
        false_accusations=tally.false_accusations,
        honest_drift=tally.honest_drift,
        cheater_updates=tally.cheater_updates,
        cheater_updates_caught=tally.cheater_updates_caught,
        cheater_updates_accepted=tally.cheater_updates_accepted,
        honest_updates=tally.honest_updates,
        honest_trained_steps=tally.honest_trained_steps,
        honest_replayed_steps=tally.honest_replayed_steps,
        replayed_steps=tally.replayed_steps,
        update_checks=c.verifier.update_checks,
        train_seconds=tally.train_seconds,
        honest_verify_seconds=tally.honest_verify_seconds,
        verify_seconds=tally.verify_seconds,
        initial_val_accuracy=acc0,
        final_val_accuracy=acc,
        final_val_loss=loss,
        wall_seconds=time.perf_counter() - t0,
    )
