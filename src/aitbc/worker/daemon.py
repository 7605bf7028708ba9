"""The provider's worker: offer a GPU, heartbeat, pull a job, train, send signed updates.

One loop, top to bottom (:meth:`Worker.run`): register the offer; then ask for the job
(a long poll) and, when a round is open for it, train one round (:meth:`Worker.train_round`:
fetch the global model and the shard by CID, H local steps, compress, upload, report).
A heartbeat thread keeps the lease. If the coordinator goes away (restart, network),
every call retries with capped exponential back-off, and the worker carries on where the
coordinator's database says the run is.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import logging
import math
import queue
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aitbc.client import ApiError, CoordinatorClient, Unreachable
from aitbc.core.compression import ErrorFeedback, build_codec
from aitbc.core.options import parse_spec
from aitbc.errors import AitbcError, IntegrityError, UsageError
from aitbc.ledger.wallet import ensure_wallet
from aitbc.market.gpus import detect_device
from aitbc.storage.blobstore import BlobCache, LocalBlobStore
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.batches import data_seed
from aitbc.training.checkpoint import (
    Layout,
    flat_params,
    load_checkpoint_file,
    load_shard_file,
    param_layout,
    params_from_file,
    tensors_to_bytes,
)
from aitbc.training.data_spec import DataSpec
from aitbc.training.devices import resolve_devices
from aitbc.training.local import LocalConfig, LocalTrainer, eager_start, epoch_steps
from aitbc.training.models import build_model
from aitbc.training.parallel import Ranks
from aitbc.training.proof import Recorder, TrainState, boundaries, commit_every
from aitbc.worker.cheats import skip_half
from aitbc.worker.config import WorkerSettings
from aitbc.worker.gossip import GossipLoop
from aitbc.worker.metrics import WorkerMetrics
from aitbc.worker.peers import BlobServer, PeerFetcher, PeerUnavailable, parse_listen
from aitbc.worker.progress import Reporter

log = logging.getLogger("aitbc.worker")
# A global model of at most this many bytes comes inside the job poll's answer (the
# coordinator's own cap is 4 MiB): a small model's round starts without a second request.
INLINE_MODEL = 1 << 20
# An update blob of at most this many bytes goes inside its update message (base64, 4/3 the
# size: well within the coordinator's default 1 MiB JSON limit, a proof beside it): one
# request a round instead of PUT + POST. A larger one, or one the coordinator refuses
# inline (a lower JSON limit: 413 body_too_large), is uploaded first as before.
INLINE_UPDATE = 256 << 10


class ModelRefused(AitbcError):
    """A job's model this worker will not build (see :meth:`Worker._decline`)."""


@dataclass
class JobState:
    """What a worker keeps between the rounds of one job: its trainer (model, inner
    optimizer, batch order) and its codec (with the error-feedback residual)."""

    job_id: str
    trainer: LocalTrainer
    codec: Any
    rounds: int | None
    shard_cid: str = ""
    done: set[int] = field(default_factory=set)
    # the last rounds' committed states and the residual each began with (runs that verify
    # work), by round, each kept until its spot check is answered (overlap 2: the next
    # round's update may be sent while this one's spot check is still to answer)
    proofs: dict[int, tuple[Recorder, Any]] = field(default_factory=dict)
    # where the optimizer and residual stood when the round began (round, optimizer state,
    # residual): restored if the round's update is not recorded, so the next round starts
    # where the last recorded update ended, as a verifying coordinator requires
    round_start: tuple[int, dict[str, Any], Any] | None = None
    # its model's parameters as (name, shape) when they are its whole state (param_layout):
    # a checkpoint's flat parameters can then be read without the model
    layout: Layout | None = None


@dataclass
class Trained:
    """One round's update, trained and encoded, not yet sent."""

    key: tuple[Any, ...]  # the job view it was trained for (:func:`_ahead_key`)
    round: int
    blob: bytes
    body: dict[str, Any]  # POST /jobs/{id}/updates
    recorder: Recorder | None  # its committed states (runs that verify work)
    residual_in: Any = None
    # where the optimizer and residual stood when it began (JobState.round_start), if kept
    start: tuple[int, dict[str, Any], Any] | None = None
    # seconds spent on it: download (the global model fetched and loaded), compute (local
    # steps), encode (codec, CID, proof); upload is added as it is sent
    timings: dict[str, float] = field(default_factory=dict)


class _Threads:
    """Daemon threads that run the calls handed to them, each kept for the next call once
    done. Handing one a call costs the caller a queue put: a thread start would make the
    caller wait until the new thread holds the GIL (up to a switch interval, 5 ms, on the
    training thread's clock, twice a round with overlap 2: 4% of its time on the digits
    MLP). A call that finds none idle starts one more. Daemon threads: a stopping worker
    does not wait for a long poll."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1  # that one takes this call (or another queued before it)
        self._calls.put((future, call))
        if start:
            threading.Thread(target=self._serve, name=self._name, daemon=True).start()
        return future

    def _serve(self) -> None:
        while True:
            future, call = self._calls.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as e:  # noqa: BLE001 - not swallowed: the caller's result() raises it
                    future.set_exception(e)
            with self._lock:
                self._idle += 1


_SENDERS = _Threads("sender")  # sends, and the look-ahead's long polls


class _Sender:
    """One call on a daemon thread (:class:`_Threads`); :meth:`wait` returns its result or
    raises its error."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._future = _SENDERS.submit(call)

    def wait(self) -> Any:
        return self._future.result()

    def done(self) -> bool:
        return self._future.done()


class _Dropped(Exception):
    """An update not sent (overlap 2): the one queued before it was refused, and it began
    where that one ended."""


def _ahead_key(job: dict[str, Any]) -> tuple[Any, ...]:
    """What a round trained ahead must match in the job's view of that round to be sent:
    the job, the round, the shard and every training setting (the owner may change them)."""
    fields = ("job_id", "round", "shard_cid", "local_steps", "batch_size", "lr", "epochs", "inner_opt", "precision")
    return tuple(job.get(k) for k in (*fields, "compression", "error_feedback", "verify_rate", "seed"))


