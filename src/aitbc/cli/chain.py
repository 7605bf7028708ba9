"""``aitbc chain``: the AIT token and the run escrow on an EVM chain.

``deploy`` deploys both contracts from a wallet's EVM account through any JSON-RPC node
and writes where they are to ``HOME/chain.json``, which the coordinator and the CLI read.
``run``, ``balance``, ``fund``, ``deposit``, ``withdraw`` and ``refund`` read that record
(``--chain-file``) and the chain only, never a coordinator, so an owner and a provider
get their money out without one (:mod:`aitbc.cli.chain_money` does the work).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from aitbc.cli import chain_money as money
from aitbc.cli.common import DEFAULT_HOME, HomeOption, err, json_text, resolve_home
from aitbc.errors import AitbcError, UsageError
from aitbc.units import format_price, parse_amount, parse_price

app = typer.Typer(help="The AIT token and the run escrow on an EVM chain.", no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
ChainFileOption = Annotated[
    Path | None, typer.Option("--chain-file", help="The deployment record (default: HOME/chain.json).")
]
TrainingIdOption = Annotated[str, typer.Option("--training-id", help="The run's id (its coordinator's).")]
WalletOption = Annotated[str, typer.Option("--wallet", help="The wallet whose EVM account acts.")]
OwnerOption = Annotated[
    str | None,
    typer.Option("--owner", help="The run's owner's address, where several owners deposited under one id."),
]
# A negative AMOUNT ("-5") is a value to refuse with its own message, not an unknown option.
AMOUNT_CONTEXT = {"ignore_unknown_options": True}


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
    json_out: JsonOption = False,
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
            money.give_gas(client, account.address, "--fund-gas")
        if client.balance(account.address) == 0:
            raise AitbcError(
                f"wallet '{wallet}''s EVM account {account.address} has no ether on chain {client.chain_id} to pay "
                "for gas; fund it (on a local anvil node: --fund-gas)"
            )
        deployment = deploy_contracts(client, account, settlement_key=settlement_key, minter_wallet=wallet)
    path = write_deployment(home, deployment)
    if json_out:
        typer.echo(json_text({**deployment.to_dict(), "path": str(path)}))
        return
    typer.echo(f"AIT token:   {deployment.token}")
    typer.echo(f"RunEscrow:   {deployment.escrow}")
    typer.echo(f"Settlement key: {deployment.settlement_key}")
    err.print(f"deployed on chain {deployment.chain_id} at {rpc}; written to {path}", highlight=False, markup=False)


def _emit(json_out: bool, obj: dict[str, Any], lines: list[str]) -> None:
    if json_out:
        typer.echo(json_text(obj))
        return
    for line in lines:
        typer.echo(line)


@app.command("run")
def run_(
    training_id: TrainingIdOption,
    owner: OwnerOption = None,
    chain_file: ChainFileOption = None,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
) -> None:
    """A run's money on chain.

    Its escrow left and deposits, price, deadline, state (open, finalized, timed out), the
    rounds settled, and each contract's bond and earnings."""
    home = resolve_home(home)
    with money.open_chain(home, chain_file) as chain:
        report = money.run_report(chain, training_id, money.find_run(chain, training_id, owner))
    lines = [
        f"Run {training_id} on chain {report['chain_id']}: {report['state']} (key {report['key']})",
        f"Owner {report['owner']}; deposited {report['deposited']} AIT, escrow left {report['escrow']} AIT, "
        f"price {report['price']} AIT a contract a round",
        f"Deadline {report['deadline_at']} (timeout {report['timeout']} s after the deposit or the last settlement; "
        f"chain time {money.when(report['chain_time'])})",
        "Rounds settled: "
        + (", ".join(f"{x['round']} (paid {x['paid']}, burned {x['burned']})" for x in report["rounds"]) or "none"),
    ]
    for c in report["contracts"]:
        slashed = ", slashed" if c["slashed"] else ""
        lines.append(f"  {c['provider']}: bond {c['bond']} AIT, earned {c['earned']} AIT not withdrawn{slashed}")
    _emit(json_out, report, lines)


