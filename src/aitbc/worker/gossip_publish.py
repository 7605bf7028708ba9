"""A gossip worker's own records: signed, written to its log on disk, claimed, served by its
peer server (:class:`PublishedRecords`), and sent to the coordinator in order by a publisher
thread (:class:`Publisher`), retrying through an outage, so training never waits for the
coordinator and a restarted coordinator gets the backlog. See :mod:`aitbc.worker.gossip`."""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path

from aitbc.client import ApiError, Unreachable
from aitbc.ledger.records import make_record
from aitbc.ledger.wallet import Wallet
from aitbc.replies.base import JsonObject
from aitbc.worker.calls import CoordinatorCalls
from aitbc.worker.fetcher import KEEP_PUBLISHED, ModelFetcher

log = logging.getLogger("aitbc.worker.gossip")

CLAIM_SECONDS = 5.0  # seconds its own record's claim may take before it is served anyway


@dataclass(frozen=True, slots=True)
class Outgoing:
    """What the publisher sends for one round, in this order."""

    round: int
    blob: bytes | None  # its model, uploaded first (a worker its neighbours cannot reach)
    signed: JsonObject | None  # its own record
    witnessed: list[JsonObject] = field(default_factory=list)  # the neighbours' records it mixed


class PublishedRecords:
    """This worker's signed records by (job, round), the last KEEP_PUBLISHED rounds of each
    job, read by its peer server's threads."""

    def __init__(self) -> None:
        self._records: dict[tuple[str, int], JsonObject] = {}

    def keep(self, job_id: str, r: int, signed: JsonObject) -> None:
        self._records[(job_id, r)] = signed

    def trim(self, job_id: str, r: int) -> None:
        """Keep job ``job_id``'s records of the last KEEP_PUBLISHED rounds up to ``r``."""
        for old in [k for k in self._records if k[0] == job_id and k[1] <= r - KEEP_PUBLISHED]:
            del self._records[old]

    def get(self, job_id: str, round: int | None) -> JsonObject | None:
        """Its record for ``job_id``: of ``round`` if kept, else its newest."""
        mine = {r: v for (j, r), v in list(self._records.items()) if j == job_id}
        if not mine:
            return None
        return mine.get(round) if round in mine else mine[max(mine)]