class Worker:
    def __init__(
        self,
        cfg: WorkerSettings,
        *,
        coordinator: str,
        home: Path,
        ca_cert: Path | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.cfg, self.coordinator, self.home = cfg, coordinator, home
        # first: a device this machine lacks is refused before anything is written
        self.devices = resolve_devices(cfg.device, cfg.gpus)  # one per data-parallel rank
        # then the coordinator's URL and CA (ftp://, no host, an unreadable --ca-cert): before the wallet too
        self.client = CoordinatorClient(coordinator, timeout=cfg.poll_seconds + 30, ca_cert=ca_cert)
        self.metrics = metrics or WorkerMetrics()  # served on --metrics-port by the caller, if asked
        self.wallet = self.client.wallet = ensure_wallet(home, cfg.wallet)
        self.cache = BlobCache(home / "worker-cache" / self.wallet.name, max_bytes=cfg.cache_bytes)
        self.device = detect_device(self.devices)
        self.ranks: Ranks | None = None  # ranks 1..N-1 with --gpus N (started by run())
        self.stop = threading.Event()
        self.job: JobState | None = None
        self.refused: set[str] = set()  # jobs whose model this machine will not build
        self.registered = threading.Event()
        self.reporter = Reporter(self._send_progress)  # progress goes out beside training, never in its way
        self._last_report: tuple[str, float] = ("", -math.inf)  # (job, when) of the last progress report
        # the last two global models, as files by CID (a round trained again reuses one; with
        # overlap the sender thread fetches the next while the main thread trains from the last);
        # any left by an earlier process go
        self._models = LocalBlobStore(home / "worker-models" / self.wallet.name, durable=False)  # a cache: no fsyncs
        shutil.rmtree(self._models.dir, ignore_errors=True)
        self._kept_models: list[str] = []
        self._models_lock = threading.Lock()
        # the next model as flat parameters, by (job, CID), read by the look-ahead thread
        # (overlap 2; at most two kept, each taken once, none past its job): the training
        # thread, done with a round, starts the next without a file read, each of whose
        # system calls may cost it a GIL switch interval while the sender threads run
        self._ready: dict[tuple[str, str], torch.Tensor] = {}
        self._ahead: Trained | None = None  # the next round, trained while this one closed (overlap)
        self._sent: tuple[str, int, str, bytes] | None = None  # (job, round, CID, blob) of the last update sent
        self._seen_job = ""  # the last job a view named (the long poll's ``known``)
        self._inline_updates = True  # update blobs up to INLINE_UPDATE go inside the update message
        # gossip: this worker's own published models (served by CID) and signed records
        self._gossip_store = LocalBlobStore(home / "worker-gossip" / self.wallet.name, durable=False)
        shutil.rmtree(self._gossip_store.dir, ignore_errors=True)
        self._gossip_kept: list[str] = []
        self.gossip_records: dict[tuple[str, int], dict[str, Any]] = {}
        self._gossip: GossipLoop | None = None
        # overlap 1: a round's update is sent by a thread of its own while the next round trains
        self._sending: tuple[dict[str, Any], Trained, _Sender] | None = None
        # overlap 2: updates being sent, in order (each waits for the one before it), and the
        # next job view being fetched, while the main thread trains on
        self._sends: list[tuple[dict[str, Any], Trained, _Sender]] = []
        self._look: _Sender | None = None
        # peer transport: fetch blobs from the workers the coordinator names; serve ours if --listen
        self.advertise = cfg.advertise_url()
        self.fetcher = PeerFetcher(timeout=cfg.peer_timeout_seconds)
        self.server: BlobServer | None = None
        self.attack = None
        if cfg.attack:
            import torch

            from aitbc.core.attacks import build_attack

            self.attack = build_attack(*parse_spec(cfg.attack, what="attack"))
            self.attack_gen = torch.Generator().manual_seed(0)
        _warm_up()

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> None:
        log.info(
            "worker %s (%s, training on %s x%d, advertised %s at %s AIT/round) -> %s",
            self.wallet.address,
            self.device.get("name"),
            self.devices[0],
            len(self.devices),
            self.cfg.gpu,
            self.cfg.price,
            self.coordinator,
        )
        if self.cfg.listen is not None:  # first: a port in use is an error before the offer is made
            host, port = parse_listen(self.cfg.listen)
            self.server = BlobServer(
                host,
                port,
                self._held,
                connections=self.cfg.peer_connections,
                corrupt=self.cfg.cheat == "bad-blobs",
                records=self._record,
                pace=self._gossip_pace,
            )
            log.info("serving held blobs to peers on %s:%d as %s", host, self.server.port, self.advertise)
        if len(self.devices) > 1:
            self.ranks = Ranks(self.devices, allow_code=self.cfg.allow_code)
        try:
            self._run()
        finally:
            if self.ranks is not None:
                self.ranks.close()
            if self.server is not None:
                self.server.close()
            self.fetcher.close()

    def _run(self) -> None:
        self._retry(self.register)
        hb = threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True)
        hb.start()
        while not self.stop.is_set():
            # with overlap, the sender thread asked for the next round after sending the last update
            # overlap 2: a thread of its own asked for it while the main thread trained
            view = self._settle_sent() or self._settle_look() or self._retry(self._poll)
            if view is None:
                break  # stopping
            job = view.get("job")
            self._seen_job = "" if job is None else job["job_id"]
            if job is not None and job["action"] == "train":
                self._expect(job)
            if job is None:
                if self.job is not None:
                    log.info("job %s released", self.job.job_id)
                    self.job, self._ahead, self._sends, self._look = None, None, [], None
                    with self._models_lock:
                        self._ready.clear()  # no copy of its models is held past the job
                    self.metrics.clear_job()
                continue
            if job["job_id"] in self.refused:
                self.stop.wait(self.cfg.poll_seconds)  # the run goes on without us; ask again later
                continue
            if (
                job["action"] == "wait"
                and job.get("mode") != "gossip"
                and (self.job is None or self.job.job_id != job["job_id"])
            ):
                try:  # a new job before its first round: its shard fetched, its model built, now
                    self._job_state(job)
                except ModelRefused as e:
                    self._decline(job, e)
                    continue
                except (ApiError, Unreachable, IntegrityError) as e:  # fetched again when it trains
                    log.info("job %s not prepared ahead: %s", job["job_id"], e)
            if job.get("challenge"):  # overlap 2: also in a view that says train (the next round's)
                try:
                    self._answer(job, job["challenge"])  # its reply was lost: the job view repeats it
                except ApiError as e:  # a refused upload (413, 429): asked again at the next poll
                    log.warning("spot check of round %s: %s", job["challenge"]["round"], e.detail)
            if job["action"] == "train":
                try:
                    if job.get("mode") == "gossip":
                        self.gossip(job)
                    else:
                        self.train_round(job)
                except ModelRefused as e:
                    self._decline(job, e)
                except ApiError as e:
                    self._refused(job, e)
                except (Unreachable, IntegrityError) as e:  # fetching the model or shard: ask again after a pause
                    log.warning("%s", e)
                    self.stop.wait(1.0)
        self.reporter.close()  # an update still being sent is left: a stopped worker's round is not recorded
        self.client.close()

    def _poll(self, after: int | None = None) -> dict[str, Any]:
        """The job's view: a long poll, answered when there is a round to train (a model of
        at most INLINE_MODEL bytes inside it: no second request before the round trains);
        ``after``: in a round past that one (overlap 2: the next model, not the updates this
        worker is still sending)."""
        # known: a new job is news at once, so its shard and model are ready before its first
        # round; the last job seen, not the last prepared (one not prepared, or a gossip job,
        # would answer every poll at once)
        params: dict[str, Any] = {"wait": self.cfg.poll_seconds, "inline": INLINE_MODEL, "known": self._seen_job}
        if after is not None:
            params["after"] = after
        return self.client.get(f"/workers/{self.wallet.address}/job", params=params, sign=True)

    def register(self) -> None:
        try:
            self.client.post(
                "/workers",
                {
                    "gpu": self.cfg.gpu,
                    "price": self.cfg.price,
                    "max_bond": self.cfg.max_bond,
                    "availability": self.cfg.availability,
                    "device": self.device,
                    **({"advertise": self.advertise} if self.advertise else {}),
                },
            )
        except ApiError as e:
            if e.code != "duplicate_registration":
                raise
            log.warning("%s; retrying", e.detail)
            raise Unreachable(e.detail) from None  # retried with back-off like an outage
        self.registered.set()
        log.info("registered offer %s", self.wallet.address)

    def _heartbeats(self) -> None:
        while not self.stop.wait(self.cfg.heartbeat_seconds):
            try:
                self.client.post("/workers/heartbeat", {}, timeout=self.cfg.heartbeat_seconds * 2)
            except ApiError as e:
                if e.code == "unknown_worker":  # the coordinator lost us (a fresh database)
                    try:
                        self.register()
                    except AitbcError as e2:
                        log.warning("re-register failed: %s", e2)
                else:
                    log.warning("heartbeat refused: %s", e.detail)
            except Unreachable:
                log.warning("heartbeat: coordinator unreachable; retrying")

    def _retry(self, call):
        """Run ``call`` until it answers; back off on an unreachable coordinator."""
        delay = self.cfg.backoff_seconds
        while not self.stop.is_set():
            try:
                return call()
            except Unreachable as e:
                log.warning("%s; retrying in %.1f s", e, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, self.cfg.max_backoff_seconds)
        return None

    def _decline(self, job: dict[str, Any], e: ModelRefused) -> None:
        """A job whose model this machine will not build (code its operator did not allow,
        a model past the bounds): nothing imported, nothing trained; the owner sees it in
        the job's status, and the round goes on without this worker (no update is no fault)."""
        log.error("job %s of %s refused: %s", job["job_id"], job["training_id"], e)
        self.refused.add(job["job_id"])
        self._progress(job, 0.0, None, 0.0, "refused: model not allowed")

    def _refused(self, job: dict[str, Any], e: ApiError) -> None:
        self.metrics.refusals.inc()
        if e.code in ("round_closed", "wrong_round", "not_accepting", "duplicate_update", "too_stale"):
            log.info("round %s of %s: %s", job["round"], job["training_id"], e.detail)
        elif e.code in ("job_not_active", "run_ended"):
            log.info("job %s over: %s", job["job_id"], e.detail)
            self.job = None
            self.metrics.clear_job()
        else:
            log.error("update refused (%s): %s", e.code, e.detail)

    # --- gossip -----------------------------------------------------------------------

    def gossip(self, job: dict[str, Any]) -> None:
        """Run a gossip job's rounds (:mod:`aitbc.worker.gossip`) until its last, or until
        the worker stops; the coordinator is needed only to start (or to refresh the roster)."""
        self.metrics.set_job(job["training_id"], job["job_id"], job["round"])
        state = self._job_state(job)
        loop = self._gossip
        if loop is None or loop.job_id != job["job_id"]:
            if loop is not None:
                loop.close()
            loop = self._gossip = GossipLoop(self, job, state)
        else:
            loop.refresh(job)
        loop.run()
        if loop.next > (job["rounds"] or 1) or loop.ended:
            self.stop.wait(self.cfg.poll_seconds if not loop.ended else 0)  # its records go out meanwhile

    def gossip_keep(self, cid: str, blob: bytes) -> None:
        """Keep one of this worker's published models (the last KEEP), served by CID."""
        from aitbc.worker.gossip import KEEP

        self._gossip_store.put_bytes(blob)
        with self._models_lock:
            self._gossip_kept.append(cid)
            while len(self._gossip_kept) > KEEP:
                (self._gossip_store.dir / self._gossip_kept.pop(0)).unlink(missing_ok=True)

    def _gossip_pace(self, job_id: str) -> str | None:
        """Where this worker's training of gossip job ``job_id`` is (the peer server's
        ``X-Aitbc-Pace`` header), or None when it is not training that job."""
        loop = self._gossip
        return loop.pace() if loop is not None and loop.job_id == job_id else None

    def _record(self, job_id: str, round: int | None) -> dict[str, Any] | None:
        """A signed record this worker published for ``job_id``: of ``round`` if kept, else its newest."""
        mine = {r: v for (j, r), v in list(self.gossip_records.items()) if j == job_id}
        if not mine:
            return None
        return mine.get(round) if round in mine else mine[max(mine)]

    # --- one round ------------------------------------------------------------------

    def train_round(self, job: dict[str, Any]) -> None:
        """Train the round the job's view asks an update for (``send_round``: the open
        round, or with ``overlap`` 2 the next one once this one's update is in), or take the
        one trained ahead for it, if it still fits (same job, round and settings), and send
        its update. In a run with ``overlap`` k, then train the next round at once from the
        view's model less this worker's own updates not yet in it (an eager start: where its
        last round ended, moved by what the global model gained since), up to k rounds
        past the view's model."""
        t0 = time.perf_counter()
        self.metrics.set_job(job["training_id"], job["job_id"], job["round"])
        state = self._job_state(job)
        if int(job.get("overlap") or 0) >= 2:
            self._train_two_ahead(job, state, t0)
            return
        n = job["round"]
        done = self._take_ahead(job, state, n)
        if done is None:
            done = self._train(job, state, n)
        chain = [(done.body["cid"], done.blob)]
        if not (job.get("overlap") and n < (job["rounds"] or 1)):
            self._submit(job, state, done, t0)
            return
        # Overlap 1: this update goes out from the sender thread while the next round trains
        # here, from the view's model (the newest there is) less this update as the
        # coordinator decodes it; that round's update names both (base_cid, prior_cid). If
        # this one is refused, the next is dropped (_settle_sent).
        self.reporter.drain()  # no progress report of this round may land after its update
        self._sending = (job, done, _Sender(lambda: self._send_and_look(job, state, done, t0)))
        self._ahead = self._train(job, state, n + 1, priors=chain)

    def _train_two_ahead(self, job: dict[str, Any], state: JobState, t0: float) -> None:
        """Overlap 2: send the update the view asks for (``send_round``: the open round's,
        or the next one's once that is in; later than the updates still being sent), the
        one trained ahead for it if it still fits, queued behind those being sent; then
        train the round after it at once from the view's model less this worker's updates
        not in it (this one, and the open round's: a chain of priors). The main thread
        never waits for a send, only for the model it trains from (:meth:`_poll` ``after``)."""
        self._reap_sends()
        m = job["round"]
        n = int(job.get("send_round") or m)
        # the view may not have seen the updates sent or being sent since it was read
        sent = [d.round for j, d, _ in self._sends if j["job_id"] == job["job_id"]]
        if self._sent is not None and self._sent[0] == job["job_id"]:
            sent.append(self._sent[1])
        if sent and n <= max(sent):
            n = max(sent) + 1
        if n > m + 1:  # nothing to send before round m closes: the oldest send first, then look again
            self._settle_sends(1)
            return
        done = self._take_ahead(job, state, n)
        if done is None:  # none trained ahead (the first round, a restart, a dropped one)
            mine = self._mine_of(job, n - 1) if n > m else None
            done = self._train(job, state, n, priors=[mine] if mine else [])
        self.reporter.drain()  # no progress report of this round may land after its update
        before = self._sends[-1][2] if self._sends else None
        self._sends.append((job, done, _Sender(lambda: self._send_after(before, job, state, done, t0))))
        chain = [(done.body["cid"], done.blob)]
        if n > m:  # the next round starts past this worker's update of the open round too
            mine = self._mine_of(job, n - 1)
            chain = chain + [mine] if mine is not None else []
        if n >= (job["rounds"] or 1) or not chain:  # the run's last update, or no eager start to make
            self._settle_sends()
            return
        # round n+1 goes out once round n is open: its view and model are fetched meanwhile
        self._look = _Sender(lambda: self._look_past(n - 1))
        self._ahead = self._train(job, state, n + 1, priors=chain)

    def _look_past(self, after: int | None) -> dict[str, Any] | None:
        """On a thread of its own: the job's view once there is a round to train (overlap 2:
        once round ``after`` has closed), its model fetched, so the main thread, done
        training ahead, finds both at hand. None: the main thread asks itself."""
        try:
            view = self._retry(lambda: self._poll(after))
            nxt = (view or {}).get("job")
            if nxt and nxt["action"] == "train" and nxt.get("global_model_cid"):
                self._expect(nxt)
                cid = nxt["global_model_cid"]
                path = self._global_model(cid, nxt.get("model_peers") or [], inline=nxt.get("global_model"))
                state = self.job
                if state is not None and state.job_id == nxt["job_id"] and state.layout is not None:
                    params = params_from_file(path, state.layout)
                    with self._models_lock:
                        self._ready[(state.job_id, cid)] = params
                        while len(self._ready) > 2:
                            self._ready.pop(next(iter(self._ready)))  # the oldest
            return view
        except (ApiError, Unreachable, IntegrityError, OSError) as e:  # the main thread polls and downloads again
            log.info("next round not fetched ahead: %s", e)
            return None

    def _settle_look(self) -> dict[str, Any] | None:
        """The view the look-ahead thread fetched (overlap 2), if one is under way."""
        look, self._look = self._look, None
        return None if look is None else look.wait()

    def _send_after(
        self, before: _Sender | None, job: dict[str, Any], state: JobState, done: Trained, t0: float
    ) -> None:
        """A sender thread (overlap 2): once the update queued before this one is sent, send
        this one; if that one was refused, this one is not sent (it began where that ended)."""
        if before is not None:
            try:
                before.wait()
            except ApiError as e:
                if e.code != "duplicate_update":
                    raise _Dropped(f"round {done.round} not sent: round {done.round - 1}'s was refused") from None
            except BaseException:  # noqa: BLE001 - dropped, or stopping: this one is not sent either
                raise _Dropped(f"round {done.round} not sent") from None
        self._submit(job, state, done, t0, drained=True)

    def _reap_sends(self) -> None:
        """Settle the sends that have finished, oldest first, without waiting."""
        while self._sends and self._sends[0][2].done():
            self._settle_sends(1)

    def _settle_sends(self, count: int | None = None) -> None:
        """Wait for the oldest ``count`` sends (all: None) in order. A refused update drops
        the round trained ahead and every update queued after it (each began where the one
        before ended), and the optimizer and residual go back to where the first that was
        not recorded began, as if none of them trained."""
        while self._sends and (count is None or count > 0):
            count = None if count is None else count - 1
            job, done, sender = self._sends.pop(0)
            try:
                sender.wait()
            except ApiError as e:
                if e.code == "duplicate_update":  # recorded before (its reply was lost): the chain goes on
                    self._note_sent(job, done)
                    continue
                later = [d for _, d, _ in self._sends]
                for _, _, s in self._sends:  # each raises _Dropped at once
                    with contextlib.suppress(BaseException):
                        s.wait()
                self._sends = []
                self._drop_after_refusal(job, e, done, later)
                self._refused(job, e)
                return
            except _Dropped:
                continue
            except (Unreachable, IntegrityError) as e:  # stopping (sends are retried through outages)
                log.warning("%s", e)

    def _note_sent(self, job: dict[str, Any], done: Trained) -> None:
        """``done`` is recorded: the last update sent, the next rounds' eager start names it."""
        self._sent = (job["job_id"], done.round, done.body["cid"], done.blob)

    def _drop_after_refusal(
        self, job: dict[str, Any], e: ApiError, done: Trained, later: list[Trained] | None = None
    ) -> None:
        """``done`` was refused (not a duplicate): the round trained ahead goes, as do
        ``later``, the updates queued after it (each began where the one before ended), and
        the optimizer and residual go back to where the first of them not recorded began (an
        update recorded as rejected: the chain goes on from it)."""
        ahead, self._ahead = self._ahead, None
        state = self.job
        if state is None or state.job_id != job["job_id"]:
            return
        dropped = [d for d in (done, *(later or []), ahead) if d is not None]
        first = dropped[1:] if e.code == "update_rejected" else dropped
        if first:
            self._restore_round_start(state, first[0].start)

    def _mine_of(self, job: dict[str, Any], round: int) -> tuple[str, bytes] | None:
        """This worker's own update of ``round`` for this job (CID, blob): the last one
        recorded, or one being sent (overlap 2); else None."""
        for j, d, _ in reversed(self._sends):
            if j["job_id"] == job["job_id"] and d.round == round:
                return d.body["cid"], d.blob
        sent = self._sent
        if sent is None or sent[0] != job["job_id"] or sent[1] != round:
            return None
        return sent[2], sent[3]

    def _send_and_look(self, job: dict[str, Any], state: JobState, done: Trained, t0: float) -> dict[str, Any] | None:
        """The sender thread: send the round's update, then wait for the next round to open
        and fetch its model, so the main thread, done training ahead, finds both at hand.
        Returns the job's view (None: the main thread asks itself)."""
        self._submit(job, state, done, t0, drained=True)
        return self._look_past(None)

    def _settle_sent(self) -> dict[str, Any] | None:
        """Wait for the update the sender thread is sending and return the job's view it
        fetched after it. If the update was refused, the round trained ahead after it goes
        too (it began where that one ended), and the optimizer and residual go back to where
        that update began, as if it never trained."""
        if self._sending is None:
            return None
        job, done, sender = self._sending
        self._sending = None
        try:
            return sender.wait()
        except ApiError as e:
            if e.code == "duplicate_update":  # recorded before (its reply was lost): the chain goes on from it
                self._note_sent(job, done)
            else:
                self._drop_after_refusal(job, e, done)
            self._refused(job, e)
        except (Unreachable, IntegrityError) as e:  # stopping (sends are retried through outages)
            log.warning("%s", e)
        return None

    def _take_ahead(self, job: dict[str, Any], state: JobState, round: int) -> Trained | None:
        """The round trained ahead for ``job`` (its update not yet sent), if the job's view
        still asks for exactly it (``round``, the view's ``send_round``); otherwise it is
        dropped and the optimizer and residual go back to where the last sent update left
        them."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        if ahead.key == _ahead_key({**job, "round": round}):
            return ahead
        log.info("round %d trained ahead is dropped: the job now asks for round %d", ahead.round, round)
        self._restore_round_start(state, ahead.start)
        return None

    def _train(
        self, job: dict[str, Any], state: JobState, round: int, priors: list[tuple[str, bytes]] | None = None
    ) -> Trained:
        """Round ``round``'s update from the job view's global model: H local steps, the
        codec, the proof if asked. A ``round`` past the view's is trained ahead (overlap):
        from the newest model there is (its update's ``base_cid``), less ``priors``, this
        worker's updates (CID, blob; newest first) of the rounds since that model as their
        blobs decode (the newest is ``prior_cid``, each names the one before): an eager
        start, where its last round ended moved by what the global model gained since, so
        the coordinator counts the update in full (``aitbc.coordinator.rounds.workers.update_prior``)."""
        base = job["global_model_cid"]
        ahead = round != job["round"]
        steps = state.trainer.cfg.steps  # local_steps, or epochs over this shard (see _steps)
        t_download = time.perf_counter()
        with self._models_lock:  # read ahead by the look-ahead thread (overlap 2), if it was
            start = self._ready.pop((state.job_id, base), None)  # used once: not held on
        if start is None:
            model = self._global_model(base, job.get("model_peers") or [], inline=job.get("global_model"))
            load_checkpoint_file(state.trainer.model, model)
            start = flat_params(state.trainer.model).cpu()  # (d,)
        download = time.perf_counter() - t_download
        if ahead and priors:
            start = eager_start(start, [blob for _, blob in priors])
        every = max(1, min(self.cfg.progress_every, steps // 4 or 1))
        job_id = job["job_id"]

        def report(step: int, loss: float) -> None:
            # The first step opens the round's reports (its loss is the job's own from then on),
            # then every `every` steps; at most one report per progress_seconds, except the
            # job's first (a round shorter than that, a small model's, reports its first step
            # once in progress_seconds: each report is a request the coordinator serves while
            # the workers train). The last step goes with the update itself: an owner who sees
            # the job complete reads its final step.
            if self.cfg.step_delay:
                time.sleep(self.cfg.step_delay)
            self.metrics.steps.inc()
            now = time.perf_counter()
            self.metrics.steps_per_second.set(step / max(now - t_compute, 1e-9))
            last_job, last_at = self._last_report
            due = last_job != job_id or now - last_at >= self.cfg.progress_seconds
            if due and (step == 1 or (step % every == 0 and step < steps)):
                self._last_report = (job_id, now)
                body = self._progress_body(job, 100.0 * step / steps, loss, self._epoch(state), "training", step=step)
                self.reporter.report(job["job_id"], body)

        verify = float(job.get("verify_rate") or 0.0) > 0
        overlap = bool(job.get("overlap"))
        if verify or overlap:  # a round sent while the next trains, or trained ahead, may be dropped
            self._mark_round_start(state, round)
        t_compute = time.perf_counter()
        recorder = Recorder(steps, sink=self._spill(round, start.numel(), steps)) if verify else None
        if self.cfg.cheat == "skip-half":
            res, recorder = skip_half(state.trainer, start, round, report)
        else:
            if self.ranks is not None:  # the other ranks train this round beside this one
                try:
                    self.ranks.round(state.trainer, start, round)
                    res = state.trainer.train_round(start, on_step=report, round=round, recorder=recorder)
                except RuntimeError as e:  # a collective failed: a rank is gone; the worker stops
                    raise self.ranks.failure(e) from None
            else:
                res = state.trainer.train_round(start, on_step=report, round=round, recorder=recorder)
        t_encode = time.perf_counter()
        feedback = isinstance(state.codec, ErrorFeedback)
        residual_in = None
        if feedback:
            residual_in = (
                state.codec.residual.clone() if state.codec.residual is not None else torch.zeros(start.numel())
            )
        blob = state.codec.encode(res.delta if self.attack is None else self._craft(res.delta))
        proof = None
        if recorder is not None:
            cfg = state.trainer.cfg
            after = state.codec.residual if feedback else None
            proof = recorder.commitment(
                residual_in,
                after,
                batch_size=cfg.batch_size,
                lr=cfg.lr,
                data_seed=data_seed(job["seed"], round),
                threads=torch.get_num_threads(),  # the verifier re-runs on as many: bit-exact on like hardware
            ).to_json()
        cid = cid_of_bytes(blob)
        t_done = time.perf_counter()
        compute = t_done - t_compute  # the update's compute_seconds: local steps and encoding
        body = {
            "round": round,
            "cid": cid,
            "train_loss": res.loss,
            "train_accuracy": res.accuracy,
            "steps": res.steps,
            "compute_seconds": compute,
            "shard_cid": state.shard_cid,
            "epoch": res.epoch,
        }
        if ahead or job.get("mode") == "async":  # async: the version it trained from sets its weight
            body["base_cid"] = base
        if ahead and priors:
            body["prior_cid"] = priors[0][0]
        if proof is not None:
            body["proof"] = proof
        return Trained(
            key=_ahead_key({**job, "round": round}),
            round=round,
            blob=blob,
            body=body,
            recorder=recorder,
            residual_in=residual_in,
            start=state.round_start if verify or overlap else None,
            timings={"download": download, "compute": t_encode - t_compute, "encode": t_done - t_encode},
        )

    def _submit(self, job: dict[str, Any], state: JobState, done: Trained, t0: float, *, drained: bool = False) -> None:
        """Upload the round's update blob and send the signed message that names it.
        ``drained``: the caller drained the progress reports (the sender thread: the
        reports now waiting are the next round's)."""
        if done.recorder is not None:  # kept until its spot check
            state.proofs[done.round] = (done.recorder, done.residual_in)
            for old in [r for r in list(state.proofs) if r < done.round - 2]:  # a copy: _answer pops too
                state.proofs.pop(old, None)
        blob, body, cid = done.blob, done.body, done.body["cid"]
        # The round's work is done: the upload is retried through an outage, never retrained.
        t_upload = time.perf_counter()
        inline = len(blob) <= INLINE_UPDATE and self._inline_updates
        if not inline:
            self._retry(lambda: self.client.put_blob(cid, blob))
        self.metrics.bytes.labels("up").inc(len(blob))
        if not drained:
            self.reporter.drain()  # no progress report of this round may land after its update
        try:
            if inline:
                reply = self._post_inline(job, body, blob)
            else:
                reply = self._post_update(job, body)
        except ApiError as e:
            if not drained and done.recorder is not None and e.code not in ("update_rejected", "duplicate_update"):
                self._restore_round_start(state)  # not recorded: as if never trained
            raise
        done.timings["upload"] = time.perf_counter() - t_upload  # the blob and the message naming it
        for phase, seconds in done.timings.items():
            self.metrics.seconds.labels(phase).inc(seconds)
        state.done.add(done.round)
        self._note_sent(job, done)
        if reply and reply.get("challenge"):
            self._answer(job, reply["challenge"])
        compute = body["compute_seconds"]
        self.metrics.rounds.inc()
        self.metrics.steps_per_second.set(body["steps"] / max(compute, 1e-9))  # compute time only
        t = done.timings
        log.info(
            "round %d/%d of %s: %d steps, loss %.4f, update %d bytes, %.2f s (%.2f s computing; "
            "download %.3f s, compute %.3f s, encode %.3f s, upload %.3f s)%s",
            done.round,
            job["rounds"] or 1,
            job["training_id"],
            body["steps"],
            body["train_loss"],
            len(blob),
            time.perf_counter() - t0,
            compute,
            t["download"],
            t["compute"],
            t["encode"],
            t["upload"],
            " trained ahead" if "base_cid" in body and job.get("mode") != "async" else "",
        )

    def _post_inline(self, job: dict[str, Any], body: dict[str, Any], blob: bytes) -> Any:
        """Send the update with its blob inside the message (one request). A coordinator
        that will not take it so (its JSON limit is lower: 413 ``body_too_large``; an older
        one: 422 ``invalid_request`` naming ``blob``) gets the blob uploaded first, as
        before, from then on."""
        try:
            return self._post_update(job, {**body, "blob": base64.b64encode(blob).decode()})
        except ApiError as e:
            refused = e.code == "body_too_large" or (e.code == "invalid_request" and "blob" in e.detail)
            if not refused:
                raise
            log.info("coordinator takes no inline update (%s): uploading update blobs first", e.detail)
            self._inline_updates = False
        self._retry(lambda: self.client.put_blob(body["cid"], blob))
        return self._post_update(job, body)

    def _post_update(self, job: dict[str, Any], body: dict[str, Any]) -> Any:
        """Send the message naming the update. Async: while the coordinator applies a
        buffer (a moment) it asks for the update again; it then joins the next buffer."""
        while True:
            try:
                return self._retry(lambda: self.client.post(f"/jobs/{job['job_id']}/updates", body))
            except ApiError as e:
                if e.code != "buffer_applying" or self.stop.wait(0.05):
                    raise

    @staticmethod
    def _mark_round_start(state: JobState, round: int) -> None:
        """Remember where this round starts; training a round again (its update was
        dropped, e.g. the owner asked for it again) starts from there once more."""
        if state.round_start is not None and state.round_start[0] == round:
            Worker._restore_round_start(state)
            return
        codec = state.codec
        residual = codec.residual.clone() if isinstance(codec, ErrorFeedback) and codec.residual is not None else None
        state.round_start = (round, copy.deepcopy(state.trainer.opt.state_dict()), residual)

    @staticmethod
    def _restore_round_start(state: JobState, start: tuple[int, dict[str, Any], Any] | None = None) -> None:
        """Put the optimizer and residual back to ``start`` (default: the round's mark)."""
        start = start or state.round_start
        if start is None:
            return
        state.round_start = start
        _, optim, residual = start
        state.trainer.opt.load_state_dict(copy.deepcopy(optim))
        for group in state.trainer.opt.param_groups:  # the state, not the settings: the job's lr now
            group["lr"] = state.trainer.cfg.lr
        if isinstance(state.codec, ErrorFeedback):
            state.codec.residual = None if residual is None else residual.clone()

    def _answer(self, job: dict[str, Any], challenge: dict[str, Any]) -> None:
        """Reveal the states the spot check of our update asks for: each uploaded as a blob,
        then named to the coordinator, which re-runs the intervals between them."""
        state = self.job
        kept_proof = None if state is None or state.job_id != job["job_id"] else state.proofs.get(challenge["round"])
        if state is None or kept_proof is None:
            log.warning("spot check of round %s: its states are no longer kept", challenge["round"])
            return
        recorder, residual_in = kept_proof
        steps = boundaries(recorder.steps, recorder.every)
        cids: dict[str, str] = {}
        for b in challenge["boundaries"]:
            step = steps[int(b)]
            kept = recorder.states.get(step)
            data = (
                kept.to_bytes()
                if kept is not None
                else (self._proofs / str(challenge["round"]) / f"{step}.safetensors").read_bytes()
            )
            cid = cid_of_bytes(data)
            self._retry(lambda cid=cid, data=data: self.client.put_blob(cid, data))
            cids[str(b)] = cid
        body: dict[str, Any] = {"round": challenge["round"], "states": cids}
        if challenge.get("residual"):
            data = tensors_to_bytes({"residual": residual_in})
            body["residual"] = cid_of_bytes(data)
            self._retry(lambda: self.client.put_blob(body["residual"], data))
        try:
            self._retry(lambda: self.client.post(f"/jobs/{job['job_id']}/proofs", body))
            log.info("round %s: revealed %d states for its spot check", challenge["round"], len(cids))
        except ApiError as e:
            log.warning("spot check of round %s: %s", challenge["round"], e.detail)
        state.proofs.pop(challenge["round"], None)  # answered once: the states go

    @property
    def _proofs(self) -> Path:
        return self.home / "worker-proofs" / self.wallet.name

    def _spill(self, round: int, d: int, steps: int) -> Callable[[TrainState], None] | None:
        """Where a round's committed states go: memory while they are small, else files
        under ``HOME/worker-proofs/<wallet>/<round>`` (the rounds before the last two go: with
        overlap the last ones' spot checks may still be answered while this one trains)."""
        per_state = 3 * 4 * d  # float32 parameters and, at most, two moments (Adam)
        if per_state * len(boundaries(steps, commit_every(steps))) <= self.cfg.proof_memory_bytes:
            return None
        folder = self._proofs / str(round)
        for old in self._proofs.glob("*") if self._proofs.is_dir() else ():
            if not old.name.isdigit() or int(old.name) < round - 2 or int(old.name) == round:
                shutil.rmtree(old, ignore_errors=True)
        folder.mkdir(parents=True)

        def write(s: TrainState) -> None:
            tmp = folder / f"{s.step}.tmp"
            tmp.write_bytes(s.to_bytes())
            tmp.replace(folder / f"{s.step}.safetensors")

        return write

    @staticmethod
    def _epoch(state: JobState) -> float:
        return state.trainer.samples_seen / state.trainer.x.shape[0]

    @staticmethod
    def _steps(job: dict[str, Any], samples: int) -> int:
        """The round's local steps: ``epochs`` passes over this shard if the owner set
        them (the shard's own size decides the steps), else ``local_steps``."""
        epochs = job.get("epochs")
        return epoch_steps(int(epochs), samples, int(job["batch_size"])) if epochs else int(job["local_steps"])

    def _craft(self, own):
        """Testing only (``--attack``): what a Byzantine worker sends instead of its update."""
        from aitbc.core.attacks import AttackView

        assert self.attack is not None  # called only when one was given
        view = AttackView(
            own=own, honest=own.new_zeros(0, own.numel()), previous=None, n=1, f=1, generator=self.attack_gen
        )
        return self.attack.craft(view)

    def _progress(self, job: dict[str, Any], pct: float, loss: float | None, epoch: float, status: str) -> None:
        """Report on this job now (outside a round's training: see :class:`Reporter`)."""
        self._send_progress(job["job_id"], self._progress_body(job, pct, loss, epoch, status))

    @staticmethod
    def _progress_body(
        job: dict[str, Any], pct: float, loss: float | None, epoch: float, status: str, *, step: int | None = None
    ) -> dict[str, Any]:
        """A report on this round: ``pct`` of its steps done (this job's work, not the run's)."""
        body: dict[str, Any] = {"progress": min(100.0, pct), "loss": loss, "epoch": epoch, "status": status}
        if job.get("round"):
            body["round"] = job["round"]
        if step is not None:
            body["step"] = step
        return body

    def _send_progress(self, job_id: str, body: dict[str, Any]) -> None:
        try:
            self.client.post(f"/jobs/{job_id}/progress", body)
        except ApiError as e:
            log.info("progress refused: %s", e.detail)
        except Unreachable as e:  # progress is advisory: not retried; the update itself is
            log.debug("progress report not delivered: %s", e)

    def _job_state(self, job: dict[str, Any]) -> JobState:
        if self.job is not None and self.job.job_id == job["job_id"]:
            # The owner may have changed the job's steps, batch size or lr, or split its shard.
            data = None
            if job["shard_cid"] != self.job.shard_cid:
                data = self._labels(load_shard_file(self._blob(job["shard_cid"])), job)
                self.job.shard_cid = job["shard_cid"]
                log.info("job %s: now on shard %d (%d samples)", job["job_id"], job["shard_index"], data[0].shape[0])
            samples = int((data[0] if data is not None else self.job.trainer.x).shape[0])
            self.job.trainer.reconfigure(
                steps=self._steps(job, samples), batch_size=job["batch_size"], lr=job["lr"], data=data
            )
            return self.job
        spec_d = job["data_spec"]
        spec = DataSpec(spec_d["task"], tuple(spec_d["input_shape"]), int(spec_d["num_classes"]))
        try:  # before any download: code this operator did not allow is never imported
            model = build_model(job["model_type"], spec, job["model_options"], allow_code=self.cfg.allow_code)
        except UsageError as e:
            raise ModelRefused(str(e)) from None
        x, y = self._labels(load_shard_file(self._blob(job["shard_cid"])), job)
        cfg = LocalConfig(
            steps=self._steps(job, int(x.shape[0])),
            batch_size=job["batch_size"],
            optimizer=job["inner_opt"],
            lr=job["lr"],
            precision=job.get("precision") or "fp32",  # a coordinator before bf16 sends none
        )
        if self.ranks is not None:
            self.ranks.job(job["model_type"], job["model_options"], spec, cfg, job["seed"], x, y)
        group = self.ranks.group if self.ranks is not None else None
        trainer = LocalTrainer(model, x, y, cfg, seed=job["seed"], device=self.devices[0], group=group)
        name, opts = parse_spec(job["compression"], what="codec")
        codec = build_codec(
            name, opts, layout=[tuple(p.shape) for p in model.parameters()], error_feedback=bool(job["error_feedback"])
        )
        self.job = JobState(
            job_id=job["job_id"],
            trainer=trainer,
            codec=codec,
            rounds=job["rounds"],
            shard_cid=job["shard_cid"],
            layout=param_layout(model),
        )
        log.info(
            "job %s: shard %d (%d samples) of %s", job["job_id"], job["shard_index"], x.shape[0], job["training_id"]
        )
        return self.job

    def _labels(self, shard: tuple[Any, Any], job: dict[str, Any]) -> tuple[Any, Any]:
        x, y = shard
        if self.attack is not None and self.attack.flips_labels:
            y = int(job["data_spec"]["num_classes"]) - 1 - y  # label-flip poisons the worker's own data
        return x, y

    def _blob(self, cid: str) -> Path:
        """A blob by CID from the local cache (LRU, capped at ``cache_bytes``), else streamed
        into it from a peer that holds it (``GET /v1/blobs/{cid}/holders``) or the
        coordinator (verified both ways): the path of its file."""
        path = self.cache.get_path(cid, self._fetch_shard)
        self._announce()
        return path

    def _fetch_shard(self, cid: str, store: LocalBlobStore) -> None:
        try:
            peers = self.client.get(f"/blobs/{cid}/holders", params={"exclude": self.wallet.address})["data"]
        except (ApiError, Unreachable) as e:  # an older coordinator, or an outage: the coordinator's copy
            log.debug("holders of %s: %s", cid, e)
            peers = []
        self._fetch(cid, store, peers)

    def _global_model(self, cid: str, peers: list[dict[str, str]] | None = None, *, inline: str | None = None) -> Path:
        """The round's global model, as a file: one of the last two downloaded if it has this
        CID (a round trained again, a skipped round; with overlap, the next round's model
        fetched by the sender thread), else the copy the job view carried (``inline``,
        base64) if it hashes to the CID, else streamed to disk from one of ``peers`` (the job
        view's ``model_peers``) or the coordinator, checked against its CID as it arrives (an
        ``IntegrityError`` if the coordinator's bytes do not hash to it). A model is used
        once or twice and replaced every round: the cache is for shards."""
        try:
            with self._models_lock:
                if cid in self._kept_models and self._models.has(cid):
                    return self._models.dir / cid
            self._models.dir.mkdir(parents=True, exist_ok=True)
            if not (inline and self._take_inline(cid, inline)):
                self._fetch(cid, self._models, peers or [])
            with self._models_lock:
                if cid not in self._kept_models:
                    self._kept_models.append(cid)
                while len(self._kept_models) > 2:
                    old = self._kept_models.pop(0)  # the oldest
                    (self._models.dir / old).unlink(missing_ok=True)
        finally:
            if self.server is not None:
                self.server.done(cid)  # peers waiting for it (this worker was a seed) look again
        self._announce()
        return self._models.dir / cid

    def _take_inline(self, cid: str, inline: str) -> bool:
        """Store the model the job view carried (base64) under ``cid`` if its bytes hash to
        it; False, storing nothing, if they do not (or are not base64): it is fetched by CID."""
        try:
            data = base64.b64decode(inline, validate=True)
            self._models.put_blob(cid, data)  # checked against the CID, as a download is
        except (ValueError, AitbcError) as e:  # binascii.Error is a ValueError; IntegrityError an AitbcError
            log.warning("the job view's copy of model %s is not usable (%s); fetching it by its CID", cid, e)
            return False
        self.metrics.bytes.labels("inline").inc(len(data))
        return True

    # --- peer transport -------------------------------------------------------------------

    def _fetch(self, cid: str, store: LocalBlobStore, peers: list[dict[str, str]]) -> None:
        """``cid`` into ``store`` from the first of ``peers`` that serves it whole and right,
        else from the coordinator. A peer whose bytes do not hash to ``cid`` is reported."""
        for peer in peers:
            try:
                size = self.fetcher.download(peer["url"], cid, store)
            except PeerUnavailable as e:
                log.info("%s; next", e)
                continue
            except IntegrityError as e:
                log.warning("%s; reported, next", e)
                self._report(cid, peer["worker"])
                continue
            except AitbcError as e:  # over the store's size limit
                log.warning("peer %s: %s; next", peer["url"], e)
                continue
            self.metrics.bytes.labels("peer").inc(size)
            log.debug("blob %s (%d bytes) from peer %s", cid, size, peer["url"])
            return
        self._download_into(cid, store)

    def _held(self, cid: str) -> Path | None:
        """The file of a blob this worker holds (a kept model, a cached shard), for its peers."""
        with self._models_lock:
            if cid in self._kept_models and (self._models.dir / cid).is_file():
                return self._models.dir / cid
            if cid in self._gossip_kept and (self._gossip_store.dir / cid).is_file():
                return self._gossip_store.dir / cid
        path = self.cache.store.dir / cid
        return path if path.is_file() else None

    def _expect(self, job: dict[str, Any]) -> None:
        """A round to train: this worker is about to fetch its model (peers that ask for it
        meanwhile wait for it: the coordinator may have named this worker a seed)."""
        if self.server is not None and job.get("global_model_cid"):
            self.server.expect(job["global_model_cid"])

    def _announce(self) -> None:
        """Tell the coordinator which blobs this worker serves now (a small signed POST
        after each fetch); nothing if it serves none. Advisory: a failure is logged."""
        if self.server is None or self.advertise is None:
            return
        with self._models_lock:
            cids = list(self._kept_models) + self._gossip_kept[::-1][:8]  # gossip: its newest models
        if self.job is not None and self.job.shard_cid:
            cids.append(self.job.shard_cid)
        try:
            self.client.post("/workers/holdings", {"advertise": self.advertise, "cids": cids[:16]})
        except (ApiError, Unreachable) as e:
            log.info("holdings not announced: %s", e)

    def _report(self, cid: str, peer: str) -> None:
        """Report a peer that served bytes not matching ``cid`` (signed; the coordinator
        checks for itself before it flags anyone), on a thread of its own."""

        def send() -> None:
            try:
                reply = self.client.post(f"/blobs/{cid}/bad-peer", {"peer": peer})
                log.warning("reported peer %s for blob %s: coordinator's check %s", peer, cid, reply["verdict"])
            except (ApiError, Unreachable) as e:
                log.warning("report of peer %s not delivered: %s", peer, e)

        threading.Thread(target=send, name="report", daemon=True).start()

    def _download_into(self, cid: str, store: LocalBlobStore) -> None:
        size = self.client.download_blob(cid, store)
        self.metrics.bytes.labels("down").inc(size)


def _warm_up() -> None:
    """Pay torch's lazy imports now (the first optimizer pulls in torch._dynamo, ~1 s),
    not inside the first round's clock."""
    import torch

    p = torch.zeros(1, requires_grad=True)
    torch.optim.AdamW([p]).step()


def run_worker(cfg: WorkerSettings, *, coordinator: str, home: Path) -> None:
    Worker(cfg, coordinator=coordinator, home=home).run()
