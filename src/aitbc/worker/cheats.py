"""Testing only: a worker that cheats, so the end-to-end tests can show it is caught.

Gossip cheats: ``copy`` (sign a neighbour's published model, its very CID, as its own
model), ``copy-noise`` (the same with a little noise added: another CID),
(:func:`copy_neighbour`). The peer server's cheats (``trickle``, ``endless``) are in
:mod:`aitbc.worker.bad_peer`, which imports no torch (the worker's settings import the
peer server).

``skip-half`` (``aitbc worker start --cheat skip-half``, hidden): train half the round's
local steps and claim all of them. Its commitment spreads the half it did over the round's
committed steps (the state after ``j`` real steps is claimed as the state at step ``2j``),
starts from the round's model and ends at the state it sends, so only the re-run of an
interval can tell: the interval's ``k`` steps from a claimed state do not land on the next
claimed state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import Tensor

from aitbc.replies.gossip import RosterEntry
from aitbc.training.local import LocalResult, LocalTrainer
from aitbc.training.proof import Recorder, TrainState, boundaries
from aitbc.worker.gossip_peers import NeighbourReader

log = logging.getLogger("aitbc.worker.cheats")


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


def copy_neighbour(
    reader: NeighbourReader,
    entries: list[RosterEntry],
    r: int,
    local: Tensor,
    blob: bytes,
    *,
    noise: bool,
    encode: Callable[[Tensor], bytes],
) -> tuple[Tensor, bytes]:
    """``copy`` / ``copy-noise`` (a gossip worker, testing only): publish a neighbour's model
    of round ``r`` (its newest if round ``r`` does not come within the run's wait) as its
    own: the very blob (its CID), or with noise of 0.05% of the distance between that model
    and its own trained one added (another CID, the same model give or take). Its own
    ``local`` and ``blob`` when no neighbour's model could be had. ``entries``: the round's
    neighbours (roster entries); ``encode``: the run's codec."""
    for entry in entries:
        deadline = time.monotonic() + reader.wait
        signed = None
        while not reader.stop.is_set():
            signed, _ = reader.record(entry, r)
            if (signed is not None and signed["record"]["round"] >= r) or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if signed is None:
            continue
        theirs = reader.blob(entry, signed["record"]["cid"])
        model = None if theirs is None else reader.decode(theirs)
        if theirs is None or model is None:
            continue
        log.warning("cheating (copy%s): round %d is %s's model", "-noise" if noise else "", r, entry.worker)
        if not noise:
            return model, theirs
        gen = torch.Generator().manual_seed(r)
        eps = torch.randn(model.shape, generator=gen)  # (d,)
        eps *= 0.0005 * float((model - local).norm()) / float(eps.norm())
        noisy = model + eps
        return noisy, encode(noisy)
    return local, blob
