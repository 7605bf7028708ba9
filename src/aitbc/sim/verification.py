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

The workers and the cheats they play are :mod:`aitbc.sim.cheats`'s.

Accepted updates are decoded, averaged (mean) and applied with FedAvg (lr 1), so training
proceeds as in a live run. Same seed, same numbers (the verifier's choices come from a
generator seeded from the config).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from aitbc.core.compression import Codec, build_codec
from aitbc.core.compression import decode as decode_update
from aitbc.core.compression.feedback import ErrorFeedback
from aitbc.core.options import parse_spec
from aitbc.core.outer import build_outer
from aitbc.errors import IntegrityError
from aitbc.json_value import JSONObject
from aitbc.sim.cheats import RoundView, Submission, Worker
from aitbc.sim.verify_config import VerifyConfig
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
    replay_threads,
)
from aitbc.training.datasets import DataOptions, load_dataset
from aitbc.training.local import LocalConfig, LocalTrainer, evaluate
from aitbc.training.models import build_model
from aitbc.training.proof import TrainState
from aitbc.training.sharding import shard_indices


@dataclass(frozen=True, slots=True)
class Finding:
    """An honest update a check left out of its round."""

    round: int
    worker: int
    check: str
    detail: str


@dataclass(kw_only=True)
class VerifyResult:
    config: VerifyConfig
    cheaters: list[int]
    rounds: int  # rounds played
    caught_round: dict[int, int]  # cheater -> first round an update of it was detected (absent: never)
    caught_by: dict[int, str]  # cheater -> the check that detected it ("start", "interval", "reveal", "update")
    proved_round: dict[int, int]  # cheater -> round a check proved it (a fault: slashed, ejected)
    false_accusations: list[Finding]  # honest workers a check faulted (would be slashed: must be none)
    honest_drift: list[Finding]  # honest updates left out unpaid as possible drift (not slashed)
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

    def to_json(self) -> JSONObject:
        out: JSONObject = asdict(self)
        out["caught_round"] = {str(k): v for k, v in self.caught_round.items()}
        out["caught_by"] = {str(k): v for k, v in self.caught_by.items()}
        out["proved_round"] = {str(k): v for k, v in self.proved_round.items()}
        out["mean_detection_round"] = self.mean_detection_round
        out["replay_share"] = self.replay_share
        out["wall_share"] = self.wall_share
        return out


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
    false_accusations: list[Finding] = field(default_factory=list)
    honest_drift: list[Finding] = field(default_factory=list)
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
        seen = Finding(round=round, worker=sub.worker, check=verdict.check, detail=verdict.detail)
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
        config=cfg,
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
