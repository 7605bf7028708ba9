"""Shared fixtures: the real console script, run as a subprocess on a temp home, and new
databases on the backend under test (``AITBC_TEST_DB``: sqlite, the default, or postgresql)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# pytest-xdist runs one process per core; one torch thread each avoids oversubscription.
torch.set_num_threads(1)

# Property tests draw the same examples on every run ("repeatable"): a CI failure replays
# here, and CI never fails on an example no run before it drew. AITBC_HYPOTHESIS=explore
# draws new ones (run it when changing a codec or a rule, and keep what it finds as a test).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("AITBC_HYPOTHESIS", "repeatable"))

AITBC = Path(sys.executable).parent / "aitbc"


def wait_until(cond, what: str = "condition", timeout: float = 60, poll: float = 0.05):
    """``cond()``'s first truthy value, polled every ``poll`` seconds; fails naming ``what``
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout:g} s")
        time.sleep(poll)


@pytest.fixture
def aitbc(tmp_path):
    """Run ``aitbc ARGS`` as a real process with its own ``--home``-style env; return
    the CompletedProcess (text mode unless ``binary=True``)."""

    home = tmp_path / "home"

    def run(*args: str, binary: bool = False, input: bytes | str | None = None, timeout: float = 300):
        env = dict(os.environ, AITBC_HOME=str(home), OMP_NUM_THREADS="1", COLUMNS="200")
        return subprocess.run(
            [str(AITBC), *args], capture_output=True, text=not binary, input=input, env=env, timeout=timeout
        )

    run.home = home
    return run


# --- databases: SQLite, or PostgreSQL where AITBC_TEST_DB=postgresql --------------------------

TEST_DB = os.environ.get("AITBC_TEST_DB", "sqlite")
PG_URL = os.environ.get("AITBC_TEST_PG_URL")  # a PostgreSQL server's maintenance database
BACKENDS = ("sqlite", "postgresql")


def pytest_configure(config: pytest.Config) -> None:
    if TEST_DB not in BACKENDS:
        raise pytest.UsageError(f"AITBC_TEST_DB={TEST_DB!r}: allowed are {', '.join(BACKENDS)}")
    if TEST_DB == "postgresql" and not PG_URL:
        raise pytest.UsageError(
            "AITBC_TEST_DB=postgresql needs AITBC_TEST_PG_URL, a server's maintenance database "
            "(`.ci/postgres start DIR` starts one and prints it)"
        )


class Databases:
    """New, empty databases for coordinators and ledgers under test. ``new(dir)`` is a SQLite
    file in ``dir``, or, where ``AITBC_TEST_DB=postgresql``, a database of its own on the
    server ``AITBC_TEST_PG_URL`` names (dropped by ``drop(url)`` or when the session ends), so
    the same suites run on both without a line of their own."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self._admin = None

    @property
    def backend(self) -> str:
        return TEST_DB

    def new(self, directory: Path, backend: str | None = None) -> str:
        if (backend or TEST_DB) == "sqlite":
            directory.mkdir(parents=True, exist_ok=True)
            return f"sqlite:///{directory / 'coordinator.db'}"
        if not PG_URL:
            pytest.skip("AITBC_TEST_PG_URL is not set (`.ci/postgres start DIR` starts a server and prints it)")
        from sqlalchemy import make_url, text

        name = f"aitbc_test_{secrets.token_hex(6)}"
        with self.admin().connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
        self.made.append(url)
        return url

    def drop(self, url: str) -> None:
        """Drop a PostgreSQL database ``new`` made (its connections are closed first); a
        SQLite file stays with its temporary directory."""
        if url not in self.made:
            return
        from sqlalchemy import make_url, text

        self.made.remove(url)
        with self.admin().connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))

    def copy(self, url: str, directory: Path) -> str:
        """A new database holding what ``url`` holds (nobody may be connected to it): SQLite's
        backup into ``directory``, or PostgreSQL's ``CREATE DATABASE ... TEMPLATE``."""
        from sqlalchemy import make_url, text

        if url.startswith("sqlite"):
            import sqlite3

            dest = self.new(directory, backend="sqlite")
            with (
                sqlite3.connect(make_url(url).database or "") as a,
                sqlite3.connect(make_url(dest).database or "") as b,
            ):
                a.backup(b)
            a.close()
            b.close()
            return dest
        name = f"aitbc_test_{secrets.token_hex(6)}"
        with self.admin().connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{make_url(url).database}"'))
        dest = make_url(url).set(database=name).render_as_string(hide_password=False)
        self.made.append(dest)
        return dest

    @staticmethod
    def sql(url: str, *statements: str) -> None:
        """Run ``statements`` in one transaction on ``url``, as someone with the database would."""
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.begin() as conn:
                for statement in statements:
                    conn.execute(text(statement))
        finally:
            engine.dispose()

    def admin(self):
        if self._admin is None:
            from sqlalchemy import create_engine
            from sqlalchemy.pool import NullPool

            self._admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        return self._admin

    def close(self) -> None:
        for url in list(self.made):
            self.drop(url)
        if self._admin is not None:
            self._admin.dispose()


@pytest.fixture(scope="session")
def databases() -> Iterator[Databases]:
    dbs = Databases()
    yield dbs
    dbs.close()


@pytest.fixture
def db_url(databases: Databases, tmp_path: Path) -> Iterator[str]:
    """The URL of a new, empty database on the backend under test, dropped after the test."""
    url = databases.new(tmp_path / "db")
    yield url
    databases.drop(url)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Where the chain suites are deselected (make test: ``-m "... and not chain"``; make
    test-long: ``-m long``), their modules are not even imported: titanoboa raises the
    interpreter's recursion limit to 100000 for the whole process, which every other test in
    that worker would then run under."""
    expr = config.option.markexpr or ""
    try:
        first = collection_path.relative_to(Path(__file__).parent).parts[:1]
    except ValueError:
        return None
    if first == ("chain",) and ("not chain" in expr or expr.strip() == "long"):
        return True
    return None
