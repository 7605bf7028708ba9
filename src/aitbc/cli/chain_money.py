"""What ``aitbc chain run/balance/fund/deposit/withdraw/refund`` do, below their options.

Each reads the deployment record (``HOME/chain.json`` or ``--chain-file``) and the chain,
never a coordinator: an owner or a provider gets its money out with nothing but the
record, its wallet and a node. A run is found on chain by its key: the owner's
(``run_key(owner, run id)``) when the owner is known, else from the ``Deposited`` events
under the run id. Every check that can refuse is made before the first transaction, so
a refusal sends nothing; what the contract refuses anyway comes back as its reason.

eth-account and the chain client are imported here only, when one of these commands runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aitbc.errors import AitbcError, NotFoundError, UsageError
from aitbc.units import format_price

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from aitbc.chain.evm.client import EvmClient
    from aitbc.chain.evm.deploy import Deployment
    from aitbc.chain.evm.escrow import ContractView, Escrow, RunView

DEV_GAS_WEI = 100 * 10**18  # what --gas / --fund-gas give on a local development node


@dataclass
class Chain:
    """The deployment, a client of its node and its escrow (``with open_chain(...)``)."""

    deployment: Deployment
    client: EvmClient
    escrow: Escrow

    def where(self) -> str:
        return f"chain {self.deployment.chain_id} (escrow {self.deployment.escrow})"


@contextmanager
def open_chain(home: Path, chain_file: Path | None) -> Iterator[Chain]:
    """The deployment at ``chain_file`` (default ``HOME/chain.json``), its node checked to
    hold the contracts."""
    from aitbc.chain.evm.client import EvmClient
    from aitbc.chain.evm.deploy import chain_file as default_file
    from aitbc.chain.evm.deploy import check_deployment, read_deployment_file
    from aitbc.chain.evm.escrow import Escrow

    path = chain_file if chain_file is not None else default_file(home)
    deployment = read_deployment_file(path)
    client = EvmClient(deployment.rpc)
    try:
        check_deployment(client, deployment)
        yield Chain(deployment, client, Escrow(client, deployment))
    finally:
        client.close()


def account_of(home: Path, wallet: str) -> LocalAccount:
    """Wallet ``wallet``'s EVM account, decrypted (made first if it has none)."""
    from eth_account import Account

    from aitbc.ledger.evm_keys import ensure_evm_account

    return Account.from_key(ensure_evm_account(home, wallet).private_key)


def minter_home(home: Path, wallet: str) -> Path:
    """Where the minter's wallet lives: HOME's wallets, else the local stack's coordinator
    HOME, where ``aitbc up --chain evm`` keeps its chain-operator wallet."""
    from aitbc.ledger.wallet import wallet_path
    from aitbc.stack_chain import coordinator_home

    if not wallet_path(home, wallet).exists() and wallet_path(coordinator_home(home), wallet).exists():
        return coordinator_home(home)
    return home


def address_of(home: Path, wallet: str) -> str:
    """Wallet ``wallet``'s EVM address; one line if it has no EVM account yet."""
    from aitbc.ledger.evm_keys import evm_address
    from aitbc.ledger.wallet import wallet_info

    wallet_info(home, wallet)  # a wallet that does not exist: its own line
    address = evm_address(home, wallet)
    if address is None:
        raise NotFoundError(f"wallet '{wallet}' has no EVM account yet; make it with: aitbc wallet evm {wallet}")
    return address


def target_address(home: Path, wallet_or_address: str) -> tuple[str, str]:
    """(label, address) of a wallet's EVM account (made if it has none) or a 0x address."""
    from eth_utils import is_hex_address, to_checksum_address

    if wallet_or_address.startswith(("0x", "0X")):
        if not is_hex_address(wallet_or_address):
            raise UsageError(f"bad address {wallet_or_address!r}: want 0x and 40 hex digits, or a wallet's name")
        address = str(to_checksum_address(wallet_or_address))
        return address, address
    from aitbc.ledger.evm_keys import ensure_evm_account, evm_address

    address = evm_address(home, wallet_or_address) or ensure_evm_account(home, wallet_or_address).address
    return f"wallet '{wallet_or_address}'", address