class Publisher:
    """One gossip job's own records. ``serving``: this worker runs a peer server (its
    records are claimed before they are served, and sent after the neighbours' it mixed);
    ``signed_log``: its log on disk."""

    def __init__(
        self,
        calls: CoordinatorCalls,
        fetcher: ModelFetcher,
        wallet: Wallet,
        published: PublishedRecords,
        *,
        job_id: str,
        training_id: str,
        samples: int,
        signed_log: Path,
        serving: bool,
    ) -> None:
        self.calls, self.fetcher, self.wallet, self.published = calls, fetcher, wallet, published
        self.job_id, self.training_id, self.samples = job_id, training_id, samples
        self.signed_log, self.serving = signed_log, serving
        self.outbox: queue.Queue[Outgoing | None] = queue.Queue()
        self.ended = False  # the coordinator said the job or run is over
        # neighbours the coordinator found signing two records of a round (equivocation): never
        # mixed again, even before their ejection reaches the roster
        self.distrusted: set[str] = set()
        self._thread = threading.Thread(target=self._publish_all, name="gossip-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, item: Outgoing) -> None:
        self.outbox.put(item)

    def close(self) -> None:
        """No more rounds: the publisher sends what is queued, then stops."""
        self.outbox.put(None)

    # --- its own signed records ---------------------------------------------------------------

    def sign(self, r: int, cid: str, loss: float) -> JsonObject:
        return make_record(
            self.wallet,
            training_id=self.training_id,
            job_id=self.job_id,
            round=r,
            cid=cid,
            samples=self.samples,
            train_loss=loss,
        )

    def keep_signed(self, signed: JsonObject) -> None:
        """Serve ``signed`` (the last KEEP_PUBLISHED rounds) after writing it to its log on
        disk and, with a server, claiming it (:meth:`_claim`)."""
        self.signed_log.parent.mkdir(parents=True, exist_ok=True)
        with self.signed_log.open("a") as f:
            f.write(json.dumps(signed, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.serving:
            self._claim(signed)
        r = int(signed["record"]["round"])
        self.published.keep(self.job_id, r, signed)
        self.published.trim(self.job_id, r)

    def _claim(self, signed: JsonObject) -> None:
        """Tell the coordinator of its own record before anyone can read it (its peer server
        serves it only after this): the coordinator then knows this worker signed the CID
        before any neighbour could copy it, so a copy of it signed by another is that
        one's, never this one's (``POST /v1/records/witnessed``; its own record is a report
        like any other: checked against its key, kept until it publishes the round). One
        try, at most :data:`CLAIM_SECONDS`: the coordinator down or slow, it serves anyway
        (training never waits for the coordinator; see the docs on copies in an outage)."""
        try:
            self.calls.witness([signed], timeout=CLAIM_SECONDS)
        except (ApiError, Unreachable) as e:
            log.info("round %s not claimed before serving it: %s", signed["record"]["round"], e)

    def restore(self, *, published: int) -> list[int]:
        """A restarted worker: the records it signed for this job before (its log) are served
        again, and those the coordinator has not recorded (rounds past ``published``) are
        queued for it. The rounds it signed, in order (its clock goes past the last, so it
        never signs a round twice: two records of one round are equivocation, whatever the
        reason)."""
        if not self.signed_log.exists():
            return []
        me = self.wallet.address
        kept: dict[int, JsonObject] = {}
        for line in self.signed_log.read_text().splitlines():
            try:
                signed = json.loads(line)
                rec = signed["record"]
                if rec["job_id"] == self.job_id and rec["worker"] == me and isinstance(rec["round"], int):
                    kept.setdefault(rec["round"], signed)  # the first it signed of a round stands
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash
        for r in sorted(kept):
            self.published.keep(self.job_id, r, kept[r])
            if r > published:
                self.outbox.put(Outgoing(r, None, kept[r]))
        return sorted(kept)

    # --- the publisher thread -----------------------------------------------------------------

    def _publish_all(self) -> None:
        while True:
            item = self.outbox.get()
            if item is None:
                return
            if item.witnessed:
                self.report_witnessed(item.round, item.witnessed)
            if item.signed is None:
                continue
            if not self._publish(item.round, item.blob, item.signed):
                return
            self.fetcher.announce()

    def _publish(self, r: int, blob: bytes | None, signed: JsonObject) -> bool:
        """Send its record of round ``r`` (its blob first, if given). False: stop publishing
        (the worker stops, or the job is over)."""
        calls = self.calls
        if blob is not None:  # cannot be reached: its neighbours and the coordinator read it there
            cid = signed["record"]["cid"]
            if calls.retry(lambda: calls.put_blob(cid, blob)) is None:
                return False  # stopping
        try:
            reply = calls.retry(lambda: calls.post_record(self.job_id, signed))
            if reply is None:
                return False  # stopping
            log.debug("round %d recorded: %s", r, reply)
        except ApiError as e:
            if e.code in ("job_not_active", "run_ended"):
                log.info("job %s over: %s", self.job_id, e.detail)
                self.ended = True
                return False
            log.warning("record of round %d refused (%s): %s", r, e.code, e.detail)
        return True

    def report_witnessed(self, r: int, witnessed: list[JsonObject]) -> None:
        """Send the neighbours' records it mixed in round ``r``: the coordinator flags a
        neighbour that signed another record of that round (equivocation)."""
        try:
            verdicts = self.calls.retry(lambda: self.calls.witness(witnessed))
        except ApiError as e:
            log.warning("records witnessed in round %d refused (%s): %s", r, e.code, e.detail)
            return
        for v in verdicts or []:
            if v.verdict == "equivocation":
                self.distrusted.add(v.worker)
                log.warning(
                    "neighbour %s signed two records of round %d: flagged; not mixed from now on",
                    v.worker,
                    v.round,
                )
