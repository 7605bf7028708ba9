"""``aitbc ledger``: audit the coordinator's ledger, and list its entries.

``aitbc ledger verify`` re-checks every entry (:func:`aitbc.ledger.chain.audit`): the
hash chain, each entry's signature and authorisation, no overdraft, no signed request
used twice, that the chain ends at the ledger's recorded head, and that the cached
balances are the ones the entries give. It reads the ledger either

- from a running coordinator (``--coordinator URL``, default as for every command):
  ``GET /v1/ledger`` (the system key and the head), ``GET /v1/ledger/balances`` and every
  page of ``GET /v1/ledger/entries``; or
- straight from its database (``--db URL``, e.g. ``sqlite:////path/coordinator.db``),
  offline, reading only. The entries cannot vouch for the key that signs them, so an
  offline audit needs the coordinator's public key from elsewhere: ``--system-key HEX``,
  else the coordinator's wallet under ``--home``: ``HOME/wallets/coordinator/key.json``
  (``--home`` is the coordinator's own home, as given to ``aitbc coordinator serve``) or
  ``HOME/coordinator/money/wallets/coordinator/key.json`` (the home of ``aitbc up``).

Online, ``--system-key`` pins the key: a coordinator reporting another one fails the
audit. The head is read before and after the entries; if the ledger moved meanwhile
(a live coordinator), the audit is redone, up to a few times.

``aitbc ledger verify --chain evm`` checks the money of a coordinator that settles on an
EVM chain against the chain's events instead (:mod:`aitbc.cli.ledger_evm`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from aitbc.cli.common import (
    DEFAULT_HOME,
    CoordinatorOption,
    HomeOption,
    agent,
    err,
    fit,
    fits,
    json_text,
    out,
    resolve_home,
)
from aitbc.errors import AitbcError, UsageError

if TYPE_CHECKING:
    from aitbc.ledger.book import EntryRecord
    from aitbc.ledger.chain import AuditResult

app = typer.Typer(help="Audit the coordinator's ledger and list its entries.", no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
ChainOption = Annotated[
    str,
    typer.Option(
        "--chain", help="local: audit the ledger's entries. evm: hold the coordinator's payments to the chain's events."
    ),
]
ChainFileOption = Annotated[
    Path | None,
    typer.Option("--chain-file", help="With --chain evm: the deployment record (default HOME/chain.json)."),
]
PAGE = 1000
ATTEMPTS = 5  # audits redone while a live ledger keeps moving


# --- where the ledger is read from ------------------------------------------------------------


class _Api:
    """The ledger through a coordinator's API (a read-only agent)."""

    def __init__(self, coordinator: str | None, home: Path = DEFAULT_HOME) -> None:
        self.agent = agent(resolve_home(home), coordinator)
        self.where = self.agent.config.resolved_coordinator_url

    def close(self) -> None:
        self.agent.stop()

    def info(self) -> dict[str, Any]:
        return self.agent.get_ledger_info().model_dump(mode="json")

    def head(self) -> tuple[int, str | None]:
        info = self.info()
        return int(info["entries"]), info["head"]

    def balances(self) -> dict[str, int]:
        return self.agent.get_ledger_balances()

    def entries(self) -> Iterator[dict[str, Any]]:
        after: int | None = 0
        while after is not None:
            page = self.agent.get_ledger_entries(after, PAGE)
            yield from page["data"]
            after = page["next"]


