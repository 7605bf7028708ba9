"""The coordinator's tables (SQLAlchemy 2, portable: no SQLite-only SQL).

Times are unix seconds (float). Money is integer micro-AIT. JSON columns hold only what
the API already validated (configs, manifests, device descriptions).
"""

# SQLAlchemy evaluates these annotations at runtime, where JSONObject is a string alias:
# ``JSONObject | None`` would be ``str | None`` there, so nullable JSON columns say Optional.
# ruff: noqa: UP045

from __future__ import annotations

import secrets
from typing import Any, Optional, TypedDict

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, String, Text, UniqueConstraint, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from aitbc.coordinator.store.run_config import RunConfig
from aitbc.json_value import JSONObject, JSONValue


class RevealedStates(TypedDict):
    """A spot check's answer as stored: each boundary's state blob CID, and the residual's."""

    states: dict[str, str]
    residual: str | None


class JobOverrides(TypedDict, total=False):
    """A job's own settings over its run's config, as the owner set them (``epochs`` sets the
    steps from the shard's size, in place of ``local_steps``)."""

    local_steps: int
    batch_size: int
    lr: float
    epochs: int


class ModelRecord(TypedDict):
    """A gossip worker's model record (:func:`aitbc.ledger.records.make_record`) as the
    coordinator checked it on receipt; ``samples`` is the worker's claim, never read (the
    coordinator counts a shard's samples itself)."""

    format: str
    training_id: str
    job_id: str
    worker: str
    round: int
    cid: str
    samples: JSONValue
    train_loss: float | None


class SignedModelRecord(TypedDict):
    """A model record and its signer's signature, stored as the worker sent it."""

    record: ModelRecord
    signature: str


class Base(DeclarativeBase):
    pass


def new_id(prefix: str) -> str:
    """``training_3fa9c1d2e4b5``: a prefix saying what it names, 48 random bits."""
    return f"{prefix}_{secrets.token_hex(6)}"


