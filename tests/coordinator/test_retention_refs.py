"""Blob retention never deletes what is referenced, even at ``gc_grace_seconds`` 0 (issue 33
part 4): an upload not yet named by its request (in flight) stays, and a blob named after
the collection's snapshot (a reveal, an accepted update, a round's commit landing while it
runs) is checked again before it goes. A real coordinator and database (SQLite, or
PostgreSQL under ``AITBC_TEST_DB=postgresql``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from aitbc.coordinator.storage import retention
from aitbc.ledger.wallet import Wallet
from aitbc.storage.cid import cid_of_bytes


@pytest.fixture
def graceless(tmp_path, databases, api):
    """A coordinator whose grace period is 0 and whose driver never collects (the tests
    collect themselves: the driver's first collection, on its first tick, deleted a test's
    aged blob under it on a loaded machine)."""
    coord, stop = api.start_on(databases, tmp_path / "coord", gc_grace_seconds=0, gc_interval_seconds=1e12)
    yield coord
    stop()


def _upload(coord, age: float = 0.0) -> str:
    """A blob nobody names, stored ``age`` seconds ago."""
    data = os.urandom(500)
    cid = cid_of_bytes(data)
    coord.client("someone", Wallet.generate("someone")).put_blob(cid, data)
    if age:
        stamp = time.time() - age
        os.utime(coord.ctx.store.dir / cid, (stamp, stamp))
    return cid


def test_at_grace_0_an_upload_in_flight_stays_and_an_old_unnamed_one_goes(graceless):
    coord = graceless
    fresh, stale = _upload(coord), _upload(coord, age=2 * retention.IN_FLIGHT_SECONDS)
    report = retention.run(coord.ctx)
    assert report.deleted == [stale]
    assert (coord.ctx.store.dir / fresh).exists() and report.young == 1
    # the loose-bytes cap does not take it either
    assert (
        retention.collect(
            coord.ctx.session, coord.ctx.store, keep_checkpoints=3, grace_seconds=0, max_loose_bytes=0
        ).deleted
        == []
    )
    assert (coord.ctx.store.dir / fresh).exists()


def test_a_blob_named_after_the_snapshot_is_kept(graceless, api):
    """The collection's first snapshot finds the blob unreferenced and old; before it is
    deleted a run names it as its model (as a round's commit or an accepted update would,
    committed while the collection runs): the check at deletion keeps it."""
    coord = graceless
    owner = coord.client("owner")
    run_id = api.create_run(owner)
    named, unnamed = (_upload(coord, age=2 * retention.IN_FLIGHT_SECONDS) for _ in range(2))
    reads = 0

    @contextmanager
    def sessions() -> Iterator[Session]:
        nonlocal reads
        with coord.ctx.session() as s:
            yield s
        reads += 1
        if reads == 1:  # the snapshot is read: now the run names the blob, and commits
            with coord.ctx.session() as w:
                w.execute(text("UPDATE runs SET global_cid = :c WHERE id = :r"), {"c": named, "r": run_id})
                w.commit()

    report = retention.collect(sessions, coord.ctx.store, keep_checkpoints=3, grace_seconds=0)
    assert reads == 2  # chosen, then checked again
    assert report.deleted == [unnamed]
    assert (coord.ctx.store.dir / named).exists()


def test_a_blob_touched_after_the_choice_is_kept(graceless):
    """A PUT of a blob already held (or ``POST /blobs/missing``) while the collection runs
    renews it: not deleted."""
    coord = graceless
    cid = _upload(coord, age=2 * retention.IN_FLIGHT_SECONDS)
    reads = 0

    @contextmanager
    def sessions() -> Iterator[Session]:
        nonlocal reads
        with coord.ctx.session() as s:
            yield s
        reads += 1
        if reads == 1:
            assert coord.client("uploader").post("/blobs/missing", {"cids": [cid]})["missing"] == []

    report = retention.collect(sessions, coord.ctx.store, keep_checkpoints=3, grace_seconds=0)
    assert report.deleted == [] and (coord.ctx.store.dir / cid).exists()
