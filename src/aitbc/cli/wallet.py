"""``aitbc wallet``: create, list and show the Ed25519 identities under ``HOME/wallets``.

A wallet's public key identifies a worker or a client to the coordinator and the
market; its private key (``HOME/wallets/NAME/key.json``, mode 0600) is never printed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from aitbc.cli.common import DEFAULT_HOME, HomeOption, err, out, resolve_home
from aitbc.ledger.wallet import create_wallet, list_wallets, load_wallet, wallet_path, wallets_dir

app = typer.Typer(
    help="Ed25519 identities (wallets) under HOME/wallets.",
    no_args_is_help=True,
)

NameArgument = Annotated[str, typer.Argument(help="The wallet's name (letters, digits, '.', '_', '-').", show_default=False)]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def _print_json(obj: object) -> None:
    typer.echo(json.dumps(obj))


@app.command()
def create(name: NameArgument, home: HomeOption = DEFAULT_HOME, json_out: JsonOption = False) -> None:
    """Create a new wallet (a fresh Ed25519 key pair) and print its address."""
    home = resolve_home(home)
    wallet = create_wallet(home, name)
    if json_out:
        _print_json(wallet.info().to_dict())
        return
    typer.echo(f"Wallet created: {wallet.name}")
    typer.echo(f"Address: {wallet.address}")
    err.print(f"private key saved to {wallet_path(home, name)} (keep it private)", highlight=False, markup=False)


@app.command("list")
def list_(home: HomeOption = DEFAULT_HOME, json_out: JsonOption = False) -> None:
    """List the wallets: name, address and creation time."""
    home = resolve_home(home)
    infos = list_wallets(home)
    if json_out:
        _print_json({"data": [info.to_dict() for info in infos], "count": len(infos)})
        return
    if not infos:
        err.print(f"no wallets in {wallets_dir(home)}", highlight=False, markup=False)
        return
    table = Table("name", "address", "created")
    for column in table.columns:  # in a narrow terminal, wrap; never cut a value short
        column.overflow = "fold"
    table.columns[1].no_wrap = True
    table.columns[1].min_width = len(infos[0].address)  # an address is copied whole
    for info in infos:
        table.add_row(Text(info.name), Text(info.address), Text(info.created))
    out.print(table, highlight=False)


@app.command()
def show(name: NameArgument, home: HomeOption = DEFAULT_HOME, json_out: JsonOption = False) -> None:
    """Show a wallet's name, address, public key, creation time and key file."""
    home = resolve_home(home)
    info = load_wallet(home, name).info()
    path = wallet_path(home, name)
    if json_out:
        _print_json({**info.to_dict(), "path": str(path)})
        return
    for label, value in (
        ("Name", info.name),
        ("Address", info.address),
        ("Public key", info.public_key),
        ("Created", info.created),
        ("Path", str(path)),
    ):
        typer.echo(f"{label + ':':<12}{value}")
