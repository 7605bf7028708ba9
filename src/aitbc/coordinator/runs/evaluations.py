"""Which round a run's validation numbers are of, and which evaluations are still to land.

A round's global model is scored on the validation split after the round closes (by the
driver's books, a moment later; every ``eval_every`` rounds and the last), so a run's
``val_loss`` may be an earlier round's, and a round just closed may have its evaluation
pending: a reader says which round a number is of, and waits for (or marks) the pending
ones instead of drawing across them.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from aitbc.coordinator.store.models import RoundRecord, Run
from aitbc.replies.results import RoundView


def latest_evaluated(s: Session, run: Run) -> int | None:
    """The round whose evaluation the run's ``val_loss`` is (0: the initial model); None before any."""
    return s.scalar(
        select(func.max(RoundRecord.round)).where(RoundRecord.run_id == run.id, RoundRecord.val_loss.is_not(None))
    )


def eval_pending(run: Run, rec: RoundRecord) -> bool:
    """Whether round ``rec``'s evaluation is due and not recorded yet."""
    return rec.round > 0 and rec.val_loss is None and run.configured and run.cfg.eval_due(rec.round)


def rounds_view(s: Session, run: Run) -> list[RoundView]:
    rows = s.scalars(select(RoundRecord).where(RoundRecord.run_id == run.id).order_by(RoundRecord.round)).all()
    return [
        RoundView(
            round=r.round,
            checkpoint_cid=r.checkpoint_cid,
            val_loss=r.val_loss,
            val_accuracy=r.val_accuracy,
            eval_pending=eval_pending(run, r),
            train_loss=r.train_loss,
            train_accuracy=r.train_accuracy,
            accepted=r.accepted,
            rejected=r.rejected,
            stragglers=r.stragglers,
            skipped=r.skipped,
            bytes_up=r.bytes_up,
            bytes_down=r.bytes_down,
            started_at=r.started_at,
            closed_at=r.closed_at,
        )
        for r in rows
    ]
