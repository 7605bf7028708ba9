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

import json
import logging
import math
import os
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import torch
from torch import Tensor

from aitbc.client import ApiError, Unreachable
from aitbc.core.aggregation import parse_aggregator
from aitbc.core.compression import decode as decode_model
from aitbc.core.gossip import PACE_MIN_STEPS, RoundNeighbours, distinct, mix_weight, model_bytes, robust_combine
from aitbc.core.norms import NormBound
from aitbc.core.options import parse_spec
from aitbc.core.staleness import build_staleness
from aitbc.errors import AitbcError, IntegrityError
from aitbc.ledger.records import make_record, record_problem
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.cid import cid_of_bytes
from aitbc.storage.peer_fetch import TooLong, TooSlow, bounded_get
from aitbc.training.checkpoint import flat_params, load_checkpoint_file
from aitbc.worker.cheats import copy_neighbour
from aitbc.worker.peers import PACE_HEADER, PeerUnavailable

if TYPE_CHECKING:
    from aitbc.worker.daemon import JobState, Worker

log = logging.getLogger("aitbc.worker.gossip")

Outgoing = tuple[int, bytes | None, dict[str, Any] | None, list[dict[str, Any]]]
KEEP = 32  # rounds of its own models and records a worker keeps (the coordinator may fetch late)
DEFAULT_WAIT = 5.0  # seconds to wait for a neighbour's model of the round when the run sets no deadline
POLL = 0.1  # seconds between asks for a neighbour's record
ROSTER_EVERY = 1.0  # seconds at least between two reads of the job view for a new roster
ROSTER_PERIOD = 5.0  # seconds at most between two reads, whether or not every neighbour answered
RECORD_SECONDS = 3.0  # seconds one read of a neighbour's record may take in all, however slowly it sends
MAX_RECORD_BYTES = 64 << 10  # a signed record is a few hundred bytes; a longer answer is refused
CLAIM_SECONDS = 5.0  # seconds its own record's claim may take before it is served anyway


