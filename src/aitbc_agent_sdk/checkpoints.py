"""Operations on a run's checkpoints and model: the workers' latest updates, the global
model's checkpoint and scores per round, a checkpoint re-hashed against its CID, the
model written to a file. Registered in :data:`~aitbc_agent_sdk.operations.OPERATIONS`
like the rest."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aitbc.replies.base import Page
from aitbc.replies.jobs import UpdateView
from aitbc.replies.results import Results, RoundView, ScorePage, ScoreView
from aitbc_agent_sdk.errors import (
    AgentError,
    InvalidArgument,
    NotFound,
)
from aitbc_agent_sdk.operations import operation, resolve_run, run_detail
from aitbc_agent_sdk.protocol import AgentState, Http, Offload, Op, Progress, ask
from aitbc_agent_sdk.results import ModelDownload, RoundCheckpoint, Validity
from aitbc_agent_sdk.run_model import download_blob, fetch_run_parts, model_cid
from aitbc_agent_sdk.workers import current_jobs

if TYPE_CHECKING:
    from aitbc.training.use import RunParts


@operation
def get_all_checkpoints(self: AgentState, training_id: str | None = None) -> Op[list[UpdateView]]:
    """The latest checkpoint of each of the run's workers (default: the agent's current
    run): the newest update each job of :meth:`get_all_workers` sent, as
    :meth:`collect_checkpoint` returns it: ``{checkpoint_id, cid, worker_id, job_id,
    training_id, round, samples, train_loss, size, status, ...}``. Workers that sent
    nothing yet are left out. Check one with :meth:`verify_checkpoint`; the global
    model's checkpoints (one per round) are :meth:`get_round_checkpoints`."""
    training_id = yield from resolve_run(self, training_id)
    run = yield from run_detail(training_id)
    latest = yield from ask(Page[UpdateView], Http("GET", f"/runs/{training_id}/updates", params={"latest": "true"}))
    by_job = {u.job_id: u for u in latest.data}
    return [by_job[w.job_id] for w in current_jobs(run) if w.job_id in by_job]


@operation
def get_round_checkpoints(self: AgentState, training_id: str | None = None) -> Op[list[RoundCheckpoint]]:
    """The global model's checkpoints, one per round, round 0 being the initial model:
    ``[{round, checkpoint_id, checkpoint_cid, val_loss, val_accuracy}]``
    (``checkpoint_id`` is the CID)."""
    rounds = yield from get_rounds(self, training_id)
    return [
        RoundCheckpoint(
            round=r.round,
            checkpoint_id=r.checkpoint_cid,
            checkpoint_cid=r.checkpoint_cid,
            val_loss=r.val_loss,
            val_accuracy=r.val_accuracy,
        )
        for r in rounds
    ]


@operation
def get_round_scores(self: AgentState, training_id: str | None = None) -> Op[list[ScoreView]]:
    """Every worker's score in every scored round of the run (default: the agent's
    current run), by round: ``[{round, worker_id, contract_id, status, quality, gain,
    own_gain, other_gain, kept, flags, provable}]``; ``quality`` (0..1) is the share of
    the round's price the worker was paid."""
    training_id = yield from resolve_run(self, training_id)
    rows: list[ScoreView] = []
    after: int | None = 0
    while after is not None:  # the coordinator sends them in pages
        res = yield from ask(ScorePage, Http("GET", f"/runs/{training_id}/scores", params={"after": after}))
        rows += res.data
        after = res.next
    return sorted(rows, key=lambda r: r.round)  # stable: as written within a round


@operation
def get_rounds(self: AgentState, training_id: str | None = None) -> Op[list[RoundView]]:
    """Every closed round of the run (default: the agent's current run) as the
    coordinator recorded it, round 0 being the initial model: ``[{round, checkpoint_cid,
    val_loss, val_accuracy, train_loss, train_accuracy, accepted, rejected, stragglers, skipped,
    bytes_up, bytes_down, started_at, closed_at}]``; ``bytes_up``/``bytes_down`` are that
    round's own (``None`` for rounds recorded before they were counted), ``val_loss``
    ``None`` until the round is evaluated."""
    training_id = yield from resolve_run(self, training_id)
    return (yield from ask(Page[RoundView], Http("GET", f"/runs/{training_id}/rounds"))).data


