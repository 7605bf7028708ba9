"""The schema is versioned (alembic, ``coordinator/migrations``); a coordinator brings its
database to the head revision at start.

A database made by the release before migrations (its real SQL dump, with the rows of a
complete, settled training) upgrades in place and then carries a new training; older ones
gain the columns added since, filled and NOT NULL; the head revision matches the models
(so a model change without a migration fails here); upgrading twice, or from two processes
at once, changes nothing more.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from aitbc.coordinator.db import head_revision, make_engine, upgrade_database
from aitbc.coordinator.models import Base
from aitbc.errors import AitbcError
from aitbc.ledger.book import LedgerBase

RELEASE = Path(__file__).parent / "data" / "release-c056fd2"
RELEASE_RUN = "training_8a369db96043"  # the complete training in the dump
TABLES = {
    "runs", "offers", "contracts", "jobs", "updates", "rounds", "flags", "scores", "settlements",
    "ledger_entries", "ledger_accounts", "ledger_head",
}  # fmt: skip


def release_home(root: Path) -> Path:
    """A coordinator home as the release left it: its database and its wallet."""
    home = root / "coord"
    shutil.copytree(RELEASE / "wallets", home / "wallets")
    (home / "wallets" / "coordinator" / "key.json").chmod(0o600)
    with sqlite3.connect(home / "coordinator.db") as conn:
        conn.executescript((RELEASE / "coordinator.sql").read_text())
    conn.close()
    return home


def url_of(path: Path) -> str:
    return f"sqlite:///{path}"


def version(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def differences(url: str) -> list:
    """What alembic's autogenerate would change to make the database match the models."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return compare_metadata(MigrationContext.configure(conn), [Base.metadata, LedgerBase.metadata])
    finally:
        engine.dispose()


def schema(url: str) -> list[tuple]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    conn.close()
    return rows


# --- the head revision ---------------------------------------------------------------


def test_head_matches_the_models(tmp_path):
    """`alembic check`: an empty database upgraded to head is exactly what the models
    describe. A model changed without a new revision fails here."""
    url = url_of(tmp_path / "new.db")
    make_engine(url).dispose()
    assert version(url) == head_revision()
    assert set(inspect(create_engine(url)).get_table_names()) == TABLES | {"alembic_version"}
    assert differences(url) == []


def test_upgrade_is_idempotent(tmp_path):
    url = url_of(tmp_path / "twice.db")
    upgrade_database(url)
    first = schema(url)
    upgrade_database(url)
    make_engine(url).dispose()
    assert schema(url) == first and version(url) == head_revision()


def test_concurrent_starts_migrate_once(tmp_path):
    """Three coordinators starting at once on one new SQLite database: each waits for the
    migration lock; the first migrates, the others find the database at head."""
    url = url_of(tmp_path / "race.db")
    code = f"from aitbc.coordinator.db import make_engine; make_engine({url!r}).dispose()"
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert version(url) == head_revision() and differences(url) == []


