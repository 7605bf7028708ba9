"""Options and helpers shared by every command."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

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

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


@contextmanager
def naming_wallet(wallet: str | None):
    """The coordinator's hints say WALLET where only the CLI knows the wallet's name."""
    from aitbc.client import ApiError

    try:
        yield
    except ApiError as e:
        if wallet and "WALLET" in e.detail:
            raise ApiError(e.status, e.code, e.detail.replace("WALLET", wallet)) from None
        raise


def resolve_home(home: Path) -> Path:
    return home.expanduser()