@app.command()
def balance(
    wallet: WalletOption,
    chain_file: ChainFileOption = None,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
) -> None:
    """A wallet's AIT and ether (for gas) on chain."""
    home = resolve_home(home)
    address = money.address_of(home, wallet)
    with money.open_chain(home, chain_file) as chain:
        ait, wei = chain.escrow.token_balance(address), chain.client.balance(address)
        chain_id = chain.deployment.chain_id
    obj = {"wallet": wallet, "address": address, "chain_id": chain_id, "balance": format_price(ait), "gas_wei": wei}
    _emit(json_out, obj, [f"{wallet} ({address}): {format_price(ait)} AIT, {wei / 10**18:g} ether on chain {chain_id}"])


@app.command(context_settings=AMOUNT_CONTEXT)
def fund(
    target: Annotated[str, typer.Argument(help="A wallet's name (its EVM account), or a 0x address.")],
    amount: Annotated[str, typer.Argument(help="AIT, up to 6 decimals, e.g. 12.5.", show_default=False)],
    gas: Annotated[bool, typer.Option("--gas", help="On a local anvil node, give it 100 ether for gas too.")] = False,
    minter_wallet: Annotated[
        str | None, typer.Option("--minter-wallet", help="The wallet holding the minter's key (default: chain.json's).")
    ] = None,
    chain_file: ChainFileOption = None,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
) -> None:
    """Development faucet: the token's minter mints AMOUNT AIT to TARGET."""
    home = resolve_home(home)
    micro = parse_amount(amount)
    with money.open_chain(home, chain_file) as chain:
        minter_name = minter_wallet or chain.deployment.minter_wallet
        if minter_name is None:
            raise UsageError("the deployment record names no minter wallet: pass --minter-wallet NAME")
        minter = money.account_of(money.minter_home(home, minter_name), minter_name)
        if minter.address != chain.deployment.minter:
            raise AitbcError(
                f"wallet '{minter_name}' ({minter.address}) is not the token's minter ({chain.deployment.minter})"
            )
        label, address = money.target_address(home, target)
        money.require_gas(chain, minter.address, f"wallet '{minter_name}'")
        if gas:
            money.give_gas(chain.client, address, "--gas")
        receipt = chain.escrow.mint(minter, address, micro)
        held = chain.escrow.token_balance(address)
    obj = {"to": address, "amount": format_price(micro), "balance": format_price(held), "tx_hash": receipt.tx_hash}
    _emit(
        json_out, obj, [f"Minted {format_price(micro)} AIT to {label} ({address}); it holds {format_price(held)} AIT"]
    )


@app.command(context_settings=AMOUNT_CONTEXT)
def deposit(
    training_id: TrainingIdOption,
    wallet: WalletOption,
    amount: Annotated[str, typer.Option("--amount", help="AIT to put in the run's escrow.")],
    price: Annotated[
        str | None,
        typer.Option("--price", help="The most one contract is paid a round, in AIT (needed at the first deposit)."),
    ] = None,
    timeout: Annotated[
        int | None,
        typer.Option("--timeout", help="Seconds without a settlement after which the run closes (default 3600)."),
    ] = None,
    chain_file: ChainFileOption = None,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
) -> None:
    """Deposit AMOUNT into the wallet's run on chain, or top its escrow up.

    A run deposited already is topped up: the price and timeout are fixed at the first
    deposit."""
    home = resolve_home(home)
    micro = parse_amount(amount, field="--amount")
    price_micro = None if price is None else parse_price(price, field="--price")
    seconds = None if timeout is None else money.parse_timeout(timeout)
    with money.open_chain(home, chain_file) as chain:
        account = money.account_of(home, wallet)
        found = money.own_run(chain, training_id, account.address)
        if found is not None:
            _check_top_up(found, price_micro, seconds)
        elif price_micro is None:
            raise UsageError("--price is needed for a run's first deposit: the most one contract is paid a round")
        who = f"wallet '{wallet}' ({account.address})"
        money.require_gas(chain, account.address, who)
        money.require_ait(chain, account.address, micro, who, "the deposit")
        if found is None:
            assert price_micro is not None
            receipt = chain.escrow.deposit(account, training_id, micro, price_micro, seconds or 3600)
        else:
            receipt = chain.escrow.top_up(account, found.key, micro)
        after = money.owned_run(chain, training_id, wallet, account.address)
    action = "deposited" if found is None else "topped up"
    obj = {
        **{"training_id": training_id, "key": "0x" + after.key.hex(), "owner": account.address, "action": action},
        **{"amount": format_price(micro), "deposited": format_price(after.run.deposited)},
        **{"escrow": format_price(after.run.escrow), "deadline": after.run.deadline, "tx_hash": receipt.tx_hash},
    }
    lines = [
        f"Run {training_id}: {action} {format_price(micro)} AIT (tx {receipt.tx_hash}); deposited "
        f"{obj['deposited']} AIT in all, escrow {obj['escrow']} AIT, deadline {money.when(after.run.deadline)}"
    ]
    _emit(json_out, obj, lines)


