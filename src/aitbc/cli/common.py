"""Options and helpers shared by every command."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from aitbc.json_value import JSONObject

if TYPE_CHECKING:
    from aitbc_agent_sdk import Agent

DEFAULT_HOME = Path("~/.aitbc")

# --home: where wallets, blobs and runs live. AITBC_HOME is read here, at the edge, only.
HomeOption = Annotated[
    Path,
    typer.Option(
        "--home",
        envvar="AITBC_HOME",
        help="State directory (blobs, wallets, runs).",
        show_default=True,
    ),
]
CoordinatorOption = Annotated[
    str | None,
    typer.Option(
        "--coordinator", help="Coordinator URL (default: AITBC_COORDINATOR, the local stack, or http://127.0.0.1:8700)."
    ),
]

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def shown(text: str) -> str:
    """``text`` safe to print: every character a terminal would act on or that hides what
    follows (control characters: ESC, BEL, newline, tab, backspace, ...; format characters:
    bidi overrides, zero-width ones) written as its Python escape (``\\x1b``, ``\\n``,
    ``\\u202e``), the rest as it is. For every text another party wrote (a file name in a
    peer's folder, a provider's GPU or device name, a coordinator's error or reason): printed
    raw, an ESC sequence would rewrite the terminal (clear it, retitle it, fake lines)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shown_name(name: str) -> str:
    """A name (of a file, a folder) as :func:`shown`, quoted as Python writes it when it has
    anything escaped (or a backslash or a leading quote, which would read as an escape), so
    no two names print alike: ``'a\\x1b[2Jb'`` is the name with an ESC, not those letters."""
    if name.isprintable() and "\\" not in name and not name.startswith(("'", '"')):
        return name
    return repr(name)


def others(text: object) -> Text:
    """A table cell of another party's text: :func:`shown`, and never read as markup."""
    return Text(shown(str(text)))


def agent(home: Path, coordinator: str | None = None, wallet: str | None = None, network: str = "local") -> Agent:
    """The SDK's agent that every command talking to a coordinator drives: signed by
    ``wallet`` (``None``: read-only, it signs nothing), at ``--coordinator`` or the
    default (``AITBC_COORDINATOR``, the local stack under ``home``, 127.0.0.1:8700)."""
    from aitbc_agent_sdk import Agent, AgentConfig  # httpx: imported on use, so --help stays fast

    return Agent(
        AgentConfig(
            name="aitbc-cli", wallet_name=wallet, coordinator_url=coordinator, home=home, blockchain_network=network
        )
    )


def json_text(obj: Any, *, sort_keys: bool = False) -> str:
    """``obj`` as JSON for ``--json``: the SDK's results (reply models) as the JSON objects
    the coordinator sent them as."""
    return json.dumps(obj, sort_keys=sort_keys, default=_reply_json)


def _reply_json(obj: object) -> Any:
    from pydantic import BaseModel  # imported on use, so --help stays fast

    from aitbc.replies.base import money_text

    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json", by_alias=True)
    if isinstance(obj, Decimal):  # an amount of AIT read off a reply: the decimal string it came as
        return money_text(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON")


def page(items: list[Any]) -> JSONObject:
    """A list as the API sends it (``{data, count}``), for ``--json``."""
    return {"data": items, "count": len(items)}


@contextmanager
def naming_wallet(wallet: str | None) -> Iterator[None]:
    """The coordinator's hints say WALLET where only the CLI knows the wallet's name."""
    from aitbc_agent_sdk import AgentError

    try:
        yield
    except AgentError as e:
        if wallet and "WALLET" in e.detail:
            raise type(e)(e.code, e.detail.replace("WALLET", wallet), e.status) from None
        raise


def resolve_home(home: Path) -> Path:
    return home.expanduser()


def fit(table: Table, *, whole: Sequence[str] = (), drop: Sequence[str] = (), console: Console | None = None) -> Table:
    """``table`` made readable at the console's width (``COLUMNS=80`` too): the columns
    named in ``whole`` (ids, CIDs, addresses: copied, so never cut or folded) keep each
    value on one line at full length; every other column wraps; and while the table still
    cannot fit, its outer border goes, then the columns named in ``drop``, in that order
    (the least useful first). Columns are named by their header."""
    console = console or out
    for column in table.columns:
        column.overflow = "fold"
        if column.header in whole:
            column.no_wrap = True
            column.min_width = max(len(line) for c in [column.header, *column.cells] for line in _lines(c))

    if not fits(table, console):
        table.show_edge = False
    for header in drop:
        if fits(table, console):
            break
        table.columns[:] = [c for c in table.columns if c.header != header]
    _widths(table, console.width)
    return table


def _widths(table: Table, width: int) -> None:
    """Column widths that fit ``width`` when the natural ones do not: the widest column
    that may wrap gives up one character at a time, never below its longest word (rich's
    own squeeze would cut words, and ids, short)."""
    cols = table.columns
    natural = [max(len(line) for c in [col.header, *col.cells] for line in _lines(c)) for col in cols]
    floor = [
        n if col.no_wrap else max([len(w) for c in [col.header, *col.cells] for w in _plain(c).split()] + [1])
        for col, n in zip(cols, natural, strict=True)
    ]
    room = width - 2 * len(cols) - ((len(cols) + 1) if table.show_edge else max(len(cols) - 1, 0))
    widths = list(natural)
    while sum(widths) > room:
        i = max(range(len(cols)), key=lambda k: (widths[k] - floor[k] > 0, widths[k]))
        if widths[i] <= floor[i]:
            return  # cannot fit without breaking words: leave it to rich
        widths[i] -= 1
    if widths != natural:
        for col, w in zip(cols, widths, strict=True):
            col.width = w


def fits(table: Table, console: Console | None = None) -> bool:
    """Whether ``table`` fits the console's width with no word, id or CID broken."""
    console = console or out
    words = [
        max(len(line) for c in [column.header, *column.cells] for line in _lines(c))
        if column.no_wrap  # kept whole: its longest line
        else max([len(w) for c in [column.header, *column.cells] for w in _plain(c).split()] + [1])
        for column in table.columns
    ]
    edges = (len(words) + 1) if table.show_edge else max(len(words) - 1, 0)
    return sum(words) + 2 * len(words) + edges <= console.width


def _plain(cell: Any) -> str:
    """A cell's text as shown (markup such as ``[red]`` taken out)."""
    return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain


def _lines(cell: Any) -> list[str]:
    return _plain(cell).splitlines() or [""]