class Run(Base):
    """One training run and its state machine (``status``; see :mod:`.states`)."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # training_<hex>
    owner: Mapped[str] = mapped_column(String(64), index=True)  # owner's address
    owner_key: Mapped[str] = mapped_column(String(64))  # owner's public key, hex
    status: Mapped[str] = mapped_column(String(16), index=True)
    # automatic: the round driver moves the phases; manual: the owner's agent does
    control: Mapped[str] = mapped_column(String(16), default="automatic")
    result_cid: Mapped[str | None] = mapped_column(String(100), default=None)  # the model the owner saved
    result_metrics: Mapped[Optional[JSONObject]] = mapped_column(JSON, default=None)  # the owner's, with it
    # An automatic run its owner took over (its first phase move): when, and the first round
    # the owner drives (rounds before it were the driver's: settled and paid automatically).
    manual_since: Mapped[float | None] = mapped_column(Float, default=None)
    manual_from_round: Mapped[int | None] = mapped_column(Integer, default=None)
    paused_from: Mapped[str | None] = mapped_column(String(16), default=None)
    model_type: Mapped[str] = mapped_column(String(200))
    model_options: Mapped[JSONObject] = mapped_column(JSON, default=dict)
    dataset_size: Mapped[str] = mapped_column(String(32))  # as the owner declared it ("100GB")
    dataset_size_bytes: Mapped[int] = mapped_column(BigInteger)  # the declaration, parsed
    target_workers: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(Integer, default=0)
    # upload-data
    data_source: Mapped[str | None] = mapped_column(String(500), default=None)
    manifest_cid: Mapped[str | None] = mapped_column(String(100), default=None)
    manifest: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    data_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)  # measured at upload
    # distribute
    config: Mapped[Optional[JSONObject]] = mapped_column(JSON, default=None)  # RunConfig, as JSON; read run.cfg
    round: Mapped[int] = mapped_column(Integer, default=0)  # the open round (1-based); 0 before
    round_started_at: Mapped[float | None] = mapped_column(Float, default=None)
    global_cid: Mapped[str | None] = mapped_column(String(100), default=None)  # model of round - 1
    outer_state_cid: Mapped[str | None] = mapped_column(String(100), default=None)
    initial_val_loss: Mapped[float | None] = mapped_column(Float, default=None)
    val_loss: Mapped[float | None] = mapped_column(Float, default=None)
    val_accuracy: Mapped[float | None] = mapped_column(Float, default=None)
    bytes_up: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_down: Mapped[int] = mapped_column(BigInteger, default=0)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    # money (micro-AIT)
    network: Mapped[str] = mapped_column(String(16), default="local")
    # On an EVM chain (the coordinator's --chain evm): the owner's account, from which the
    # run's escrow key is derived, and the on-chain deposit mirrored into escrow so far.
    owner_evm: Mapped[str | None] = mapped_column(String(42), default=None)
    chain_deposited: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    budget: Mapped[int | None] = mapped_column(BigInteger, default=None)  # escrowed at init, if given
    bond: Mapped[int] = mapped_column(BigInteger, default=0)  # each hired provider posts this
    escrowed: Mapped[int] = mapped_column(BigInteger, default=0)  # total moved into escrow
    settled_round: Mapped[int] = mapped_column(Integer, default=0)  # rounds scored and paid so far
    finalized: Mapped[bool] = mapped_column(default=False)  # remainder refunded, bonds returned
    bonds_returned: Mapped[bool] = mapped_column(default=False)  # honest providers' bonds given back
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, default=None)
    finished_at: Mapped[float | None] = mapped_column(Float, default=None)

    @property
    def cfg(self) -> RunConfig:
        """The training config, typed; validated once per stored value. A run not yet
        distributed has none: asking for it is a bug (check ``run.configured``)."""
        if self.config is None:
            raise RuntimeError(f"run {self.id} has no training config yet")
        cached = self.__dict__.get("_cfg")
        if cached is None or cached[0] is not self.config:
            cached = (self.config, RunConfig.model_validate(self.config))
            self.__dict__["_cfg"] = cached
        return cached[1]

    @property
    def configured(self) -> bool:
        return self.config is not None

    @property
    def data_manifest(self) -> dict[str, Any]:
        """The attached dataset manifest (``shards``, ``val``, ``spec``). A run without data
        has no jobs, rounds or runtime: asking for it there is a bug (check ``manifest``)."""
        if self.manifest is None:
            raise RuntimeError(f"run {self.id} has no data attached")
        return self.manifest


class Offer(Base):
    """A provider's live offer in the marketplace; its id is the worker's address."""

    __tablename__ = "offers"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    public_key: Mapped[str] = mapped_column(String(64))
    gpu: Mapped[str] = mapped_column(String(64))  # advertised class, canonical
    device: Mapped[JSONObject] = mapped_column(JSON, default=dict)  # what the worker really found
    price: Mapped[int] = mapped_column(BigInteger)  # micro-AIT per round
    availability: Mapped[float] = mapped_column(Float)
    reputation: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), index=True)  # online | failed | offline
    flags: Mapped[int] = mapped_column(Integer, default=0)
    failed_at: Mapped[float | None] = mapped_column(Float, default=None)  # when last marked failed
    max_bond: Mapped[int] = mapped_column(BigInteger, default=0)  # the most it lets a contract lock
    # the largest model it trains, in parameters (aitbc.market.capacity); None: not stated, takes any run
    max_params: Mapped[int | None] = mapped_column(BigInteger, default=None)
    registration: Mapped[Optional[JSONObject]] = mapped_column(
        JSON, default=None
    )  # its signed offer (authorises bonds)
    evm_address: Mapped[str | None] = mapped_column(String(42), default=None)  # paid here on an EVM chain
    last_heartbeat: Mapped[float] = mapped_column(Float)
    registered_at: Mapped[float] = mapped_column(Float)


class Contract(Base):
    """A provider hired for a run at an agreed price per round."""

    __tablename__ = "contracts"
    __table_args__ = (UniqueConstraint("run_id", "worker_id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # contract_<hex>
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    worker_id: Mapped[str] = mapped_column(ForeignKey("offers.id"), index=True)
    price: Mapped[int] = mapped_column(BigInteger)  # micro-AIT per round
    score: Mapped[float] = mapped_column(Float)  # the marketplace score when hired
    status: Mapped[str] = mapped_column(String(16))  # hired | working | released | failed | slashed
    bond: Mapped[int] = mapped_column(BigInteger, default=0)  # posted when hired
    slashed: Mapped[int] = mapped_column(BigInteger, default=0)
    paid_manual: Mapped[int] = mapped_column(BigInteger, default=0)  # the owner's own payments (process_payment)
    # On an EVM chain: the provider's account when hired, and its bond seen on chain and mirrored.
    evm_address: Mapped[str | None] = mapped_column(String(42), default=None)
    chain_bonded: Mapped[bool] = mapped_column(default=False, server_default=false())
    created_at: Mapped[float] = mapped_column(Float)


class Job(Base):
    """One worker's assignment in a run: a shard to train on, round after round."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # job_<hex>
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    contract_id: Mapped[str] = mapped_column(ForeignKey("contracts.id"))
    worker_id: Mapped[str] = mapped_column(ForeignKey("offers.id"), index=True)
    shard_index: Mapped[int] = mapped_column(Integer)
    shard_cid: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(16), index=True)  # active | failed | released
    joined_round: Mapped[int] = mapped_column(Integer)
    replaces: Mapped[str | None] = mapped_column(String(64), default=None)  # job it took over
    config: Mapped[JobOverrides] = mapped_column(
        JSON, default=dict
    )  # the owner's overrides: local_steps, batch_size, lr
    seed: Mapped[int | None] = mapped_column(BigInteger, default=None)  # the worker's batch-order seed
    # the config before the owner's last change, and when it changed: a round under way
    # then may have been trained with either (verification replays what the worker used)
    previous_config: Mapped[Optional[JobOverrides]] = mapped_column(JSON, default=None)
    config_at: Mapped[float | None] = mapped_column(Float, default=None)
    moved_from: Mapped[int | None] = mapped_column(Integer, default=None)  # its shard before a split or a move
    # the worker's last progress report
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    loss: Mapped[float | None] = mapped_column(Float, default=None)
    epoch: Mapped[float] = mapped_column(Float, default=0.0)
    worker_status: Mapped[str] = mapped_column(String(32), default="assigned")
    progress_round: Mapped[int | None] = mapped_column(Integer, default=None)  # the round it reported on
    step: Mapped[int | None] = mapped_column(Integer, default=None)  # local steps done in that round
    progress_at: Mapped[float | None] = mapped_column(Float, default=None)  # when (coordinator's clock)
    speed: Mapped[float | None] = mapped_column(Float, default=None)  # samples/s measured between reports
    rounds_done: Mapped[int] = mapped_column(Integer, default=0)
    compute_seconds: Mapped[float] = mapped_column(Float, default=0.0)  # reported, summed
    end_reason: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class Update(Base):
    """One update a worker sent for one round: accepted, or rejected with the reason."""

    __tablename__ = "updates"
    __table_args__ = (UniqueConstraint("job_id", "round"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    worker_id: Mapped[str] = mapped_column(String(64), index=True)
    round: Mapped[int] = mapped_column(Integer)
    cid: Mapped[str] = mapped_column(String(100))
    size: Mapped[int] = mapped_column(BigInteger)
    samples: Mapped[int] = mapped_column(Integer)
    shard_index: Mapped[int | None] = mapped_column(Integer, default=None)  # the shard it was trained on
    train_loss: Mapped[float | None] = mapped_column(Float, default=None)
    train_accuracy: Mapped[float | None] = mapped_column(Float, default=None)  # as the worker reports it
    # the model it was trained from when not its round's own (overlap k: one of rounds r-1-k..r-2's
    # checkpoints; 0006); always set on an update sent ahead of its round (overlap 2)
    base_cid: Mapped[str | None] = mapped_column(String(100), default=None)
    # overlap, eager start: its worker's own round r-1 update, taken from base_cid (0011), with
    # that update's own prior in turn while the base is older than its round's (overlap 2)
    prior_cid: Mapped[str | None] = mapped_column(String(100), default=None)
    compute_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    status: Mapped[str] = mapped_column(String(16))  # accepted | rejected | excluded (left out by the owner)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[float] = mapped_column(Float)
    # Verification of work (see coordinator/verification/spot_checks.py). None: the run does not verify.
    proof: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)  # the worker's commitment
    challenge: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)  # what it must reveal
    revealed: Mapped[RevealedStates | None] = mapped_column(JSON, default=None)  # boundary -> state blob CID
    verification: Mapped[str | None] = mapped_column(String(16), default=None)
    verify_detail: Mapped[str | None] = mapped_column(Text, default=None)
    verify_steps: Mapped[int | None] = mapped_column(Integer, default=None)  # local steps the coordinator re-ran
    verify_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    # Gossip runs: the record as the worker signed it, and the published model's validation loss
    record: Mapped[Optional[SignedModelRecord]] = mapped_column(JSON, default=None)
    val_loss: Mapped[float | None] = mapped_column(Float, default=None)


