"""What a language model's run shows beside its loss: the tokens its model has been trained
on, and the perplexity of its validation loss.

*Tokens seen* counts what the accepted updates were trained on: each one's local steps x
batch size samples (its job's settings, :func:`~aitbc.coordinator.store.repository.job_settings`)
x the tokens of a sample (the data's context). *Perplexity* is exp(loss), the loss being the
mean cross-entropy per token in nats. Classification runs have neither (None).
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from aitbc.coordinator.store.models import Job, Run, Update
from aitbc.coordinator.store.repository import job_settings
from aitbc.states import UpdateStatus

# exp() of a larger loss overflows a float: no perplexity is shown for it
MAX_LOSS = 700.0


def context_of(run: Run) -> int | None:
    """Tokens per sample of a language run's data; None for classification or no data."""
    spec = (run.manifest or {}).get("spec") or {}
    if spec.get("task") != "language" or not spec.get("input_shape"):
        return None
    return int(spec["input_shape"][0])


def perplexity(run: Run, loss: float | None) -> float | None:
    """exp(``loss``) for a language run; None for a classifier, no loss or one past :data:`MAX_LOSS`."""
    if loss is None or context_of(run) is None or not math.isfinite(loss) or loss > MAX_LOSS:
        return None
    return math.exp(loss)


def tokens_seen(s: Session, run: Run) -> int | None:
    """Tokens the run's accepted updates were trained on; None for a classifier."""
    T = context_of(run)
    if T is None:
        return None
    accepted = dict(
        s.execute(
            select(Update.job_id, func.count())
            .where(Update.run_id == run.id, Update.status == UpdateStatus.ACCEPTED)
            .group_by(Update.job_id)
        ).all()
    )
    if not accepted:
        return 0
    total = 0
    for job in s.scalars(select(Job).where(Job.id.in_(list(accepted)))):
        cfg = job_settings(run, job)
        total += int(accepted[job.id]) * cfg["local_steps"] * cfg["batch_size"] * T
    return total


def result_fields(s: Session, run: Run) -> dict[str, Any]:
    """The results' language fields: ``tokens_seen`` and ``final_val_perplexity``."""
    return {"tokens_seen": tokens_seen(s, run), "final_val_perplexity": perplexity(run, run.val_loss)}


def detail_fields(s: Session, run: Run) -> dict[str, Any]:
    """The run detail's and the dashboard's: ``tokens_seen`` and ``val_perplexity``."""
    return {"tokens_seen": tokens_seen(s, run), "val_perplexity": perplexity(run, run.val_loss)}