class GossipLoop:
    """One gossip job's rounds on this worker (see the module's docstring)."""

    def __init__(self, worker: Worker, job: dict[str, Any], state: JobState) -> None:
        self.w, self.job_id, self.training_id = worker, job["job_id"], job["training_id"]
        g = job["gossip"]
        self.rounds = int(job["rounds"])
        self.roster: list[dict[str, Any]] = g["roster"]
        self.me = next(i for i, e in enumerate(self.roster) if e["worker"] == worker.wallet.address)
        self.neighbours = RoundNeighbours(g["topology"], len(self.roster), int(g["seed"]))
        self.aggregator = parse_aggregator(g["aggregator"], default_f=int(g["f"]))
        self.bound = NormBound(clip=float(g["norm_clip"]), reject=float(g["norm_reject"]))
        self.max_staleness = int(g["max_staleness"])
        # a neighbour's model of an older round counts this rule's weight (an older coordinator: 1)
        self.staleness = build_staleness(*parse_spec(g.get("staleness") or "constant", what="staleness rule"))
        self.wait = float(g["wait"] or DEFAULT_WAIT)
        self.d = int(job["d"])
        # its neighbours' models' exact size: a peer that sends more is refused at the byte past it
        self.model_size = model_bytes(str(job["compression"]), self.d)
        if worker.server is not None and worker.cfg.cheat in ("trickle", "endless"):  # testing: a bad peer server
            worker.server.misbehave = worker.cfg.cheat
        self.state = state
        self.samples = int(state.trainer.x.shape[0])
        self.next = int(g["next_round"])
        # the latest consensus the coordinator recorded (round 0: the initial model)
        load_checkpoint_file(state.trainer.model, worker._global_model(job["global_model_cid"], []))
        self.params: Tensor = flat_params(state.trainer.model).cpu()  # (d,) this worker's own model
        self.incoming = LocalBlobStore(worker.home / "worker-gossip-in" / worker.wallet.name, durable=False)
        # (round, a blob to upload first, its own record, the neighbours' records it mixed)
        self.outbox: queue.Queue[Outgoing | None] = queue.Queue()
        self.signed_log = worker.home / "worker-gossip-records" / worker.wallet.name / f"{self.job_id}.jsonl"
        self._restore(published=self.next - 1)
        self.publisher = threading.Thread(target=self._publish_all, name="gossip-publisher", daemon=True)
        self.publisher.start()
        self.ended = False  # the coordinator said the job or run is over
        self.lagging: dict[str, bool] = {}  # neighbours behind this worker at their last look
        # neighbours the coordinator found signing two records of a round (equivocation): never
        # mixed again, even before their ejection reaches the roster
        self.distrusted: set[str] = set()
        self.unreached = False  # a neighbour's server did not answer (or it named none) this round
        self.roster_read = time.monotonic()
        self.steps = int(state.trainer.cfg.steps)
        # (round, steps done, when its training began, when it ended or None), for pace()
        self._pace: tuple[int, int, float, float | None] = (0, 0, 0.0, None)
        self._reported = -math.inf  # when it last reported progress (monotonic)

    def refresh(self, job: dict[str, Any]) -> None:
        """A newer job view: the roster may have changed. A worker replaced (a new URL, key)
        keeps the positions: same size, same draws. A worker gone for good (ejected, its
        shard not taken over) or one more (a split) changes the size: the topology's draws
        are made again over the new positions (the same seed: every worker that reads this
        roster gets the same neighbours), so nobody keeps mixing a worker the run let go."""
        g = job["gossip"]
        roster = g["roster"]
        me = next((i for i, e in enumerate(roster) if e["worker"] == self.w.wallet.address), None)
        if me is None:
            return  # not in it: its own job ended (the job view will say so)
        if len(roster) != len(self.roster):
            try:
                neighbours = RoundNeighbours(g["topology"], len(roster), int(g["seed"]))
            except AitbcError as e:  # too few left for the topology: keep the old draws
                log.warning("roster of %d workers kept: %s", len(self.roster), e)
                return
            log.info("roster changed: %d -> %d workers; neighbours drawn again", len(self.roster), len(roster))
            self.neighbours = neighbours
        self.roster, self.me = roster, me
        self.next = max(self.next, int(g["next_round"]))

    # --- the rounds -----------------------------------------------------------------------

    def run(self) -> None:
        w = self.w
        while self.next <= self.rounds and not w.stop.is_set() and not self.ended:
            self._reread_roster()
            r = self.next
            t0 = time.perf_counter()
            self._pace = (r, 0, time.monotonic(), None)
            res = self.state.trainer.train_round(self.params, round=r, on_step=self._step)
            self._pace = (r, self._pace[1], self._pace[2], time.monotonic())
            delta = res.delta if w.attack is None else w._craft(res.delta)
            local = self.params - delta  # (d,) the model it publishes
            blob = self.state.codec.encode(local)
            if w.cfg.cheat in ("copy", "copy-noise"):  # testing: publish a neighbour's model as its own
                local, blob = copy_neighbour(self, r, local, blob, noise=w.cfg.cheat == "copy-noise")
            cid = cid_of_bytes(blob)
            w.gossip_keep(cid, blob)
            signed = self._sign(r, cid, res.loss)
            self._keep_signed(signed)  # on disk before anyone can see it: a restart never signs round r again
            published, published_blob = signed, blob
            if w.cfg.cheat == "equivocate":  # testing: publish another model than the one it serves
                published_blob = self.state.codec.encode(local + 1e-3)
                w.gossip_keep(cid_of_bytes(published_blob), published_blob)
                published = self._sign(r, cid_of_bytes(published_blob), res.loss)
            if w.server is None:  # its neighbours read its record and model at the coordinator: send them now
                self.outbox.put((r, published_blob, published, []))
            own = self.decode(blob)  # what its neighbours receive (a lossy codec: the same rounding)
            received, weights = [own if own is not None else local], [float(self.samples)]
            owners = [w.wallet.address]
            ahead, stale = r, 0
            witnessed: list[dict[str, Any]] = []  # the neighbours' records it mixed: the coordinator compares
            for j in self.neighbours.of(r, self.me):
                if self.roster[j]["worker"] in self.distrusted:
                    continue
                got = self._neighbour(self.roster[j], r)
                if got is not None:
                    model, samples, their_round, their_record = got
                    weight = mix_weight(float(samples), max(0, r - their_round), self.staleness, self.max_staleness)
                    if weight is None:  # (_neighbour left out those past max_staleness)
                        continue
                    received.append(model)
                    weights.append(weight)
                    owners.append(self.roster[j]["worker"])
                    ahead = max(ahead, their_round)
                    stale += their_round < r
                    witnessed.append(their_record)
            # a worker with a server: the records it mixed go first, then its own (the round cannot
            # close on every record before they are compared); without one: only the records now
            self.outbox.put((r, None, published if w.server is not None else None, witnessed))
            # a neighbour's copy of its own model, or of another neighbour's, counts once
            keep = distinct(received, owners)
            if len(keep) < len(received):
                log.warning("round %d: %d copied model(s) left out of the mix", r, len(received) - len(keep))
                received, weights = [received[k] for k in keep], [weights[k] for k in keep]
            mixed = robust_combine(
                received, weights, aggregator=self.aggregator, norm_bound=self.bound, round_index=r
            ).result
            self.params = mixed if mixed is not None else received[0]
            w.metrics.rounds.inc()
            log.info(
                "gossip round %d/%d of %s: loss %.4f, mixed %d models (%d stale), %.2f s",
                r,
                self.rounds,
                self.training_id,
                res.loss,
                len(received),
                stale,
                time.perf_counter() - t0,
            )
            self.next = max(r + 1, ahead)  # behind its neighbours: catch up to their clock

    def _reread_roster(self) -> None:
        """A neighbour's server did not answer: it may have restarted elsewhere (a new URL),
        or announced one to a restarted coordinator. Read the job view again (at most every
        ROSTER_EVERY seconds), and every ROSTER_PERIOD seconds anyway (a worker ejected
        while its server still answers); the coordinator unreachable: go on with the roster
        it has."""
        since = time.monotonic() - self.roster_read
        if since < ROSTER_EVERY or (not self.unreached and since < ROSTER_PERIOD):
            return
        self.unreached, self.roster_read = False, time.monotonic()
        try:
            view = self.w.client.get(f"/workers/{self.w.wallet.address}/job", sign=True)
        except (ApiError, Unreachable) as e:
            log.debug("roster not re-read: %s", e)
            return
        job = view.get("job")
        if job and job.get("job_id") == self.job_id and job.get("gossip"):
            self.refresh(job)

    def _step(self, step: int, loss: float) -> None:
        w = self.w
        if w.cfg.step_delay:
            time.sleep(w.cfg.step_delay)
        w.metrics.steps.inc()
        r, _, began, _ = self._pace
        self._pace = (r, step, began, None)
        # Progress to the coordinator (its own thread: training never waits): the round's
        # first step and its PACE_MIN_STEPS-th (its pace, early enough for the coordinator
        # to close its record of a round this worker cannot publish before the deadline),
        # then as a sync worker reports.
        now = time.monotonic()
        every = max(1, min(w.cfg.progress_every, self.steps // 4 or 1))
        if step in (1, min(PACE_MIN_STEPS, self.steps)) or (
            step % every == 0 and step < self.steps and now - self._reported >= w.cfg.progress_seconds
        ):
            self._reported = now
            body = w._progress_body(
                {"round": r}, 100.0 * step / self.steps, loss, w._epoch(self.state), "training", step=step
            )
            body["seconds"] = round(time.monotonic() - began, 4)  # its own clock: the coordinator judges its pace
            w.reporter.report(self.job_id, body)

    def pace(self) -> str | None:
        """Where this worker's training is (its peer server's ``X-Aitbc-Pace``), or None
        before its first round: ``round=R; step=S; steps=N; seconds=T``, T the seconds from
        the start of round R's training to now (to its end, once it ended)."""
        r, step, began, ended = self._pace
        if r == 0:
            return None
        return f"round={r}; step={step}; steps={self.steps}; seconds={(ended or time.monotonic()) - began:.3f}"

    def decode(self, blob: bytes) -> Tensor | None:
        try:
            m = decode_model(blob, max_numel=self.d)
        except (IntegrityError, ValueError):
            return None
        if m.shape != (self.d,) or not torch.isfinite(m).all():
            return None
        return m.to(torch.float32)

    # --- neighbours -----------------------------------------------------------------------

    def _neighbour(self, entry: dict[str, Any], r: int) -> tuple[Tensor, int, int, dict[str, Any]] | None:
        """Neighbour ``entry``'s model of round ``r`` (or its newest within max_staleness):
        (model, its samples, its round, its signed record), or None."""
        # a neighbour that was a round or more behind last time is slow: its newest is taken
        # at once (within max_staleness), not waited for every round
        deadline = time.monotonic() + (0.0 if self.lagging.get(entry["worker"]) else self.wait)
        best: dict[str, Any] | None = None
        pace: tuple[int, int, int, float] | None = None
        while not self.w.stop.is_set():
            signed, pace = self._record(entry, r)
            if signed is not None and (best is None or signed["record"]["round"] >= best["record"]["round"]):
                best = signed
            if (best is not None and best["record"]["round"] >= r) or time.monotonic() >= deadline:
                break
            eta = None if pace is None else eta_of(pace, r)
            if pace is not None and eta is not None and time.monotonic() + eta > deadline:  # cannot make it
                log.info(
                    "neighbour %s is at round %d, step %d of %d: about %.2f s from round %d, past the wait",
                    entry["worker"],
                    pace[0],
                    pace[1],
                    pace[2],
                    eta,
                    r,
                )
                break
            time.sleep(POLL)
        if best is not None and pace is not None and pace[0] >= best["record"]["round"] + 2:
            # it is rounds ahead of the record it served (this worker is the slow one): its
            # newest model, not its old one of round r (mixing that would leave this worker
            # as far behind, and its neighbours would mix its model back)
            newest, _ = self._record(entry, None)
            if newest is not None and newest["record"]["round"] > best["record"]["round"]:
                best = newest
        self.lagging[entry["worker"]] = best is None or best["record"]["round"] < r
        if best is None:
            log.info("no record from neighbour %s for round %d", entry["worker"], r)
            return None
        rec = best["record"]
        if r - rec["round"] > self.max_staleness:
            log.info(
                "neighbour %s is at round %d, more than %d behind %d: not mixed",
                entry["worker"],
                rec["round"],
                self.max_staleness,
                r,
            )
            return None
        model = self._model(entry, rec["cid"])
        if model is None:
            return None
        return model, int(rec["samples"]), int(rec["round"]), best

    def _record(
        self, entry: dict[str, Any], r: int | None
    ) -> tuple[dict[str, Any] | None, tuple[int, int, int, float] | None]:
        """Its signed record of round ``r`` (else, or with ``r`` None, its newest), checked,
        from its server, else the coordinator (or None); and its pace as its server told it
        (or None)."""
        signed = pace = None
        params = {} if r is None else {"round": r}
        if entry.get("url"):
            body = bytearray()
            try:
                reply = bounded_get(
                    self.w.fetcher.http,
                    f"{entry['url']}/v1/records/{entry['job_id']}",
                    params=params,
                    seconds=RECORD_SECONDS,
                    max_bytes=MAX_RECORD_BYTES,
                    take=body.extend,
                )
                pace = parse_pace(reply.headers.get(PACE_HEADER), self.rounds)
                if reply.status == 200:
                    signed = json.loads(body)
            except (httpx.HTTPError, ValueError, TooSlow, TooLong) as e:
                log.debug("record from %s: %s", entry["url"], e)
        if signed is None:
            self.unreached = True
            try:
                signed = self.w.client.get(f"/jobs/{entry['job_id']}/records", params=params)
            except (ApiError, Unreachable) as e:
                log.debug("record of %s from the coordinator: %s", entry["job_id"], e)
                return None, pace
        problem = record_problem(signed, entry["public_key"])
        if problem is None:
            rec = signed["record"]
            if rec["training_id"] != self.training_id or rec["job_id"] != entry["job_id"]:
                problem = f"a record for run {rec['training_id']!r}, job {rec['job_id']!r}"
            elif not isinstance(rec["round"], int) or not 1 <= rec["round"] <= self.rounds:
                problem = f"a record of round {rec['round']!r}"
        if problem is not None:
            log.warning("neighbour %s: record refused: %s", entry["worker"], problem)
            return None, pace
        return signed, pace

    def _model(self, entry: dict[str, Any], cid: str) -> Tensor | None:
        """The model ``cid`` from the neighbour's server (CID-checked, at most its known
        size, within the fetcher's deadline; a mismatch is reported), else the
        coordinator's copy."""
        blob = self.blob(entry, cid)
        return None if blob is None else self.decode(blob)

    def blob(self, entry: dict[str, Any], cid: str) -> bytes | None:
        """The bytes of :meth:`_model`."""
        w = self.w
        path: Path | None = None
        if entry.get("url"):
            try:
                size = w.fetcher.download(entry["url"], cid, self.incoming, max_bytes=self.model_size)
                w.metrics.bytes.labels("peer").inc(size)
                path = self.incoming.dir / cid
            except PeerUnavailable as e:
                log.info("%s; the coordinator's copy", e)
            except IntegrityError as e:
                log.warning("%s; reported", e)
                w._report(cid, entry["worker"])
                return None
            except AitbcError as e:
                log.warning("neighbour %s: %s", entry["worker"], e)
                return None
        if path is None:
            try:
                w.client.download_blob(cid, self.incoming)
                path = self.incoming.dir / cid
            except (ApiError, Unreachable, IntegrityError) as e:
                log.info("model %s of %s not fetched: %s", cid, entry["worker"], e)
                return None
        try:
            return path.read_bytes()
        finally:
            path.unlink(missing_ok=True)

    # --- the record -------------------------------------------------------------------------

    def close(self) -> None:
        """No more rounds: the publisher sends what is queued, then stops."""
        self.outbox.put(None)

    def _publish_all(self) -> None:
        w = self.w
        while True:
            item = self.outbox.get()
            if item is None:
                return
            r, blob, signed, witnessed = item
            if witnessed:
                self._report_witnessed(r, witnessed)
            if signed is None:
                continue
            if blob is not None:  # cannot be reached: its neighbours and the coordinator read it there
                cid = signed["record"]["cid"]
                if w._retry(lambda cid=cid, blob=blob: w.client.put_blob(cid, blob)) is None:
                    return  # stopping
            try:
                reply = w._retry(lambda signed=signed: w.client.post(f"/jobs/{self.job_id}/records", signed))
                if reply is None:
                    return  # stopping
                log.debug("round %d recorded: %s", r, reply)
            except ApiError as e:
                if e.code in ("job_not_active", "run_ended"):
                    log.info("job %s over: %s", self.job_id, e.detail)
                    self.ended = True
                    return
                log.warning("record of round %d refused (%s): %s", r, e.code, e.detail)
            w._announce()

    def _report_witnessed(self, r: int, witnessed: list[dict[str, Any]]) -> None:
        """Send the neighbours' records it mixed in round ``r``: the coordinator flags a
        neighbour that signed another record of that round (equivocation)."""
        w = self.w
        try:
            reply = w._retry(lambda: w.client.post("/records/witnessed", {"records": witnessed}))
        except ApiError as e:
            log.warning("records witnessed in round %d refused (%s): %s", r, e.code, e.detail)
            return
        for v in (reply or {}).get("data", []):
            if v["verdict"] == "equivocation":
                self.distrusted.add(v["worker"])
                log.warning(
                    "neighbour %s signed two records of round %d: flagged; not mixed from now on",
                    v["worker"],
                    v["round"],
                )

    # --- its own signed records ---------------------------------------------------------------

    def _sign(self, r: int, cid: str, loss: float) -> dict[str, Any]:
        return make_record(
            self.w.wallet,
            training_id=self.training_id,
            job_id=self.job_id,
            round=r,
            cid=cid,
            samples=self.samples,
            train_loss=loss,
        )

    def _keep_signed(self, signed: dict[str, Any]) -> None:
        """Serve ``signed`` (the last KEEP rounds) after writing it to its log on disk and,
        with a server, claiming it (:meth:`_claim`)."""
        self.signed_log.parent.mkdir(parents=True, exist_ok=True)
        with self.signed_log.open("a") as f:
            f.write(json.dumps(signed, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.w.server is not None:
            self._claim(signed)
        r = int(signed["record"]["round"])
        records = self.w.gossip_records
        records[(self.job_id, r)] = signed
        for old in [k for k in records if k[0] == self.job_id and k[1] <= r - KEEP]:
            del records[old]

    def _claim(self, signed: dict[str, Any]) -> None:
        """Tell the coordinator of its own record before anyone can read it (its peer server
        serves it only after this): the coordinator then knows this worker signed the CID
        before any neighbour could copy it, so a copy of it signed by another is that
        one's, never this one's (``POST /v1/records/witnessed``; its own record is a report
        like any other: checked against its key, kept until it publishes the round). One
        try, at most :data:`CLAIM_SECONDS`: the coordinator down or slow, it serves anyway
        (training never waits for the coordinator; see the docs on copies in an outage)."""
        try:
            self.w.client.post("/records/witnessed", {"records": [signed]}, timeout=CLAIM_SECONDS)
        except (ApiError, Unreachable) as e:
            log.info("round %s not claimed before serving it: %s", signed["record"]["round"], e)

    def _restore(self, *, published: int) -> None:
        """A restarted worker: the records it signed for this job before (its log) are served
        again, those the coordinator has not recorded (rounds past ``published``) are queued
        for it, and its clock goes past the last one, so it never signs a round twice (two
        records of one round are equivocation, whatever the reason)."""
        if not self.signed_log.exists():
            return
        me = self.w.wallet.address
        kept: dict[int, dict[str, Any]] = {}
        for line in self.signed_log.read_text().splitlines():
            try:
                signed = json.loads(line)
                rec = signed["record"]
                if rec["job_id"] == self.job_id and rec["worker"] == me and isinstance(rec["round"], int):
                    kept.setdefault(rec["round"], signed)  # the first it signed of a round stands
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash
        for r in sorted(kept):
            self.w.gossip_records[(self.job_id, r)] = kept[r]
            if r > published:
                self.outbox.put((r, None, kept[r], []))
        if kept:
            self.next = max(self.next, max(kept) + 1)
            log.info("job %s: %d signed records restored; next round %d", self.job_id, len(kept), self.next)


# --- a neighbour's pace ---------------------------------------------------------------------


def parse_pace(text: str | None, rounds: int) -> tuple[int, int, int, float] | None:
    """A peer server's ``X-Aitbc-Pace`` (``round=R; step=S; steps=N; seconds=T``) as
    (R, S, N, T), or None when absent or not of that form (it is advisory: ignored)."""
    if not text or len(text) > 200:
        return None
    fields: dict[str, str] = {}
    for part in text.split(";"):
        key, sep, value = part.strip().partition("=")
        if not sep or key in fields:
            return None
        fields[key] = value
    if set(fields) != {"round", "step", "steps", "seconds"}:
        return None
    try:
        r, step, steps = int(fields["round"]), int(fields["step"]), int(fields["steps"])
        seconds = float(fields["seconds"])
    except ValueError:
        return None
    if not (1 <= r <= rounds and steps >= 1 and 0 <= step <= steps and math.isfinite(seconds) and seconds >= 0):
        return None
    return r, step, steps, seconds


def eta_of(pace: tuple[int, int, int, float], r: int) -> float | None:
    """Seconds until a neighbour at ``pace`` (:func:`parse_pace`) trains round ``r`` to its
    end, at its own seconds a step so far in its round: the steps left of its round and of
    every round up to ``r``; ``inf`` when it is past ``r`` (a worker that caught up skips
    rounds: no record of ``r`` will come); None when too early in its round to tell
    (fewer than :data:`PACE_MIN_STEPS` steps)."""
    at, step, steps, seconds = pace
    if at > r:
        return math.inf
    if step < min(PACE_MIN_STEPS, steps) or seconds <= 0:
        return None
    return ((r - at) * steps + steps - step) * seconds / step