class RoundRecord(Base):
    """A closed round: the global model it produced (a checkpoint blob) and its metrics."""

    __tablename__ = "rounds"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    round: Mapped[int] = mapped_column(Integer, primary_key=True)  # 0: the initial model
    checkpoint_cid: Mapped[str] = mapped_column(String(100))
    outer_state_cid: Mapped[str | None] = mapped_column(String(100), default=None)
    val_loss: Mapped[float | None] = mapped_column(Float, default=None)
    val_accuracy: Mapped[float | None] = mapped_column(Float, default=None)
    train_loss: Mapped[float | None] = mapped_column(Float, default=None)
    train_accuracy: Mapped[float | None] = mapped_column(Float, default=None)  # mean of the accepted updates'
    accepted: Mapped[int] = mapped_column(Integer, default=0)
    rejected: Mapped[int] = mapped_column(Integer, default=0)
    stragglers: Mapped[list[str]] = mapped_column(JSON, default=list)  # worker ids left out
    skipped: Mapped[bool] = mapped_column(default=False)  # too few updates for the rule
    bytes_up: Mapped[int | None] = mapped_column(BigInteger, default=None)  # its updates' bytes
    bytes_down: Mapped[int | None] = mapped_column(BigInteger, default=None)  # the model, once per answer
    started_at: Mapped[float] = mapped_column(Float)
    closed_at: Mapped[float] = mapped_column(Float)
    spread: Mapped[float | None] = mapped_column(Float, default=None)  # gossip: the models' mean distance