@operation
def verify_checkpoint(
    self: AgentState, checkpoint: UpdateView | RoundCheckpoint | RoundView | Mapping[str, Any] | str
) -> Op[Validity]:
    """Download a checkpoint through the coordinator and re-hash it against its CID: a
    worker's (from :meth:`get_all_checkpoints` or :meth:`collect_checkpoint`) must decode
    as an update; a round's (from :meth:`get_round_checkpoints` or :meth:`get_rounds`, a
    mapping with ``checkpoint_cid`` and ``round``, or a CID) must be a loadable checkpoint,
    of the round claimed if given. Truthy exactly when ``valid``, so
    ``if not agent.verify_checkpoint(c)`` reads as said: a
    :class:`~aitbc_agent_sdk.results.Validity` ``{valid, cid, round, detail, worker_id,
    pruned}`` (``worker_id`` for a worker's, ``pruned`` for a recorded round whose bytes
    the coordinator's blob retention deleted). Never raises for a bad checkpoint, only for
    an unreachable coordinator."""
    return (yield from _verify(checkpoint if isinstance(checkpoint, (str, Mapping)) else dict(checkpoint)))


def _verify(checkpoint: Mapping[str, Any] | str) -> Op[Validity]:
    from aitbc.errors import AitbcError
    from aitbc.storage.cid import cid_of_bytes

    if isinstance(checkpoint, Mapping) and checkpoint.get("job_id") and checkpoint.get("cid"):
        return (yield from _verify_update(checkpoint))
    if isinstance(checkpoint, str):
        cid, claimed = checkpoint, None
    elif isinstance(checkpoint, Mapping) and (checkpoint.get("checkpoint_cid") or checkpoint.get("cid")):
        cid, claimed = checkpoint.get("checkpoint_cid") or checkpoint["cid"], checkpoint.get("round")
    else:
        raise InvalidArgument(
            "bad_argument", f"checkpoint must be a CID or a dict with checkpoint_cid, got {checkpoint!r}"
        )
    try:
        data = yield Http("GET", f"/blobs/{cid}", raw=True)
    except AgentError as e:
        if e.code == "unknown_blob" and claimed is not None:  # a recorded round whose bytes retention deleted
            return Validity(valid=False, pruned=True, cid=cid, round=claimed, detail="pruned by blob retention")
        if isinstance(e, (NotFound, InvalidArgument)) or e.status in (400, 404):
            return Validity(valid=False, cid=cid, round=claimed, detail=e.detail)
        raise
    actual = yield Offload(cid_of_bytes, (data,))
    if actual != cid:
        return Validity(valid=False, cid=cid, round=claimed, detail=f"blob hashes to {actual}, not {cid}")
    try:
        meta = yield Offload(_read_checkpoint, (data,))
    except AitbcError as e:
        return Validity(valid=False, cid=cid, round=claimed, detail=str(e))
    rnd = int(meta["round"]) if str(meta.get("round", "")).isdigit() else None
    if claimed is not None and rnd != claimed:
        return Validity(valid=False, cid=cid, round=claimed, detail=f"checkpoint says round {meta.get('round')}")
    return Validity(valid=True, cid=cid, round=rnd, detail="hash and checkpoint OK")


def _read_checkpoint(data: bytes) -> dict[str, str]:
    """A checkpoint's metadata, once its tensors load (safetensors, finite)."""
    from aitbc.training.checkpoint import bytes_to_tensors, read_metadata  # torch: imported on use

    meta = read_metadata(data)
    bytes_to_tensors(data)
    return meta


