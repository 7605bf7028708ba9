"""Every public method of the agents, written once as a sans-IO generator.

Each operation takes the agent (``self``: config, wallet) and its arguments, yields
:mod:`~aitbc_agent_sdk.protocol` requests and returns a plain dict (or list, or str).
:func:`operation` records it in :data:`OPERATIONS`; ``Agent`` and ``AsyncAgent`` get one
method per entry, with the operation's name, docstring and signature."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from aitbc import run_defaults
from aitbc.market.ranking import Offer, rank_offers
from aitbc.units import format_price, parse_price
from aitbc_agent_sdk.errors import (
    AgentError,
    AmbiguousRun,
    Conflict,
    IntegrityFailure,
    InvalidArgument,
    NotFound,
    TrainingFailed,
    WaitTimeout,
)
from aitbc_agent_sdk.protocol import AgentState, Close, Http, Meter, Offload, Op, Progress, Sleep
from aitbc_agent_sdk.results import Liveness, Validity

OPERATIONS: dict[str, Callable[..., Op[Any]]] = {}

ENDED = ("complete", "failed", "stopped")

F = TypeVar("F", bound=Callable[..., Any])


def operation(fn: F) -> F:
    OPERATIONS[fn.__name__] = fn
    return fn


def _amount(value: Any, what: str) -> str:
    """Money goes to the API as a decimal string (the server keeps integer micro-AIT)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidArgument("bad_amount", f'{what} must be a number of AIT (e.g. 100 or "1.5"), got {value!r}')
    return value if isinstance(value, str) else (str(value) if isinstance(value, int) else repr(value))


def _max_cost(run: dict[str, Any], rounds: int, max_cost: int | float | str | None) -> str | None:
    """The most ``distribute`` may escrow, signed by the owner: ``max_cost`` if given, else
    for a run without a budget the hired contracts' price x ``rounds`` (what the
    coordinator will escrow for them); None for a run with a budget (it is escrowed)."""
    if max_cost is not None:
        return _amount(max_cost, "max_cost")
    if run.get("budget") is not None:
        return None
    hired = sum(c["price_micro"] for c in run["contracts"] if c["status"] == "hired")
    return format_price(hired * rounds)


# --- lifecycle (the wallet and the ledger: money.py) ---------------------------------------


@operation
def start(self: AgentState) -> Op[dict[str, Any]]:
    """Check the coordinator answers (``GET /v1/health``), load the agent's wallet
    (created under ``HOME/wallets`` if missing; a read-only agent has none) and return
    ``{status, name, address, coordinator, network}``."""
    from aitbc.ledger.wallet import ensure_wallet

    if self.config.wallet_name is not None:
        self._wallet = yield Offload(ensure_wallet, (self.config.resolved_home, self.config.wallet_name))
    health = yield Http("GET", "/health")
    return {
        "status": "started",
        "name": self.config.name,
        "address": self.address,
        "coordinator": self.config.resolved_coordinator_url,
        "network": self.config.blockchain_network,
        "coordinator_version": health.get("version"),
    }


@operation
def stop(self: AgentState) -> Op[dict[str, Any]]:
    """Release the agent's connections (runs keep going on the coordinator)."""
    yield Close()
    return {"status": "stopped", "name": self.config.name}


def _wallet(self: AgentState) -> Op[Any]:
    """The agent's wallet (loaded on first use)."""
    if self.config.wallet_name is None:
        raise InvalidArgument("no_wallet", "this agent is read-only (AgentConfig(wallet_name=None)); name a wallet")
    if self._wallet is None:
        from aitbc.ledger.wallet import load_wallet

        self._wallet = yield Offload(load_wallet, (self.config.resolved_home, self.config.wallet_name))
    return self._wallet


# --- the agent's current run -----------------------------------------------------------------


def resolve_run(self: AgentState, training_id: str | None) -> Op[str]:
    """The run a method acts on: ``training_id`` if given (it becomes the agent's current
    run), else the current run (the one the agent initialized or last named), else the
    only active run (not complete, failed or stopped) its wallet owns, which becomes
    current. None or several: :class:`AmbiguousRun`, naming the candidates."""
    if training_id is not None:
        if not isinstance(training_id, str) or not training_id:
            raise InvalidArgument("bad_argument", f"training_id must be a run id (training_...), got {training_id!r}")
        self._training_id = training_id
        return training_id
    if self._training_id is not None:
        return self._training_id
    if self.config.wallet_name is None:
        raise AmbiguousRun(
            "no_current_run", "this read-only agent has no current run and no wallet to find one; pass training_id=", []
        )
    candidates = yield from _active_runs(self)
    if len(candidates) == 1:
        self._training_id = candidates[0]
        return candidates[0]
    wallet = yield from _wallet(self)
    who = f"wallet {self.config.wallet_name!r} ({wallet.address})"
    if not candidates:
        raise AmbiguousRun(
            "no_current_run",
            f"this agent has no current run and {who} owns no active run; create one "
            f"(initialize_distributed_training) or pass training_id=",
            [],
        )
    raise AmbiguousRun(
        "ambiguous_run",
        f"this agent has no current run and {who} owns {len(candidates)} active runs "
        f"({', '.join(candidates)}); pass training_id= to choose one",
        candidates,
    )


def _active_runs(self: AgentState) -> Op[list[str]]:
    wallet = yield from _wallet(self)
    res = yield Http("GET", "/runs", params={"owner": wallet.address})
    return [r["training_id"] for r in res["data"] if r["status"] not in ENDED]


def _soft_run(self: AgentState, training_id: str | None) -> Op[str | None]:
    """:func:`resolve_run`, or None where it would raise (for methods that work without a run)."""
    try:
        return (yield from resolve_run(self, training_id))
    except AmbiguousRun:
        return None


# --- a run --------------------------------------------------------------------------------


