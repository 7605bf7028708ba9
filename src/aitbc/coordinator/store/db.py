"""Engine, sessions and the schema's version. SQLite (the embedded default) runs in WAL mode
so readers never block the round driver's writes; any other SQLAlchemy URL is used as given.

The schema is versioned by alembic (``coordinator/migrations``, shipped inside the package):
:func:`make_engine` first brings the database to the head revision with
:func:`upgrade_database`, in one transaction that holds a lock, so two coordinators
starting at once on one database migrate it once (the second finds it at head).
"""

from __future__ import annotations

import logging
import zlib
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine, create_engine, event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from aitbc.errors import AitbcError

log = logging.getLogger("aitbc.coordinator.store.db")

MIGRATIONS = Path(__file__).parent / "migrations"
# PostgreSQL advisory lock that serialises migrations (any stable 64-bit number).
_PG_LOCK = zlib.crc32(b"aitbc.coordinator.migrations")
# Seconds a starting coordinator waits for another one's migration (SQLite's write lock).
MIGRATION_WAIT = 300


def make_engine(url: str) -> Engine:
    upgrade_database(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:  # every new connection
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")  # durable at each WAL checkpoint; safe in WAL mode
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()
    else:
        engine = create_engine(url, pool_pre_ping=True)
    return engine


def make_sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


# --- schema versions --------------------------------------------------------------------


def alembic_config(url: str | None = None, connection: Connection | None = None) -> Config:
    """alembic's configuration, built in code (no alembic.ini): the migrations shipped in
    the package, and either an open ``connection`` (what :func:`upgrade_database` passes)
    or a ``url``. A developer adding a revision after changing the models:

        python -c "from alembic import command; from aitbc.coordinator.store.db import alembic_config; \\
                   command.revision(alembic_config('sqlite:///head.db'), 'what changed', autogenerate=True)"

    (on a database at head, e.g. one :func:`upgrade_database` just made)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "no migrations shipped"
    return head


def upgrade_database(url: str) -> None:
    """Bring the database at ``url`` to the head revision: every revision for an empty one;
    a database made before migrations is adopted by the first (see its docstring); one at
    head is left alone. Runs in one transaction under a lock (SQLite: its write lock,
    taken by BEGIN IMMEDIATE; PostgreSQL: an advisory lock), so concurrent starts are safe
    and a failed upgrade changes nothing."""
    engine = _migration_engine(url)
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(select(text(f"pg_advisory_xact_lock({_PG_LOCK})")))
            before = MigrationContext.configure(conn).get_current_revision()
            command.upgrade(alembic_config(connection=conn), "head")
            after = MigrationContext.configure(conn).get_current_revision()
        if after != before:
            log.info("database schema: %s -> %s", before or "unversioned", after)
    except CommandError as e:  # e.g. a database a newer aitbc has migrated past our head
        where = make_url(url).render_as_string(hide_password=True)
        raise AitbcError(f"cannot upgrade the database {where} to schema {head_revision()}: {e}") from None
    except AitbcError as e:
        where = make_url(url).render_as_string(hide_password=True)
        raise AitbcError(f"cannot upgrade the database {where}: {e}") from None
    finally:
        engine.dispose()


def _migration_engine(url: str) -> Engine:
    if not url.startswith("sqlite"):
        return create_engine(url)
    # A connection of its own: foreign keys off (a batch migration copies a table, drops the
    # old one and renames the copy, which enforced keys would refuse) and transactions begun
    # by us, as BEGIN IMMEDIATE: the write lock from the first statement on, so a second
    # coordinator waits here until the first has migrated, then finds the database at head.
    engine = create_engine(url, connect_args={"timeout": MIGRATION_WAIT})

    @event.listens_for(engine, "connect")
    def _own_transactions(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None

    @event.listens_for(engine, "begin")
    def _immediate(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