def _verify_update(update: Mapping[str, Any]) -> Op[Validity]:
    """A worker's update (from :meth:`collect_checkpoint`): its blob hashes to its CID and
    decodes as an update."""
    from aitbc.core.compression import decode
    from aitbc.errors import AitbcError
    from aitbc.storage.cid import cid_of_bytes

    cid, rnd, worker = update["cid"], update.get("round"), update.get("worker_id")
    try:
        data = yield Http("GET", f"/blobs/{cid}", raw=True)
    except AgentError as e:
        if isinstance(e, (NotFound, InvalidArgument)) or e.status in (400, 404):
            return Validity(valid=False, cid=cid, round=rnd, detail=e.detail, worker_id=worker)
        raise
    actual = yield Offload(cid_of_bytes, (data,))
    detail = f"blob hashes to {actual}, not {cid}" if actual != cid else None
    if detail is None:
        try:
            yield Offload(decode, (data,))
        except AitbcError as e:
            detail = f"not an update: {e}"
    return Validity(valid=detail is None, cid=cid, round=rnd, detail=detail or "hash and update OK", worker_id=worker)


@operation
def download_model(
    self: AgentState,
    training_id: str | None = None,
    path: str | Path | None = None,
    round: int | None = None,
    *,
    format: str = "safetensors",
    adapter_only: bool = False,
    progress: Progress | None = None,
) -> Op[ModelDownload]:
    """Write the run's model (``round``: that round's checkpoint; default the latest),
    verified against its CID first. ``format="safetensors"`` (the default): to the file
    ``path``, the checkpoint as stored (a built-in model loads it in plain PyTorch:
    docs/owner.md, "Use your model"). ``format="hf"`` (a Hugging Face model's run): into the new or empty
    folder ``path``, a directory that ``transformers``' ``AutoModelForCausalLM`` and
    ``AutoTokenizer`` load with nothing of aitbc installed (a LoRA run's model merged
    into its base; ``adapter_only``: the adapter alone, which ``peft`` loads onto the
    base the run started from, the folder given to ``init --from-pretrained``). Either
    appears only whole. Returns ``{training_id, path, cid, bytes}`` (``bytes``: all
    written). No model yet: :class:`Conflict` (``no_model``); no such round:
    :class:`NotFound`; a format the model has not: :class:`InvalidArgument`.
    ``progress``: stage ``download`` (see :data:`aitbc_agent_sdk.Progress`)."""
    from aitbc.training.export import check_format

    if path is None:
        raise InvalidArgument("bad_argument", "download_model needs path=, the file (or, format hf, folder) to write")
    training_id = yield from resolve_run(self, training_id)
    out = Path(path).expanduser()
    if format == "hf":
        run = yield from run_detail(training_id)
        lora = run.model_options.get("lora") is not None
        check_format(run.model_type, format, adapter_only=adapter_only, lora=lora)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise InvalidArgument("bad_argument", f"{out} exists and is not an empty folder; give a new or empty one")
        if not out.parent.is_dir():
            raise NotFound("not_found", f"no such directory: {out.parent}")
        got = yield from fetch_run_parts(training_id, round, progress)
        written = yield Offload(_export_hf, (got.parts, out, adapter_only))
        return ModelDownload(training_id=training_id, path=str(out), cid=got.cid, bytes=written)
    check_format("", format, adapter_only=adapter_only)  # safetensors, or a one-line refusal
    if out.is_dir():
        raise InvalidArgument("bad_argument", f"{out} is a directory; give the file to write")
    if not out.parent.exists():
        raise NotFound("not_found", f"no such directory: {out.parent}")
    res = yield from ask(Results, Http("GET", f"/runs/{training_id}/results"))
    cid = model_cid(res, training_id, round)
    data = yield from download_blob(cid, progress)
    yield Offload(_write_whole, (out, data))
    return ModelDownload(training_id=training_id, path=str(out), cid=cid, bytes=len(data))


def _export_hf(parts: RunParts, out: Path, adapter_only: bool) -> int:
    """Rebuild the run's model and write it as a Hugging Face directory; its bytes."""
    from aitbc.training.export import export_hf
    from aitbc.training.use import load_run_model

    rm = load_run_model(parts)
    done = export_hf(rm.model, parts.tokenizer, out, adapter_only=adapter_only)
    return sum((done.path / f).stat().st_size for f in done.files)


_download = download_blob  # manual control and the tests fetch a verified blob through this name


def _write_whole(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(path)
