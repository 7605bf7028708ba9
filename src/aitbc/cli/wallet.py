"""``aitbc wallet``: create, list and show the Ed25519 identities under ``HOME/wallets``.

A wallet's public key identifies a worker or a client to the coordinator and the
market; its private key (``HOME/wallets/NAME/key.json``, mode 0600) is never printed.
A wallet's EVM account (``evm.json``, a Web3 Secret Storage keystore:
:mod:`aitbc.ledger.evm_keys`), which holds AIT on an EVM chain, is made at its first
on-chain use or by ``aitbc wallet evm NAME``, not here: making one imports eth-account,
which takes seconds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from aitbc.cli import checks
from aitbc.cli.common import (
    DEFAULT_HOME,
    CoordinatorOption,
    HomeOption,
    agent,
    err,
    fit,
    json_text,
    naming_wallet,
    out,
    page,
    resolve_home,
)
from aitbc.errors import AitbcError, NotFoundError, UsageError
from aitbc.ledger.evm_keys import ensure_evm_account, evm_address, evm_key_path
from aitbc.ledger.sealed import PASSPHRASE_ENV
from aitbc.ledger.wallet import (
    WalletExistsError,
    create_wallet,
    list_wallets,
    load_wallet,
    wallet_encrypted,
    wallet_info,
    wallet_path,
    wallets_dir,
)

if TYPE_CHECKING:
    from aitbc_agent_sdk import Agent

app = typer.Typer(
    help="Ed25519 identities (wallets) under HOME/wallets.",
    no_args_is_help=True,
)

NameArgument = Annotated[
    str, typer.Argument(help="The wallet's name (letters, digits, '.', '_', '-').", show_default=False)
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def _print_json(obj: object) -> None:
    typer.echo(json_text(obj))


@app.command()
def create(
    name: NameArgument,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
    encrypt: Annotated[
        bool,
        typer.Option(
            "--encrypt",
            help="Encrypt the key with a passphrase (asked twice, or AITBC_WALLET_PASSPHRASE); "
            "every later use needs it (workers: AITBC_WALLET_PASSPHRASE).",
        ),
    ] = False,
) -> None:
    """Create a new wallet (a fresh Ed25519 key pair) and print its address.

    A wallet of that name in HOME already is left as it is and shown (exit 0), so a setup
    line can be run again."""
    home = resolve_home(home)
    if wallet_path(home, name).exists():  # before any passphrase is asked for
        _existing(home, name, encrypt=encrypt, json_out=json_out)
        return
    passphrase = None
    if encrypt:
        passphrase = os.environ.get(PASSPHRASE_ENV) or typer.prompt(
            f"Passphrase for wallet '{name}'", hide_input=True, confirmation_prompt=True
        )
    try:
        wallet = create_wallet(home, name, passphrase=passphrase)
    except WalletExistsError:  # another process created it meanwhile
        _existing(home, name, encrypt=encrypt, json_out=json_out)
        return
    if json_out:
        _print_json({**wallet.info().to_dict(), "evm_address": None, "existed": False})
        return
    typer.echo(f"Wallet created: {wallet.name}")
    typer.echo(f"Address: {wallet.address}")
    typer.echo(f"EVM address: {_evm_shown(name, None)}")
    sealed = " encrypted with your passphrase" if encrypt else ""
    err.print(
        f"private key saved{sealed} to {wallet_path(home, name)} (keep it private)", highlight=False, markup=False
    )


def _existing(home: Path, name: str, *, encrypt: bool, json_out: bool) -> None:
    """``create`` of a wallet that exists: its key is never replaced (it may hold money or
    sign a run). Shown as a load checks it, so a key file that is not the one created
    under that name (another key, a plaintext one where an encrypted one was) is refused
    as every use refuses it; ``--encrypt`` of a plaintext wallet is refused, not reported
    as done."""
    info = wallet_info(home, name)
    encrypted = wallet_encrypted(home, name)
    if encrypt and not encrypted:
        raise AitbcError(
            f"wallet '{name}' already exists unencrypted ({wallet_path(home, name).parent}) and was left as it is; "
            "choose another name for an encrypted wallet"
        )
    evm = evm_address(home, name)
    if json_out:
        _print_json({**info.to_dict(), "evm_address": evm, "existed": True})
        return
    typer.echo(f"Wallet exists: {name} (left unchanged{', encrypted' if encrypted else ''})")
    typer.echo(f"Address: {info.address}")
    typer.echo(f"EVM address: {_evm_shown(name, evm)}")


def _evm_shown(name: str, evm: str | None) -> str:
    return evm if evm is not None else f"none yet (made at its first on-chain use, or by: aitbc wallet evm {name})"


@app.command("list")
def list_(home: HomeOption = DEFAULT_HOME, json_out: JsonOption = False) -> None:
    """List the wallets: name, address and creation time."""
    home = resolve_home(home)
    infos = list_wallets(home)
    if json_out:
        data = [{**info.to_dict(), "evm_address": evm_address(home, info.name)} for info in infos]
        _print_json({"data": data, "count": len(infos)})
        return
    if not infos:
        err.print(f"no wallets in {wallets_dir(home)}", highlight=False, markup=False)
        return
    table = Table("name", "address", "evm address", "created")
    for info in infos:
        evm = evm_address(home, info.name) or "-"
        table.add_row(Text(info.name), Text(info.address), Text(evm), Text(info.created))
    # an address is copied whole; a narrow terminal drops the creation time, then the EVM address
    out.print(fit(table, whole=("address", "evm address"), drop=("created", "evm address")), highlight=False)


@app.command()
def show(name: NameArgument, home: HomeOption = DEFAULT_HOME, json_out: JsonOption = False) -> None:
    """Show a wallet's name, address, EVM address, public key, creation time and key file."""
    home = resolve_home(home)
    info = wallet_info(home, name)
    path = wallet_path(home, name)
    evm = evm_address(home, name)
    if json_out:
        _print_json({**info.to_dict(), "evm_address": evm, "path": str(path)})
        return
    for label, value in (
        ("Name", info.name),
        ("Address", info.address),
        ("EVM address", _evm_shown(name, evm)),
        ("Public key", info.public_key),
        ("Created", info.created),
        ("Path", str(path)),
    ):
        typer.echo(f"{label + ':':<13}{value}")


