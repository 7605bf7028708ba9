"""Peer transport: which workers hold which blobs, so that a worker fetches a round's model
(or a shard) from another worker instead of from the coordinator.

The book is in memory, like heartbeats (:class:`~aitbc.coordinator.context.Liveness`): a
worker started with ``--listen`` tells where it serves (``advertise``, in its registration
and in each announcement) and which CIDs it holds (``POST /v1/workers/holdings``, after it
fetched a model). After a coordinator restart the book starts empty and every worker fetches
from the coordinator until the next announcements: a cost, never a fault. Who was caught
serving corrupt bytes is not forgotten: the flag ``bad_peer_blob`` is in the database, and a
worker it names is refused as a peer again after a restart, or by another replica.

Who gets whom (:meth:`PeerBook.holders_for`): up to :data:`PEERS_GIVEN` live holders of the
CID other than the asker, picked at random (the load spreads); while nobody holds it yet, the
first :data:`SEEDS` askers that serve blobs fetch it from the coordinator (the *seeds*) and
every later asker is handed the seeds (a seed's server holds the request until its own copy
is complete). A worker always falls back to the coordinator, so a wrong answer here costs
bytes, never a round.

Reports of bad peers (:func:`check_report`): a worker whose fetch from a peer did not hash to
the CID reports it, signed. One report alone flags nobody: the coordinator fetches the CID
from the accused itself and checks the bytes. Bytes that do not hash to the CID are the
peer's own signed-for fault (a Flag ``bad_peer_blob``, its offer's flags + 1, its holdings
dropped); a peer that does not answer loses that claim (an honest peer may have evicted the
blob); a peer that serves the right bytes is not flagged, and the report only counts as a
signal: a peer reported by :data:`DISTRUST_REPORTS` distinct workers is no longer handed out
(no flag, no money: it costs the coordinator bandwidth, never the peer its reputation).

SSRF: a worker can advertise any http(s) URL. The coordinator fetches from it only to check
a report (or a gossip model it signed a record of), at most once per (peer, CID), only
``GET {url}/v1/blobs/{cid}``, without redirects, reading at most the blob's size (a longer
body is refused at the byte past it), within a wall-clock deadline that holds however
slowly the peer sends (:func:`aitbc.storage.peer_fetch.bounded_get`), and never returns
what it read (only whether it hashed to the CID). Workers fetch only URLs the coordinator hands out,
and every byte they keep is CID-verified.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import httpx
from sqlalchemy.orm import Session

from aitbc.coordinator.store.models import Flag, Offer
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.peer_fetch import TooLong, TooSlow, bounded_get
from aitbc.storage.peer_url import MAX_URL, check_advertise
from aitbc.storage.unixfs import BlobHasher

__all__ = ["MAX_URL", "PeerBook", "PeerFetches", "check_advertise", "check_report"]

log = logging.getLogger("aitbc.coordinator")

MAX_HELD = 16  # CIDs one announcement may name (a worker keeps two models and a few shards)
PEERS_GIVEN = 3  # holders handed to one asker (it tries them in turn, then the coordinator)
SEEDS = 1  # askers per CID sent to the coordinator before peers are handed out
DISTRUST_REPORTS = 3  # distinct reporters after which a peer is no longer handed out
MAX_CIDS = 1024  # CIDs the book tracks seeds for (the oldest are forgotten)
CHECK_TIMEOUT = 10.0  # seconds for one read by the coordinator from a worker's peer server
FETCH_SECONDS = 3 * CHECK_TIMEOUT  # seconds for a whole fetch from a peer, however slowly it sends
FETCH_THREADS = 8  # gossip models fetched from peers at once, at most


class PeerBook:
    """Who serves where and holds what (see the module's docstring); thread-safe."""

    def __init__(self, *, rng: random.Random | None = None) -> None:
        self._lock = threading.Lock()
        self._rng = rng or random.Random()
        self._urls: dict[str, str] = {}  # worker -> advertised URL
        self._held: dict[str, set[str]] = {}  # worker -> CIDs it announced
        self._holders: dict[str, dict[str, None]] = {}  # CID -> workers (insertion-ordered)
        self._seeds: OrderedDict[str, list[str]] = OrderedDict()  # CID -> workers sent to the coordinator
        self._reports: dict[str, set[str]] = {}  # accused worker -> distinct reporters
        self._checked: dict[tuple[str, str], str] = {}  # (worker, CID) -> the coordinator's verdict
        self.banned: set[str] = set()  # workers caught serving corrupt bytes: never handed out again
        self.fetches = PeerFetches()  # gossip models being fetched from workers (coordinator.gossip)

    def advertise(self, worker: str, url: str | None) -> None:
        with self._lock:
            if url is None or worker in self.banned:
                self._forget(worker)
            else:
                self._urls[worker] = url

    def announce(self, worker: str, url: str, cids: list[str]) -> None:
        """``worker`` serves at ``url`` and holds exactly ``cids`` now (the last announcement wins)."""
        with self._lock:
            if worker in self.banned:
                return
            self._urls[worker] = url
            for cid in self._held.get(worker, set()) - set(cids):
                self._drop(cid, worker)
            self._held[worker] = set(cids)
            for cid in cids:
                if (worker, cid) not in self._checked or self._checked[(worker, cid)] == "ok":
                    self._holders.setdefault(cid, {})[worker] = None

    def url(self, worker: str) -> str | None:
        return self._urls.get(worker)

    def holders_for(
        self,
        cid: str,
        asker: str,
        alive: Callable[[str], bool],
        *,
        fetchers: Callable[[], list[str]] | None = None,
    ) -> list[dict[str, str]]:
        """Up to :data:`PEERS_GIVEN` peers to fetch ``cid`` from (``{"worker", "url"}``),
        never the asker; empty: fetch from the coordinator. ``fetchers``: the workers that
        are about to fetch ``cid`` too (a round's model: the run's active workers); while
        nobody holds it, the first of them that serve (the asker if it does) are made its
        seeds: they fetch it from the coordinator, the others from them."""
        seed = fetchers is not None
        with self._lock:

            def usable(w: str) -> bool:
                return w != asker and w in self._urls and alive(w) and len(self._reports.get(w, ())) < DISTRUST_REPORTS

            held = [w for w in self._holders.get(cid, {}) if usable(w)]
            seeds = self._seeds.get(cid, []) if seed else []  # fetchers given: a model being fetched
            pending = [w for w in seeds if usable(w) and w not in held]
            chosen = self._rng.sample(held, min(PEERS_GIVEN, len(held)))
            if len(chosen) < PEERS_GIVEN and pending:
                chosen += self._rng.sample(pending, min(PEERS_GIVEN - len(chosen), len(pending)))
            if not chosen and fetchers is not None:
                live = [w for w in seeds if alive(w)]
                if asker not in live and len(live) < SEEDS:
                    new: str | None
                    if asker in self._urls:
                        new = asker  # it fetches from the coordinator; later askers from it
                    else:  # it cannot serve: another fetcher that can is made the seed, and handed out
                        able = [w for w in fetchers() if usable(w) and w not in live]
                        new = self._rng.choice(able) if able else None
                        chosen = [new] if new is not None else []
                    if new is not None:
                        self._seeds[cid] = [*live, new]
                        self._seeds.move_to_end(cid)
                        while len(self._seeds) > MAX_CIDS:
                            self._seeds.popitem(last=False)
            return [{"worker": w, "url": self._urls[w]} for w in chosen]

    def report(self, accused: str, reporter: str) -> int:
        """Count a report; returns how many distinct workers have reported ``accused``."""
        with self._lock:
            self._reports.setdefault(accused, set()).add(reporter)
            return len(self._reports[accused])

    def verdict(self, accused: str, cid: str) -> str | None:
        return self._checked.get((accused, cid))

    def judge(self, accused: str, cid: str, verdict: str) -> None:
        """Record the coordinator's own check: ``bad`` forgets the peer, ``gone`` its claim."""
        with self._lock:
            self._checked[(accused, cid)] = verdict
            if verdict == "bad":
                self.banned.add(accused)
                self._forget(accused)
            elif verdict == "gone":
                self._drop(cid, accused)
                self._held.get(accused, set()).discard(cid)

    def ban(self, worker: str) -> None:
        """Never hand ``worker`` out again (caught serving corrupt bytes)."""
        with self._lock:
            self.banned.add(worker)
            self._forget(worker)

    def _forget(self, worker: str) -> None:
        self._urls.pop(worker, None)
        for cid in self._held.pop(worker, set()):
            self._drop(cid, worker)

    def _drop(self, cid: str, worker: str) -> None:
        held = self._holders.get(cid)
        if held is not None:
            held.pop(worker, None)
            if not held:  # last round's model, held by nobody now: the book does not grow with rounds
                del self._holders[cid]


class PeerFetches:
    """The coordinator's fetches of gossip models from workers' peer servers, each on a
    thread of its own, never the round driver's: the driver asks for verdicts
    (:meth:`verdicts`) and moves on to other runs while they are pending, so a slow peer
    holds only the round whose model it serves, and only until the fetch's wall-clock
    deadline (:data:`FETCH_SECONDS`). At most :data:`FETCH_THREADS` fetch at once (the
    rest queue); a verdict is kept until the round that wanted it closes (:meth:`forget`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verdicts: dict[tuple[str, str], str | None] = {}  # (worker, CID) -> verdict; None: fetching
        self._slots = threading.BoundedSemaphore(FETCH_THREADS)

    def verdicts(
        self, wanted: list[tuple[str, str]], fetch: Callable[[str, str], str], done: Callable[[], None]
    ) -> dict[tuple[str, str], str] | None:
        """Each (worker, CID)'s verdict (``fetch``'s answer), or None while any is still
        being fetched; each not asked for before is started now, on a thread of its own
        (``done`` is called when it ends: the driver looks again)."""
        with self._lock:
            for key in wanted:
                if key not in self._verdicts:
                    self._verdicts[key] = None
                    threading.Thread(
                        target=self._fetch, args=(key, fetch, done), name="gossip-fetch", daemon=True
                    ).start()
            got = {key: self._verdicts[key] for key in wanted}
        if any(v is None for v in got.values()):
            return None
        return {key: v for key, v in got.items() if v is not None}

    def _fetch(self, key: tuple[str, str], fetch: Callable[[str, str], str], done: Callable[[], None]) -> None:
        with self._slots:
            try:
                verdict = fetch(*key)
            except Exception:  # a bug, a full disk: not the worker's fault, and asked again later
                log.exception("fetching %s from %s failed", key[1], key[0])
                with self._lock:
                    self._verdicts.pop(key, None)
                return
        with self._lock:
            self._verdicts[key] = verdict
        done()

    def pending(self, key: tuple[str, str]) -> bool:
        """Whether (worker, CID) is being fetched now."""
        with self._lock:
            return key in self._verdicts and self._verdicts[key] is None

    def forget(self, keys: list[tuple[str, str]]) -> None:
        """The round that wanted these closed: their verdicts are not kept."""
        with self._lock:
            for key in keys:
                if self._verdicts.get(key) is not None:
                    del self._verdicts[key]


class PeerChecks(Protocol):
    """What checking a report needs of the coordinator (its context has each): the peer book,
    the blob store, and a database session to flag a peer in."""

    @property
    def peers(self) -> PeerBook: ...

    @property
    def store(self) -> LocalBlobStore: ...

    def session(self) -> Session: ...


def check_report(
    ctx: PeerChecks, reporter: str, accused: str, cid: str, *, signed: Callable[[], str] | None = None
) -> dict[str, Any]:
    """A worker says ``accused`` served bytes for ``cid`` that did not hash to it. The
    coordinator checks by fetching ``cid`` from the accused itself (once per peer and CID)
    and flags it only if its own fetch does not hash either (see the module's docstring).
    ``signed``: for a CID the coordinator does not hold, its own fetch-and-check when the
    accused signed a record of it (gossip: :func:`aitbc.coordinator.rounds.gossip.fetch_model`),
    None when it did not. Returns ``{"verdict": "bad" | "gone" | "ok" | "unknown", "reports": n}``."""
    book: PeerBook = ctx.peers
    reports = book.report(accused, reporter)
    url = book.url(accused)
    verdict = book.verdict(accused, cid)
    if verdict is None:
        if url is None:
            return {"verdict": "unknown", "reports": reports}  # nothing the coordinator can check
        if ctx.store.has(cid):
            verdict = _fetch_and_check(url, cid, ctx.store.size(cid))
        elif signed is not None:  # a gossip model the accused signed a record of: fetched (and kept) or caught now
            verdict = signed()
        else:
            return {"verdict": "unknown", "reports": reports}
        book.judge(accused, cid, verdict)
        if verdict == "bad":
            _flag_peer(ctx, accused, f"served bytes for blob {cid} that do not hash to it (checked by the coordinator)")
    return {"verdict": verdict, "reports": reports}


def _fetch_and_check(url: str, cid: str, size: int) -> str:
    """``bad``: the peer answered 200 with bytes that are not ``cid`` (more bytes than the
    blob's own size included: refused at the byte past it); ``gone``: no usable answer
    (refused, 404, past the deadline); ``ok``."""
    hasher = BlobHasher()
    try:
        if not stream_from_peer(url, cid, hasher.update, max_bytes=size):
            return "gone"
    except TooLong:
        return "bad"
    return "ok" if hasher.size == size and hasher.matches(cid) else "bad"


def stream_from_peer(
    url: str, cid: str, take: Callable[[bytes], None], *, max_bytes: int, seconds: float | None = None
) -> bool:
    """``GET {url}/v1/blobs/{cid}`` from a worker's peer server, each block of the body
    handed to ``take`` (which raises to stop); True when the whole body came, False when
    there was no usable answer (refused, not 200, a transport error, or not done within
    ``seconds`` of the call, default :data:`FETCH_SECONDS`: a wall-clock deadline, however
    slowly the peer sends). A body
    longer than ``max_bytes`` (the blob's known size) is refused at that byte:
    :class:`~aitbc.storage.peer_fetch.TooLong`."""
    try:
        answer = bounded_get(
            peer_http(),
            f"{url}/v1/blobs/{cid}",
            seconds=FETCH_SECONDS if seconds is None else seconds,
            max_bytes=max_bytes,
            take=take,
        )
    except (httpx.HTTPError, TooSlow):
        return False
    return answer.status == 200


_http: httpx.Client | None = None  # one client for every fetch from a peer (see peer_http)
_http_lock = threading.Lock()
_http_warming = False


def peer_http() -> httpx.Client:
    """The client that fetches blobs from workers' peer servers, made once: making one
    loads its TLS trust store, tens of ms of CPU, which a client per model would cost every
    gossip round close, many times over."""
    global _http
    with _http_lock:
        if _http is None:
            _http = httpx.Client(timeout=httpx.Timeout(CHECK_TIMEOUT, connect=3.0), follow_redirects=False)
        return _http


def warm_peer_http() -> None:
    """Make that client in the background, once (a gossip run's first round trains
    meanwhile), so the first close does not wait for it: under load, making it is slow."""
    global _http_warming
    with _http_lock:
        if _http is not None or _http_warming:
            return
        _http_warming = True
    threading.Thread(target=peer_http, name="peer-http", daemon=True).start()


def _flag_peer(ctx: PeerChecks, worker: str, reason: str) -> None:
    with ctx.session() as s:
        offer = s.get(Offer, worker)
        if offer is not None:
            offer.flags += 1
        s.add(Flag(worker_id=worker, kind="bad_peer_blob", reason=reason, created_at=time.time()))
        s.commit()
