"""Options and helpers shared by every command."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

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


def page(items: list[Any]) -> dict[str, Any]:
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