def _check_top_up(found: money.Found, price: int | None, timeout: int | None) -> None:
    r = found.run
    if price is not None and price != r.price:
        raise UsageError(f"the run's price is {format_price(r.price)} AIT, fixed at its deposit; --price differs")
    if timeout is not None and timeout != r.timeout:
        raise UsageError(f"the run's timeout is {r.timeout} s, fixed at its deposit; --timeout differs")
    if not r.open:
        raise AitbcError(f"run is {r.state}: no more money goes into it")


@app.command()
def withdraw(
    training_id: TrainingIdOption,
    wallet: WalletOption,
    owner: OwnerOption = None,
    chain_file: ChainFileOption = None,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
) -> None:
    """A provider takes what it earned in a run, and its bond once the run is closed.

    A run is closed when finalized, or when it timed out without the coordinator."""
    home = resolve_home(home)
    with money.open_chain(home, chain_file) as chain:
        account = money.account_of(home, wallet)
        found = money.bonded_run(chain, training_id, wallet, account.address, owner)
        problem = money.nothing_to_withdraw(found, chain.escrow.contract(found.key, account.address), wallet)
        if problem is not None:
            raise AitbcError(problem)
        money.require_gas(chain, account.address, f"wallet '{wallet}' ({account.address})")
        receipt = chain.escrow.withdraw(account, found.key)
        paid = money.event_args(chain, receipt, "Withdrawn")
        held = chain.escrow.token_balance(account.address)
    obj = {
        **{"training_id": training_id, "key": "0x" + found.key.hex(), "provider": account.address},
        **{"earned": format_price(paid["earned"]), "bond": format_price(paid["bond"])},
        **{"balance": format_price(held), "tx_hash": receipt.tx_hash},
    }
    lines = [
        f"Withdrew {obj['earned']} AIT earned and {obj['bond']} AIT of bond from run {training_id} "
        f"(tx {receipt.tx_hash}); {wallet} holds {obj['balance']} AIT"
    ]
    _emit(json_out, obj, lines)


@app.command()
def refund(
    training_id: TrainingIdOption,
    wallet: WalletOption,
    chain_file: ChainFileOption = None,
    home: HomeOption = DEFAULT_HOME,
    json_out: JsonOption = False,
) -> None:
    """The owner takes back the escrow left in its run, once finalized or timed out.

    A run times out when no settlement came for its timeout: the way out without the
    coordinator."""
    home = resolve_home(home)
    with money.open_chain(home, chain_file) as chain:
        account = money.account_of(home, wallet)
        found = money.owned_run(chain, training_id, wallet, account.address)
        problem = money.not_refundable(found, wallet)
        if problem is not None:
            raise AitbcError(problem)
        money.require_gas(chain, account.address, f"wallet '{wallet}' ({account.address})")
        receipt = chain.escrow.refund(account, found.key)
        paid = money.event_args(chain, receipt, "Refunded")["amount"]
        held = chain.escrow.token_balance(account.address)
    obj = {
        **{"training_id": training_id, "key": "0x" + found.key.hex(), "owner": account.address},
        **{"amount": format_price(paid), "balance": format_price(held), "tx_hash": receipt.tx_hash},
    }
    lines = [
        f"Refunded {obj['amount']} AIT of run {training_id} (tx {receipt.tx_hash}); {wallet} holds {obj['balance']} AIT"
    ]
    _emit(json_out, obj, lines)
