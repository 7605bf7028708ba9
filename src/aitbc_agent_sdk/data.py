"""Operations on a run's dataset and the coordinator's blobs: upload a file, folder or
model (a run's dataset is cut into its shards as it is uploaded), read a blob back,
cut and attach a dataset. Registered in :data:`~aitbc_agent_sdk.operations.OPERATIONS`
like the rest."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aitbc.replies.base import Page
from aitbc.replies.jobs import ShardView
from aitbc.replies.runs import MeasuredSize, RunDetail
from aitbc_agent_sdk.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
)
from aitbc_agent_sdk.operations import _soft_run, operation, resolve_run, run_detail
from aitbc_agent_sdk.protocol import AgentState, Http, Meter, Offload, Op, Progress, ask
from aitbc_agent_sdk.results import DataUploaded, ShardRef

if TYPE_CHECKING:
    from aitbc.run_data import TextOptions


@operation
def upload_to_ipfs(
    self: AgentState,
    path: str | Path | None = None,
    data: Any = None,
    pin: bool = True,
    training_id: str | None = None,
    *,
    progress: Progress | None = None,
) -> Op[str]:
    """Store a file or a folder (``path``) or ``data`` on the coordinator, content
    addressed as ``ipfs add -r --cid-version=1`` would (a folder is a UnixFS directory:
    raw leaves, 256 KiB chunks), and return the root CID; only the blobs the coordinator
    lacks are sent. ``data``: bytes, or a model (``torch.nn.Module``) or state dict,
    stored as a safetensors checkpoint (what :meth:`federated_average` returns as
    ``model`` is accepted). ``pin``: pinned for the agent's wallet, so the coordinator's
    blob retention keeps every blob of it (``POST /v1/blobs/{cid}/pin``).

    A folder or file uploaded while the agent's current run (``training_id``, default:
    the current run, if any), a run its wallet owns, is ``initializing`` or
    ``distributing`` becomes that run's dataset: it is cut into the run's shards (one per target worker; see
    :meth:`create_data_shards`) and attached, with ``data_source`` ``ipfs://CID``.

    ``progress(stage, done, total)`` (see :data:`aitbc_agent_sdk.Progress`): bytes hashed
    (``hash``, a path's files) and sent (``upload``); for a run's dataset then
    ``package`` and ``upload`` again (its shards)."""
    if (path is None) == (data is None):
        raise InvalidArgument("bad_argument", "upload_to_ipfs takes exactly one of path= or data=")
    from aitbc_agent_sdk import ipfs

    if path is None:
        return (yield from ipfs.store_data(self, data, pin, progress))
    p = Path(path).expanduser()
    if not p.exists():
        raise NotFound("not_found", f"no such file or folder: {p}")
    cid = yield from ipfs.store_path(self, p, pin, progress)
    tid = yield from _soft_run(self, training_id)
    if tid is not None:
        yield from _adopt_dataset(self, tid, cid, p, progress)
    return cid


@operation
def get_from_ipfs(self: AgentState, cid: str, *, progress: Progress | None = None) -> Op[bytes]:
    """The bytes of the blob ``cid`` on the coordinator: a whole file, or a folder's
    directory node (see :mod:`aitbc.storage.unixfs` to walk one), checked against the CID
    here, so a coordinator cannot hand back something else. Unknown: :class:`NotFound`
    (``unknown_blob``); not a CID: :class:`InvalidArgument`. ``progress``: stage
    ``download`` (see :data:`aitbc_agent_sdk.Progress`)."""
    from aitbc.storage.cid import is_cid
    from aitbc.storage.unixfs import check_blob

    if not isinstance(cid, str) or not is_cid(cid):
        raise InvalidArgument("bad_cid", f"{cid!r} is not a CIDv1 (base32, starts with 'b')")
    receiving = Meter(progress, "download")
    data = yield Http("GET", f"/blobs/{cid}", raw=True, progress=receiving.request())
    receiving.end()
    yield Offload(check_blob, (cid, data))  # an IntegrityError reaches the caller as IntegrityFailure
    return data


DATA_PHASES = ("initializing", "distributing")


def _adopt_dataset(
    self: AgentState, training_id: str, cid: str, path: Path, progress: Progress | None = None
) -> Op[None]:
    """An upload made while the run is initializing or distributing becomes its dataset
    (a run of this agent's wallet only: reading another's run made it current, not ours)."""
    run = yield from run_detail(training_id)
    if run.status not in DATA_PHASES or run.owner != self.address:
        return None
    self._datasets[cid] = path
    if run.data_source != f"ipfs://{cid}":
        yield from _cut(self, run, str(path), run.target_workers, source=f"ipfs://{cid}", progress=progress)
    return None


def _dataset_path(self: AgentState, run: RunDetail) -> Op[tuple[str, str]]:
    """``(path to cut, source to record)`` of the run's dataset: the folder or file
    uploaded for it (from this agent's upload, else fetched back from the coordinator
    by its CID), or what the CLI's ``upload-data`` named."""
    source = run.data_source
    if not source:
        raise Conflict(
            "no_data",
            f"run {run.training_id} has no dataset yet: upload one with upload_to_ipfs(path=FOLDER) while it "
            f"is initializing, or name it with data_path=",
        )
    if not source.startswith("ipfs://"):
        return source, source
    cid = source.removeprefix("ipfs://")
    local = self._datasets.get(cid)
    if local is None or not local.exists():
        from aitbc_agent_sdk import uploads

        local = yield Offload(
            uploads.fetch_tree, (self.config.resolved_coordinator_url, self.config.resolved_ca_cert, cid)
        )
        self._datasets[cid] = local
    return str(local), source


def _cut(
    self: AgentState,
    run: RunDetail,
    data_path: str,
    k: int,
    *,
    source: str,
    alpha: float | None = None,
    max_bytes: int | None = None,
    text: TextOptions | None = None,
    progress: Progress | None = None,
) -> Op[DataUploaded]:
    """Cut the dataset at ``data_path`` into ``k`` shards and a validation split, upload
    them and their manifest and attach it to the run (``source``: what it records).
    ``progress``: ``package`` (total 0 until the pieces are made, then their bytes) and
    ``upload``."""
    from aitbc.run_data import TextOptions, prepare_run_data  # torch: imported on use

    training_id = run.training_id
    run_tok = (run.model_options or {}).get("tokenizer")  # a pretrained model's, uploaded by init
    if isinstance(run_tok, str):  # its data is tokenized with it, however the data came
        text = dataclasses.replace(text or TextOptions(), run_tokenizer=(yield from get_from_ipfs(self, run_tok)))
    packing = Meter(progress, "package")
    rd = yield Offload(
        functools.partial(prepare_run_data, dict(run), data_path, shards=k, alpha=alpha, max_bytes=max_bytes, text=text)
    )
    blobs = rd.blobs()
    size = sum(len(blob) for _, blob in blobs)
    packing.update(size, size)
    sending = Meter(progress, "upload", size)
    for cid, blob in blobs:
        yield Http("PUT", f"/blobs/{cid}", content=blob, progress=sending.request())
    sending.end()
    body = {"manifest_cid": rd.manifest_cid, "source": source}
    detail = yield from ask(RunDetail, Http("POST", f"/runs/{training_id}/data", body))
    return DataUploaded(
        training_id=training_id,
        manifest_cid=rd.manifest_cid,
        shards=rd.shard_cids,
        shard_samples=list(rd.packaged.samples),
        val_cid=rd.val_cid,
        samples=sum(rd.packaged.samples),
        val_samples=rd.packaged.val_samples,
        data_bytes=detail.data_bytes,
        dataset_size=run.dataset_size,
        dataset=rd.dataset.name,
        task=rd.dataset.spec.task,
        measured=None if rd.dataset.measured is None else MeasuredSize(**rd.dataset.measured.as_dict()),
        tokenizer_cid=None if rd.tokenizer_blob is None else rd.tokenizer_blob.cid,
        vocab_size=None if rd.tokenizer_blob is None else rd.tokenizer_blob.vocab_size,
    )


def _shard_count(run: RunDetail, num_shards: int | None) -> int:
    k = run.target_workers if num_shards is None else num_shards
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidArgument("bad_shards", f"num_shards must be an integer >= 1, got {num_shards!r}")
    if run.control == "automatic" and k != run.target_workers:
        raise InvalidArgument(
            "bad_shards",
            f"num_shards={num_shards}: run {run.training_id} (automatic control) plans one "
            f"shard per target worker, so num_shards must be {run.target_workers} (or None)",
        )
    return k


@operation
def upload_data(
    self: AgentState,
    training_id: str | None = None,
    data_path: str | None = None,
    num_shards: int | None = None,
    *,
    alpha: float | None = None,
    max_bytes: int | None = None,
    text_field: str = "text",
    vocab_size: int | None = None,
    tokenizer: str | Path | None = None,
    progress: Progress | None = None,
) -> Op[DataUploaded]:
    """Split the dataset at ``data_path`` (``digits``, ``stdlib``, a text file or folder,
    a ``.jsonl`` or ``.parquet`` file, a folder of them, a ``datasets`` ``save_to_disk``
    directory, an ``.npz``; default: the run's dataset, uploaded with
    :meth:`upload_to_ipfs`) into shards and a validation split, upload them and the
    manifest that names them, and attach the manifest to the run (initializing; or
    distributing, before any job). ``num_shards``: as in :meth:`create_data_shards`;
    ``alpha``: Dirichlet label skew of the shards (IID if None); ``max_bytes``: text
    corpora, bytes read at most (default :data:`aitbc.run_defaults.MAX_CORPUS_BYTES`);
    ``text_field``: the records' text field. A model with a tokenizer (``hf:...``) trains
    on tokens: a byte-level BPE of at most ``vocab_size`` tokens (default 8192, 257 to
    65536) is trained on the corpus, or ``tokenizer`` (a ``tokenizer.json`` path) is used,
    or the tokenizer a pretrained model came with (the run's ``tokenizer`` option); it is
    uploaded with the shards. Returns ``{training_id, manifest_cid, shards (CIDs),
    shard_samples, val_cid, samples, val_samples, data_bytes (stored), dataset_size
    (declared), dataset, task, measured {bytes, documents, tokens, samples, val_samples},
    tokenizer_cid, vocab_size}``. ``progress(stage, done, total)`` (see
    :data:`aitbc_agent_sdk.Progress`): ``package`` (its total is 0 until the shards are
    made, then their bytes), then ``upload`` (bytes sent)."""
    tid = yield from resolve_run(self, training_id)
    run = yield from run_detail(tid)
    k = _shard_count(run, num_shards)
    if max_bytes is not None and max_bytes <= 0:
        raise InvalidArgument("bad_argument", f"max_bytes must be > 0, got {max_bytes}")
    if not isinstance(text_field, str) or not text_field:
        raise InvalidArgument("bad_argument", f"text_field must be a non-empty string, got {text_field!r}")
    from aitbc.run_data import TextOptions  # torch: imported on use

    text = TextOptions(text_field, vocab_size, None if tokenizer is None else str(tokenizer))
    if data_path is None:
        path, source = yield from _dataset_path(self, run)
    else:
        path = source = data_path
    return (
        yield from _cut(
            self, run, path, k, source=source, alpha=alpha, max_bytes=max_bytes, text=text, progress=progress
        )
    )


@operation
def create_data_shards(
    self: AgentState,
    training_id: str | None = None,
    num_shards: int | None = None,
    data_path: str | None = None,
    *,
    progress: Progress | None = None,
) -> Op[list[ShardRef]]:
    """Cut the run's dataset (uploaded with :meth:`upload_to_ipfs` while the run was
    initializing or distributing; or ``data_path``: ``digits``, ``stdlib``, a text file or
    folder, an ``.npz``) into ``num_shards`` shards (default: one per target worker) and a
    validation split, upload them with their manifest and attach it to the run, in phase
    ``initializing`` or ``distributing``. A folder of text files is the text corpus
    (byte-level, for the transformer). Returns ``[{shard_id (CID), samples,
    shard_index}]``; when the run already has that many shards of that dataset they are
    returned as they are. An automatic run has one shard per target worker; a manual
    (owner-driven) run takes any ``num_shards``, and the agent sends each shard's job.
    :meth:`upload_data` does the same with more options and returns more (``progress``
    as there)."""
    tid = yield from resolve_run(self, training_id)
    run = yield from run_detail(tid)
    if run.status not in DATA_PHASES:
        raise Conflict(
            "bad_state", f"run {tid} is {run.status}; its dataset is cut while it is initializing or distributing"
        )
    k = _shard_count(run, num_shards)
    same = data_path is None or data_path == run.data_source
    if run.manifest_cid and run.shards == k and same:
        shards = yield from ask(Page[ShardView], Http("GET", f"/runs/{tid}/shards"))
        return [ShardRef(shard_id=sh.shard_id, samples=sh.samples, shard_index=sh.shard_index) for sh in shards.data]
    up = yield from upload_data(self, tid, data_path, k, progress=progress)
    return [ShardRef(shard_id=c, samples=n, shard_index=i) for i, (c, n) in enumerate(zip(up.shards, up.shard_samples))]
