"""A gossip job on the worker: train from its own model, publish it, mix with the neighbours'.

Each round ``r`` (the worker's own clock; see :class:`GossipLoop`):

1. train ``local_steps`` from its own model; its model after them is ``local`` (an attacker,
   ``--attack``, publishes ``start - crafted`` instead, as in the simulator);
2. encode ``local`` with the run's codec (a value codec: whole models), keep the blob and
   serve it by CID on its peer server (``--listen``); a worker that cannot be reached
   uploads it to the coordinator instead;
3. sign a record of it (:mod:`aitbc.ledger.records`), write it to its log on disk (a
   restarted worker serves its records again and resumes past the last: it never signs a
   round twice), serve the record (``GET /v1/records/{job}``); a worker without a server
   queues it for the coordinator now (a publisher thread sends the queue in order,
   retrying through an outage, so training never waits for the coordinator and a
   restarted coordinator gets the backlog);
4. for each neighbour of the round's topology draw (:class:`aitbc.core.gossip.RoundNeighbours`,
   the simulator's draw): fetch its record (its peer server, else the coordinator), check
   the signature against the roster's key and that it is this run's and that job's, wait
   up to ``wait`` seconds for its round ``r`` (else take its newest if at most
   ``max_staleness`` rounds old, weighted by the run's staleness rule at its age:
   :func:`aitbc.core.gossip.mix_weight`, else nothing), fetch the model by CID (its
   server, else the coordinator; bytes that do not hash to the CID it signed are reported
   and dropped), decode and check it;
5. mix: the run's norm bound and robust rule over its own and the neighbours' models
   (:func:`aitbc.core.gossip.robust_combine`, the simulator's code); that is its next model;
6. queue the neighbours' records it mixed (``POST /v1/records/witnessed``: the coordinator
   flags a neighbour that signed another record of the round, equivocation), then, with a
   server, its own record: the round cannot close on every record before its neighbours'
   records are compared.

A worker beside a slower neighbour does not wait past ``wait``, nor once that neighbour's
own pace says it cannot publish the round within it (its peer server tells where its
training is, :data:`aitbc.worker.peers.PACE_HEADER`: at its seconds a step so far, the
steps it has left, from :data:`PACE_MIN_STEPS` steps into a round), and not at all once that
neighbour was behind at its last look (it takes its newest model, within max_staleness); a
slow worker that finds its neighbours ahead jumps its clock to theirs (the rounds it skipped
have no record of it): it mixes the newest model of a neighbour whose pace puts it two or
more rounds past the record it served, not that old one. The pace is advisory and
unsigned: a neighbour that lies about it can only make others wait up to ``wait`` (as
without it) or leave its own model out. The worker also reports its progress to the
coordinator, signed (round, step, its own seconds into the round), from a round's first
and :data:`PACE_MIN_STEPS`-th step: the coordinator's record of a round does not wait
for the deadline for a worker whose own pace puts it past twice the deadline
(:func:`aitbc.coordinator.rounds.gossip.cannot_make_it`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from torch import Tensor

from aitbc.client import ApiError, Unreachable
from aitbc.core.aggregation import parse_aggregator
from aitbc.core.gossip import PACE_MIN_STEPS, RoundNeighbours, distinct, mix_weight, model_bytes, robust_combine
from aitbc.core.norms import NormBound
from aitbc.core.options import parse_spec
from aitbc.core.staleness import build_staleness
from aitbc.errors import AitbcError
from aitbc.ledger.wallet import Wallet
from aitbc.replies.base import JsonObject
from aitbc.replies.gossip import GossipOrder, RosterEntry
from aitbc.replies.jobs import JobOrder
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.checkpoint import flat_params, load_checkpoint_file
from aitbc.training.local import LocalResult
from aitbc.worker.calls import CoordinatorCalls
from aitbc.worker.cheats import copy_neighbour
from aitbc.worker.config import WorkerSettings
from aitbc.worker.fetcher import ModelFetcher
from aitbc.worker.gossip_peers import NeighbourReader
from aitbc.worker.gossip_publish import Outgoing, PublishedRecords, Publisher
from aitbc.worker.metrics import WorkerMetrics
from aitbc.worker.progress import Reporter, progress_body
from aitbc.worker.records import JobState
from aitbc.worker.round_training import RoundTrainer

log = logging.getLogger("aitbc.worker.gossip")

DEFAULT_WAIT = 5.0  # seconds to wait for a neighbour's model of the round when the run sets no deadline
ROSTER_EVERY = 1.0  # seconds at least between two reads of the job view for a new roster
ROSTER_PERIOD = 5.0  # seconds at most between two reads, whether or not every neighbour answered


def _order(job: JobOrder) -> GossipOrder:
    """The gossip part of a gossip job's view (a gossip run's views always carry it)."""
    if job.gossip is None:
        raise AitbcError(f"job {job.job_id}: a gossip job's view without its roster")
    return job.gossip


@dataclass(frozen=True, slots=True)
class GossipParts:
    """The worker's parts a gossip job uses."""

    cfg: WorkerSettings
    calls: CoordinatorCalls
    fetcher: ModelFetcher
    trainer: RoundTrainer  # what it publishes for its trained model (``--attack``)
    metrics: WorkerMetrics
    reporter: Reporter
    wallet: Wallet
    stop: threading.Event
    home: Path
    published: PublishedRecords  # its own signed records, served by its peer server