class _Db:
    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            parsed = make_url(url)
        except ArgumentError:
            raise UsageError(f"--db {url!r} is not a database URL; e.g. sqlite:////path/to/coordinator.db") from None
        if parsed.get_backend_name() == "sqlite":
            path = parsed.database
            if not path or path == ":memory:" or not Path(path).is_file():
                raise AitbcError(f"no database file at {path or url!r} (from --db {url})")
        self.where = url
        try:
            self.engine = create_engine(url)
        except Exception as e:  # noqa: BLE001 - an unknown dialect, a missing driver: one line
            raise UsageError(f"cannot open --db {url}: {e}") from None

    def close(self) -> None:
        self.engine.dispose()

    def _read(self, fn):
        from sqlalchemy.exc import SQLAlchemyError
        from sqlalchemy.orm import Session

        try:
            with Session(self.engine) as s:
                return fn(s)
        except SQLAlchemyError as e:
            orig = getattr(e, "orig", None)  # the driver's own error, when there is one
            first = str(orig if orig is not None else e).splitlines()[0]
            raise AitbcError(f"cannot read the ledger from {self.where}: {first}") from None

    def head(self) -> tuple[int, str | None]:
        from aitbc.ledger.book import Head

        def read(s):
            h = s.get(Head, 1)
            return (h.seq, h.hash) if h is not None and h.seq else (0, None)

        return self._read(read)

    def balances(self) -> dict[str, int]:
        from aitbc.ledger.book import Ledger

        return self._read(Ledger.cached_balances)

    def entries(self) -> Iterator[EntryRecord]:
        from aitbc.ledger.book import Ledger

        after = 0
        while True:
            rows = self._read(lambda s: [e.as_dict() for e in Ledger.entries(s, after=after, limit=PAGE)])  # noqa: B023 - called at once
            yield from rows
            if len(rows) < PAGE:
                return
            after = rows[-1]["seq"]


def _key_hex(text: str, what: str) -> str:
    from aitbc.ledger.wallet import public_key_from_hex

    try:
        public_key_from_hex(text)
    except ValueError:
        raise UsageError(f"{what} {text!r} is not a public key (64 hex digits)") from None
    return text.lower()


def _offline_key(system_key: str | None, home: Path) -> tuple[str, str]:
    """The coordinator's public key for an offline audit, and where it came from."""
    from aitbc.ledger.wallet import load_wallet

    if system_key:
        return _key_hex(system_key, "--system-key"), "--system-key"
    for h in (home, home / "coordinator"):
        path = h / "wallets" / "coordinator" / "key.json"
        if path.is_file():
            return load_wallet(h, "coordinator").public_key, str(path)
    raise UsageError(
        f"an offline audit needs the coordinator's public key: pass --system-key HEX (GET /v1/ledger "
        f"shows it), or --home set to the coordinator's home (no wallets/coordinator/key.json in {home})"
    )


def _audit(source: _Api | _Db, system_key: str | None) -> AuditResult:
    from aitbc.ledger.chain import audit

    for _ in range(ATTEMPTS):
        before = source.head()
        cached = source.balances()
        result = audit(source.entries(), system_key=system_key, cached=cached, head=before)
        if source.head() == before:
            return result
    raise AitbcError(f"the ledger at {source.where} kept changing during {ATTEMPTS} audits; try again")


def audit_coordinator(url: str, *, system_key: str | None = None) -> AuditResult:
    """The audit ``aitbc ledger verify --coordinator URL`` runs, as an ``AuditResult``
    (for other commands: e.g. the demo's closing check). ``system_key`` pins the key."""
    source = _Api(url)
    try:
        key = _key_hex(str(source.info()["system_key"]), "the coordinator's system key")
        if system_key is not None and system_key.lower() != key:
            raise AitbcError(f"the coordinator at {url} signs with {key}, not {system_key.lower()}")
        return _audit(source, key)
    finally:
        source.close()


def _on_chain(chain: str, chain_file: Path | None, *, db: str | None, system_key: str | None) -> bool:
    """Whether ``verify`` checks an EVM chain; refuses options that do not go together."""
    if chain not in ("local", "evm"):
        raise UsageError(f"--chain {chain!r}: allowed are local, evm")
    if chain == "evm" and (db is not None or system_key is not None):
        raise UsageError("--chain evm reads the coordinator's API and the chain: --db and --system-key do not apply")
    if chain == "local" and chain_file is not None:
        raise UsageError("--chain-file goes with --chain evm")
    return chain == "evm"


