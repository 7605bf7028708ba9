"""Engine and sessions. SQLite (the embedded default) runs in WAL mode so readers never
block the round driver's writes; any other SQLAlchemy URL is used as given."""

from __future__ import annotations

from sqlalchemy import Engine, create_engine, event, inspect, literal, text
from sqlalchemy.orm import Session, sessionmaker

from aitbc.coordinator.models import Base
from aitbc.ledger.book import LedgerBase


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # every new connection
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")  # durable at each WAL checkpoint; safe in WAL mode
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()
    else:
        engine = create_engine(url, pool_pre_ping=True)
    Base.metadata.create_all(engine)
    LedgerBase.metadata.create_all(engine)
    add_new_columns(engine)
    return engine


def add_new_columns(engine: Engine) -> list[str]:
    """A database made by an earlier version lacks the columns added since (each has a
    default or is nullable): add them in place, so an existing home keeps working.
    Returns ``table.column`` for each one added."""
    insp = inspect(engine)
    added = []
    with engine.begin() as conn:
        for table in [*Base.metadata.sorted_tables, *LedgerBase.metadata.sorted_tables]:
            have = {c["name"] for c in insp.get_columns(table.name)}
            for col in table.columns:
                if col.name in have:
                    continue
                ddl = f"ALTER TABLE {table.name} ADD COLUMN {col.name} {col.type.compile(engine.dialect)}"
                if col.default is not None and col.default.is_scalar:
                    value = literal(col.default.arg, col.type).compile(
                        dialect=engine.dialect, compile_kwargs={"literal_binds": True}
                    )
                    ddl += f" DEFAULT {value}"
                conn.execute(text(ddl))
                added.append(f"{table.name}.{col.name}")
    return added


def make_sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