@app.command()
def evm(name: NameArgument, home: HomeOption = DEFAULT_HOME, json_out: JsonOption = False) -> None:
    """Make wallet NAME's EVM account if it has none, and print its address.

    It is made under the wallet's passphrase (asked for, or AITBC_WALLET_PASSPHRASE) and
    never replaced; an on-chain command (aitbc chain deploy) makes it too."""
    home = resolve_home(home)
    wallet_info(home, name)  # a missing or replaced wallet is refused before a passphrase is asked for
    address = evm_address(home, name)
    existed = address is not None
    if address is None:  # eth-account is imported (seconds) only to make one
        address = ensure_evm_account(home, name).address
    if json_out:
        _print_json({"name": name, "evm_address": address, "existed": existed})
        return
    typer.echo(f"EVM address: {address}")
    if not existed:
        err.print(f"EVM account made: {evm_key_path(home, name)} (keep it private)", highlight=False, markup=False)


# --- money on the local network (the coordinator keeps the ledger) --------------------

NetworkOption = Annotated[
    str, typer.Option("--network", help="Ledger network: local (mainnet and testnet are not available in this build).")
]
AmountArgument = Annotated[str, typer.Argument(help="AIT, up to 6 decimals, e.g. 12.5.", show_default=False)]
# A negative AMOUNT ("-5") is a value to refuse with its own message, not an unknown option.
AMOUNT_CONTEXT = {"ignore_unknown_options": True}


def _money_agent(home: Path, coordinator: str | None, name: str, network: str) -> Agent:
    """Wallet NAME's agent on ``network`` (checked first: one line naming the allowed ones)."""
    from aitbc.ledger.chain import LedgerError, check_network  # not .book: no SQLAlchemy for a CLI command

    try:
        check_network(network)
    except LedgerError as e:
        raise UsageError(e.detail) from None
    load_wallet(home, name)  # a missing wallet is refused before any request
    return agent(home, coordinator, name, network)


@app.command(context_settings=AMOUNT_CONTEXT)
def fund(
    name: NameArgument,
    amount: AmountArgument,
    network: NetworkOption = "local",
    coordinator: CoordinatorOption = None,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
) -> None:
    """The local faucet: mint AMOUNT AIT into wallet NAME (a recorded, signed mint).

    On a local stack started with --chain evm, the AIT is minted on its chain to the
    wallet's EVM account (made if it has none), which is given ether for gas too."""
    home = resolve_home(home)
    checks.amount(amount)
    if _evm_stack(home):
        _fund_on_chain(home, name, amount, json_out)
        return
    with _money_agent(home, coordinator, name, network) as a:
        res = a.fund_wallet(amount)
    if json_out:
        _print_json(res)
        return
    typer.echo(f"Funded {name} with {res['amount']} AIT (ledger entry {res['entry']}); balance {res['balance']} AIT")


