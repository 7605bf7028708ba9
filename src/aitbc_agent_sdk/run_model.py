"""Fetching what rebuilds a run's model on this machine: the run's model name and options,
its data manifest (the spec and the tokenizer's CID), a round's checkpoint, the tokenizer,
and a LoRA run's base weights. Every blob is re-hashed against its CID as it arrives, so a
coordinator cannot hand over other bytes than the run recorded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aitbc.replies.results import Results
from aitbc.replies.runs import RunDetail
from aitbc_agent_sdk.errors import Conflict, IntegrityFailure, NotFound
from aitbc_agent_sdk.operations import run_detail
from aitbc_agent_sdk.protocol import Http, Meter, Offload, Op, Progress, ask

if TYPE_CHECKING:
    from aitbc.training.use import RunParts


def download_blob(cid: str, progress: Progress | None = None) -> Op[bytes]:
    """A blob's bytes, re-hashed here: a coordinator cannot hand us something else."""
    from aitbc.storage.cid import cid_of_bytes

    receiving = Meter(progress, "download")
    data = yield Http("GET", f"/blobs/{cid}", raw=True, progress=receiving.request())
    receiving.end()
    actual = yield Offload(cid_of_bytes, (data,))
    if actual != cid:
        raise IntegrityFailure("integrity", f"blob {cid} from the coordinator does not hash to its CID (got {actual})")
    return data


def model_cid(res: Results, training_id: str, round: int | None) -> str:
    """The CID of the run's model at ``round`` (None: the latest). No model yet:
    :class:`Conflict` (``no_model``); no such round: :class:`NotFound`."""
    cid = res.model_cid
    if round is not None:
        match = [ck.cid for ck in res.checkpoints if ck.round == round]
        if not match:
            raise NotFound(
                "unknown_round",
                f"run {training_id} has no checkpoint for round {round} (it has 0..{len(res.checkpoints) - 1})",
            )
        cid = match[0]
    if cid is None:
        raise Conflict("no_model", f"run {training_id} has no model yet (status {res.status})")
    return cid


def fetch_manifest(run: RunDetail) -> Op[dict[str, Any]]:
    if run.manifest_cid is None:
        raise Conflict("no_data", f"run {run.training_id} has no data yet (upload-data)")
    raw = yield from download_blob(run.manifest_cid)
    try:
        manifest = json.loads(raw)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        raise IntegrityFailure("integrity", f"run {run.training_id}'s manifest is not a JSON object")
    return manifest


@dataclass(frozen=True, slots=True)
class Fetched:
    """A run, what rebuilds its model at a round, and that round's checkpoint CID."""

    run: RunDetail
    parts: RunParts
    cid: str


def fetch_run_parts(training_id: str, round: int | None = None, progress: Progress | None = None) -> Op[Fetched]:
    """The run and what rebuilds its model at ``round`` (default: the latest)."""
    from aitbc.training.tokenizer import tokenizer_cid
    from aitbc.training.use import RunParts, base_weights_cid, spec_of_manifest

    run = yield from run_detail(training_id)
    res = yield from ask(Results, Http("GET", f"/runs/{training_id}/results"))
    cid = model_cid(res, training_id, round)
    manifest = yield from fetch_manifest(run)
    checkpoint = yield from download_blob(cid, progress)
    tok = tokenizer_cid(manifest)
    tokenizer = (yield from download_blob(tok)) if tok else None
    base = base_weights_cid(run.model_type, run.model_options)
    weights = (yield from download_blob(base, progress)) if base else None
    parts = RunParts(run.model_type, run.model_options, spec_of_manifest(manifest), checkpoint, tokenizer, weights)
    return Fetched(run, parts, cid)
