"""The worker's blobs: the round's global model, its shard, and (gossip) its own published
models; fetched by CID from a peer that holds them or from the coordinator, checked
against the CID as they arrive, kept on disk, and served to peers (``--listen``).

A global model is used once or twice and replaced every round: the last two are kept as
files (a round trained again, a skipped round; with overlap, the next round's model fetched
by a sender thread while the main thread trains from the last). Shards go through the
least-recently-used cache (``cache_bytes``).
"""

from __future__ import annotations

import base64
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from aitbc.client import ApiError, Unreachable
from aitbc.errors import AitbcError, IntegrityError
from aitbc.replies.blobs import PeerRef
from aitbc.storage.blobstore import BlobCache, LocalBlobStore
from aitbc.training.checkpoint import Layout, params_from_file
from aitbc.worker.calls import CoordinatorCalls
from aitbc.worker.metrics import WorkerMetrics
from aitbc.worker.peers import BlobServer, PeerFetcher, PeerUnavailable

log = logging.getLogger("aitbc.worker")

KEEP_PUBLISHED = 32  # gossip: rounds of its own models and records a worker keeps (the coordinator may fetch late)


class ModelFetcher:
    """See the module's docstring. ``home`` / ``wallet``: where its files go
    (``HOME/worker-cache/<wallet>`` and beside it); ``current_shard``: the shard of the
    job it trains now ("" if none), announced with the models it holds."""

    def __init__(
        self,
        calls: CoordinatorCalls,
        metrics: WorkerMetrics,
        *,
        home: Path,
        wallet: str,
        cache_bytes: int,
        peer_timeout: float,
        advertise: str | None,
        current_shard: Callable[[], str],
    ) -> None:
        self.calls, self.metrics = calls, metrics
        self.cache = BlobCache(home / "worker-cache" / wallet, max_bytes=cache_bytes)
        self.peers = PeerFetcher(timeout=peer_timeout)
        self.server: BlobServer | None = None  # this worker's peer server, once started (--listen)
        self.advertise = advertise
        self._current_shard = current_shard
        # any models left by an earlier process go
        self.models = LocalBlobStore(home / "worker-models" / wallet, durable=False)  # a cache: no fsyncs
        shutil.rmtree(self.models.dir, ignore_errors=True)
        self._kept_models: list[str] = []
        self._lock = threading.Lock()
        # the next model as flat parameters, by (job, CID), read by the look-ahead thread
        # (overlap 2; at most two kept, each taken once, none past its job): the training
        # thread, done with a round, starts the next without a file read, each of whose
        # system calls may cost it a GIL switch interval while the sender threads run
        self._ready: dict[tuple[str, str], torch.Tensor] = {}
        # gossip: this worker's own published models (served by CID)
        self._published = LocalBlobStore(home / "worker-gossip" / wallet, durable=False)
        shutil.rmtree(self._published.dir, ignore_errors=True)
        self._published_kept: list[str] = []

    def close(self) -> None:
        self.peers.close()

    # --- the global model -----------------------------------------------------------------

    def global_model(self, cid: str, peers: list[PeerRef] | None = None, *, inline: str | None = None) -> Path:
        """The round's global model, as a file: one of the last two downloaded if it has this
        CID, else the copy the job view carried (``inline``, base64) if it hashes to the
        CID, else streamed to disk from one of ``peers`` (the job view's ``model_peers``) or
        the coordinator, checked against its CID as it arrives (an ``IntegrityError`` if the
        coordinator's bytes do not hash to it)."""
        try:
            with self._lock:
                if cid in self._kept_models and self.models.has(cid):
                    return self.models.dir / cid
            self.models.dir.mkdir(parents=True, exist_ok=True)
            if not (inline and self._take_inline(cid, inline)):
                self._fetch(cid, self.models, peers or [])
            with self._lock:
                if cid not in self._kept_models:
                    self._kept_models.append(cid)
                while len(self._kept_models) > 2:
                    old = self._kept_models.pop(0)  # the oldest
                    (self.models.dir / old).unlink(missing_ok=True)
        finally:
            if self.server is not None:
                self.server.done(cid)  # peers waiting for it (this worker was a seed) look again
        self.announce()
        return self.models.dir / cid

    def _take_inline(self, cid: str, inline: str) -> bool:
        """Store the model the job view carried (base64) under ``cid`` if its bytes hash to
        it; False, storing nothing, if they do not (or are not base64): it is fetched by CID."""
        try:
            data = base64.b64decode(inline, validate=True)
            self.models.put_blob(cid, data)  # checked against the CID, as a download is
        except (ValueError, AitbcError) as e:  # binascii.Error is a ValueError; IntegrityError an AitbcError
            log.warning("the job view's copy of model %s is not usable (%s); fetching it by its CID", cid, e)
            return False
        self.metrics.bytes.labels("inline").inc(len(data))
        return True

    def read_ahead(self, job_id: str, cid: str, path: Path, layout: Layout) -> None:
        """Read model ``cid`` (its file ``path``) as flat parameters for job ``job_id``'s
        next round (:meth:`take_ready`); the two newest are kept."""
        params = params_from_file(path, layout)
        with self._lock:
            self._ready[(job_id, cid)] = params
            while len(self._ready) > 2:
                self._ready.pop(next(iter(self._ready)))  # the oldest

    def take_ready(self, job_id: str, cid: str) -> torch.Tensor | None:
        """Model ``cid``'s flat parameters if read ahead for job ``job_id`` (used once: not held on)."""
        with self._lock:
            return self._ready.pop((job_id, cid), None)

    def forget_ready(self) -> None:
        """The job is released: no copy of its models is held past it."""
        with self._lock:
            self._ready.clear()

    # --- shards -----------------------------------------------------------------------------

    def shard(self, cid: str) -> Path:
        """A blob by CID from the local cache (LRU, capped at ``cache_bytes``), else streamed
        into it from a peer that holds it (``GET /v1/blobs/{cid}/holders``) or the
        coordinator (verified both ways): the path of its file."""
        path = self.cache.get_path(cid, self._fetch_shard)
        self.announce()
        return path

    def _fetch_shard(self, cid: str, store: LocalBlobStore) -> None:
        try:
            peers = self.calls.holders(cid)
        except (ApiError, Unreachable) as e:  # an older coordinator, or an outage: the coordinator's copy
            log.debug("holders of %s: %s", cid, e)
            peers = []
        self._fetch(cid, store, peers)

    # --- gossip: its own published models ---------------------------------------------------

    def keep_published(self, cid: str, blob: bytes) -> None:
        """Keep one of this worker's published models (the last KEEP_PUBLISHED), served by CID."""
        self._published.put_bytes(blob)
        with self._lock:
            self._published_kept.append(cid)
            while len(self._published_kept) > KEEP_PUBLISHED:
                (self._published.dir / self._published_kept.pop(0)).unlink(missing_ok=True)

    # --- peer transport ---------------------------------------------------------------------

    def _fetch(self, cid: str, store: LocalBlobStore, peers: list[PeerRef]) -> None:
        """``cid`` into ``store`` from the first of ``peers`` that serves it whole and right,
        else from the coordinator. A peer whose bytes do not hash to ``cid`` is reported."""
        for peer in peers:
            try:
                size = self.peers.download(peer.url, cid, store)
            except PeerUnavailable as e:
                log.info("%s; next", e)
                continue
            except IntegrityError as e:
                log.warning("%s; reported, next", e)
                self.report(cid, peer.worker)
                continue
            except AitbcError as e:  # over the store's size limit
                log.warning("peer %s: %s; next", peer.url, e)
                continue
            self.metrics.bytes.labels("peer").inc(size)
            log.debug("blob %s (%d bytes) from peer %s", cid, size, peer.url)
            return
        self.download(cid, store)

    def download(self, cid: str, store: LocalBlobStore) -> None:
        """``cid`` into ``store`` from the coordinator."""
        size = self.calls.download_blob(cid, store)
        self.metrics.bytes.labels("down").inc(size)

    def held(self, cid: str) -> Path | None:
        """The file of a blob this worker holds (a kept model, a cached shard), for its peers."""
        with self._lock:
            if cid in self._kept_models and (self.models.dir / cid).is_file():
                return self.models.dir / cid
            if cid in self._published_kept and (self._published.dir / cid).is_file():
                return self._published.dir / cid
        path = self.cache.store.dir / cid
        return path if path.is_file() else None

    def expect(self, cid: str | None) -> None:
        """This worker is about to fetch model ``cid`` (peers that ask for it meanwhile wait
        for it: the coordinator may have named this worker a seed)."""
        if self.server is not None and cid:
            self.server.expect(cid)

    def announce(self) -> None:
        """Tell the coordinator which blobs this worker serves now (a small signed POST
        after each fetch); nothing if it serves none. Advisory: a failure is logged."""
        if self.server is None or self.advertise is None:
            return
        with self._lock:
            cids = list(self._kept_models) + self._published_kept[::-1][:8]  # gossip: its newest models
        shard = self._current_shard()
        if shard:
            cids.append(shard)
        try:
            self.calls.announce_holdings(self.advertise, cids[:16])
        except (ApiError, Unreachable) as e:
            log.info("holdings not announced: %s", e)

    def report(self, cid: str, peer: str) -> None:
        """Report a peer that served bytes not matching ``cid`` (signed; the coordinator
        checks for itself before it flags anyone), on a thread of its own."""

        def send() -> None:
            try:
                verdict = self.calls.report_bad_peer(cid, peer)
                log.warning("reported peer %s for blob %s: coordinator's check %s", peer, cid, verdict)
            except (ApiError, Unreachable) as e:
                log.warning("report of peer %s not delivered: %s", peer, e)

        threading.Thread(target=send, name="report", daemon=True).start()
