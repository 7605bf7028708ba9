"""A gossip worker's neighbours, read: a neighbour's signed record of a round (its peer
server, else the coordinator), checked; its pace (:data:`aitbc.worker.peers.PACE_HEADER`);
and the model the record names, fetched by CID and decoded (see :mod:`aitbc.worker.gossip`
for when a worker waits for a neighbour and when it does not).

``d``: the model's parameter count; a model is ``(d,)``.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import httpx
import torch
from torch import Tensor

from aitbc.client import ApiError, Unreachable
from aitbc.core.compression import decode as decode_model
from aitbc.core.gossip import PACE_MIN_STEPS
from aitbc.errors import AitbcError, IntegrityError
from aitbc.ledger.records import record_problem
from aitbc.replies.base import JsonObject
from aitbc.replies.gossip import RosterEntry
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.peer_fetch import TooLong, TooSlow, bounded_get
from aitbc.worker.calls import CoordinatorCalls
from aitbc.worker.metrics import WorkerMetrics
from aitbc.worker.peers import PACE_HEADER, PeerFetcher, PeerUnavailable

log = logging.getLogger("aitbc.worker.gossip")

POLL = 0.1  # seconds between asks for a neighbour's record
RECORD_SECONDS = 3.0  # seconds one read of a neighbour's record may take in all, however slowly it sends
MAX_RECORD_BYTES = 64 << 10  # a signed record is a few hundred bytes; a longer answer is refused


class Pace(NamedTuple):
    """Where a neighbour's training is: step ``step`` of ``steps`` of round ``round``,
    ``seconds`` into that round's training."""

    round: int
    step: int
    steps: int
    seconds: float


class NeighbourModel(NamedTuple):
    """A neighbour's model to mix, with what weighs it and the record that names it."""

    model: Tensor  # (d,)
    samples: int
    round: int
    signed: JsonObject  # its signed record


