"""Spot checks on the worker (runs that verify work): a round's committed states kept in
memory or on disk while it trains, and revealed when the coordinator's spot check of its
update asks for them."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from aitbc.client import ApiError
from aitbc.replies.jobs import Challenge
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.checkpoint import tensors_to_bytes
from aitbc.training.proof import TrainState, boundaries, commit_every
from aitbc.worker.calls import CoordinatorCalls, Reveal
from aitbc.worker.records import JobState

log = logging.getLogger("aitbc.worker")


class SpotChecks:
    """``folder``: where committed states too large for memory go (``memory_bytes`` a round
    at most stay in memory)."""

    def __init__(self, calls: CoordinatorCalls, *, folder: Path, memory_bytes: int) -> None:
        self.calls, self.folder, self.memory_bytes = calls, folder, memory_bytes

    def answer(self, job_id: str, state: JobState | None, challenge: Challenge) -> None:
        """Reveal the states the spot check of our update asks for: each uploaded as a blob,
        then named to the coordinator, which re-runs the intervals between them. ``state``:
        the job this worker trains now (None: none)."""
        r = challenge.round
        kept_proof = None if state is None or state.job_id != job_id else state.proofs.get(r)
        if state is None or kept_proof is None:
            log.warning("spot check of round %s: its states are no longer kept", r)
            return
        recorder = kept_proof.recorder
        steps = boundaries(recorder.steps, recorder.every)
        cids: dict[str, str] = {}
        for b in challenge.boundaries:
            step = steps[int(b)]
            kept = recorder.states.get(step)
            data = kept.to_bytes() if kept is not None else (self.folder / str(r) / f"{step}.safetensors").read_bytes()
            cids[str(b)] = self._upload(data)
        body: Reveal = {"round": r, "states": cids}
        if challenge.residual:
            body["residual"] = self._upload(tensors_to_bytes({"residual": kept_proof.residual_in}))
        try:
            self.calls.retry(lambda: self.calls.post_proofs(job_id, body))
            log.info("round %s: revealed %d states for its spot check", r, len(cids))
        except ApiError as e:
            log.warning("spot check of round %s: %s", r, e.detail)
        state.proofs.pop(r, None)  # answered once: the states go

    def _upload(self, data: bytes) -> str:
        """Upload ``data`` as a blob (retried through an outage): its CID."""
        cid = cid_of_bytes(data)
        self.calls.retry(lambda: self.calls.put_blob(cid, data))
        return cid

    def spill(self, round: int, d: int, steps: int) -> Callable[[TrainState], None] | None:
        """Where a round's committed states go: memory while they are small, else files
        under ``folder/<round>`` (the rounds before the last two go: with overlap the last
        ones' spot checks may still be answered while this one trains)."""
        per_state = 3 * 4 * d  # float32 parameters and, at most, two moments (Adam)
        if per_state * len(boundaries(steps, commit_every(steps))) <= self.memory_bytes:
            return None
        folder = self.folder / str(round)
        for old in self.folder.glob("*") if self.folder.is_dir() else ():
            if not old.name.isdigit() or int(old.name) < round - 2 or int(old.name) == round:
                shutil.rmtree(old, ignore_errors=True)
        folder.mkdir(parents=True)

        def write(s: TrainState) -> None:
            tmp = folder / f"{s.step}.tmp"
            tmp.write_bytes(s.to_bytes())
            tmp.replace(folder / f"{s.step}.safetensors")

        return write