@app.command()
def verify(
    coordinator: CoordinatorOption = None,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Audit this database directly, offline (a SQLAlchemy URL, e.g. sqlite:////path/coordinator.db).",
        ),
    ] = None,
    system_key: Annotated[
        str | None,
        typer.Option(
            "--system-key",
            help="The coordinator's public key (64 hex). Offline: default from HOME/wallets/coordinator/key.json. Online: fail if the coordinator reports another.",
        ),
    ] = None,
    chain: ChainOption = "local",
    chain_file: ChainFileOption = None,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
) -> None:
    """Audit every ledger entry: chain, signatures, authorisations, balances, head.

    With --chain evm: rebuild every balance from the EVM chain's events and compare each
    EVM run's payments (escrow, each provider's pay, bond and slash, each settlement
    transaction) with them."""
    home = resolve_home(home)
    if _on_chain(chain, chain_file, db=db, system_key=system_key):
        from aitbc.cli.ledger_evm import verify_evm

        verify_evm(coordinator, home, chain_file, json_out=json_out)
        return
    if db is not None and coordinator is not None:
        raise UsageError("give --coordinator (audit through the API) or --db (audit the database), not both")
    if db is not None:
        key, key_from = _offline_key(system_key, home)
        source: _Api | _Db = _Db(db)
        network = None
    else:
        source = _Api(coordinator, home)
        try:
            info = source.info()
        except AitbcError:
            source.close()
            raise
        key, key_from, network = (
            _key_hex(str(info["system_key"]), "the coordinator's system key"),
            "GET /v1/ledger",
            info["network"],
        )
        if system_key is not None and _key_hex(system_key, "--system-key") != key:
            source.close()
            raise AitbcError(
                f"the coordinator at {source.where} signs with {key}, not the --system-key {system_key.lower()}"
            )
    try:
        result = _audit(source, key)
    finally:
        source.close()
    if json_out:
        typer.echo(
            json.dumps(
                {
                    **dataclasses.asdict(result),
                    "description": result.describe(),
                    "source": source.where,
                    "network": network,
                    "system_key": key,
                    "system_key_from": key_from,
                }
            )
        )
        if not result.ok:
            raise typer.Exit(1)
        return
    if not result.ok:
        raise AitbcError(result.describe())
    typer.echo(result.describe())
    err.print(f"audited {source.where}; coordinator key {key[:16]}... from {key_from}", highlight=False, markup=False)


def _entries_table(data: list[dict[str, Any]]) -> Table:
    """Accounts and amounts whole (they are copied); key and memo wrap, then go, at a
    narrow width; narrower still, each entry's two accounts share a column, one per line."""
    stacked = False
    while True:
        accounts = ("debit / credit",) if stacked else ("debit", "credit")
        table = Table("seq", "kind", *accounts, "amount AIT", "key", "memo")
        for e in data:
            moved = (Text(f"{e['debit']}\n{e['credit']}"),) if stacked else (Text(e["debit"]), Text(e["credit"]))
            table.add_row(
                str(e["seq"]),
                Text(e["kind"]),
                *moved,
                str(e["amount_ait"]),
                Text(e["key"] or ""),
                Text(json.dumps(e["memo"], sort_keys=True)),
            )
        fit(table, whole=("seq", *accounts, "amount AIT"), drop=("memo", "key", "kind"))
        if stacked or fits(table):
            return table
        stacked = True


@app.command()
def entries(
    after: Annotated[int, typer.Option("--after", help="List entries after this sequence number.")] = 0,
    limit: Annotated[int, typer.Option("--limit", help="Most entries to list (1..10000).")] = 100,
    coordinator: CoordinatorOption = None,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
) -> None:
    """List ledger entries in chain order: seq, kind, debit, credit, amount, key, memo."""
    home = resolve_home(home)
    if after < 0:
        raise UsageError(f"--after must be >= 0, got {after}")
    if not 1 <= limit <= 10_000:
        raise UsageError(f"--limit must be in 1..10000, got {limit}")
    with agent(home, coordinator) as a:
        res = a.get_ledger_entries(after, limit)
    if json_out:
        typer.echo(json_text(res))
        return
    if not res["data"]:
        err.print(f"no ledger entries after {after}", highlight=False, markup=False)
        return
    out.print(_entries_table(res["data"]), highlight=False)
    if res.get("next") is not None:
        err.print(
            f"more after entry {res['next']}: aitbc ledger entries --after {res['next']}", highlight=False, markup=False
        )