@operation
def initialize_distributed_training(
    self: AgentState,
    model_type: str,
    dataset_size: int | float | str,
    target_workers: int,
    *,
    model_options: dict[str, Any] | None = None,
    seed: int = 0,
    budget: int | float | str | None = None,
    bond: int | float | str | None = None,
    control: Literal["automatic", "manual"] = "automatic",
) -> Op[dict[str, Any]]:
    """Create a run (``POST /v1/runs``); returns its summary with ``training_id``.

    ``dataset_size``: a number means GB (``100`` -> ``"100GB"``), or a string such as
    ``"500MB"``; the real size is measured when the data is uploaded. ``model_options``:
    the model's options (e.g. ``{"context": 64}``); ``seed``: of the data split and the
    initial model; ``budget``: AIT escrowed now (without it ``start_training`` escrows the
    contracts' cost); ``bond``: AIT each hired provider locks (default 0); ``control``:
    ``"automatic"`` (the coordinator drives the phases) or ``"manual"`` (the agent does,
    with :meth:`update_training_phase`, :meth:`send_training_job` and
    :meth:`federated_average`; the coordinator waits)."""
    if control not in ("automatic", "manual"):
        raise InvalidArgument("bad_control", f"control must be 'automatic' or 'manual', got {control!r}")
    if isinstance(dataset_size, bool) or not isinstance(dataset_size, (int, float, str)):
        raise InvalidArgument(
            "bad_size", f"dataset_size must be a number of GB or a size like '500MB', got {dataset_size!r}"
        )
    size = dataset_size if isinstance(dataset_size, str) else f"{dataset_size:g}GB"
    if isinstance(target_workers, bool) or not isinstance(target_workers, int) or target_workers < 1:
        raise InvalidArgument("bad_workers", f"target_workers must be an integer >= 1, got {target_workers!r}")
    body: dict[str, Any] = {
        "model_type": model_type,
        "dataset_size": size,
        "target_workers": target_workers,
        "network": self.config.blockchain_network,
        "model_options": dict(model_options or {}),
        "seed": int(seed),
        "control": control,
    }
    if budget is not None:
        body["budget"] = _amount(budget, "budget")
    if bond is not None:
        body["bond"] = _amount(bond, "bond")
    run = yield Http("POST", "/runs", body)
    self._training_id = run["training_id"]
    return {**run, "phase": run["status"]}


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
    run = yield Http("GET", f"/runs/{training_id}")
    if run["status"] not in DATA_PHASES or run["owner"] != self.address:
        return None
    self._datasets[cid] = path
    if run.get("data_source") != f"ipfs://{cid}":
        yield from _cut(self, run, str(path), run["target_workers"], source=f"ipfs://{cid}", progress=progress)
    return None


def _dataset_path(self: AgentState, run: dict[str, Any]) -> Op[tuple[str, str]]:
    """``(path to cut, source to record)`` of the run's dataset: the folder or file
    uploaded for it (from this agent's upload, else fetched back from the coordinator
    by its CID), or what the CLI's ``upload-data`` named."""
    source = run.get("data_source")
    if not source:
        raise Conflict(
            "no_data",
            f"run {run['training_id']} has no dataset yet: upload one with upload_to_ipfs(path=FOLDER) while it "
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
    run: dict[str, Any],
    data_path: str,
    k: int,
    *,
    source: str,
    alpha: float | None = None,
    max_bytes: int | None = None,
    progress: Progress | None = None,
) -> Op[dict[str, Any]]:
    """Cut the dataset at ``data_path`` into ``k`` shards and a validation split, upload
    them and their manifest and attach it to the run (``source``: what it records).
    ``progress``: ``package`` (total 0 until the pieces are made, then their bytes) and
    ``upload``."""
    from aitbc.run_data import prepare_run_data  # torch: imported on use

    training_id = run["training_id"]
    packing = Meter(progress, "package")
    rd = yield Offload(functools.partial(prepare_run_data, run, data_path, shards=k, alpha=alpha, max_bytes=max_bytes))
    blobs = rd.blobs()
    size = sum(len(blob) for _, blob in blobs)
    packing.update(size, size)
    sending = Meter(progress, "upload", size)
    for cid, blob in blobs:
        yield Http("PUT", f"/blobs/{cid}", content=blob, progress=sending.request())
    sending.end()
    detail = yield Http("POST", f"/runs/{training_id}/data", {"manifest_cid": rd.manifest_cid, "source": source})
    return {
        "training_id": training_id,
        "manifest_cid": rd.manifest_cid,
        "shards": rd.shard_cids,
        "shard_samples": list(rd.packaged.samples),
        "val_cid": rd.val_cid,
        "samples": sum(rd.packaged.samples),
        "val_samples": rd.packaged.val_samples,
        "data_bytes": detail["data_bytes"],
        "dataset_size": run["dataset_size"],
        "dataset": rd.dataset.name,
        "task": rd.dataset.spec.task,
    }


def _shard_count(run: dict[str, Any], num_shards: int | None) -> int:
    k = run["target_workers"] if num_shards is None else num_shards
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidArgument("bad_shards", f"num_shards must be an integer >= 1, got {num_shards!r}")
    if run.get("control") == "automatic" and k != run["target_workers"]:
        raise InvalidArgument(
            "bad_shards",
            f"num_shards={num_shards}: run {run['training_id']} (automatic control) plans one "
            f"shard per target worker, so num_shards must be {run['target_workers']} (or None)",
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
    progress: Progress | None = None,
) -> Op[dict[str, Any]]:
    """Split the dataset at ``data_path`` (``digits``, ``stdlib``, a text file or folder,
    an ``.npz``; default: the run's dataset, uploaded with :meth:`upload_to_ipfs`) into
    shards and a validation split, upload them and the manifest that names them, and
    attach the manifest to the run (initializing; or distributing, before any job).
    ``num_shards``: as in :meth:`create_data_shards`; ``alpha``: Dirichlet label skew of
    the shards (IID if None); ``max_bytes``: text corpora, bytes read at most (default
    :data:`aitbc.run_defaults.MAX_CORPUS_BYTES`). Returns ``{training_id, manifest_cid,
    shards (CIDs), shard_samples, val_cid, samples, val_samples, data_bytes (measured),
    dataset_size (declared), dataset, task}``. ``progress(stage, done, total)`` (see
    :data:`aitbc_agent_sdk.Progress`): ``package`` (its total is 0 until the shards are
    made, then their bytes), then ``upload`` (bytes sent)."""
    tid = yield from resolve_run(self, training_id)
    run = yield Http("GET", f"/runs/{tid}")
    k = _shard_count(run, num_shards)
    if max_bytes is not None and max_bytes <= 0:
        raise InvalidArgument("bad_argument", f"max_bytes must be > 0, got {max_bytes}")
    if data_path is None:
        path, source = yield from _dataset_path(self, run)
    else:
        path = source = data_path
    return (yield from _cut(self, run, path, k, source=source, alpha=alpha, max_bytes=max_bytes, progress=progress))


