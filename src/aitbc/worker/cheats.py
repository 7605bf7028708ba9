"""Testing only: a worker that cheats, so the end-to-end tests can show it is caught.

``skip-half`` (``aitbc worker start --cheat skip-half``, hidden): train half the round's
local steps and claim all of them. Its commitment spreads the half it did over the round's
committed steps (the state after ``j`` real steps is claimed as the state at step ``2j``),
starts from the round's model and ends at the state it sends, so only the re-run of an
interval can tell: the interval's ``k`` steps from a claimed state do not land on the next
claimed state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from torch import Tensor

from aitbc.training.local import LocalResult, LocalTrainer
from aitbc.training.proof import Recorder, TrainState, boundaries


def skip_half(
    trainer: LocalTrainer, start: Tensor, round: int, on_step: Callable[[int, float], None] | None
) -> tuple[LocalResult, Recorder]:
    steps = trainer.cfg.steps
    half = max(1, steps // 2)
    done = Recorder(half, every=1)
    trainer.cfg.steps = half
    try:
        res = trainer.train_round(start, on_step, round=round, recorder=done)
    finally:
        trainer.cfg.steps = steps
    claimed = Recorder(steps)
    for b in boundaries(steps, claimed.every):
        real = done.states[min(half, round_half(b, half, steps))]
        claimed.states[b] = TrainState(b, real.params, real.optim)
    return replace(res, steps=steps), claimed


def round_half(b: int, half: int, steps: int) -> int:
    """The real step whose state is claimed for committed step ``b``."""
    return (b * half + steps // 2) // steps