def _evm_stack(home: Path) -> bool:
    """HOME's local stack was started with --chain evm (its chain.json names the contracts)."""
    from aitbc import stack
    from aitbc.chain.evm.deploy import chain_file

    recorded = stack.load(home)
    return recorded is not None and recorded.chain == "evm" and chain_file(home).exists()


def _fund_on_chain(home: Path, name: str, amount: str, json_out: bool) -> None:
    """``fund`` on an EVM stack: the stack's minter mints AMOUNT to NAME's EVM account."""
    from aitbc import stack_chain
    from aitbc.chain.evm.deploy import read_deployment
    from aitbc.units import format_price, parse_amount

    load_wallet(home, name)  # a missing wallet is refused before anything is made or sent
    micro = parse_amount(amount)
    deployment = read_deployment(home)
    address = ensure_evm_account(home, name).address
    done = stack_chain.fund_account(home, deployment, address, micro)
    if json_out:
        _print_json(
            {
                "name": name,
                "evm_address": address,
                "chain_id": deployment.chain_id,
                "amount": format_price(micro),
                "balance": format_price(done.balance),
                "tx_hash": done.tx_hash,
            }
        )
        return
    typer.echo(
        f"Funded {name} with {format_price(micro)} AIT on chain {deployment.chain_id} (EVM account {address}, "
        f"tx {done.tx_hash}, gas included); balance {format_price(done.balance)} AIT"
    )


@app.command()
def balance(
    name: NameArgument,
    network: NetworkOption = "local",
    coordinator: CoordinatorOption = None,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
) -> None:
    """Wallet NAME's balance on the ledger."""
    home = resolve_home(home)
    with _money_agent(home, coordinator, name, network) as a:
        res = a.get_balance()
    if json_out:
        _print_json({**res, "name": name})
        return
    typer.echo(f"{name} ({res['address']}): {res['balance']} AIT on {res['network']}")


@app.command(context_settings=AMOUNT_CONTEXT)
def send(
    name: NameArgument,
    to: Annotated[
        str,
        typer.Argument(
            help="A wallet name under HOME, a provider of the local stack (provider-1, ...), or an address (ait1...).",
            show_default=False,
        ),
    ],
    amount: AmountArgument,
    network: NetworkOption = "local",
    coordinator: CoordinatorOption = None,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
) -> None:
    """Send AMOUNT AIT from wallet NAME to TO (signed by NAME)."""
    home = resolve_home(home)
    checks.amount(amount)
    address = to if to.startswith("ait1") else _recipient(home, to)  # no key needed: an address is enough
    with _money_agent(home, coordinator, name, network) as a, naming_wallet(name):
        res = a.transfer_funds(address, amount)
    if json_out:
        _print_json(res)
        return
    typer.echo(
        f"Sent {res['amount']} AIT from {name} to {address} (ledger entry {res['entry']}); balance {res['balance']} AIT"
    )


def _recipient(home: Path, name: str) -> str:
    """The address of wallet ``name`` under HOME, else of the local stack's provider so
    named (its wallet lives under its worker's home)."""
    from aitbc import stack

    try:
        return wallet_info(home, name).address
    except NotFoundError:
        address = stack.provider_address(home, name)
        if address is not None:
            return address
        providers = stack.provider_names(home)
        known = f", nor a provider of the local stack ({', '.join(providers)})" if providers else ""
        raise NotFoundError(
            f"no wallet {name!r} in {wallets_dir(home)}{known}; give a wallet name or an address (ait1...)"
        ) from None


@app.command()
def history(
    name: NameArgument,
    limit: Annotated[int, typer.Option(help="Most recent entries to show.")] = 50,
    network: NetworkOption = "local",
    coordinator: CoordinatorOption = None,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
) -> None:
    """Ledger entries that moved money into or out of wallet NAME."""
    import time as _time

    home = resolve_home(home)
    w = load_wallet(home, name)
    if limit < 1:
        raise UsageError(f"--limit must be >= 1, got {limit}")
    with _money_agent(home, coordinator, name, network) as a:
        entries = a.get_wallet_history(limit)
    if json_out:
        _print_json(page(entries))
        return
    if not entries:
        err.print(f"no ledger entries for {name}", highlight=False, markup=False)
        return
    mine = f"wallet:{w.address}"
    table = Table("#", "time", "kind", "amount AIT", "counterparty", "memo")
    for e in entries:
        sign = "+" if e["credit"] == mine else "-"
        other = e["debit"] if e["credit"] == mine else e["credit"]
        table.add_row(
            str(e["seq"]),
            _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(e["created_at"])),
            e["kind"],
            f"{sign}{e['amount_ait']}",
            other,
            json.dumps(e["memo"], sort_keys=True),
        )
    out.print(fit(table, whole=("counterparty",), drop=("memo", "kind", "#", "time")))
