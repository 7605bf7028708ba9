"""``aitbc chain``: the AIT token and the run escrow on an EVM chain.

``deploy`` deploys both contracts from a wallet's EVM account through any JSON-RPC node
and writes where they are to ``HOME/chain.json``, which the coordinator and the CLI read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from aitbc.chain.evm.client import EvmClient

from aitbc.chain.evm.rpc import RpcError
from aitbc.cli.common import DEFAULT_HOME, HomeOption, err, json_text, resolve_home
from aitbc.errors import AitbcError, UsageError

app = typer.Typer(help="The AIT token and the run escrow on an EVM chain.", no_args_is_help=True)

DEV_GAS_WEI = 100 * 10**18  # what --fund-gas gives on a local development node


@app.command()
def deploy(
    rpc: Annotated[str, typer.Option("--rpc", help="The chain's JSON-RPC URL, e.g. http://127.0.0.1:8545.")],
    wallet: Annotated[str, typer.Option("--wallet", help="The wallet whose EVM account deploys and pays the gas.")],
    settlement_key: Annotated[
        str | None,
        typer.Option("--settlement-key", help="The address that settles runs (default: the deploying wallet's)."),
    ] = None,
    fund_gas: Annotated[
        bool,
        typer.Option(
            "--fund-gas", help="On a local anvil node, give the wallet's EVM account 100 ether for gas first."
        ),
    ] = False,
    replace: Annotated[
        bool, typer.Option("--replace", help="Deploy new contracts even if HOME/chain.json names some.")
    ] = False,
    home: HomeOption = DEFAULT_HOME,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Deploy the AIT token and the run escrow, and write their addresses to HOME/chain.json.

    The wallet's EVM account (made first if the wallet has none) deploys both, pays the gas
    and is the token's minter; it is the settlement key too unless --settlement-key names
    another address."""
    # Imported when run: eth-account costs seconds to import, which every aitbc command would pay.
    from eth_account import Account
    from eth_utils import is_hex_address, to_checksum_address

    from aitbc.chain.evm.client import EvmClient
    from aitbc.chain.evm.deploy import chain_file, deploy_contracts, write_deployment
    from aitbc.ledger.evm_keys import ensure_evm_account

    home = resolve_home(home)
    if settlement_key is not None:
        if not is_hex_address(settlement_key):
            raise UsageError(f"bad --settlement-key {settlement_key!r}: want an EVM address, 0x and 40 hex digits")
        settlement_key = to_checksum_address(settlement_key)
    if chain_file(home).exists() and not replace:
        raise AitbcError(
            f"{chain_file(home)} names contracts deployed already; pass --replace to deploy new ones "
            "(money in the old escrow stays there)"
        )
    account = Account.from_key(ensure_evm_account(home, wallet).private_key)
    with EvmClient(rpc) as client:
        if fund_gas:
            _fund_gas(client, account.address)
        if client.balance(account.address) == 0:
            raise AitbcError(
                f"wallet '{wallet}''s EVM account {account.address} has no ether on chain {client.chain_id} to pay "
                "for gas; fund it (on a local anvil node: --fund-gas)"
            )
        deployment = deploy_contracts(client, account, settlement_key=settlement_key)
    path = write_deployment(home, deployment)
    if json_out:
        typer.echo(json_text({**deployment.to_dict(), "path": str(path)}))
        return
    typer.echo(f"AIT token:   {deployment.token}")
    typer.echo(f"RunEscrow:   {deployment.escrow}")
    typer.echo(f"Settlement key: {deployment.settlement_key}")
    err.print(f"deployed on chain {deployment.chain_id} at {rpc}; written to {path}", highlight=False, markup=False)


def _fund_gas(client: EvmClient, address: str) -> None:
    """Give ``address`` ether for gas on a local anvil (its anvil_setBalance method)."""
    try:
        client.rpc.call("anvil_setBalance", address, hex(DEV_GAS_WEI))
    except RpcError as e:
        raise AitbcError(
            f"--fund-gas works on a local anvil node only: the node at {client.url} refused anvil_setBalance ({e.message})"
        ) from None