@operation
def create_data_shards(
    self: AgentState,
    training_id: str | None = None,
    num_shards: int | None = None,
    data_path: str | None = None,
    *,
    progress: Progress | None = None,
) -> Op[list[dict[str, Any]]]:
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
    run = yield Http("GET", f"/runs/{tid}")
    if run["status"] not in DATA_PHASES:
        raise Conflict(
            "bad_state", f"run {tid} is {run['status']}; its dataset is cut while it is initializing or distributing"
        )
    k = _shard_count(run, num_shards)
    same = data_path is None or data_path == run.get("data_source")
    if run.get("manifest_cid") and run.get("shards") == k and same:
        shards = yield Http("GET", f"/runs/{tid}/shards")
        return [
            {"shard_id": sh["shard_id"], "samples": sh["samples"], "shard_index": sh["shard_index"]}
            for sh in shards["data"]
        ]
    up = yield from upload_data(self, tid, data_path, k, progress=progress)
    return [
        {"shard_id": c, "samples": n, "shard_index": i}
        for i, (c, n) in enumerate(zip(up["shards"], up["shard_samples"]))
    ]


@operation
def get_training_status(self: AgentState, training_id: str | None = None) -> Op[dict[str, Any]]:
    """The run's detail (``GET /v1/runs/{id}``; default: the agent's current run) plus
    ``phase`` (its status: initializing, distributing, training, aggregating, paused,
    complete, failed, stopped)."""
    training_id = yield from resolve_run(self, training_id)
    run = yield Http("GET", f"/runs/{training_id}")
    return {**run, "phase": run["status"]}


@operation
def list_trainings(self: AgentState, status: str | None = None, owner: str | None = None) -> Op[list[dict[str, Any]]]:
    """Every run on the coordinator, newest first (``status``: only runs in that state;
    ``owner``: only runs of that wallet address): ``[{training_id, status, model_type,
    round, rounds, val_loss, target_workers, owner, created_at, ...}]``."""
    res = yield Http("GET", "/runs", params={"status": status, "owner": owner})
    return res["data"]


@operation
def discover_gpu_workers(
    self: AgentState,
    min_gpu: str | None = None,
    required_workers: int = 1,
    max_price: int | float | str | None = None,
    training_id: str | None = None,
) -> Op[list[dict[str, Any]]]:
    """The best ``required_workers`` live, free offers, ranked by the marketplace score:
    ``[{worker_id, gpu_type, price, reputation, availability, score, ...}]`` (the market's
    view of each offer, plus its score), best first
    (``min_gpu``: the lowest GPU class, ``max_price``: AIT per round). Hire them with
    :meth:`negotiate_worker_contract`. Fewer than ``required_workers``: :class:`Conflict`
    (``not_enough_workers``).

    With ``training_id``, ranking and hiring are one step on the coordinator
    (:meth:`hire_workers`): the best are hired at their asking price and every ranked
    offer is returned with ``hired`` (the hired ones carry ``contract_id``)."""
    if training_id is not None:
        res = yield from hire_workers(self, training_id, required_workers, min_gpu=min_gpu, max_price=max_price)
        contracts = {c["worker_id"]: c for c in res["contracts"]}
        return [
            {**r, **({"contract_id": contracts[r["worker_id"]]["contract_id"]} if r["worker_id"] in contracts else {})}
            for r in res["ranked"]
        ]
    _check_workers(required_workers)
    limit = None if max_price is None else parse_price(_amount(max_price, "max_price"), field="max_price") / 1_000_000
    res = yield Http("GET", "/market/offers")
    ranked = rank_free(res["data"], min_gpu=min_gpu, max_price=limit)
    if len(ranked) < required_workers:
        raise Conflict(
            "not_enough_workers",
            f"{required_workers} workers required; {len(ranked)} live, free offer(s) "
            f"match (min_gpu={min_gpu}, max_price={max_price}) of {len(res['data'])} live",
        )
    return ranked[:required_workers]


def _check_workers(required_workers: int) -> None:
    if isinstance(required_workers, bool) or not isinstance(required_workers, int) or required_workers < 1:
        raise InvalidArgument("bad_workers", f"required_workers must be an integer >= 1, got {required_workers!r}")


@operation
def hire_workers(
    self: AgentState,
    training_id: str | None = None,
    required_workers: int = 1,
    min_gpu: str | None = None,
    max_price: int | float | str | None = None,
) -> Op[dict[str, Any]]:
    """Rank the live, free offers on the coordinator (``POST /v1/runs/{id}/discover``) and
    hire the best ``required_workers`` for the run at their asking price, in one step.
    Returns ``{ranked: [{worker_id, gpu_type, price, reputation, availability, score,
    hired}], contracts: [{contract_id, worker_id, price, ...}], count (hired)}``. Too few
    match: :class:`Conflict` (``not_enough_workers``) and nobody is hired. The owner's money
    comes first: an owner whose wallet and run escrow cannot pay every contract of the run
    at its price for the run's rounds (the default plan's until distribute) gets
    :class:`Conflict` (``insufficient_funds``, naming the shortfall) and nobody is hired."""
    _check_workers(required_workers)
    training_id = yield from resolve_run(self, training_id)
    body: dict[str, Any] = {"required_workers": required_workers, "min_gpu": min_gpu}
    if max_price is not None:
        body["max_price"] = _amount(max_price, "max_price")
    return (yield Http("POST", f"/runs/{training_id}/discover", body))


