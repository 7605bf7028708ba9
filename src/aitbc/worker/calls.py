"""Every request the worker makes of the coordinator, and the one place that reads their
replies: the other parts call these methods and never build a path or read a reply's
fields themselves.

Each reply is parsed into the model the coordinator answers with (:mod:`aitbc.replies`),
so a field it renamed is a type error here, not a ``KeyError`` deep in a round. An
unreachable coordinator raises :class:`~aitbc.client.Unreachable`; :meth:`CoordinatorCalls.retry`
runs a call again with capped exponential back-off until it answers or the worker stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, NotRequired, TypedDict, TypeVar

from aitbc.chain_clients import parse_chain
from aitbc.client import ApiError, CoordinatorClient, Unreachable
from aitbc.replies.base import JsonObject, Page, parse
from aitbc.replies.blobs import BlobStored, Holders, PeerRef, PeerVerdict
from aitbc.replies.chain import EvmChain, LocalChain
from aitbc.replies.gossip import RecordAccepted, SignedRecord, Witnessed
from aitbc.replies.health import Health
from aitbc.replies.jobs import Challenge, JobPoll, UpdateAccepted
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.worker.progress import ProgressReport

log = logging.getLogger("aitbc.worker")

T = TypeVar("T")


class Reveal(TypedDict):
    """The body of ``POST /v1/jobs/{id}/proofs``: the challenged states' CIDs by boundary."""

    round: int
    states: dict[str, str]
    residual: NotRequired[str]  # the CID of the error-feedback residual the round started from


class CoordinatorCalls:
    """The coordinator's API as this worker uses it. ``stop``: the worker's stop event
    (retries and waits end with it); ``backoff`` / ``max_backoff``: seconds of the first
    wait before a retry and the most it doubles to."""

    def __init__(self, client: CoordinatorClient, *, stop: threading.Event, backoff: float, max_backoff: float) -> None:
        self.client = client
        self.stop = stop
        self.backoff, self.max_backoff = backoff, max_backoff

    @property
    def address(self) -> str:
        """This worker's wallet address (the client's wallet signs every request)."""
        wallet = self.client.wallet
        assert wallet is not None  # set by the worker before any call
        return wallet.address

    def retry(self, call: Callable[[], T]) -> T | None:
        """Run ``call`` until it answers; back off on an unreachable coordinator. None: stopping."""
        delay = self.backoff
        while not self.stop.is_set():
            try:
                return call()
            except Unreachable as e:
                log.warning("%s; retrying in %.1f s", e, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, self.max_backoff)
        return None

    def close(self) -> None:
        self.client.close()

    # --- the offer and the job ------------------------------------------------------------

    def chain(self) -> LocalChain | EvmChain:
        """Where the coordinator holds runs' money (one without the route: its own ledger)."""
        try:
            return parse_chain(self.client.get("/chain"))
        except ApiError as e:
            if e.status != 404:
                raise
            return parse_chain(None)

    def coordinator_id(self) -> str:
        """The coordinator's id (``/v1/health``): what an offer's ``evm_proof`` is bound to."""
        return parse(Health, self.client.get("/health")).coordinator_id

    def register(self, offer: dict[str, Any]) -> None:
        self.client.post("/workers", offer)

    def heartbeat(self, *, timeout: float) -> None:
        self.client.post("/workers/heartbeat", {}, timeout=timeout)

    def poll_job(self, *, wait: float, inline: int, known: str, after: int | None) -> JobPoll:
        """The job's view, a long poll (see :meth:`aitbc.worker.job_loop.JobLoop.poll`)."""
        params: dict[str, Any] = {"wait": wait, "inline": inline, "known": known}
        if after is not None:
            params["after"] = after
        return parse(JobPoll, self.client.get(f"/workers/{self.address}/job", params=params, sign=True))

    def job_view(self) -> JobPoll:
        """The job's view now (no long poll)."""
        return parse(JobPoll, self.client.get(f"/workers/{self.address}/job", sign=True))

    def post_progress(self, job_id: str, body: ProgressReport) -> None:
        self.client.post(f"/jobs/{job_id}/progress", body)

    # --- updates and spot checks ------------------------------------------------------------

    def post_update(self, job_id: str, body: dict[str, Any]) -> Challenge | None:
        """Send the message naming an update (retried through an outage): the spot check
        the reply asks for, if any. Async: while the coordinator applies a buffer (a moment)
        it asks for the update again; it then joins the next buffer."""
        while True:
            try:
                reply = self.retry(lambda: self.client.post(f"/jobs/{job_id}/updates", body))
                return parse(UpdateAccepted, reply).challenge if reply else None
            except ApiError as e:
                if e.code != "buffer_applying" or self.stop.wait(0.05):
                    raise

    def post_proofs(self, job_id: str, body: Reveal) -> None:
        self.client.post(f"/jobs/{job_id}/proofs", body)

    # --- blobs ------------------------------------------------------------------------------

    def put_blob(self, cid: str, data: bytes) -> BlobStored:
        return parse(BlobStored, self.client.put_blob(cid, data))

    def download_blob(self, cid: str, store: LocalBlobStore) -> int:
        return self.client.download_blob(cid, store)

    def holders(self, cid: str) -> list[PeerRef]:
        """The peers that hold blob ``cid``, other than this worker."""
        return parse(Holders, self.client.get(f"/blobs/{cid}/holders", params={"exclude": self.address})).data

    def announce_holdings(self, advertise: str, cids: list[str]) -> None:
        self.client.post("/workers/holdings", {"advertise": advertise, "cids": cids})

    def report_bad_peer(self, cid: str, peer: str) -> str:
        """Report ``peer`` for serving bytes that are not ``cid``: the coordinator's verdict."""
        return parse(PeerVerdict, self.client.post(f"/blobs/{cid}/bad-peer", {"peer": peer})).verdict

    # --- gossip records ---------------------------------------------------------------------

    def record(self, job_id: str, round: int | None) -> SignedRecord:
        """The coordinator's copy of job ``job_id``'s signed record of ``round`` (None: its newest)."""
        params = {} if round is None else {"round": round}
        return parse(SignedRecord, self.client.get(f"/jobs/{job_id}/records", params=params))

    def post_record(self, job_id: str, signed: JsonObject) -> RecordAccepted:
        return parse(RecordAccepted, self.client.post(f"/jobs/{job_id}/records", signed))

    def witness(self, records: list[JsonObject], *, timeout: float | None = None) -> list[Witnessed]:
        """Report signed records seen (``POST /v1/records/witnessed``): the coordinator's
        verdict on each."""
        reply = self.client.post("/records/witnessed", {"records": records}, timeout=timeout)
        return parse(Page[Witnessed], reply).data if reply else []