def test_a_newer_database_is_refused_in_one_line(tmp_path):
    url = url_of(tmp_path / "newer.db")
    upgrade_database(url)
    with sqlite3.connect(tmp_path / "newer.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    conn.close()
    with pytest.raises(AitbcError) as e:
        make_engine(url)
    assert "cannot upgrade the database" in str(e.value) and "9999" in str(e.value)
    assert "\n" not in str(e.value)


# --- databases made before migrations -------------------------------------------------


def test_release_database_upgrades_in_place_and_trains(tmp_path, api, aitbc):
    """The release's own database (a finished, settled training in it) is adopted at
    revision 1 without a change to its rows, then a new training runs on it to the end and
    the ledger, old entries and new, still verifies."""
    home = release_home(tmp_path)
    url = url_of(home / "coordinator.db")
    with sqlite3.connect(home / "coordinator.db") as conn:  # its providers left long ago, whenever this runs
        conn.execute("UPDATE offers SET last_heartbeat = last_heartbeat - 1e7")
    conn.close()
    before = {t: _rows(url, t) for t in TABLES}
    coord, stop = api.start_coordinator(home)
    try:
        assert version(url) == head_revision() and differences(url) == []
        assert {t: _rows(url, t) for t in TABLES} == before  # adopted as it was

        owner = coord.client("owner")
        old = owner.get(f"/runs/{RELEASE_RUN}")
        assert (old["status"], old["round"]) == ("complete", 3)
        assert len(owner.get(f"/runs/{RELEASE_RUN}/rounds")["data"]) == 4  # round 0 and three more

        training = api.start_training_run(coord, 2, prefix="after-upgrade", rounds=1)
        for w in training.workers:
            cid = api.put_update(w, torch.full((training.d,), 0.01))
            w.post(f"/jobs/{training.jobs[w.wallet.address]}/updates", api.update_body(1, cid))
        run = api.wait_status(training.owner, training.run_id, "complete", timeout=60)
        assert run["round"] == 1
        deadline = time.monotonic() + 30
        while not (pay := training.owner.get(f"/runs/{training.run_id}/payments"))["finalized"]:
            assert time.monotonic() < deadline, pay
            time.sleep(0.05)
        assert (pay["settled_round"], len(pay["data"])) == (1, 2), pay
    finally:
        stop()
    r = aitbc("ledger", "verify", "--db", url, "--home", str(home))
    assert r.returncode == 0 and "ledger OK" in r.stdout, r.stdout + r.stderr


def test_older_database_gains_filled_columns(tmp_path):
    """A database of an earlier release (columns and a table added since are missing, one
    of them NOT NULL with rows in it) gains them, its rows filled with the model's default
    and the column NOT NULL, exactly as revision 1 has it."""
    home = release_home(tmp_path)
    url = url_of(home / "coordinator.db")
    with sqlite3.connect(home / "coordinator.db") as conn:
        for table, column in [
            ("runs", "control"),
            ("runs", "bonds_returned"),
            ("runs", "result_cid"),
            ("jobs", "seed"),
            ("jobs", "config"),
            ("offers", "failed_at"),
            ("contracts", "paid_manual"),
        ]:
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        # what the old add_new_columns did: a NOT NULL column added as nullable, rows left NULL
        conn.execute("ALTER TABLE jobs ADD COLUMN config JSON")
        conn.execute("DROP TABLE settlements")
    conn.close()
    make_engine(url).dispose()
    assert version(url) == head_revision() and differences(url) == []
    with sqlite3.connect(home / "coordinator.db") as conn:
        assert conn.execute("SELECT control, bonds_returned, result_cid FROM runs").fetchall() == [
            ("automatic", 0, None)
        ]
        assert conn.execute("SELECT DISTINCT config, seed FROM jobs").fetchall() == [("{}", None)]
        assert conn.execute("SELECT DISTINCT paid_manual FROM contracts").fetchall() == [(0,)]
        with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):
            conn.execute("UPDATE runs SET control = NULL")
    conn.close()
    columns = {c["name"]: c for c in inspect(create_engine(url)).get_columns("jobs")}
    assert columns["config"]["nullable"] is False


def test_a_column_that_cannot_be_filled_stops_the_upgrade_unchanged(tmp_path):
    home = release_home(tmp_path)
    url = url_of(home / "coordinator.db")
    with sqlite3.connect(home / "coordinator.db") as conn:
        conn.execute("ALTER TABLE runs DROP COLUMN bonds_returned")  # fillable: would be added...
        conn.execute("ALTER TABLE offers DROP COLUMN public_key")  # ...but this one is not
    conn.close()
    before = schema(url)
    with pytest.raises(AitbcError) as e:
        make_engine(url)
    msg = str(e.value)
    assert "table offers has no column public_key" in msg and "start a new one" in msg and "\n" not in msg
    assert schema(url) == before and version(url) is None  # one transaction: nothing was changed


def _rows(url: str, table: str) -> list[tuple]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        rows = sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
    conn.close()
    return rows
