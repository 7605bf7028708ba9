"""Loose blobs are capped: anyone with a wallet (free to make) can upload blobs and keep
touching them, so the unreferenced ones inside their grace period may hold at most
``max_loose_bytes`` in all; past it, blob retention deletes the least recently touched.
What a run still needs is never deleted for the cap."""

from __future__ import annotations

import json
import os
import time

import pytest

from aitbc.coordinator.storage import retention
from aitbc.ledger.wallet import Wallet
from aitbc.storage.cid import cid_of_bytes

CAP = 3000


@pytest.fixture
def capped(tmp_path, databases, api):
    coord, stop = api.start_on(databases, tmp_path / "coord", gc_grace_seconds=3600, max_loose_bytes=CAP)
    yield coord
    stop()


def test_loose_blobs_past_the_cap_go_oldest_first_and_live_ones_stay(capped, api):
    coord = capped
    t = api.start_training_run(coord, 2)  # its manifest, shards and model: live, more than CAP
    run = coord.rows("SELECT global_cid, manifest_cid FROM runs WHERE id = :r", r=t.run_id)[0]
    live = {run["global_cid"], run["manifest_cid"]}

    attacker = coord.client("flood", Wallet.generate("flood"))
    blobs = [os.urandom(1000) for _ in range(5)]
    cids = [cid_of_bytes(b) for b in blobs]
    now = time.time()
    for i, (cid, data) in enumerate(zip(cids, blobs)):
        attacker.put_blob(cid, data)
        stamp = now - 100 + i  # uploaded (or last touched) in this order, all inside the grace period
        os.utime(coord.ctx.store.dir / cid, (stamp, stamp))
    # Touching keeps the grace period going, but not past the cap: the first upload, touched
    # again now, becomes the newest.
    assert attacker.post("/blobs/missing", {"cids": [cids[0]]})["missing"] == []

    dry = retention.run(coord.ctx, dry_run=True)
    assert dry.over_cap == 2 and all((coord.ctx.store.dir / c).exists() for c in cids)
    report = retention.run(coord.ctx)
    assert report.over_cap == 2 and set(report.deleted) == {cids[1], cids[2]}
    assert report.young == 3 and report.young_bytes == 3000 <= CAP
    held = set(os.listdir(coord.ctx.store.dir))
    assert {cids[0], cids[3], cids[4]} <= held and live <= held  # the run's blobs stay, though over the cap
    assert report.as_dict()["over_cap"] == 2


def test_the_gc_command_takes_the_cap(aitbc, tmp_path, monkeypatch):
    """``aitbc coordinator gc`` applies AITBC_MAX_LOOSE_BYTES as the coordinator does."""
    home = tmp_path / "c"
    blobs_dir = home / "blobs"
    blobs_dir.mkdir(parents=True)
    for i in range(3):
        data = os.urandom(1000)
        (blobs_dir / cid_of_bytes(data)).write_bytes(data)
        stamp = time.time() - 100 + i
        os.utime(blobs_dir / cid_of_bytes(data), (stamp, stamp))
    monkeypatch.setenv("AITBC_MAX_LOOSE_BYTES", "1500")
    r = aitbc("coordinator", "gc", "--home", str(home), "--gc-grace", "3600", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["deleted"], out["over_cap"], out["young"]) == (2, 2, 1)