@dataclass(frozen=True, slots=True)
class RoundClock:
    """Where this worker's training of its gossip job is, for :meth:`GossipLoop.pace`."""

    round: int = 0
    step: int = 0  # steps done
    began: float = 0.0  # when its training began (monotonic)
    ended: float | None = None  # when it ended, once it has


@dataclass(slots=True)
class Mix:
    """The models one round mixes: its own first, then its neighbours'."""

    received: list[Tensor]  # (d,) each
    weights: list[float]
    owners: list[str]
    ahead: int  # the newest round among them
    stale: int = 0  # neighbours' models of an older round
    witnessed: list[JsonObject] = field(default_factory=list)  # the neighbours' records it mixed


class GossipLoop:
    """One gossip job's rounds on this worker (see the module's docstring)."""

    def __init__(self, job: JobOrder, state: JobState, parts: GossipParts) -> None:
        self.parts = p = parts
        self.job_id, self.training_id = job.job_id, job.training_id
        self.address = p.wallet.address
        g = _order(job)
        self.rounds = int(job.rounds or 1)
        self.roster: list[RosterEntry] = g.roster
        self.me = next(i for i, e in enumerate(self.roster) if e.worker == self.address)
        self.neighbours = RoundNeighbours(str(g.topology), len(self.roster), int(g.seed))
        self.aggregator = parse_aggregator(g.aggregator, default_f=int(g.f))
        self.bound = NormBound(clip=float(g.norm_clip), reject=float(g.norm_reject))
        # a neighbour's model of an older round counts this rule's weight (an older coordinator: 1)
        self.staleness = build_staleness(*parse_spec(g.staleness or "constant", what="staleness rule"))
        d = int(job.d or 0)
        if p.fetcher.server is not None and p.cfg.cheat in ("trickle", "endless"):  # testing: a bad peer server
            p.fetcher.server.misbehave = p.cfg.cheat
        self.state = state
        self.samples = int(state.trainer.x.shape[0])
        self.next = int(g.next_round)
        # the latest consensus the coordinator recorded (round 0: the initial model)
        load_checkpoint_file(state.trainer.model, p.fetcher.global_model(str(job.global_model_cid), []))
        self.params: Tensor = flat_params(state.trainer.model).cpu()  # (d,) this worker's own model
        self.reader = NeighbourReader(
            p.calls,
            p.fetcher.peers,
            p.metrics,
            stop=p.stop,
            report=p.fetcher.report,
            incoming=LocalBlobStore(p.home / "worker-gossip-in" / p.wallet.name, durable=False),
            training_id=self.training_id,
            rounds=self.rounds,
            d=d,
            model_size=model_bytes(str(job.compression), d),
            wait=float(g.wait or DEFAULT_WAIT),
            max_staleness=int(g.max_staleness),
        )
        self.publisher = Publisher(
            p.calls,
            p.fetcher,
            p.wallet,
            p.published,
            job_id=self.job_id,
            training_id=self.training_id,
            samples=self.samples,
            signed_log=p.home / "worker-gossip-records" / p.wallet.name / f"{self.job_id}.jsonl",
            serving=p.fetcher.server is not None,
        )
        restored = self.publisher.restore(published=self.next - 1)
        if restored:
            self.next = max(self.next, restored[-1] + 1)
            log.info("job %s: %d signed records restored; next round %d", self.job_id, len(restored), self.next)
        self.publisher.start()
        self.roster_read = time.monotonic()
        self.steps = int(state.trainer.cfg.steps)
        self._clock = RoundClock()
        self._reported = -math.inf  # when it last reported progress (monotonic)

    @property
    def ended(self) -> bool:
        """The coordinator said the job or run is over."""
        return self.publisher.ended

    def close(self) -> None:
        """No more rounds: the publisher sends what is queued, then stops."""
        self.publisher.close()

    def refresh(self, job: JobOrder) -> None:
        """A newer job view: the roster may have changed. A worker replaced (a new URL, key)
        keeps the positions: same size, same draws. A worker gone for good (ejected, its
        shard not taken over) or one more (a split) changes the size: the topology's draws
        are made again over the new positions (the same seed: every worker that reads this
        roster gets the same neighbours), so nobody keeps mixing a worker the run let go."""
        g = _order(job)
        roster = g.roster
        me = next((i for i, e in enumerate(roster) if e.worker == self.address), None)
        if me is None:
            return  # not in it: its own job ended (the job view will say so)
        if len(roster) != len(self.roster):
            try:
                neighbours = RoundNeighbours(str(g.topology), len(roster), int(g.seed))
            except AitbcError as e:  # too few left for the topology: keep the old draws
                log.warning("roster of %d workers kept: %s", len(self.roster), e)
                return
            log.info("roster changed: %d -> %d workers; neighbours drawn again", len(self.roster), len(roster))
            self.neighbours = neighbours
        self.roster, self.me = roster, me
        self.next = max(self.next, int(g.next_round))

    # --- the rounds -----------------------------------------------------------------------

    def run(self) -> None:
        while self.next <= self.rounds and not self.parts.stop.is_set() and not self.ended:
            self._reread_roster()
            self._round(self.next)

    def _round(self, r: int) -> None:
        p = self.parts
        t0 = time.perf_counter()
        self._clock = RoundClock(r, 0, time.monotonic(), None)
        res = self.state.trainer.train_round(self.params, round=r, on_step=self._step)
        self._clock = replace(self._clock, ended=time.monotonic())
        local = self.params - p.trainer.sent_update(res.delta)  # (d,) the model it publishes
        blob = self.state.codec.encode(local)
        if p.cfg.cheat in ("copy", "copy-noise"):  # testing: publish a neighbour's model as its own
            entries = [self.roster[j] for j in self.neighbours.of(r, self.me)]
            local, blob = copy_neighbour(
                self.reader, entries, r, local, blob, noise=p.cfg.cheat == "copy-noise", encode=self.state.codec.encode
            )
        published = self._publish_own(r, local, blob, res)
        own = self.reader.decode(blob)  # what its neighbours receive (a lossy codec: the same rounding)
        mix = self._gather(r, own if own is not None else local)
        # a worker with a server: the records it mixed go first, then its own (the round cannot
        # close on every record before they are compared); without one: only the records now
        self.publisher.put(Outgoing(r, None, published if p.fetcher.server is not None else None, mix.witnessed))
        self.params = self._combine(r, mix)
        p.metrics.rounds.inc()
        log.info(
            "gossip round %d/%d of %s: loss %.4f, mixed %d models (%d stale), %.2f s",
            r,
            self.rounds,
            self.training_id,
            res.loss,
            len(mix.received),
            mix.stale,
            time.perf_counter() - t0,
        )
        self.next = max(r + 1, mix.ahead)  # behind its neighbours: catch up to their clock

    def _publish_own(self, r: int, local: Tensor, blob: bytes, res: LocalResult) -> JsonObject:
        """Keep and serve its model of round ``r`` and its signed record: the record it
        publishes (a worker without a server queues both for the coordinator now)."""
        p = self.parts
        cid = cid_of_bytes(blob)
        p.fetcher.keep_published(cid, blob)
        signed = self.publisher.sign(r, cid, res.loss)
        self.publisher.keep_signed(signed)  # on disk before anyone can see it: a restart never signs round r again
        published, published_blob = signed, blob
        if p.cfg.cheat == "equivocate":  # testing: publish another model than the one it serves
            published_blob = self.state.codec.encode(local + 1e-3)
            p.fetcher.keep_published(cid_of_bytes(published_blob), published_blob)
            published = self.publisher.sign(r, cid_of_bytes(published_blob), res.loss)
        if p.fetcher.server is None:  # its neighbours read its record and model at the coordinator: send them now
            self.publisher.put(Outgoing(r, published_blob, published))
        return published

    def _gather(self, r: int, own: Tensor) -> Mix:
        """Its own model of round ``r`` and its neighbours' (each weighted by its samples and
        the staleness rule at its age)."""
        mix = Mix([own], [float(self.samples)], [self.address], ahead=r)
        for j in self.neighbours.of(r, self.me):
            if self.roster[j].worker in self.publisher.distrusted:
                continue
            got = self.reader.model_of(self.roster[j], r)
            if got is None:
                continue
            weight = mix_weight(float(got.samples), max(0, r - got.round), self.staleness, self.reader.max_staleness)
            if weight is None:  # (model_of left out those past max_staleness)
                continue
            mix.received.append(got.model)
            mix.weights.append(weight)
            mix.owners.append(self.roster[j].worker)
            mix.ahead = max(mix.ahead, got.round)
            mix.stale += got.round < r
            mix.witnessed.append(got.signed)
        return mix

    def _combine(self, r: int, mix: Mix) -> Tensor:
        """Its next model: the run's norm bound and robust rule over the models mixed."""
        received, weights = mix.received, mix.weights
        # a neighbour's copy of its own model, or of another neighbour's, counts once
        keep = distinct(received, mix.owners)
        if len(keep) < len(received):
            log.warning("round %d: %d copied model(s) left out of the mix", r, len(received) - len(keep))
            received, weights = [received[k] for k in keep], [weights[k] for k in keep]
        mixed = robust_combine(
            received, weights, aggregator=self.aggregator, norm_bound=self.bound, round_index=r
        ).result
        return mixed if mixed is not None else received[0]

    def _reread_roster(self) -> None:
        """A neighbour's server did not answer: it may have restarted elsewhere (a new URL),
        or announced one to a restarted coordinator. Read the job view again (at most every
        ROSTER_EVERY seconds), and every ROSTER_PERIOD seconds anyway (a worker ejected
        while its server still answers); the coordinator unreachable: go on with the roster
        it has."""
        since = time.monotonic() - self.roster_read
        if since < ROSTER_EVERY or (not self.reader.unreached and since < ROSTER_PERIOD):
            return
        self.reader.unreached, self.roster_read = False, time.monotonic()
        try:
            view = self.parts.calls.job_view()
        except (ApiError, Unreachable) as e:
            log.debug("roster not re-read: %s", e)
            return
        job = view.job
        if job and job.job_id == self.job_id and job.gossip:
            self.refresh(job)

    def _step(self, step: int, loss: float) -> None:
        p = self.parts
        if p.cfg.step_delay:
            time.sleep(p.cfg.step_delay)
        p.metrics.steps.inc()
        self._clock = replace(self._clock, step=step, ended=None)
        r, began = self._clock.round, self._clock.began
        # Progress to the coordinator (its own thread: training never waits): the round's
        # first step and its PACE_MIN_STEPS-th (its pace, early enough for the coordinator
        # to close its record of a round this worker cannot publish before the deadline),
        # then as a sync worker reports.
        now = time.monotonic()
        every = max(1, min(p.cfg.progress_every, self.steps // 4 or 1))
        if step in (1, min(PACE_MIN_STEPS, self.steps)) or (
            step % every == 0 and step < self.steps and now - self._reported >= p.cfg.progress_seconds
        ):
            self._reported = now
            body = progress_body(r, 100.0 * step / self.steps, loss, self.state.epoch, "training", step=step)
            body["seconds"] = round(time.monotonic() - began, 4)  # its own clock: the coordinator judges its pace
            p.reporter.report(self.job_id, body)

    def pace(self) -> str | None:
        """Where this worker's training is (its peer server's ``X-Aitbc-Pace``), or None
        before its first round: ``round=R; step=S; steps=N; seconds=T``, T the seconds from
        the start of round R's training to now (to its end, once it ended)."""
        c = self._clock
        if c.round == 0:
            return None
        return (
            f"round={c.round}; step={c.step}; steps={self.steps}; seconds={(c.ended or time.monotonic()) - c.began:.3f}"
        )
