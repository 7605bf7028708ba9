"""The round driver's books thread's own copy of each live run's model.

The rounds thread aggregates and checkpoints with the runtime's model under the runtime's
lock (:mod:`.runtime`); the books thread evaluates and scores closed rounds, which on a
large model takes longer than a round. With a model of its own (one copy per live run,
made once) it never holds that lock for a forward pass, so a round's close never waits
for the previous round's scoring.
"""

from __future__ import annotations

import copy

from torch import nn

from aitbc.coordinator.context import Context
from aitbc.coordinator.runtime import RunRuntime


def books_model(ctx: Context, run_id: str, rt: RunRuntime) -> nn.Module:
    """Run ``run_id``'s model for the books thread (copied from ``rt``'s under its lock, once)."""
    model = ctx.books_models.get(run_id)
    if model is None:
        with rt.lock:
            model = ctx.books_models[run_id] = copy.deepcopy(rt.model)
    return model


def drop_books_model(ctx: Context, run_id: str) -> None:
    ctx.books_models.pop(run_id, None)
