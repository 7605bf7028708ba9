"""Gossip: workers train from their own models and mix them with their topology neighbours'
peer to peer; a round is the coordinator's record of their published models, not a barrier.
It is due and closed by :mod:`..gossip_close` (the consensus, its outliers, the pay), its
records kept by :mod:`..gossip`. A worker keeps its own round clock: its job view names the
round it trains next, its roster and the mixing rule, and never the global model.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import conflict
from aitbc.coordinator.rounds import gossip, gossip_close
from aitbc.coordinator.rounds.jobs import reached
from aitbc.coordinator.rounds.modes.base import JobView, RoundMode, Turn
from aitbc.coordinator.schemas import Progress
from aitbc.coordinator.store.models import Job, Run
from aitbc.replies.jobs import Action
from aitbc.run_mode import RunMode
from aitbc.states import RunStatus


class GossipMode(RoundMode):
    kind = RunMode.GOSSIP

    def round_due(self, ctx: Context, s: Session, run: Run, *, now: float) -> bool:
        return gossip_close.round_due(ctx, s, run, now=now)

    def close_round(self, ctx: Context, run_id: str) -> None:
        gossip_close.close_round(ctx, run_id)

    def score(self, ctx: Context, run_id: str, r: int) -> None:
        """Judged when the round closed: a kept model is paid, the rest not."""
        gossip_close.score(ctx, run_id, r)

    def progress(self, run: Run, job: Job, body: Progress, *, now: float) -> bool:
        """A report on the worker's own clock (any round of the run: no round waits for the
        record), with its own seconds into the round (its pace, :func:`..gossip.note_pace`);
        a report of the record's open round may let that round close without it
        (:func:`..gossip.cannot_make_it`): the driver looks again."""
        if body.round is not None and body.round > run.cfg.rounds:
            raise conflict("wrong_round", f"progress for round {body.round}; run {run.id} has {run.cfg.rounds} rounds")
        if body.step is not None and body.round is not None:
            gossip.note_pace(run, job, body.round, body.step, body.seconds, now=now)
        elif body.round == run.round and body.step is not None:
            reached(run, job, body.round, body.step, now=now)
        return body.round == run.round

    def job_view(self, ctx: Context, s: Session, run: Run, job: Job, turn: Turn) -> JobView:
        """The worker's record follows its own clock: it trains its next round while the
        run is live; its view carries the roster and the mixing rule."""
        cfg = run.cfg
        nxt = gossip.next_round(s, job)
        live = run.status in (RunStatus.TRAINING, RunStatus.AGGREGATING)
        fields = {
            "gossip": {
                "topology": cfg.topology,
                "seed": run.seed,
                "aggregator": cfg.aggregator,
                "f": cfg.f,
                "next_round": nxt,
                "roster": gossip.roster(ctx, s, run),
                "norm_clip": ctx.settings.norm_clip,
                "norm_reject": ctx.settings.norm_reject,
                "max_staleness": cfg.max_staleness,
                "staleness": cfg.staleness,  # a neighbour's older model counts this rule's weight
                "wait": cfg.deadline,
            }
        }
        action: Action = "train" if live and nxt <= cfg.rounds else "wait"
        return JobView(Turn(action, None), deadline=cfg.deadline, serves_global_model=False, fields=fields)