class Flag(Base):
    """A recorded misbehaviour or failure of a worker (bad update, missed lease, ...)."""

    __tablename__ = "flags"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    worker_id: Mapped[str] = mapped_column(String(64), index=True)
    run_id: Mapped[str | None] = mapped_column(String(64), index=True, default=None)
    round: Mapped[int | None] = mapped_column(Integer, default=None)
    kind: Mapped[str] = mapped_column(String(32))  # rejected_update | lease_expired | straggler | bad_blob
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


class Witness(Base):
    """A gossip record of a worker's, as another worker received it (reported with
    ``POST /v1/records/witnessed``, signature checked): kept while the coordinator holds no
    record of that job and round with the same CID, so a different record the worker signs
    for the round later is caught (:func:`aitbc.coordinator.rounds.gossip.witness`)."""

    __tablename__ = "gossip_witnesses"
    __table_args__ = (UniqueConstraint("job_id", "round", "cid"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(64), index=True)
    job_id: Mapped[str] = mapped_column(String(64))
    worker_id: Mapped[str] = mapped_column(String(64))  # who signed it
    round: Mapped[int] = mapped_column(Integer)
    cid: Mapped[str] = mapped_column(String(100))
    record: Mapped[SignedModelRecord] = mapped_column(JSON)  # {"record": ..., "signature": ...} as signed
    reporter: Mapped[str] = mapped_column(String(64))  # the worker that received it
    created_at: Mapped[float] = mapped_column(Float)


class Score(Base):
    """One worker's contribution to one round (see :mod:`aitbc.core.scoring`)."""

    __tablename__ = "scores"
    __table_args__ = (UniqueConstraint("run_id", "round", "contract_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    round: Mapped[int] = mapped_column(Integer)
    contract_id: Mapped[str] = mapped_column(ForeignKey("contracts.id"), index=True)  # pay views
    worker_id: Mapped[str] = mapped_column(String(64), index=True)
    status: Mapped[str] = mapped_column(String(16))  # accepted | rejected | missing
    gain: Mapped[float | None] = mapped_column(Float, default=None)
    own_gain: Mapped[float | None] = mapped_column(Float, default=None)
    other_gain: Mapped[float | None] = mapped_column(Float, default=None)
    kept: Mapped[float | None] = mapped_column(Float, default=None)
    flags: Mapped[list[str]] = mapped_column(JSON, default=list)
    provable: Mapped[bool] = mapped_column(default=False)  # misbehaviour anyone can re-check: slashes
    quality: Mapped[float] = mapped_column(Float)


class Settlement(Base):
    """A contract's pay for one round: written once, in the transaction of its ledger entry."""

    __tablename__ = "settlements"
    __table_args__ = (UniqueConstraint("contract_id", "round"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    contract_id: Mapped[str] = mapped_column(ForeignKey("contracts.id"))
    worker_id: Mapped[str] = mapped_column(String(64))
    round: Mapped[int] = mapped_column(Integer)
    quality: Mapped[float] = mapped_column(Float)
    due: Mapped[int] = mapped_column(BigInteger)  # price x quality, micro-AIT
    paid: Mapped[int] = mapped_column(BigInteger)  # what escrow could pay of it
    entry_seq: Mapped[int | None] = mapped_column(Integer, default=None)  # the ledger entry, if paid > 0
    created_at: Mapped[float] = mapped_column(Float)


class ChainTx(Base):
    """A transaction the settlement key owes the chain (``kind`` ``settle`` for round
    ``round``, ``finalize`` with round 0), queued in the transaction that settles the round in
    the books. Its nonce and signed bytes are stored before the broadcast, so a sender that
    restarts resends the same transaction (``status``: queued, signed, sent, mined, final,
    failed). ``payload``: ``{"providers": [...], "amounts": [...], "slashes": [...]}``
    for a settlement (providers in increasing address order)."""

    __tablename__ = "chain_txs"
    __table_args__ = (UniqueConstraint("run_id", "kind", "round"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    round: Mapped[int] = mapped_column(Integer)
    payload: Mapped[JSONObject] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True)
    nonce: Mapped[int | None] = mapped_column(BigInteger, default=None)
    raw_tx: Mapped[str | None] = mapped_column(Text, default=None)  # 0x-hex, signed
    tx_hash: Mapped[str | None] = mapped_column(String(66), default=None)
    block: Mapped[int | None] = mapped_column(BigInteger, default=None)  # mined in
    confirmations: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    gas_used: Mapped[int | None] = mapped_column(BigInteger, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    sender: Mapped[str | None] = mapped_column(String(64), default=None)  # the replica that signed it
    created_at: Mapped[float] = mapped_column(Float)
    sent_at: Mapped[float | None] = mapped_column(Float, default=None)
    final_at: Mapped[float | None] = mapped_column(Float, default=None)


class Pin(Base):
    """A wallet's pin of a blob DAG (a file or a folder): blob retention keeps every blob
    reachable from ``cid`` while the pin exists; ``bytes`` (every blob under it, each
    once) counts against the wallet's ``max_pinned_bytes``."""

    __tablename__ = "pins"
    __table_args__ = (UniqueConstraint("owner", "cid"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)  # the signer's address
    cid: Mapped[str] = mapped_column(String(100), index=True)  # the root
    bytes: Mapped[int] = mapped_column(BigInteger)
    blobs: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


class CoordinatorIdentity(Base):
    """The one row naming the coordinator this database is (``/v1/health``'s
    ``coordinator_id``): drawn once, by the migration that made the table, and never changed."""

    __tablename__ = "coordinator_identity"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # coordinator_<16 hex digits>
    created_at: Mapped[float] = mapped_column(Float)


class ChainBinding(Base):
    """The one row naming where this database's money is (:mod:`.chain_binding`):
    written by the first start (``chain`` local, or evm with the deployment it settled on)
    and never changed, so a start on another chain is refused instead of spending the books."""

    __tablename__ = "chain_binding"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)  # always 1: one row
    chain: Mapped[str] = mapped_column(String(8))  # local | evm
    chain_id: Mapped[int | None] = mapped_column(BigInteger, default=None)
    escrow: Mapped[str | None] = mapped_column(String(42), default=None)
    token: Mapped[str | None] = mapped_column(String(42), default=None)
    # The hash of the deployment's block: a node reset and redeployed from the same key puts
    # the contracts at the same addresses on the same chain id, but never in the same block.
    anchor: Mapped[str | None] = mapped_column(String(66), default=None)
    created_at: Mapped[float] = mapped_column(Float)


class DriverLease(Base):
    """Who drives the rounds (:mod:`.lease`): one row per lease ``name``, taken and renewed
    only by a compare-and-set UPDATE, so two coordinators on one database never both hold it."""

    __tablename__ = "driver_lease"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)  # "rounds"
    holder: Mapped[str] = mapped_column(String(64))  # the holding process's replica id
    expires_at: Mapped[float] = mapped_column(Float)  # its holder's clock; taken by another after it
    since: Mapped[float] = mapped_column(Float)  # when this holder took it


class SeenNonce(Base):
    """A signed request's nonce, seen by one of the replicas sharing this database
    (:mod:`.nonces`): a request replayed to another replica is refused like one replayed
    to the same. Kept until ``expires_at`` (its timestamp plus the window), then purged."""

    __tablename__ = "seen_nonces"

    nonce: Mapped[str] = mapped_column(String(32), primary_key=True)  # 32 lower-case hex digits
    expires_at: Mapped[float] = mapped_column(Float, index=True)
