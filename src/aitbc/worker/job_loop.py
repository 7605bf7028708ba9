"""The worker's job loop: register the offer, keep the lease with heartbeats, ask for the
job (a long poll) and, when a round is open for it, train it (:class:`SendPipeline`) or run
its gossip rounds (:class:`GossipLoop`); until the worker stops.

If the coordinator goes away (restart, network), every call retries with capped
exponential back-off, and the worker carries on where the coordinator's database says the
run is.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from aitbc.client import ApiError, Unreachable
from aitbc.errors import AitbcError, IntegrityError
from aitbc.ledger.wallet import Wallet
from aitbc.replies.base import JsonObject
from aitbc.replies.chain import EvmChain
from aitbc.replies.jobs import BondRequired, JobOrder, JobPoll
from aitbc.run_mode import RunMode
from aitbc.units import parse_price
from aitbc.worker.calls import CoordinatorCalls
from aitbc.worker.chain_bonds import WorkerChain
from aitbc.worker.config import WorkerSettings
from aitbc.worker.fetcher import ModelFetcher
from aitbc.worker.gossip import GossipLoop, GossipParts
from aitbc.worker.gossip_publish import PublishedRecords
from aitbc.worker.metrics import WorkerMetrics
from aitbc.worker.model_cap import ModelTooLarge
from aitbc.worker.progress import ProgressReport, Reporter, progress_body
from aitbc.worker.records import BadShard, JobState, ModelRefused
from aitbc.worker.round_training import RoundTrainer
from aitbc.worker.sending import SendPipeline
from aitbc.worker.spot_checks import SpotChecks

log = logging.getLogger("aitbc.worker")

# A global model of at most this many bytes comes inside the job poll's answer (the
# coordinator's own cap is 4 MiB): a small model's round starts without a second request.
INLINE_MODEL = 1 << 20


class JobLoop:
    """See the module's docstring. :meth:`_run` is the loop; :meth:`train_round` one round
    of a job that is not gossip, as the loop runs it."""

    def __init__(
        self,
        cfg: WorkerSettings,
        *,
        calls: CoordinatorCalls,
        fetcher: ModelFetcher,
        trainer: RoundTrainer,
        spot_checks: SpotChecks,
        metrics: WorkerMetrics,
        reporter: Reporter,
        wallet: Wallet,
        home: Path,
        device: JsonObject,
    ) -> None:
        self.cfg, self.calls, self.fetcher, self.trainer = cfg, calls, fetcher, trainer
        self.spot_checks, self.metrics, self.reporter = spot_checks, metrics, reporter
        self.wallet, self.home, self.device = wallet, home, device
        self.stop = calls.stop
        self.registered = threading.Event()
        self.job: JobState | None = None
        self.refused: set[str] = set()  # jobs whose model this machine will not build
        self.published = PublishedRecords()  # gossip: its signed records, served by its peer server
        self._gossip: GossipLoop | None = None
        self._seen_job = ""  # the last job a view named (the long poll's ``known``)
        self.chain: WorkerChain | None = None  # on an EVM coordinator: its account there (at registration)
        self.pipeline = SendPipeline(
            trainer=trainer,
            calls=calls,
            fetcher=fetcher,
            spot_checks=spot_checks,
            metrics=metrics,
            reporter=reporter,
            current=lambda: self.job,
            poll=lambda after: self._poll(after),
            refused=lambda job, e: self._on_refusal(job, e),
        )

    # --- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        self.calls.retry(self.register)
        hb = threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True)
        hb.start()
        while not self.stop.is_set():
            # with overlap, the sender thread asked for the next round after sending the last update
            # overlap 2: a thread of its own asked for it while the main thread trained
            view = self.pipeline.view_after_send() or self.pipeline.view_looked_ahead() or self.calls.retry(self._poll)
            if view is None:
                break  # stopping
            self._take(view.job)
        self.reporter.close()  # an update still being sent is left: a stopped worker's round is not recorded
        self.calls.close()

    def _take(self, job: JobOrder | None) -> None:
        """Act on the job a view names (None: none)."""
        self._seen_job = "" if job is None else job.job_id
        if job is None:
            self._release()
            return
        if job.action == "train":
            self.fetcher.expect(job.global_model_cid)
        if job.bond_required is not None:  # its contract's bond is not on chain yet: posted, then asked again
            self._post_bond(job, job.bond_required)
            return
        if job.job_id in self.refused:
            self.stop.wait(self.cfg.poll_seconds)  # the run goes on without us; ask again later
            return
        new = self.job is None or self.job.job_id != job.job_id
        if job.action == "wait" and not RunMode.named(job.mode).peer_to_peer and new and not self._prepare_ahead(job):
            return
        if job.challenge:  # overlap 2: also in a view that says train (the next round's)
            try:  # its reply was lost: the job view repeats it
                self.spot_checks.answer(job.job_id, self.job, job.challenge)
            except ApiError as e:  # a refused upload (413, 429): asked again at the next poll
                log.warning("spot check of round %s: %s", job.challenge.round, e.detail)
        if job.action == "train":
            self._train(job)

    def _post_bond(self, job: JobOrder, bond: BondRequired) -> None:
        """Post the bond ``job`` asks for; the next poll answers at once (the coordinator
        looks for the bond at pickup). One that failed is tried again after a pause."""
        posted = False
        if self.chain is None:
            log.error("job %s asks for a bond on chain, but the coordinator said it settles locally", job.job_id)
        else:
            posted = self.chain.post_bond(bond)
        if posted:
            self._seen_job = ""
        else:
            self.stop.wait(self.cfg.poll_seconds)

    def _release(self) -> None:
        """The job is over for this worker: nothing of it is kept."""
        if self.job is None:
            return
        log.info("job %s released", self.job.job_id)
        self.job = None
        self.pipeline.release()
        self.fetcher.forget_ready()  # no copy of its models is held past the job
        self.metrics.clear_job()

    def _prepare_ahead(self, job: JobOrder) -> bool:
        """A new job before its first round: its shard fetched, its model built, now. False:
        its model is refused."""
        try:
            self.job = self.trainer.prepare(job, self.job)
        except ModelRefused as e:
            self.decline(job, e)
            return False
        except (ApiError, Unreachable, IntegrityError) as e:  # fetched again when it trains
            log.info("job %s not prepared ahead: %s", job.job_id, e)
        return True

    def _train(self, job: JobOrder) -> None:
        try:
            if RunMode.named(job.mode).peer_to_peer:
                self.gossip(job)
            else:
                self.train_round(job)
        except ModelRefused as e:
            self.decline(job, e)
        except ApiError as e:
            self._on_refusal(job, e)
        except (Unreachable, IntegrityError) as e:  # fetching the model or shard: ask again after a pause
            log.warning("%s", e)
            self.stop.wait(1.0)

    def train_round(self, job: JobOrder) -> None:
        """One round of a job that is not gossip (see :meth:`SendPipeline.train_round`)."""
        t0 = time.perf_counter()
        self.metrics.set_job(job.training_id, job.job_id, job.round)
        self.job = state = self.trainer.prepare(job, self.job)
        self.pipeline.train_round(job, state, t0)

    def _poll(self, after: int | None = None) -> JobPoll:
        """The job's view: a long poll, answered when there is a round to train (a model of
        at most INLINE_MODEL bytes inside it: no second request before the round trains);
        ``after``: in a round past that one (overlap 2: the next model, not the updates this
        worker is still sending)."""
        # known: a new job is news at once, so its shard and model are ready before its first
        # round; the last job seen, not the last prepared (one not prepared, or a gossip job,
        # would answer every poll at once)
        return self.calls.poll_job(wait=self.cfg.poll_seconds, inline=INLINE_MODEL, known=self._seen_job, after=after)

    # --- the offer and the lease --------------------------------------------------------------

    def register(self) -> None:
        offer: dict[str, Any] = {
            "gpu": self.cfg.gpu,
            "price": self.cfg.price,
            "max_bond": self.cfg.max_bond,
            "availability": self.cfg.availability,
            "device": self.device,
        }
        if self.trainer.max_params is not None:  # none: no stated limit (a device of unknown memory)
            offer["max_params"] = self.trainer.max_params
        if self.fetcher.advertise:
            offer["advertise"] = self.fetcher.advertise
        if self.chain is None:
            view = self.calls.chain()
            if isinstance(view, EvmChain):  # its bonds go on chain from its wallet's EVM account
                self.chain = WorkerChain(
                    view, home=self.home, wallet=self.wallet.name, max_bond=parse_price(self.cfg.max_bond)
                )
        if self.chain is not None:  # named with its proof, bound to this wallet at this coordinator
            offer["evm_address"] = self.chain.address
            offer["evm_proof"] = self.chain.proof(self.wallet.address, self.calls.coordinator_id())
        try:
            self.calls.register(offer)
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
                self.calls.heartbeat(timeout=self.cfg.heartbeat_seconds * 2)
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

    # --- refusals ---------------------------------------------------------------------------

    def decline(self, job: JobOrder, e: ModelRefused) -> None:
        """A job whose model this machine will not build (code its operator did not allow,
        a model past the bounds or this worker's ``max_params``, a shard that is not data of
        the job's spec): nothing imported, nothing trained; the owner sees it in the job's
        status (``refused: model not allowed``, ``refused: model too large`` or ``refused:
        bad data``), and the round goes on without this worker (no update is no fault)."""
        log.error("job %s of %s refused: %s", job.job_id, job.training_id, e)
        self.refused.add(job.job_id)
        why = (
            "refused: model too large"
            if isinstance(e, ModelTooLarge)
            else "refused: bad data"
            if isinstance(e, BadShard)
            else "refused: model not allowed"
        )
        self._send_progress(job.job_id, progress_body(job.round, 0.0, None, 0.0, why))

    def _on_refusal(self, job: JobOrder, e: ApiError) -> None:
        """The coordinator refused an update (or the round's work): why, in the log; a job
        that is over is let go."""
        self.metrics.refusals.inc()
        if e.code in ("round_closed", "wrong_round", "not_accepting", "duplicate_update", "too_stale"):
            log.info("round %s of %s: %s", job.round, job.training_id, e.detail)
        elif e.code in ("job_not_active", "run_ended"):
            log.info("job %s over: %s", job.job_id, e.detail)
            self.job = None
            self.metrics.clear_job()
        else:
            log.error("update refused (%s): %s", e.code, e.detail)

    def _send_progress(self, job_id: str, body: ProgressReport) -> None:
        """Send a progress report now (the :class:`Reporter`'s thread, or outside a round)."""
        try:
            self.calls.post_progress(job_id, body)
        except ApiError as e:
            log.info("progress refused: %s", e.detail)
        except Unreachable as e:  # progress is advisory: not retried; the update itself is
            log.debug("progress report not delivered: %s", e)

    # --- gossip -----------------------------------------------------------------------------

    def gossip(self, job: JobOrder) -> None:
        """Run a gossip job's rounds (:mod:`aitbc.worker.gossip`) until its last, or until
        the worker stops; the coordinator is needed only to start (or to refresh the roster)."""
        self.metrics.set_job(job.training_id, job.job_id, job.round)
        self.job = state = self.trainer.prepare(job, self.job)
        loop = self._gossip
        if loop is None or loop.job_id != job.job_id:
            if loop is not None:
                loop.close()
            parts = GossipParts(
                cfg=self.cfg,
                calls=self.calls,
                fetcher=self.fetcher,
                trainer=self.trainer,
                metrics=self.metrics,
                reporter=self.reporter,
                wallet=self.wallet,
                stop=self.stop,
                home=self.home,
                published=self.published,
            )
            loop = self._gossip = GossipLoop(job, state, parts)
        else:
            loop.refresh(job)
        loop.run()
        if loop.next > (job.rounds or 1) or loop.ended:
            self.stop.wait(self.cfg.poll_seconds if not loop.ended else 0)  # its records go out meanwhile

    def gossip_pace(self, job_id: str) -> str | None:
        """Where this worker's training of gossip job ``job_id`` is (the peer server's
        ``X-Aitbc-Pace`` header), or None when it is not training that job."""
        loop = self._gossip
        return loop.pace() if loop is not None and loop.job_id == job_id else None