def give_gas(client: EvmClient, address: str, option: str) -> None:
    """Give ``address`` ether for gas on a local anvil (its anvil_setBalance method)."""
    from aitbc.chain.evm.rpc import RpcError

    try:
        client.rpc.call("anvil_setBalance", address, hex(DEV_GAS_WEI))
    except RpcError as e:
        raise AitbcError(
            f"{option} works on a local anvil node only: the node at {client.url} refused anvil_setBalance ({e.message})"
        ) from None


def require_gas(chain: Chain, address: str, who: str) -> None:
    if chain.client.balance(address) == 0:
        raise AitbcError(
            f"{who}'s EVM account {address} has no ether on chain {chain.deployment.chain_id} to pay for gas; "
            f"fund it (on a local anvil node: aitbc chain fund {address} AMOUNT --gas)"
        )


def require_ait(chain: Chain, address: str, need: int, who: str, what: str) -> None:
    held = chain.escrow.token_balance(address)
    if held < need:
        raise AitbcError(
            f"{who} holds {format_price(held)} AIT on chain {chain.deployment.chain_id}, {what} needs "
            f"{format_price(need)}: fund it (aitbc chain fund ...)"
        )


def parse_timeout(seconds: int) -> int:
    from aitbc.chain.evm.contracts import MAX_TIMEOUT

    if not 1 <= seconds <= MAX_TIMEOUT:
        raise UsageError(f"--timeout {seconds}: want 1 to {MAX_TIMEOUT} seconds")
    return seconds


@dataclass(frozen=True, slots=True)
class Found:
    key: bytes
    run: RunView


def find_run(chain: Chain, training_id: str, owner: str | None) -> Found:
    """Run ``training_id`` on chain: ``owner``'s if given, else the one deposit under the id
    (several owners: one line asking for --owner)."""
    from eth_utils import is_hex_address, to_checksum_address

    from aitbc.chain.evm.contracts import run_key

    if owner is not None:
        if not is_hex_address(owner):
            raise UsageError(f"bad --owner {owner!r}: want an EVM address, 0x and 40 hex digits")
        key = run_key(to_checksum_address(owner), training_id)
        view = chain.escrow.run(key)
        if not view.exists:
            raise NotFoundError(f"{owner} deposited no run {training_id!r} on {chain.where()}")
        return Found(key, view)
    deposits = chain.escrow.deposits(training_id)
    if not deposits:
        raise NotFoundError(f"no run {training_id!r} was deposited on {chain.where()}")
    if len(deposits) > 1:
        owners = ", ".join(d.owner for d in deposits)
        raise UsageError(
            f"run {training_id!r} was deposited by {len(deposits)} owners ({owners}): name one with --owner"
        )
    return Found(deposits[0].key, chain.escrow.run(deposits[0].key))


def own_run(chain: Chain, training_id: str, address: str) -> Found | None:
    """The run ``address`` deposited as ``training_id``, None if it deposited none."""
    from aitbc.chain.evm.contracts import run_key

    key = run_key(address, training_id)
    view = chain.escrow.run(key)
    return Found(key, view) if view.exists else None


def owned_run(chain: Chain, training_id: str, wallet: str, address: str) -> Found:
    """The run ``wallet`` deposited as ``training_id``; one line naming who did if not it."""
    found = own_run(chain, training_id, address)
    if found is not None:
        return found
    others = [d.owner for d in chain.escrow.deposits(training_id)]
    by = f"; it was deposited by {', '.join(others)}" if others else ""
    raise NotFoundError(
        f"wallet '{wallet}' ({address}) deposited no run {training_id!r} on {chain.where()}{by}: only its owner "
        "is refunded"
    )


