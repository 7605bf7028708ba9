"""The schema is versioned (alembic, ``coordinator/migrations``); a coordinator brings its
database to the head revision at start.

A database made by the release before migrations (its real SQL dump, with the rows of a
complete, settled training) upgrades in place and then carries a new training; older ones
gain the columns added since, filled and NOT NULL; the head revision matches the models
(so a model change without a migration fails here); upgrading twice, or from several
processes at once, changes nothing more.

Every test runs on SQLite and, where ``AITBC_TEST_PG_URL`` names a PostgreSQL server (CI
starts one: ``.ci/postgres``), on PostgreSQL too, each in a database of its own.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, MetaData, Table, create_engine, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from aitbc.coordinator.store.db import alembic_config, head_revision, make_engine, upgrade_database
from aitbc.coordinator.store.models import Base
from aitbc.errors import AitbcError
from aitbc.ledger.book import LedgerBase

RELEASE = Path(__file__).parent / "data" / "release-c056fd2"
RELEASE_RUN = "training_8a369db96043"  # the complete training in the dump
TABLES = (
    "runs", "offers", "contracts", "jobs", "updates", "rounds", "flags", "scores", "settlements",
    "ledger_entries", "ledger_accounts", "ledger_head",
)  # fmt: skip


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path, databases) -> Iterator[str]:
    """The URL of a new, empty database (SQLite: a file beside the test's home)."""
    url = databases.new(tmp_path / "coord", backend=request.param)
    yield url
    databases.drop(url)


@pytest.fixture
def home(tmp_path) -> Path:
    """A coordinator home with the release's coordinator wallet (it signed the dump's ledger)."""
    home = tmp_path / "coord"
    shutil.copytree(RELEASE / "wallets", home / "wallets")
    (home / "wallets" / "coordinator" / "key.json").chmod(0o600)
    return home


def make_release_database(url: str, tmp_path: Path) -> None:
    """The database the release left: on SQLite its own dump (the release's DDL and rows);
    on PostgreSQL revision 1's tables (the release's schema) without a version, holding
    the dump's rows."""
    dump = tmp_path / "release.db"
    with sqlite3.connect(dump) as conn:
        conn.executescript((RELEASE / "coordinator.sql").read_text())
    conn.close()
    if url.startswith("sqlite"):
        shutil.copy(dump, make_url(url).database or "")
        return
    command.upgrade(alembic_config(url), "0001")
    source, target = create_engine(f"sqlite:///{dump}"), create_engine(url)
    try:
        tables = MetaData()
        tables.reflect(target)
        with source.connect() as src, target.begin() as dst:
            dst.execute(text("DROP TABLE alembic_version"))
            for table in tables.sorted_tables:
                if table.name in TABLES:
                    old = Table(table.name, MetaData(), autoload_with=src)
                    rows = [dict(r._mapping) for r in src.execute(select(old))]
                    if rows:
                        dst.execute(table.insert(), rows)
                    (key,) = table.primary_key.columns if len(table.primary_key.columns) == 1 else (None,)
                    if rows and key is not None and isinstance(rows[0][key.name], int):
                        # as if the rows had been inserted here: a serial key's sequence past them
                        # (setval of NULL, a key without a sequence, does nothing)
                        dst.execute(
                            text(f"SELECT setval(pg_get_serial_sequence('{table.name}', '{key.name}'), :n)"),
                            {"n": max(r[key.name] for r in rows)},
                        )
    finally:
        source.dispose()
        target.dispose()


def engine_of(url: str) -> Engine:
    return create_engine(url)


def run_sql(url: str, *statements: str) -> None:
    engine = engine_of(url)
    try:
        with engine.begin() as conn:
            for sql in statements:
                conn.execute(text(sql))
    finally:
        engine.dispose()


def version(url: str) -> str | None:
    engine = engine_of(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def differences(url: str) -> list:
    """What alembic's autogenerate would change to make the database match the models."""
    engine = engine_of(url)
    try:
        with engine.connect() as conn:
            return compare_metadata(MigrationContext.configure(conn), [Base.metadata, LedgerBase.metadata])
    finally:
        engine.dispose()


def schema(url: str) -> dict[str, Any]:
    engine = engine_of(url)
    try:
        insp = inspect(engine)
        return {
            t: (
                [(c["name"], str(c["type"]), c["nullable"]) for c in insp.get_columns(t)],
                sorted((i["name"], tuple(i["column_names"])) for i in insp.get_indexes(t)),
                sorted(tuple(u["column_names"]) for u in insp.get_unique_constraints(t)),
            )
            for t in sorted(insp.get_table_names())
        }
    finally:
        engine.dispose()


def rows(url: str, table: str) -> list[dict[str, Any]]:
    engine = engine_of(url)
    try:
        with engine.connect() as conn:
            t = Table(table, MetaData(), autoload_with=conn)
            return sorted((dict(r._mapping) for r in conn.execute(select(t))), key=repr)
    finally:
        engine.dispose()


# Columns a later revision added NOT NULL with a server default (an old row reads the default).
SERVER_DEFAULTS = {("runs", "chain_deposited"), ("contracts", "chain_bonded")}


# --- the head revision ---------------------------------------------------------------


def test_head_matches_the_models(url):
    """`alembic check`: an empty database upgraded to head is exactly what the models
    describe. A model changed without a new revision fails here."""
    make_engine(url).dispose()
    assert version(url) == head_revision()
    assert set(schema(url)) == {
        *TABLES,
        "pins",
        "driver_lease",
        "seen_nonces",
        "gossip_witnesses",
        "coordinator_identity",
        "chain_txs",
        "chain_binding",
        "alembic_version",
    }  # 0003, 0007, 0008, 0010, 0013, 0014, 0015
    assert differences(url) == []


def test_upgrade_is_idempotent(url):
    upgrade_database(url)
    first = schema(url)
    upgrade_database(url)
    make_engine(url).dispose()
    assert schema(url) == first and version(url) == head_revision()


def test_concurrent_starts_migrate_once(url):
    """Three coordinators starting at once on one new database: each waits for the
    migration lock; the first migrates, the others find the database at head."""
    code = f"from aitbc.coordinator.store.db import make_engine; make_engine({url!r}).dispose()"
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert version(url) == head_revision() and differences(url) == []


def test_a_newer_database_is_refused_in_one_line(url):
    upgrade_database(url)
    run_sql(url, "UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(AitbcError) as e:
        make_engine(url)
    assert "cannot upgrade the database" in str(e.value) and "9999" in str(e.value)
    assert "\n" not in str(e.value)


# --- databases made before migrations -------------------------------------------------


def test_release_database_upgrades_in_place_and_trains(url, home, tmp_path, api, aitbc):
    """The release's own database (a finished, settled training in it) is adopted at
    revision 1 without a change to its rows, then a new training runs on it to the end and
    the ledger, old entries and new, still verifies."""
    make_release_database(url, tmp_path)
    run_sql(url, "UPDATE offers SET last_heartbeat = last_heartbeat - 1e7")  # its providers left long ago
    before = {t: rows(url, t) for t in TABLES}
    coord, stop = api.start_coordinator(home, db_url=url)
    try:
        assert version(url) == head_revision() and differences(url) == []
        # adopted as it was: every row and value kept; columns added by later revisions are null
        after = {t: rows(url, t) for t in TABLES}
        for t in TABLES:
            old_columns = set(before[t][0]) if before[t] else set()
            kept = sorted(json.dumps({k: r[k] for k in old_columns}, sort_keys=True, default=str) for r in after[t])
            assert kept == sorted(json.dumps(r, sort_keys=True, default=str) for r in before[t]), t
            assert all(r[k] is None or (t, k) in SERVER_DEFAULTS for r in after[t] for k in set(r) - old_columns), t

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


def test_older_database_gains_filled_columns(url, tmp_path):
    """A database of an earlier release (columns and a table added since are missing, one
    of them NOT NULL with rows in it) gains them, its rows filled with the model's default
    and the column NOT NULL, exactly as revision 1 has it."""
    make_release_database(url, tmp_path)
    dropped = [
        ("runs", "control"),
        ("runs", "bonds_returned"),
        ("runs", "result_cid"),
        ("jobs", "seed"),
        ("jobs", "config"),
        ("offers", "failed_at"),
        ("contracts", "paid_manual"),
    ]
    run_sql(
        url,
        *(f"ALTER TABLE {table} DROP COLUMN {column}" for table, column in dropped),
        # what the old add_new_columns did: a NOT NULL column added as nullable, rows left NULL
        "ALTER TABLE jobs ADD COLUMN config JSON",
        "DROP TABLE settlements",
    )
    make_engine(url).dispose()
    assert version(url) == head_revision() and differences(url) == []
    assert [(r["control"], r["bonds_returned"], r["result_cid"]) for r in rows(url, "runs")] == [
        ("automatic", False, None)
    ]
    assert {(repr(r["config"]), r["seed"]) for r in rows(url, "jobs")} == {("{}", None)}
    assert {r["paid_manual"] for r in rows(url, "contracts")} == {0}
    assert rows(url, "settlements") == []
    with pytest.raises(IntegrityError):
        run_sql(url, "UPDATE runs SET control = NULL")
    columns = {c["name"]: c for c in inspect(engine_of(url)).get_columns("jobs")}
    assert columns["config"]["nullable"] is False


def test_a_column_that_cannot_be_filled_stops_the_upgrade_unchanged(url, tmp_path):
    make_release_database(url, tmp_path)
    run_sql(
        url,
        "ALTER TABLE runs DROP COLUMN bonds_returned",  # fillable: would be added...
        "ALTER TABLE offers DROP COLUMN public_key",  # ...but this one is not
    )
    before = schema(url)
    with pytest.raises(AitbcError) as e:
        make_engine(url)
    msg = str(e.value)
    assert "table offers has no column public_key" in msg and "start a new one" in msg and "\n" not in msg
    assert schema(url) == before and version(url) is None  # one transaction: nothing was changed