def market_offer(o: dict[str, Any]) -> Offer:
    """An offer of ``GET /v1/market/offers`` as the marketplace's :class:`Offer` (to score
    or rank it here; the price from its exact micro-AIT)."""
    return Offer(
        worker_id=o["worker_id"],
        gpu=o["gpu_type"],
        price=o["price_micro"] / 1_000_000,
        reputation=o["reputation"],
        availability=o["availability"],
        last_heartbeat=o.get("last_heartbeat", 0.0),
    )


def rank_free(
    offers: list[dict[str, Any]],
    *,
    min_gpu: str | None = None,
    max_price: float | None = None,
    exclude: set[str] | frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """The live offers (``GET /v1/market/offers``) no run holds, best first by the
    marketplace's ranking, each with its ``score`` added. (The coordinator judged them
    live; no clock is read here.)"""
    free = {o["worker_id"]: o for o in offers if not o.get("busy") and o["worker_id"] not in exclude}
    ranked = rank_offers(
        [market_offer(o) for o in free.values()],
        min_gpu=min_gpu,
        max_price=max_price,
        now=0.0,
        max_age=float("inf"),
    )
    return [{**with_prices(free[r.offer.worker_id]), "score": r.score} for r in ranked]


@operation
def start_training(
    self: AgentState,
    training_id: str | None = None,
    rounds: int = run_defaults.ROUNDS,
    local_steps: int = run_defaults.LOCAL_STEPS,
    *,
    batch_size: int = run_defaults.BATCH_SIZE,
    lr: float = run_defaults.LR,
    inner_opt: str = run_defaults.INNER_OPT,
    outer: str = run_defaults.OUTER,
    outer_options: dict[str, Any] | None = None,
    aggregator: str = run_defaults.AGGREGATOR,
    compression: str = run_defaults.COMPRESSION,
    error_feedback: bool = run_defaults.ERROR_FEEDBACK,
    deadline: float | None = None,
    quorum: int | None = None,
    min_workers: int | None = None,
    max_workers: int | None = None,
    eval_every: int = run_defaults.EVAL_EVERY,
    max_cost: int | float | str | None = None,
    verify_rate: float = run_defaults.VERIFY_RATE,
    overlap: int = run_defaults.OVERLAP,
    precision: str = run_defaults.PRECISION,
    mode: str = "sync",
    buffer: int | None = None,
    max_staleness: int = 4,
    staleness: str = "polynomial",
    topology: str = "ring",
) -> Op[dict[str, Any]]:
    """Assign the shards to the hired workers and start the rounds (``distribute``):
    ``rounds`` of ``local_steps`` inner steps (of ``batch_size`` samples, learning rate
    ``lr``, optimizer ``inner_opt``) per worker, aggregated by ``aggregator`` (e.g.
    ``trimmed-mean:beta=0.2``) and the ``outer`` optimizer (fedavg, diloco; its
    ``outer_options``), updates sent through ``compression`` (e.g. ``int8``,
    ``topk:ratio=0.01``; ``error_feedback`` keeps each worker's residual). ``deadline``:
    seconds a round waits at most (default :data:`aitbc.run_defaults.DEADLINE`), then
    closes with ``quorum`` accepted updates (default ``min_workers``, default 1); a worker
    that sent nothing by then loses its place; ``max_workers``: joiners included (default: target
    workers); the model is evaluated every ``eval_every`` rounds. A run without a budget
    escrows the contracts' cost now; unless ``max_cost`` is given it is the contracts'
    price x rounds. ``verify_rate`` in [0, 1]: spot checks, the expected share of each
    update's local steps the coordinator re-runs (a verified update is paid in full; one
    that fails is rejected and its worker slashed). ``overlap`` 1: a worker starts round
    r+1 from the newest published model as soon as it has sent round r, and its update is
    applied to the newer model (one-step delay); 2: two rounds ahead, the next round's
    update sent before that round opens (two-step delay); 0: synchronous rounds. ``precision``
    ``bf16``: the workers' inner steps run under bfloat16 autocast (``fp32``: none).
    ``mode`` ``async``: no round barrier; every ``buffer`` accepted updates (default half
    the workers; or ``deadline`` seconds with at least one) are applied as a new version,
    each down-weighted by ``staleness`` (a rule of :mod:`aitbc.core.staleness`) for the
    versions applied since the one it was trained from, and refused past ``max_staleness``.
    ``mode`` ``gossip``: workers train from their own models and mix them with their
    ``topology`` neighbours' (``ring``, ``random:K``) peer to peer, by the run's rule; the
    coordinator records each worker's signed model CID per round and scores them.
    Returns the run detail with ``phase``."""
    training_id = yield from resolve_run(self, training_id)
    run = yield Http("GET", f"/runs/{training_id}")
    body: dict[str, Any] = {
        "rounds": rounds,
        "local_steps": local_steps,
        "batch_size": batch_size,
        "lr": lr,
        "inner_opt": inner_opt,
        "outer": outer,
        "aggregator": aggregator,
        "compression": compression,
        "error_feedback": error_feedback,
        "deadline": deadline,
        "quorum": quorum,
        "min_workers": min_workers,
        "max_workers": max_workers,
        "eval_every": eval_every,
        "max_cost": _max_cost(run, rounds, max_cost),
        "verify_rate": verify_rate,
        "overlap": overlap,
        "precision": precision,
        "mode": mode,
        "buffer": buffer,
        "max_staleness": max_staleness,
        "staleness": staleness,
    }
    if mode == "gossip":
        body["topology"] = topology
    if outer_options is not None:
        body["outer_options"] = dict(outer_options)
    run = yield Http("POST", f"/runs/{training_id}/distribute", body)
    return {**run, "phase": run["status"]}


@operation
def stop_training(self: AgentState, training_id: str | None = None) -> Op[dict[str, Any]]:
    """End the run now (it ends as ``stopped``; its workers are released, closed rounds
    settled and the rest of the escrow refunded). Returns the run's summary."""
    training_id = yield from resolve_run(self, training_id)
    return (yield Http("POST", f"/runs/{training_id}/stop"))


@operation
def pause_training(self: AgentState, training_id: str | None = None) -> Op[dict[str, Any]]:
    """Hold an automatic run after its current round's updates (``paused``); returns the
    run's detail. :meth:`resume_training` continues it."""
    training_id = yield from resolve_run(self, training_id)
    return (yield Http("POST", f"/runs/{training_id}/pause"))


@operation
def resume_training(self: AgentState, training_id: str | None = None) -> Op[dict[str, Any]]:
    """Continue a paused run; returns the run's detail."""
    training_id = yield from resolve_run(self, training_id)
    return (yield Http("POST", f"/runs/{training_id}/resume"))


# --- workers --------------------------------------------------------------------------------


def current_jobs(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's workers as its detail lists them (one job each), less the failed jobs
    whose shard went to another job (named ``replaces``, or any later job on that shard)
    and, while the run is live, the jobs that ended otherwise (released): the working
    ones and the failed ones nobody replaced yet. Once the run ended, each job as it ended."""
    replaced = {w["replaces"] for w in run["workers"] if w.get("replaces")}
    taken = {w["shard_index"] for w in run["workers"] if w["job_status"] != "failed"}
    jobs = [
        w
        for w in run["workers"]
        if w["job_id"] not in replaced and not (w["job_status"] == "failed" and w["shard_index"] in taken)
    ]
    if run["status"] in ENDED:
        return jobs
    return [w for w in jobs if w["job_status"] in ("active", "failed")]


@operation
def get_all_workers(self: AgentState, training_id: str | None = None) -> Op[list[dict[str, Any]]]:
    """The run's workers (default: the agent's current run), one job each: the working
    ones and any failed one not replaced yet (once the run ended, each job as it ended).
    Each has ``worker_id, job_id, job_status, status, progress, loss, epoch, speed,
    gpu_type, score, last_heartbeat_age, ...``; :meth:`get_worker_progress` tells more."""
    training_id = yield from resolve_run(self, training_id)
    run = yield Http("GET", f"/runs/{training_id}")
    return current_jobs(run)


@operation
def get_active_workers(self: AgentState, training_id: str | None = None) -> Op[list[dict[str, Any]]]:
    """The run's jobs still working (not failed, released or replaced), as in
    :meth:`get_all_workers`."""
    training_id = yield from resolve_run(self, training_id)
    run = yield Http("GET", f"/runs/{training_id}")
    return [w for w in run["workers"] if w["job_status"] == "active"]


@operation
def get_worker_progress(self: AgentState, job_id: str) -> Op[dict[str, Any]]:
    """``{progress, loss, epoch, status}`` of one job (``GET /v1/jobs/{job_id}``):
    ``progress`` is the percentage (0-100) of the job's work in the open round;
    ``status`` is ``complete`` once its update for the round is in and accepted
    (``rejected`` if refused), before that the worker's last report (``waiting``,
    ``training``, ...), and ``failed``/``released`` once the job ended; ``loss`` is its
    latest training loss, a number (before its first step, the validation loss of the
    model it starts from); ``epoch``: passes over its shard so far.
    Plus ``job_id, worker_id, training_id, gpu_type, speed, rounds_done, job_status``
    (active, failed, released), ``round`` (the run's open round) and ``round_update``
    (``accepted`` or ``rejected`` once the worker sent that round's update, else None)."""
    j = yield Http("GET", f"/jobs/{job_id}")
    loss = j["loss"]
    if loss is None:  # not started yet: the loss of the model it starts from
        run = yield Http("GET", f"/runs/{j['training_id']}")
        loss = next((v for v in (run["val_loss"], run["initial_val_loss"]) if v is not None), float("nan"))
    return {
        "job_id": j["job_id"],
        "worker_id": j["worker_id"],
        "training_id": j["training_id"],
        "gpu_type": j.get("gpu_type"),
        "progress": j["progress"],
        "loss": loss,
        "epoch": j["epoch"],
        "status": j["status"],
        "speed": j.get("speed"),
        "rounds_done": j["rounds_done"],
        "round": j["round"],
        "round_update": j["this_round"],
        "job_status": j["job_status"],
    }


@operation
def get_worker_job(self: AgentState, worker_id: str, training_id: str | None = None) -> Op[dict[str, Any] | None]:
    """The worker's current (active) job, else its most recent one (in ``training_id``
    if given), or None if it never had one: ``{job_id, worker_id, training_id, gpu_type,
    shard_index, job_status, progress, ...}``."""
    res = yield Http("GET", f"/workers/{worker_id}/jobs")
    jobs = [j for j in res["data"] if training_id in (None, j["training_id"])]
    active = [j for j in jobs if j["job_status"] == "active"]
    job = (active or jobs or [None])[0]
    if job is not None and job.get("gpu_type") is None:  # the GPU class the worker offers
        offers = yield Http("GET", "/market/offers", params={"all": "true"})
        job = {**job, "gpu_type": next((o["gpu_type"] for o in offers["data"] if o["worker_id"] == worker_id), None)}
    return job


def with_prices(d: dict[str, Any]) -> dict[str, Any]:
    """``price`` as a number of AIT (from the exact ``price_micro``, which stays beside it)."""
    if d.get("price_micro") is not None:
        return {**d, "price": d["price_micro"] / 1_000_000}
    return d


@operation
def negotiate_worker_contract(
    self: AgentState, worker_id: str, training_id: str | None = None, price: int | float | str | None = None
) -> Op[dict[str, Any]]:
    """Hire one provider for the run (default: the agent's current run) at ``price`` AIT
    per round (default: its asking price): accepted when it is at least the provider's
    asking price (else ``Conflict`` with code ``price_rejected``), and the owner can pay
    for it (else ``Conflict`` ``insufficient_funds``, as :meth:`hire_workers`). Returns
    ``{contract_id, price (a number of AIT), price_micro (exact), worker_id,
    training_id, status}``: pay it with :meth:`process_payment` (``amount=contract["price"]``)."""
    training_id = yield from resolve_run(self, training_id)
    if price is None:
        price = yield from _asking_price(worker_id)
    c = yield Http(
        "POST", f"/runs/{training_id}/contracts", json={"worker_id": worker_id, "price": _amount(price, "price")}
    )
    return {
        "contract_id": c["contract_id"],
        "price": c["price_micro"] / 1_000_000,
        "price_micro": c["price_micro"],
        "worker_id": c["worker_id"],
        "training_id": c["training_id"],
        "status": c["status"],
    }


def _asking_price(worker_id: str) -> Op[str]:
    offers = yield Http("GET", "/market/offers", params={"all": "true"})
    mine = [o for o in offers["data"] if o["worker_id"] == worker_id]
    if not mine:
        raise NotFound("unknown_worker", f"worker {worker_id} has no offer on this coordinator")
    return format_price(mine[0]["price_micro"])


@operation
def get_market_offers(self: AgentState, include_offline: bool = False) -> Op[list[dict[str, Any]]]:
    """Every live offer on the market, busy or free (``GET /v1/market/offers``):
    ``[{worker_id, gpu_type, device, price, price_micro, reputation, availability,
    status, live, busy, last_heartbeat, last_heartbeat_age}]``. ``include_offline``:
    also offers that are not live (failed, silent), with their status."""
    res = yield Http("GET", "/market/offers", params={"all": "true" if include_offline else None})
    return [with_prices(o) for o in res["data"]]


@operation
def get_available_workers(
    self: AgentState, training_id: str | None = None, min_gpu: str | None = None
) -> Op[list[dict[str, Any]]]:
    """The workers the run (default: the agent's current run, if any) could add now: live
    offers no run holds and the run has no contract with, best first by the marketplace
    score (``min_gpu``: the weakest GPU class accepted). Each is the market's view of the
    offer (``worker_id, gpu_type, price, price_micro, reputation, availability, ...``)
    plus ``score``. Hire one with :meth:`add_worker` (``worker_id=``)."""
    training_id = yield from _soft_run(self, training_id)
    res = yield Http("GET", "/market/offers")
    taken: set[str] = set()
    if training_id is not None:
        run = yield Http("GET", f"/runs/{training_id}")
        taken = {c["worker_id"] for c in run["contracts"]}
    return rank_free(res["data"], min_gpu=min_gpu, exclude=taken)


@operation
def ping_worker(self: AgentState, worker_id: str, max_age: float | None = None) -> Op[Liveness]:
    """Whether the worker answers: truthy exactly when it is ``alive`` (online and heard
    from within ``max_age`` seconds; default: the coordinator's lease, within which
    workers heartbeat several times), so ``if not agent.ping_worker(w)`` reads as said.
    A :class:`~aitbc_agent_sdk.results.Liveness` dict: ``{worker_id, alive,
    last_heartbeat_age, status, gpu_type, busy}``. An unknown worker: :class:`NotFound`."""
    res = yield Http("GET", "/market/offers", params={"all": "true"})
    for o in res["data"]:
        if o["worker_id"] == worker_id:
            fresh = o["live"] if max_age is None else o["last_heartbeat_age"] <= max_age
            return Liveness(
                worker_id=worker_id,
                alive=bool(fresh and o["status"] == "online"),
                last_heartbeat_age=o["last_heartbeat_age"],
                status=o["status"],
                gpu_type=o["gpu_type"],
                busy=o.get("busy", False),
            )
    raise NotFound("unknown_worker", f"worker {worker_id} has no offer on this coordinator")


# --- progress, checkpoints, results -------------------------------------------------------------


@operation
def get_all_checkpoints(self: AgentState, training_id: str | None = None) -> Op[list[dict[str, Any]]]:
    """The latest checkpoint of each of the run's workers (default: the agent's current
    run): the newest update each job of :meth:`get_all_workers` sent, as
    :meth:`collect_checkpoint` returns it: ``{checkpoint_id, cid, worker_id, job_id,
    training_id, round, samples, train_loss, size, status, ...}``. Workers that sent
    nothing yet are left out. Check one with :meth:`verify_checkpoint`; the global
    model's checkpoints (one per round) are :meth:`get_round_checkpoints`."""
    training_id = yield from resolve_run(self, training_id)
    run = yield Http("GET", f"/runs/{training_id}")
    latest = yield Http("GET", f"/runs/{training_id}/updates", params={"latest": "true"})
    by_job = {u["job_id"]: u for u in latest["data"]}
    return [by_job[w["job_id"]] for w in current_jobs(run) if w["job_id"] in by_job]


@operation
def get_round_checkpoints(self: AgentState, training_id: str | None = None) -> Op[list[dict[str, Any]]]:
    """The global model's checkpoints, one per round, round 0 being the initial model:
    ``[{round, checkpoint_id, checkpoint_cid, val_loss, val_accuracy}]``
    (``checkpoint_id`` is the CID)."""
    training_id = yield from resolve_run(self, training_id)
    res = yield Http("GET", f"/runs/{training_id}/rounds")
    return [
        {
            "round": r["round"],
            "checkpoint_id": r["checkpoint_cid"],
            "checkpoint_cid": r["checkpoint_cid"],
            "val_loss": r["val_loss"],
            "val_accuracy": r["val_accuracy"],
        }
        for r in res["data"]
    ]


@operation
def get_round_scores(self: AgentState, training_id: str | None = None) -> Op[list[dict[str, Any]]]:
    """Every worker's score in every scored round of the run (default: the agent's
    current run), by round: ``[{round, worker_id, contract_id, status, quality, gain,
    own_gain, other_gain, kept, flags, provable}]``; ``quality`` (0..1) is the share of
    the round's price the worker was paid."""
    training_id = yield from resolve_run(self, training_id)
    rows: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:  # the coordinator sends them in pages
        res = yield Http("GET", f"/runs/{training_id}/scores", params={"after": after})
        rows += res["data"]
        after = res.get("next")
    return sorted(rows, key=lambda r: r["round"])  # stable: as written within a round


@operation
def get_rounds(self: AgentState, training_id: str | None = None) -> Op[list[dict[str, Any]]]:
    """Every closed round of the run (default: the agent's current run) as the
    coordinator recorded it, round 0 being the initial model: ``[{round, checkpoint_cid,
    val_loss, val_accuracy, train_loss, train_accuracy, accepted, rejected, stragglers, skipped,
    bytes_up, bytes_down, started_at, closed_at}]``; ``bytes_up``/``bytes_down`` are that
    round's own (``None`` for rounds recorded before they were counted), ``val_loss``
    ``None`` until the round is evaluated."""
    training_id = yield from resolve_run(self, training_id)
    res = yield Http("GET", f"/runs/{training_id}/rounds")
    return list(res["data"])


@operation
def verify_checkpoint(self: AgentState, checkpoint: dict[str, Any] | str) -> Op[Validity]:
    """Download a checkpoint through the coordinator and re-hash it against its CID: a
    worker's (from :meth:`get_all_checkpoints` or :meth:`collect_checkpoint`) must decode
    as an update; a round's (from :meth:`get_round_checkpoints`, or a CID) must be a
    loadable checkpoint, of the round claimed if given. Truthy exactly when ``valid``, so
    ``if not agent.verify_checkpoint(c)`` reads as said: a
    :class:`~aitbc_agent_sdk.results.Validity` dict ``{valid, cid, round, detail}``
    (``worker_id`` for a worker's, ``pruned: True`` for a recorded round whose bytes the
    coordinator's blob retention deleted). Never raises for a bad checkpoint, only for an
    unreachable coordinator."""
    return Validity((yield from _verify(checkpoint)))


def _verify(checkpoint: dict[str, Any] | str) -> Op[dict[str, Any]]:
    from aitbc.errors import AitbcError
    from aitbc.storage.cid import cid_of_bytes

    if isinstance(checkpoint, dict) and checkpoint.get("job_id") and checkpoint.get("cid"):
        return (yield from _verify_update(checkpoint))
    if isinstance(checkpoint, str):
        cid, claimed = checkpoint, None
    elif isinstance(checkpoint, dict) and (checkpoint.get("checkpoint_cid") or checkpoint.get("cid")):
        cid, claimed = checkpoint.get("checkpoint_cid") or checkpoint["cid"], checkpoint.get("round")
    else:
        raise InvalidArgument(
            "bad_argument", f"checkpoint must be a CID or a dict with checkpoint_cid, got {checkpoint!r}"
        )
    try:
        data = yield Http("GET", f"/blobs/{cid}", raw=True)
    except AgentError as e:
        if e.code == "unknown_blob" and claimed is not None:  # a recorded round whose bytes retention deleted
            return {"valid": False, "pruned": True, "cid": cid, "round": claimed, "detail": "pruned by blob retention"}
        if isinstance(e, (NotFound, InvalidArgument)) or e.status in (400, 404):
            return {"valid": False, "cid": cid, "round": claimed, "detail": e.detail}
        raise
    actual = yield Offload(cid_of_bytes, (data,))
    if actual != cid:
        return {"valid": False, "cid": cid, "round": claimed, "detail": f"blob hashes to {actual}, not {cid}"}
    try:
        meta = yield Offload(_read_checkpoint, (data,))
    except AitbcError as e:
        return {"valid": False, "cid": cid, "round": claimed, "detail": str(e)}
    rnd = int(meta["round"]) if str(meta.get("round", "")).isdigit() else None
    if claimed is not None and rnd != claimed:
        return {"valid": False, "cid": cid, "round": claimed, "detail": f"checkpoint says round {meta.get('round')}"}
    return {"valid": True, "cid": cid, "round": rnd, "detail": "hash and checkpoint OK"}


def _read_checkpoint(data: bytes) -> dict[str, str]:
    """A checkpoint's metadata, once its tensors load (safetensors, finite)."""
    from aitbc.training.checkpoint import bytes_to_tensors, read_metadata  # torch: imported on use

    meta = read_metadata(data)
    bytes_to_tensors(data)
    return meta


def _verify_update(update: dict[str, Any]) -> Op[dict[str, Any]]:
    """A worker's update (from :meth:`collect_checkpoint`): its blob hashes to its CID and
    decodes as an update."""
    from aitbc.core.compression import decode
    from aitbc.errors import AitbcError
    from aitbc.storage.cid import cid_of_bytes

    cid, rnd = update["cid"], update.get("round")
    try:
        data = yield Http("GET", f"/blobs/{cid}", raw=True)
    except AgentError as e:
        if isinstance(e, (NotFound, InvalidArgument)) or e.status in (400, 404):
            return {"valid": False, "cid": cid, "round": rnd, "detail": e.detail, "worker_id": update.get("worker_id")}
        raise
    actual = yield Offload(cid_of_bytes, (data,))
    detail = f"blob hashes to {actual}, not {cid}" if actual != cid else None
    if detail is None:
        try:
            yield Offload(decode, (data,))
        except AitbcError as e:
            detail = f"not an update: {e}"
    return {
        "valid": detail is None,
        "cid": cid,
        "round": rnd,
        "detail": detail or "hash and update OK",
        "worker_id": update.get("worker_id"),
    }


@operation
def get_training_progress(self: AgentState, training_id: str | None = None) -> Op[dict[str, Any]]:
    """``{round, rounds, rounds_completed, speed, target_speed, val_loss, phase}`` of the
    run (default: the agent's current run): ``speed`` is rounds completed per second
    since training started; ``target_speed`` the rounds per second its plan asks for
    (1/deadline; without a deadline, as the coordinator derives it from the plan)."""
    training_id = yield from resolve_run(self, training_id)
    run = yield Http("GET", f"/runs/{training_id}")
    started, now = run.get("started_at"), run.get("finished_at") or run.get("time") or time.time()
    speed = run["rounds_completed"] / (now - started) if started and now > started else 0.0
    deadline = (run.get("config") or {}).get("deadline")
    return {
        "round": run["round"],
        "rounds": run["rounds"],
        "rounds_completed": run["rounds_completed"],
        "speed": run.get("speed", speed),
        "target_speed": (1.0 / deadline) if deadline else run.get("target_speed"),
        "val_loss": run["val_loss"],
        "phase": run["status"],
    }


@operation
def wait_for_completion(
    self: AgentState, training_id: str | None = None, timeout: float = 600.0, poll: float = 1.0
) -> Op[dict[str, Any]]:
    """Poll the run until it ends; returns its detail when ``complete``. Raises
    :class:`TrainingFailed` if it fails or is stopped and :class:`WaitTimeout` after
    ``timeout`` s."""
    training_id = yield from resolve_run(self, training_id)
    t0 = time.monotonic()
    while True:
        run = yield Http("GET", f"/runs/{training_id}")
        if run["status"] == "complete":
            return {**run, "phase": run["status"]}
        if run["status"] == "failed":
            raise TrainingFailed("run_failed", f"run {training_id} failed: {run.get('error') or 'no reason recorded'}")
        if run["status"] == "stopped":
            raise TrainingFailed("run_stopped", f"run {training_id} was stopped by its owner")
        left = timeout - (time.monotonic() - t0)
        if left <= 0:
            raise WaitTimeout(
                "timeout",
                f"run {training_id} did not finish within {timeout:g} s "
                f"(status {run['status']}, round {run['round']}/{run['rounds']})",
            )
        yield Sleep(min(poll, left))


@operation
def get_results(self: AgentState, training_id: str | None = None) -> Op[dict[str, Any]]:
    """Final metrics, the model's CID, every checkpoint and the workers' scores."""
    training_id = yield from resolve_run(self, training_id)
    return (yield Http("GET", f"/runs/{training_id}/results"))


@operation
def download_model(
    self: AgentState,
    training_id: str | None = None,
    path: str | Path | None = None,
    round: int | None = None,
    *,
    progress: Progress | None = None,
) -> Op[dict[str, Any]]:
    """Write the run's model (``round``: that round's checkpoint; default the latest) to
    the file ``path`` as a safetensors checkpoint, verified against its CID first; the
    file appears only whole. Returns ``{training_id, path, cid, bytes}``. No model yet:
    :class:`Conflict` (``no_model``); no such round: :class:`NotFound`. ``progress``: stage
    ``download`` (see :data:`aitbc_agent_sdk.Progress`)."""
    if path is None:
        raise InvalidArgument("bad_argument", "download_model needs path=, the file to write")
    training_id = yield from resolve_run(self, training_id)
    out = Path(path).expanduser()
    if out.is_dir():
        raise InvalidArgument("bad_argument", f"{out} is a directory; give the file to write")
    if not out.parent.exists():
        raise NotFound("not_found", f"no such directory: {out.parent}")
    res = yield Http("GET", f"/runs/{training_id}/results")
    cid = res["model_cid"]
    if round is not None:
        match = [ck["cid"] for ck in res["checkpoints"] if ck["round"] == round]
        if not match:
            raise NotFound(
                "unknown_round",
                f"run {training_id} has no checkpoint for round {round} (it has 0..{len(res['checkpoints']) - 1})",
            )
        cid = match[0]
    if cid is None:
        raise Conflict("no_model", f"run {training_id} has no model yet (status {res['status']})")
    data = yield from _download(cid, progress)
    yield Offload(_write_whole, (out, data))
    return {"training_id": training_id, "path": str(out), "cid": cid, "bytes": len(data)}


def _download(cid: str, progress: Progress | None = None) -> Op[bytes]:
    """A blob's bytes, re-hashed here: a coordinator cannot hand us something else."""
    from aitbc.storage.cid import cid_of_bytes

    receiving = Meter(progress, "download")
    data = yield Http("GET", f"/blobs/{cid}", raw=True, progress=receiving.request())
    receiving.end()
    actual = yield Offload(cid_of_bytes, (data,))
    if actual != cid:
        raise IntegrityFailure("integrity", f"blob {cid} from the coordinator does not hash to its CID (got {actual})")
    return data


def _write_whole(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(path)


# --- payments ---------------------------------------------------------------------------


@operation
def get_payments(self: AgentState, training_id: str | None = None) -> Op[dict[str, Any]]:
    """Per contract: rounds accepted, score, paid, bond, slashed, reputation; and the escrow."""
    training_id = yield from resolve_run(self, training_id)
    return (yield Http("GET", f"/runs/{training_id}/payments"))


@operation
def process_payment(
    self: AgentState, worker_id: str, contract_id: str, amount: int | float | str, training_id: str | None = None
) -> Op[dict[str, Any]]:
    """Pay ``amount`` AIT from a run's escrow to the worker holding ``contract_id`` (the
    run's owner only). The run is found among the agent's runs from the contract (which
    must be that worker's), or given as ``training_id``. Returns ``{contract_id, worker_id,
    amount, amount_micro, entry, escrow_left}``."""
    amount_text = _amount(amount, "amount")
    if worker_id.startswith("training_") and training_id is None:  # the earlier (training_id, contract_id, amount) form
        worker_id, training_id = "", worker_id
    if training_id is None:
        training_id = yield from _run_of_contract(self, contract_id, worker_id=worker_id)
    elif worker_id:
        run = yield Http("GET", f"/runs/{training_id}")
        holder = next((c["worker_id"] for c in run["contracts"] if c["contract_id"] == contract_id), worker_id)
        if holder != worker_id:  # checked before paying (an unknown contract is the server's 404)
            raise InvalidArgument("bad_argument", f"contract {contract_id} is with {holder}, not {worker_id}")
    return (yield Http("POST", f"/runs/{training_id}/payments", {"contract_id": contract_id, "amount": amount_text}))


def _run_of_contract(self: AgentState, contract_id: str, *, worker_id: str) -> Op[str]:
    wallet = yield from _wallet(self)
    runs = yield from list_trainings(self, owner=wallet.address)
    for r in runs:
        detail = yield Http("GET", f"/runs/{r['training_id']}")
        for c in detail["contracts"]:
            if c["contract_id"] == contract_id:
                if c["worker_id"] != worker_id:
                    raise InvalidArgument(
                        "bad_argument", f"contract {contract_id} is with {c['worker_id']}, not {worker_id}"
                    )
                return r["training_id"]
    raise NotFound("unknown_contract", f"no run of {wallet.address} has contract {contract_id!r}")


@operation
def refund_payments(self: AgentState, training_id: str | None = None) -> Op[dict[str, Any]]:
    """Return an ended run's unspent escrow to the agent (and honest providers' bonds);
    returns the payments view. A run still going: :class:`Conflict` (``bad_state``)."""
    training_id = yield from resolve_run(self, training_id)
    return (yield Http("POST", f"/runs/{training_id}/refund"))