def bonded_run(chain: Chain, training_id: str, wallet: str, address: str, owner: str | None) -> Found:
    """The run ``training_id`` in which ``wallet``'s account has a contract."""
    if owner is not None:
        found = find_run(chain, training_id, owner)
        candidates = [found] if chain.escrow.contract(found.key, address).bonded else []
    else:
        keys = [d.key for d in chain.escrow.deposits(training_id)]
        if not keys:
            raise NotFoundError(f"no run {training_id!r} was deposited on {chain.where()}")
        candidates = [Found(k, chain.escrow.run(k)) for k in keys if chain.escrow.contract(k, address).bonded]
    if not candidates:
        raise NotFoundError(f"wallet '{wallet}' ({address}) has no contract in run {training_id!r} on {chain.where()}")
    if len(candidates) > 1:
        owners = ", ".join(c.run.owner for c in candidates)
        raise UsageError(
            f"wallet '{wallet}' has contracts in {len(candidates)} runs {training_id!r} ({owners}): name one with --owner"
        )
    return candidates[0]


def chain_time(client: EvmClient) -> int:
    """The latest block's timestamp: the clock the escrow's deadlines are read against."""
    return int(client.rpc.call("eth_getBlockByNumber", "latest", False)["timestamp"], 16)


def when(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")


def run_report(chain: Chain, training_id: str, found: Found) -> dict[str, Any]:
    """Everything the chain holds of a run: its escrow and state, rounds and contracts."""
    key_topic = "0x" + found.key.hex()
    escrow = chain.escrow.escrow
    start = chain.deployment.block
    rounds = [
        {"round": e.args["round"], "paid": format_price(e.args["paid"]), "burned": format_price(e.args["burned"])}
        for e in escrow.events("RoundSettled", indexed=[key_topic], from_block=start)
    ]
    providers = [e.args["provider"] for e in escrow.events("Bonded", indexed=[key_topic], from_block=start)]
    r = found.run
    return {
        "training_id": training_id,
        "chain_id": chain.deployment.chain_id,
        "escrow_contract": chain.deployment.escrow,
        "key": key_topic,
        "owner": r.owner,
        "state": r.state,
        "deposited": format_price(r.deposited),
        "escrow": format_price(r.escrow),
        "price": format_price(r.price),
        "timeout": r.timeout,
        "deadline": r.deadline,
        "deadline_at": when(r.deadline),
        "chain_time": chain_time(chain.client),
        "rounds": sorted(rounds, key=lambda x: x["round"]),
        "contracts": [contract_report(p, chain.escrow.contract(found.key, p)) for p in providers],
    }


def contract_report(provider: str, c: ContractView) -> dict[str, Any]:
    return {"provider": provider, "bond": format_price(c.bond), "earned": format_price(c.earned), "slashed": c.slashed}


def nothing_to_withdraw(found: Found, c: ContractView, wallet: str) -> str | None:
    """Why ``wallet`` can withdraw nothing from the run now (None: it can)."""
    closed = found.run.exists and not found.run.open
    if c.earned > 0 or (closed and c.bond > 0):
        return None
    if not closed and c.bond > 0:
        return (
            f"wallet '{wallet}' has nothing to withdraw yet: no earnings, and its bond of {format_price(c.bond)} AIT "
            f"comes back once the run is finalized or timed out (deadline {when(found.run.deadline)})"
        )
    return f"wallet '{wallet}' has nothing to withdraw from this run (no earnings, no bond held)"


def not_refundable(found: Found, wallet: str) -> str | None:
    """Why ``wallet`` (the owner) cannot be refunded now (None: it can)."""
    r = found.run
    if r.open:
        return (
            f"run still open: the escrow of {format_price(r.escrow)} AIT is refunded once the coordinator finalizes "
            f"it or it times out (deadline {when(r.deadline)}, unless a round settles before)"
        )
    if r.escrow == 0:
        return f"nothing to refund: run's escrow is empty (wallet '{wallet}' was refunded, or providers were paid all)"
    return None


def event_args(chain: Chain, receipt: Any, name: str) -> dict[str, Any]:
    """The args of the escrow's event ``name`` in ``receipt`` (it logs one)."""
    for e in chain.escrow.escrow.receipt_events(receipt):
        if e.name == name:
            return e.args
    raise AitbcError(f"transaction {receipt.tx_hash} logged no {name}")
