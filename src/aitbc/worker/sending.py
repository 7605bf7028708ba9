"""The send pipeline: a round's update uploaded and named to the coordinator, and, in a run
with ``overlap``, sent from a sender thread while the main thread trains the next round.

Overlap 1: a round's update goes out from a sender thread, which then waits for the next
round and fetches its model, while the main thread trains that round ahead. Overlap 2:
updates queue, each sent once the one before it is (:class:`InFlight`), and a look-ahead
thread fetches the next job view and model; the main thread never waits for a send, only
for the model it trains from. A refused update drops the round trained ahead and every
update queued after it (each began where the one before ended), and the optimizer and
residual go back to where the first not recorded began.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aitbc.client import ApiError, Unreachable
from aitbc.errors import IntegrityError
from aitbc.replies.jobs import Challenge, JobOrder, JobPoll
from aitbc.run_mode import RunMode
from aitbc.worker.calls import CoordinatorCalls
from aitbc.worker.fetcher import ModelFetcher
from aitbc.worker.metrics import WorkerMetrics
from aitbc.worker.progress import Reporter
from aitbc.worker.records import JobState, KeptProof, OwnUpdate, SentUpdate, Trained, ahead_key
from aitbc.worker.round_training import RoundTrainer
from aitbc.worker.spot_checks import SpotChecks
from aitbc.worker.threads import Sender

log = logging.getLogger("aitbc.worker")

# An update blob of at most this many bytes goes inside its update message (base64, 4/3 the
# size: well within the coordinator's default 1 MiB JSON limit, a proof beside it): one
# request a round instead of PUT + POST. A larger one, or one the coordinator refuses
# inline (a lower JSON limit: 413 body_too_large), is uploaded first.
INLINE_UPDATE = 256 << 10


class Dropped(Exception):
    """An update not sent (overlap 2): the one queued before it was refused, and it began
    where that one ended."""


@dataclass(frozen=True, slots=True)
class InFlight:
    """An update being sent on a sender thread, and the job view it was trained for."""

    job: JobOrder
    trained: Trained
    sender: Sender


class SendPipeline:
    """This worker's rounds from training to recorded update (see the module's docstring).
    ``current``: the job state the worker holds now; ``poll(after)``: the job's view, a long
    poll; ``refused(job, error)``: what the worker does when an update is refused."""

    def __init__(
        self,
        *,
        trainer: RoundTrainer,
        calls: CoordinatorCalls,
        fetcher: ModelFetcher,
        spot_checks: SpotChecks,
        metrics: WorkerMetrics,
        reporter: Reporter,
        current: Callable[[], JobState | None],
        poll: Callable[[int | None], JobPoll],
        refused: Callable[[JobOrder, ApiError], None],
    ) -> None:
        self.trainer, self.calls, self.fetcher, self.spot_checks = trainer, calls, fetcher, spot_checks
        self.metrics, self.reporter = metrics, reporter
        self._current, self._poll, self._refused = current, poll, refused
        self._ahead: Trained | None = None  # the next round, trained while this one closed (overlap)
        self._sent: SentUpdate | None = None  # the last update recorded
        self._sending: InFlight | None = None  # overlap 1: sent while the next round trains
        self._sends: list[InFlight] = []  # overlap 2: in order, each waits for the one before it
        self._look: Sender | None = None  # overlap 2: the next job view, fetched meanwhile
        self._inline_updates = True  # update blobs up to INLINE_UPDATE go inside the update message

    def release(self) -> None:
        """The job is released: nothing trained ahead or queued for it is kept."""
        self._ahead, self._sends, self._look = None, [], None

    # --- a round ----------------------------------------------------------------------------

    def train_round(self, job: JobOrder, state: JobState, t0: float) -> None:
        """Train the round the job's view asks an update for (``send_round``: the open
        round, or with ``overlap`` 2 the next one once this one's update is in), or take the
        one trained ahead for it, if it still fits (same job, round and settings), and send
        its update. In a run with ``overlap`` k, then train the next round at once from the
        view's model less this worker's own updates not yet in it (an eager start: where its
        last round ended, moved by what the global model gained since), up to k rounds
        past the view's model."""
        if int(job.overlap or 0) >= 2:
            self._train_two_ahead(job, state, t0)
            return
        n = job.round
        done = self._take_ahead(job, state, n)
        if done is None:
            done = self.trainer.train(job, state, n)
        if not (job.overlap and n < (job.rounds or 1)):
            self._submit(job, state, done, t0)
            return
        # Overlap 1: this update goes out from the sender thread while the next round trains
        # here, from the view's model (the newest there is) less this update as the
        # coordinator decodes it; that round's update names both (base_cid, prior_cid). If
        # this one is refused, the next is dropped (view_after_send).
        self.reporter.drain()  # no progress report of this round may land after its update
        self._sending = InFlight(job, done, Sender(lambda: self._send_and_look(job, state, done, t0)))
        self._ahead = self.trainer.train(job, state, n + 1, priors=[done.update])

    def _train_two_ahead(self, job: JobOrder, state: JobState, t0: float) -> None:
        """Overlap 2: send the update the view asks for (``send_round``: the open round's,
        or the next one's once that is in; later than the updates still being sent), the
        one trained ahead for it if it still fits, queued behind those being sent; then
        train the round after it at once from the view's model less this worker's updates
        not in it (this one, and the open round's: a chain of priors). The main thread
        never waits for a send, only for the model it trains from (``poll(after)``)."""
        self._reap_sends()
        m = job.round
        n = int(job.send_round or m)
        # the view may not have seen the updates sent or being sent since it was read
        sent = [f.trained.round for f in self._sends if f.job.job_id == job.job_id]
        if self._sent is not None and self._sent.job_id == job.job_id:
            sent.append(self._sent.round)
        if sent and n <= max(sent):
            n = max(sent) + 1
        if n > m + 1:  # nothing to send before round m closes: the oldest send first, then look again
            self._settle_sends(1)
            return
        done = self._take_ahead(job, state, n)
        if done is None:  # none trained ahead (the first round, a restart, a dropped one)
            mine = self.own_update(job.job_id, n - 1) if n > m else None
            done = self.trainer.train(job, state, n, priors=[mine] if mine else [])
        self.reporter.drain()  # no progress report of this round may land after its update
        before = self._sends[-1].sender if self._sends else None
        self._sends.append(InFlight(job, done, Sender(lambda: self._send_after(before, job, state, done, t0))))
        chain = [done.update]
        if n > m:  # the next round starts past this worker's update of the open round too
            mine = self.own_update(job.job_id, n - 1)
            chain = chain + [mine] if mine is not None else []
        if n >= (job.rounds or 1) or not chain:  # the run's last update, or no eager start to make
            self._settle_sends()
            return
        # round n+1 goes out once round n is open: its view and model are fetched meanwhile
        self._look = Sender(lambda: self._look_past(n - 1))
        self._ahead = self.trainer.train(job, state, n + 1, priors=chain)

    def _take_ahead(self, job: JobOrder, state: JobState, round: int) -> Trained | None:
        """The round trained ahead for ``job`` (its update not yet sent), if the job's view
        still asks for exactly it (``round``, the view's ``send_round``); otherwise it is
        dropped and the optimizer and residual go back to where the last sent update left
        them."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        if ahead.key == ahead_key(job, round):
            return ahead
        log.info("round %d trained ahead is dropped: the job now asks for round %d", ahead.round, round)
        state.restore_round_start(ahead.start)
        return None

    def own_update(self, job_id: str, round: int) -> OwnUpdate | None:
        """This worker's own update of ``round`` for job ``job_id``: the last one recorded,
        or one being sent (overlap 2); else None."""
        for f in reversed(self._sends):
            if f.job.job_id == job_id and f.trained.round == round:
                return f.trained.update
        sent = self._sent
        if sent is None or sent.job_id != job_id or sent.round != round:
            return None
        return sent.update

    # --- the next job view, fetched ahead ----------------------------------------------------

    def _look_past(self, after: int | None) -> JobPoll | None:
        """On a sender thread: the job's view once there is a round to train (overlap 2:
        once round ``after`` has closed), its model fetched, so the main thread, done
        training ahead, finds both at hand. None: the main thread asks itself."""
        try:
            view = self.calls.retry(lambda: self._poll(after))
            nxt = None if view is None else view.job
            if nxt and nxt.action == "train" and nxt.global_model_cid:
                self.fetcher.expect(nxt.global_model_cid)
                cid = nxt.global_model_cid
                path = self.fetcher.global_model(cid, nxt.model_peers, inline=nxt.global_model)
                state = self._current()
                if state is not None and state.job_id == nxt.job_id and state.layout is not None:
                    self.fetcher.read_ahead(state.job_id, cid, path, state.layout)
            return view
        except (ApiError, Unreachable, IntegrityError, OSError) as e:  # the main thread polls and downloads again
            log.info("next round not fetched ahead: %s", e)
            return None

    def view_looked_ahead(self) -> JobPoll | None:
        """The view the look-ahead thread fetched (overlap 2), if one is under way."""
        look, self._look = self._look, None
        return None if look is None else look.wait()

    def _send_and_look(self, job: JobOrder, state: JobState, done: Trained, t0: float) -> JobPoll | None:
        """The sender thread (overlap 1): send the round's update, then wait for the next
        round to open and fetch its model, so the main thread, done training ahead, finds
        both at hand. Returns the job's view (None: the main thread asks itself)."""
        self._submit(job, state, done, t0, drained=True)
        return self._look_past(None)

    # --- settling what was sent ----------------------------------------------------------------

    def view_after_send(self) -> JobPoll | None:
        """Overlap 1: wait for the update the sender thread is sending and return the job's
        view it fetched after it. If the update was refused, the round trained ahead after it
        goes too (it began where that one ended), and the optimizer and residual go back to
        where that update began, as if it never trained."""
        if self._sending is None:
            return None
        job, done, sender = self._sending.job, self._sending.trained, self._sending.sender
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

    def _send_after(self, before: Sender | None, job: JobOrder, state: JobState, done: Trained, t0: float) -> None:
        """A sender thread (overlap 2): once the update queued before this one is sent, send
        this one; if that one was refused, this one is not sent (it began where that ended)."""
        if before is not None:
            try:
                before.wait()
            except ApiError as e:
                if e.code != "duplicate_update":
                    raise Dropped(f"round {done.round} not sent: round {done.round - 1}'s was refused") from None
            except BaseException:  # noqa: BLE001 - dropped, or stopping: this one is not sent either
                raise Dropped(f"round {done.round} not sent") from None
        self._submit(job, state, done, t0, drained=True)

    def _reap_sends(self) -> None:
        """Settle the sends that have finished, oldest first, without waiting."""
        while self._sends and self._sends[0].sender.done():
            self._settle_sends(1)

    def _settle_sends(self, count: int | None = None) -> None:
        """Wait for the oldest ``count`` sends (all: None) in order. A refused update drops
        the round trained ahead and every update queued after it (each began where the one
        before ended), and the optimizer and residual go back to where the first that was
        not recorded began, as if none of them trained."""
        while self._sends and (count is None or count > 0):
            count = None if count is None else count - 1
            first = self._sends.pop(0)
            try:
                first.sender.wait()
            except ApiError as e:
                if e.code == "duplicate_update":  # recorded before (its reply was lost): the chain goes on
                    self._note_sent(first.job, first.trained)
                    continue
                later = [f.trained for f in self._sends]
                for f in self._sends:  # each raises Dropped at once
                    with contextlib.suppress(BaseException):
                        f.sender.wait()
                self._sends = []
                self._drop_after_refusal(first.job, e, first.trained, later)
                self._refused(first.job, e)
                return
            except Dropped:
                continue
            except (Unreachable, IntegrityError) as e:  # stopping (sends are retried through outages)
                log.warning("%s", e)

    def _note_sent(self, job: JobOrder, done: Trained) -> None:
        """``done`` is recorded: the last update sent, the next rounds' eager start names it."""
        self._sent = SentUpdate(job.job_id, done.round, done.update)

    def _drop_after_refusal(
        self, job: JobOrder, e: ApiError, done: Trained, later: list[Trained] | None = None
    ) -> None:
        """``done`` was refused (not a duplicate): the round trained ahead goes, as do
        ``later``, the updates queued after it (each began where the one before ended), and
        the optimizer and residual go back to where the first of them not recorded began (an
        update recorded as rejected: the chain goes on from it)."""
        ahead, self._ahead = self._ahead, None
        state = self._current()
        if state is None or state.job_id != job.job_id:
            return
        dropped = [d for d in (done, *(later or []), ahead) if d is not None]
        first = dropped[1:] if e.code == "update_rejected" else dropped
        if first:
            state.restore_round_start(first[0].start)

    # --- the upload ----------------------------------------------------------------------------

    def _submit(self, job: JobOrder, state: JobState, done: Trained, t0: float, *, drained: bool = False) -> None:
        """Upload the round's update blob and send the signed message that names it.
        ``drained``: the caller drained the progress reports (the sender thread: the
        reports now waiting are the next round's)."""
        if done.recorder is not None:  # kept until its spot check
            state.proofs[done.round] = KeptProof(done.recorder, done.residual_in)
            for old in [r for r in list(state.proofs) if r < done.round - 2]:  # a copy: answers pop too
                state.proofs.pop(old, None)
        blob, body, cid = done.blob, done.body, done.body["cid"]
        # The round's work is done: the upload is retried through an outage, never retrained.
        t_upload = time.perf_counter()
        inline = len(blob) <= INLINE_UPDATE and self._inline_updates
        if not inline:
            self.calls.retry(lambda: self.calls.put_blob(cid, blob))
        self.metrics.bytes.labels("up").inc(len(blob))
        if not drained:
            self.reporter.drain()  # no progress report of this round may land after its update
        try:
            challenge = self._post_inline(job, body, blob) if inline else self.calls.post_update(job.job_id, body)
        except ApiError as e:
            if not drained and done.recorder is not None and e.code not in ("update_rejected", "duplicate_update"):
                state.restore_round_start()  # not recorded: as if never trained
            raise
        done.timings["upload"] = time.perf_counter() - t_upload  # the blob and the message naming it
        for phase, seconds in done.timings.items():
            self.metrics.seconds.labels(phase).inc(seconds)
        state.done.add(done.round)
        self._note_sent(job, done)
        if challenge:
            self.spot_checks.answer(job.job_id, self._current(), challenge)
        self.metrics.rounds.inc()
        self.metrics.steps_per_second.set(body["steps"] / max(body["compute_seconds"], 1e-9))  # compute time only
        self._log_sent(job, done, t0)

    def _log_sent(self, job: JobOrder, done: Trained, t0: float) -> None:
        body, t = done.body, done.timings
        log.info(
            "round %d/%d of %s: %d steps, loss %.4f, update %d bytes, %.2f s (%.2f s computing; "
            "download %.3f s, compute %.3f s, encode %.3f s, upload %.3f s)%s",
            done.round,
            job.rounds or 1,
            job.training_id,
            body["steps"],
            body["train_loss"],
            len(done.blob),
            time.perf_counter() - t0,
            body["compute_seconds"],
            t["download"],
            t["compute"],
            t["encode"],
            t["upload"],
            " trained ahead" if "base_cid" in body and not RunMode.named(job.mode).buffered else "",
        )

    def _post_inline(self, job: JobOrder, body: dict[str, Any], blob: bytes) -> Challenge | None:
        """Send the update with its blob inside the message (one request). A coordinator
        that will not take it so (its JSON limit is lower: 413 ``body_too_large``; an older
        one: 422 ``invalid_request`` naming ``blob``) gets the blob uploaded first from then on."""
        try:
            return self.calls.post_update(job.job_id, {**body, "blob": base64.b64encode(blob).decode()})
        except ApiError as e:
            refused = e.code == "body_too_large" or (e.code == "invalid_request" and "blob" in e.detail)
            if not refused:
                raise
            log.info("coordinator takes no inline update (%s): uploading update blobs first", e.detail)
            self._inline_updates = False
        self.calls.retry(lambda: self.calls.put_blob(body["cid"], blob))
        return self.calls.post_update(job.job_id, body)
