"""Blob retention: which blobs the coordinator still needs, and deleting the rest.

Every round's checkpoint CID stays recorded in the ``rounds`` table; only bytes go. A blob
is *live* (kept) when it is:

- a checkpoint (or outer-optimizer state) of one of the last ``keep_checkpoints`` rounds of
  its run, the run's current model (``global_cid``, ``outer_state_cid``) or its chosen
  result (``result_cid``);
- a checkpoint a pending step still reads: the model before the oldest unsettled round
  (scoring judges updates against it) and any round whose evaluation is missing;
- data of a run not yet finalized: its manifest, shards (split ones included), the
  validation split, and every job's shard;
- an update of a round not yet scored and settled, in a run not yet finalized;
- under a pin (:mod:`aitbc.coordinator.pins`): every blob reachable from a pinned root
  (a file, or a folder's directory nodes and files, :mod:`aitbc.storage.unixfs`).

Everything else is deleted once older than ``gc_grace_seconds`` (by mtime). Race safety:
the live set is read in one database snapshot; a blob written after that snapshot (a new
checkpoint, an upload not yet referenced) is younger than the grace period, and a PUT of a
blob already held refreshes its mtime (:meth:`LocalBlobStore.touch`), so neither is
deleted. The round driver runs :func:`collect` every ``gc_interval_seconds``;
``aitbc coordinator gc`` runs it on demand.
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
from aitbc.coordinator.models import Job, Pin, RoundRecord, Run, Update
from aitbc.errors import NotFoundError, UsageError
from aitbc.storage.blobstore import LocalBlobStore
from aitbc.storage.unixfs import reachable

log = logging.getLogger("aitbc.coordinator")


@dataclass
class GcReport:
    """What one collection found and did (sizes in bytes)."""

    deleted: list[str] = field(default_factory=list)  # CIDs removed (or, dry run, that would be)
    freed: int = 0
    kept: int = 0  # blobs live in the database
    kept_bytes: int = 0
    young: int = 0  # not live but inside the grace period: left for a later collection
    young_bytes: int = 0
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
        recs = s.execute(
            select(RoundRecord.round, RoundRecord.checkpoint_cid, RoundRecord.outer_state_cid, RoundRecord.val_loss)
            .where(RoundRecord.run_id == run.id)
            .order_by(RoundRecord.round.desc())
        ).all()
        for i, (r, ckpt, outer, val_loss) in enumerate(recs):
            needed = i < keep_checkpoints or (r > 0 and val_loss is None)
            if not run.finalized:
                needed |= r >= run.settled_round  # the model the next round to score is judged against
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
        live.update(
            s.scalars(select(Update.cid).where(Update.run_id == run.id, Update.round > run.settled_round)).all()
        )
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


def collect(
    sessions: Callable[[], Session],
    store: LocalBlobStore,
    *,
    keep_checkpoints: int,
    grace_seconds: float,
    dry_run: bool = False,
    now: float | None = None,
) -> GcReport:
    """Delete (or, ``dry_run``, only list) the blobs no rule keeps that are older than
    ``grace_seconds``."""
    with sessions() as s:
        live = live_cids(s, keep_checkpoints)
        roots = set(s.scalars(select(Pin.cid)).all())  # the same snapshot
    live |= pinned_blobs(store, roots)
    now = time.time() if now is None else now
    report = GcReport(dry_run=dry_run)
    for info in store.list():
        if info.cid in live:
            report.kept += 1
            report.kept_bytes += info.size
            continue
        try:
            mtime = os.stat(store.dir / info.cid).st_mtime
        except FileNotFoundError:
            continue  # deleted meanwhile (a concurrent collection)
        if now - mtime < grace_seconds:
            report.young += 1
            report.young_bytes += info.size
            continue
        if not dry_run:
            try:
                store.delete(info.cid)
            except NotFoundError:
                continue  # deleted meanwhile
        report.deleted.append(info.cid)
        report.freed += info.size
    if report.deleted and not dry_run:
        log.info("gc: deleted %d blobs, %d bytes freed; %d kept", len(report.deleted), report.freed, report.kept)
    return report


def run(ctx: Context, *, dry_run: bool = False) -> GcReport:
    """:func:`collect` with the coordinator's settings."""
    st = ctx.settings
    return collect(
        ctx.session, ctx.store, keep_checkpoints=st.keep_checkpoints, grace_seconds=st.gc_grace_seconds, dry_run=dry_run
    )
