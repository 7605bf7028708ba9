"""The workers of a simulated verified run: each trains and commits honestly, or plays
one cheat.

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
feedback residual, committed), so :func:`~aitbc.training.checks.check_update` holds
whenever its last state is revealed: a cheater is never caught by an inconsistency it
could have avoided.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from aitbc.core.compression import Codec
from aitbc.core.compression.feedback import ErrorFeedback
from aitbc.sim.verify_config import CHEATS, VerifyConfig
from aitbc.training.batches import data_seed
from aitbc.training.checks import Replay, replay, replay_threads
from aitbc.training.local import LocalTrainer
from aitbc.training.proof import Commitment, Recorder, TrainState, boundaries, commit_every


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
