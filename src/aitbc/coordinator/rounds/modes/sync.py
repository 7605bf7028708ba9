"""Sync: every worker trains from the round's global model and the round waits for them all
(a barrier). It closes when every active job has answered, or at its deadline once the
quorum of accepted updates is met (the rest are stragglers). With ``overlap`` k an update may
start from one of the k models before its round's, and counts by ``overlap_staleness``.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.rounds.lifecycle import answers, past_deadline
from aitbc.coordinator.rounds.modes.base import CentralMode
from aitbc.coordinator.store.models import Run
from aitbc.coordinator.verification import scoring
from aitbc.coordinator.verification.spot_checks import pending_in_round
from aitbc.run_mode import RunMode


class SyncMode(CentralMode):
    kind = RunMode.SYNC

    def round_due(self, ctx: Context, s: Session, run: Run, *, now: float) -> bool:
        a = answers(s, run)
        if pending_in_round(s, run.id, run.round):
            return False  # a spot check is under way: its update must not be aggregated unjudged
        if a.everyone:
            return True  # nobody left to wait for (if none was accepted, the round is skipped)
        if past_deadline(run, now=now):
            return a.accepted >= run.cfg.quorum
        return False

    def score(self, ctx: Context, run_id: str, r: int) -> None:
        scoring.score(ctx, run_id, r)
