"""Blob retention: which blobs the coordinator still needs, and deleting the rest.

Every round's checkpoint CID stays recorded in the ``rounds`` table; only bytes go. A blob
is *live* (kept) when it is:

- a checkpoint (or outer-optimizer state) of one of the last ``keep_checkpoints`` rounds of
  its run (at least the last 1 + k in a run with ``overlap`` k), the run's current model (``global_cid``, ``outer_state_cid``) or its chosen
  result (``result_cid``);
- a fine-tune's pretrained weights and tokenizer (its model options' ``init_weights`` and
  ``tokenizer``), for the run's life: its checkpoints and result are read on top of them;
- a checkpoint a pending step still reads: the model before the oldest unsettled round
  (scoring judges updates against it) and any round whose evaluation is missing;
- data of a run not yet finalized: its manifest, shards (split ones included), the
  validation split, and every job's shard; a run's tokenizer (language data), for as long
  as the run is recorded (its result is sampled, evaluated and downloaded with it);
- an update of a round not yet scored and settled, in a run not yet finalized;
- under a pin (:mod:`aitbc.coordinator.storage.pins`): every blob reachable from a pinned root
  (a file, or a folder's directory nodes and files, :mod:`aitbc.storage.unixfs`).

Everything else is deleted once older than ``gc_grace_seconds`` (by mtime), and, because
anyone with a wallet (wallets are free) can upload blobs and keep touching them, the
unreferenced blobs inside the grace period are capped too: past ``max_loose_bytes`` in
all, the least recently touched go first.

Nothing referenced is ever deleted, whatever the grace (0 included):

- **in flight**: a blob is stored before the row that names it is committed (an update or
  the states a spot check asked for, uploaded and then named by their request; a round's
  checkpoint and outer state, written and then committed with the round). A blob written or
  touched in the last :data:`IN_FLIGHT_SECONDS` is never deleted, not by the grace period
  and not by the loose-bytes cap: a smaller ``gc_grace_seconds`` counts as this floor;
- **named since the snapshot**: the live set is read in one database snapshot, and a row
  committed after it (a reveal, an accepted update, a round's commit) names a blob the
  snapshot did not see. So the blobs chosen for deletion are checked again just before they
  go: a second snapshot, read after the choice, keeps any that became live, and a blob
  touched meanwhile (a PUT of a blob already held, ``POST /v1/blobs/missing``) is kept too.

Disk is then bounded by what runs reference, the pins' total cap and this cap, plus what
arrives within the in-flight window (and between two collections). The round driver runs
:func:`collect` every ``gc_interval_seconds``; ``aitbc coordinator gc`` runs it on demand,
safely while the coordinator runs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.store.models import Job, Pin, RoundRecord, Run, Update
from aitbc.errors import NotFoundError, UsageError
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.unixfs import reachable
from aitbc.training.pretrained import blob_cids

log = logging.getLogger("aitbc.coordinator")
# A blob this young is never deleted: the time a request has between storing a blob and
# committing the row that names it (a worker's upload and its update or reveal; a round's
# checkpoint and its commit). Loopback requests take milliseconds; this leaves a stalled
# client, a retry and a slow commit ample room.
IN_FLIGHT_SECONDS = 60.0


@dataclass
class GcReport:
    """What one collection found and did (sizes in bytes)."""

    deleted: list[str] = field(default_factory=list)  # CIDs removed (or, dry run, that would be)
    freed: int = 0
    kept: int = 0  # blobs live in the database
    kept_bytes: int = 0
    young: int = 0  # not live but inside the grace period: left for a later collection
    young_bytes: int = 0
    over_cap: int = 0  # of ``deleted``: inside the grace period, deleted as loose bytes were over the cap
    dry_run: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "dry_run": self.dry_run,
            "deleted": len(self.deleted),
            "freed_bytes": self.freed,
            "kept": self.kept,
            "kept_bytes": self.kept_bytes,
            "young": self.young,
            "young_bytes": self.young_bytes,
            "over_cap": self.over_cap,
        }


def _snapshot(s: Session) -> None:
    """Make every following read of ``s`` see one committed state of the database."""
    if s.get_bind().dialect.name == "sqlite":
        # pysqlite opens no transaction for reads, so each SELECT would see its own state;
        # a deferred BEGIN pins one WAL snapshot from the first read to the session's end.
        s.connection().exec_driver_sql("BEGIN")
    else:
        s.connection(execution_options={"isolation_level": "REPEATABLE READ"})


def live_cids(s: Session, keep_checkpoints: int) -> set[str]:
    """Every CID the database still needs the bytes of (see the module's docstring).
    Call on a fresh session: the reads are made in one snapshot."""
    _snapshot(s)
    live: set[str] = set()
    runs = s.scalars(select(Run)).all()
    for run in runs:
        live.update(c for c in (run.global_cid, run.outer_state_cid, run.result_cid) if c)
        live.update(blob_cids(run.model_options))  # a fine-tune's base and tokenizer: its result needs them
        tok = (run.manifest or {}).get("tokenizer")
        if isinstance(tok, dict) and tok.get("cid"):
            live.add(str(tok["cid"]))
        recs = s.execute(
            select(RoundRecord.round, RoundRecord.checkpoint_cid, RoundRecord.outer_state_cid, RoundRecord.val_loss)
            .where(RoundRecord.run_id == run.id)
            .order_by(RoundRecord.round.desc())
        ).all()
        # overlap k: an update may start from one of the k models before its round's own (the
        # spot check's start digest and replay read it), so those are needed too
        recent = max(keep_checkpoints, 1 + (run.cfg.overlap if run.config else 0))
        # async: an update is judged against its base, up to max_staleness versions before its round's
        lag = run.cfg.base_lag if run.config else 0
        for i, (r, ckpt, outer, val_loss) in enumerate(recs):
            needed = i < recent or (r > 0 and val_loss is None)
            if not run.finalized:
                needed |= r >= run.settled_round - lag  # the model the next round to score is judged against
            if needed:
                live.update(c for c in (ckpt, outer) if c)
        if run.finalized:
            continue
        if run.manifest_cid:
            live.add(run.manifest_cid)
        if run.manifest:
            live.update(str(e["cid"]) for e in run.manifest.get("shards", []) if isinstance(e, dict) and e.get("cid"))
            val = run.manifest.get("val")
            if isinstance(val, dict) and val.get("cid"):
                live.add(str(val["cid"]))
        live.update(s.scalars(select(Job.shard_cid).where(Job.run_id == run.id)).all())
        # each unsettled update, and its priors (overlap, eager start: a spot check replays
        # from base - prior - ..., the job's own updates of the rounds before, up to overlap
        # of them: those rounds' updates are kept too, with their own priors)
        # and the model each was trained from (an eager start is rebuilt from it when its
        # update is scored, up to overlap + 1 rounds before its round's: older than the
        # newest checkpoints kept above when scoring lags)
        depth = run.cfg.overlap if run.config else 0
        for cid, prior, base in s.execute(
            select(Update.cid, Update.prior_cid, Update.base_cid).where(
                Update.run_id == run.id, Update.round > run.settled_round - depth
            )
        ).all():
            live.update(c for c in (cid, prior, base) if c)
        # the states a spot check's reveal names: the driver has yet to read them (or they are a failure's evidence)
        for rev in s.scalars(
            select(Update.revealed).where(
                Update.run_id == run.id, Update.round > run.settled_round, Update.revealed.is_not(None)
            )
        ).all():
            if rev is None:  # the query leaves none out; the column's type says it may be
                continue
            live.update(str(c) for c in (rev.get("states") or {}).values())
            if rev.get("residual"):
                live.add(str(rev["residual"]))
    return live


def pinned_blobs(store: LocalBlobStore, roots: set[str]) -> set[str]:
    """Every blob reachable from the pinned ``roots`` (a blob already gone is skipped:
    what is left of the DAG is still kept)."""

    def read_node(cid: str) -> bytes | None:
        try:
            return store.peek_node(cid)
        except NotFoundError:
            return None

    kept: set[str] = set()
    for root in sorted(roots):
        try:
            kept |= reachable(read_node, root)
        except UsageError as e:  # over the walk's bound: keep what the pin recorded at least
            log.warning("gc: pin %s: %s", root, e)
            kept.add(root)
    return kept


def _referenced(sessions: Callable[[], Session], store: LocalBlobStore, keep_checkpoints: int) -> set[str]:
    """Every blob the database keeps (:func:`live_cids`) or a pin does, in one snapshot."""
    with sessions() as s:
        live = live_cids(s, keep_checkpoints)
        roots = set(s.scalars(select(Pin.cid)).all())  # the same snapshot
    return live | pinned_blobs(store, roots)


def collect(
    sessions: Callable[[], Session],
    store: LocalBlobStore,
    *,
    keep_checkpoints: int,
    grace_seconds: float,
    max_loose_bytes: int | None = None,
    dry_run: bool = False,
    now: float | None = None,
    in_flight_seconds: float = IN_FLIGHT_SECONDS,
) -> GcReport:
    """Delete (or, ``dry_run``, only list) the blobs no rule keeps that are older than
    ``grace_seconds``, then the least recently touched of the younger ones while they
    hold more than ``max_loose_bytes``; never one written or touched in the last
    ``in_flight_seconds`` (:data:`IN_FLIGHT_SECONDS`; tests of the keep rules alone pass
    0), and never one a snapshot read after the choice finds referenced."""
    live = _referenced(sessions, store, keep_checkpoints)
    now = time.time() if now is None else now
    grace = max(grace_seconds, in_flight_seconds)
    report = GcReport(dry_run=dry_run)
    old: list[tuple[str, int]] = []  # (cid, size) past the grace period: deleted
    young: list[tuple[float, str, int]] = []  # (mtime, cid, size) of unreferenced blobs in their grace period
    for info in store.list():
        if info.cid in live:
            report.kept += 1
            report.kept_bytes += info.size
            continue
        try:
            mtime = os.stat(store.dir / info.cid).st_mtime
        except FileNotFoundError:
            continue  # deleted meanwhile (a concurrent collection)
        if now - mtime < grace:
            young.append((mtime, info.cid, info.size))
            continue
        old.append((info.cid, info.size))
    young.sort()
    loose = sum(size for _, _, size in young)
    over: list[tuple[str, int]] = []  # past the loose-bytes cap: the least recently touched, not in flight
    for mtime, cid, size in young:
        if max_loose_bytes is not None and loose > max_loose_bytes and now - mtime >= in_flight_seconds:
            loose -= size
            over.append((cid, size))
            continue
        report.young += 1
        report.young_bytes += size
    if old or over:
        # Named or touched since the choice (a reveal, an accepted update, a round's commit
        # committed after the first snapshot): kept. A row committed after this second read
        # would have to name a blob nobody wrote, uploaded, pinned or asked about in the last
        # in_flight_seconds, and every request that names a blob does one of those just before.
        live = _referenced(sessions, store, keep_checkpoints)
        for cid, size in old:
            _delete(store, report, cid, size, live, now, in_flight_seconds)
        for cid, size in over:
            if _delete(store, report, cid, size, live, now, in_flight_seconds):
                report.over_cap += 1
    if report.deleted and not dry_run:
        log.info("gc: deleted %d blobs, %d bytes freed; %d kept", len(report.deleted), report.freed, report.kept)
    return report


def _delete(
    store: LocalBlobStore, report: GcReport, cid: str, size: int, live: set[str], now: float, in_flight: float
) -> bool:
    """Delete one blob (a dry run only counts it) unless it is ``live`` now or was touched
    in the last ``in_flight`` seconds (then it is counted kept or young); False if it was
    not deleted."""
    try:
        touched = now - os.stat(store.dir / cid).st_mtime < in_flight
    except FileNotFoundError:
        return False  # deleted meanwhile (a concurrent collection)
    if cid in live:
        report.kept += 1
        report.kept_bytes += size
        return False
    if touched:
        report.young += 1
        report.young_bytes += size
        return False
    if not report.dry_run:
        try:
            store.delete(cid)
        except NotFoundError:
            return False  # deleted meanwhile (a concurrent collection)
    report.deleted.append(cid)
    report.freed += size
    return True


def run(ctx: Context, *, dry_run: bool = False) -> GcReport:
    """:func:`collect` with the coordinator's settings."""
    st = ctx.settings
    return collect(
        ctx.session,
        ctx.store,
        keep_checkpoints=st.keep_checkpoints,
        grace_seconds=st.gc_grace_seconds,
        max_loose_bytes=st.max_loose_bytes,
        dry_run=dry_run,
    )