class NeighbourReader:
    """Reads one gossip job's neighbours for this worker. ``wait``: seconds to wait for a
    neighbour's record of the round; ``max_staleness``: the oldest round mixed, in rounds
    behind; ``model_size``: a neighbour's model's exact size in bytes (a peer that sends
    more is refused at the byte past it); ``report(cid, worker)``: report a peer whose bytes
    do not hash to the CID it signed."""

    def __init__(
        self,
        calls: CoordinatorCalls,
        peers: PeerFetcher,
        metrics: WorkerMetrics,
        *,
        stop: threading.Event,
        report: Callable[[str, str], None],
        incoming: LocalBlobStore,
        training_id: str,
        rounds: int,
        d: int,
        model_size: int,
        wait: float,
        max_staleness: int,
    ) -> None:
        self.calls, self.peers, self.metrics, self.stop, self.report = calls, peers, metrics, stop, report
        self.incoming = incoming
        self.training_id, self.rounds, self.d, self.model_size = training_id, rounds, d, model_size
        self.wait, self.max_staleness = wait, max_staleness
        self.lagging: dict[str, bool] = {}  # neighbours behind this worker at their last look
        self.unreached = False  # a neighbour's server did not answer (or it named none) since reset

    def model_of(self, entry: RosterEntry, r: int) -> NeighbourModel | None:
        """Neighbour ``entry``'s model of round ``r`` (or its newest within max_staleness), or None."""
        # a neighbour that was a round or more behind last time is slow: its newest is taken
        # at once (within max_staleness), not waited for every round
        best, pace = self._wait_for_record(entry, r)
        if best is not None and pace is not None and pace.round >= best["record"]["round"] + 2:
            # it is rounds ahead of the record it served (this worker is the slow one): its
            # newest model, not its old one of round r (mixing that would leave this worker
            # as far behind, and its neighbours would mix its model back)
            newest, _ = self.record(entry, None)
            if newest is not None and newest["record"]["round"] > best["record"]["round"]:
                best = newest
        self.lagging[entry.worker] = best is None or best["record"]["round"] < r
        if best is None:
            log.info("no record from neighbour %s for round %d", entry.worker, r)
            return None
        rec = best["record"]
        if r - rec["round"] > self.max_staleness:
            log.info(
                "neighbour %s is at round %d, more than %d behind %d: not mixed",
                entry.worker,
                rec["round"],
                self.max_staleness,
                r,
            )
            return None
        blob = self.blob(entry, rec["cid"])
        model = None if blob is None else self.decode(blob)
        if model is None:
            return None
        return NeighbourModel(model, int(rec["samples"]), int(rec["round"]), best)

    def _wait_for_record(self, entry: RosterEntry, r: int) -> tuple[JsonObject | None, Pace | None]:
        """Its newest record up to round ``r``, asked for every POLL until it has round
        ``r``, the wait runs out, or its pace says it cannot make it; and its last pace."""
        deadline = time.monotonic() + (0.0 if self.lagging.get(entry.worker) else self.wait)
        best: JsonObject | None = None
        pace: Pace | None = None
        while not self.stop.is_set():
            signed, pace = self.record(entry, r)
            if signed is not None and (best is None or signed["record"]["round"] >= best["record"]["round"]):
                best = signed
            if (best is not None and best["record"]["round"] >= r) or time.monotonic() >= deadline:
                break
            eta = None if pace is None else eta_of(pace, r)
            if pace is not None and eta is not None and time.monotonic() + eta > deadline:  # cannot make it
                log.info(
                    "neighbour %s is at round %d, step %d of %d: about %.2f s from round %d, past the wait",
                    entry.worker,
                    pace.round,
                    pace.step,
                    pace.steps,
                    eta,
                    r,
                )
                break
            time.sleep(POLL)
        return best, pace

    def record(self, entry: RosterEntry, r: int | None) -> tuple[JsonObject | None, Pace | None]:
        """Its signed record of round ``r`` (else, or with ``r`` None, its newest), checked,
        from its server, else the coordinator (or None); and its pace as its server told it
        (or None)."""
        signed, pace = self._record_from_peer(entry, r)
        if signed is None:
            self.unreached = True
            try:
                signed = self.calls.record(entry.job_id, r).model_dump()
            except (ApiError, Unreachable) as e:
                log.debug("record of %s from the coordinator: %s", entry.job_id, e)
                return None, pace
        problem = record_problem(signed, entry.public_key)
        if problem is None:
            rec = signed["record"]
            if rec["training_id"] != self.training_id or rec["job_id"] != entry.job_id:
                problem = f"a record for run {rec['training_id']!r}, job {rec['job_id']!r}"
            elif not isinstance(rec["round"], int) or not 1 <= rec["round"] <= self.rounds:
                problem = f"a record of round {rec['round']!r}"
        if problem is not None:
            log.warning("neighbour %s: record refused: %s", entry.worker, problem)
            return None, pace
        return signed, pace

    def _record_from_peer(self, entry: RosterEntry, r: int | None) -> tuple[JsonObject | None, Pace | None]:
        if not entry.url:
            return None, None
        signed = pace = None
        body = bytearray()
        try:
            reply = bounded_get(
                self.peers.http,
                f"{entry.url}/v1/records/{entry.job_id}",
                params={} if r is None else {"round": r},
                seconds=RECORD_SECONDS,
                max_bytes=MAX_RECORD_BYTES,
                take=body.extend,
            )
            pace = parse_pace(reply.headers.get(PACE_HEADER), self.rounds)
            if reply.status == 200:
                signed = json.loads(body)
        except (httpx.HTTPError, ValueError, TooSlow, TooLong) as e:
            log.debug("record from %s: %s", entry.url, e)
        return signed, pace

    def blob(self, entry: RosterEntry, cid: str) -> bytes | None:
        """The model ``cid`` from the neighbour's server (CID-checked, at most its known
        size, within the fetcher's deadline; a mismatch is reported), else the
        coordinator's copy."""
        path: Path | None = None
        if entry.url:
            try:
                size = self.peers.download(entry.url, cid, self.incoming, max_bytes=self.model_size)
                self.metrics.bytes.labels("peer").inc(size)
                path = self.incoming.dir / cid
            except PeerUnavailable as e:
                log.info("%s; the coordinator's copy", e)
            except IntegrityError as e:
                log.warning("%s; reported", e)
                self.report(cid, entry.worker)
                return None
            except AitbcError as e:
                log.warning("neighbour %s: %s", entry.worker, e)
                return None
        if path is None:
            try:
                self.calls.download_blob(cid, self.incoming)
                path = self.incoming.dir / cid
            except (ApiError, Unreachable, IntegrityError) as e:
                log.info("model %s of %s not fetched: %s", cid, entry.worker, e)
                return None
        try:
            return path.read_bytes()
        finally:
            path.unlink(missing_ok=True)

    def decode(self, blob: bytes) -> Tensor | None:
        """The ``(d,)`` float32 model in ``blob``, or None if it is not one (or not finite)."""
        try:
            m = decode_model(blob, max_numel=self.d)
        except (IntegrityError, ValueError):
            return None
        if m.shape != (self.d,) or not torch.isfinite(m).all():
            return None
        return m.to(torch.float32)


# --- a neighbour's pace ---------------------------------------------------------------------


def parse_pace(text: str | None, rounds: int) -> Pace | None:
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
    return Pace(r, step, steps, seconds)


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
