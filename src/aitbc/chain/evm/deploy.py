"""Deploy the AIT token and the run escrow, and the record of where they are:
``HOME/chain.json``, which the coordinator and the CLI read to find them.

::

    {"version": 1, "rpc": "http://127.0.0.1:8545", "chain_id": 31337,
     "token": "0x...", "escrow": "0x...", "settlement_key": "0x...", "minter": "0x...",
     "block": <the deployment's first block: event scans start there>,
     "compiler": "0.4.3", "deployed_at": <ISO 8601 UTC>, "minter_wallet": "ops"}

The deployer is the token's minter (the local faucet; ``minter_wallet`` names its wallet
in the deploying HOME, for ``aitbc chain fund``, or is null); the settlement key, the only
address that settles and finalizes runs, is the deployer's too unless another is given.
:func:`check_deployment` holds a record to the chain: the same chain id, and at each
address the code these sources compile to (an address reused on a restarted dev node, or
a record of another chain, is refused).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_utils import is_hex_address, to_checksum_address

from aitbc.chain.evm.client import EvmClient
from aitbc.chain.evm.contract import Contract, deploy
from aitbc.chain.evm.contracts import AIT, RUN_ESCROW, compiled
from aitbc.errors import AitbcError, NotFoundError

CHAIN_FILE = "chain.json"
_VERSION = 1


@dataclass(frozen=True, slots=True)
class Deployment:
    """Where the contracts are (``HOME/chain.json``)."""

    rpc: str
    chain_id: int
    token: str
    escrow: str
    settlement_key: str
    minter: str
    block: int
    compiler: str
    deployed_at: str
    minter_wallet: str | None = None  # the deploying HOME's wallet that holds the minter's key

    def to_dict(self) -> dict[str, Any]:
        return {"version": _VERSION, **asdict(self)}


def chain_file(home: Path) -> Path:
    return Path(home) / CHAIN_FILE


def deploy_contracts(
    client: EvmClient,
    account: LocalAccount,
    *,
    settlement_key: str | None = None,
    cache_dir: Path | None = None,
    minter_wallet: str | None = None,
) -> Deployment:
    """Deploy AIT then RunEscrow from ``account`` (wallet ``minter_wallet``'s, recorded
    when given); where they are."""
    key = to_checksum_address(settlement_key or account.address)
    first_block = client.block_number() + 1
    token = compiled(AIT, cache_dir=cache_dir)
    escrow = compiled(RUN_ESCROW, cache_dir=cache_dir)
    token_contract = deploy(client, account, token)
    escrow_contract = deploy(client, account, escrow, token_contract.address, key)
    return Deployment(
        rpc=client.url,
        chain_id=client.chain_id,
        token=token_contract.address,
        escrow=escrow_contract.address,
        settlement_key=key,
        minter=to_checksum_address(account.address),
        block=first_block,
        compiler=token.compiler,
        deployed_at=datetime.now(UTC).isoformat(timespec="seconds"),
        minter_wallet=minter_wallet,
    )


def write_deployment(home: Path, deployment: Deployment) -> Path:
    """Write ``HOME/chain.json`` whole (a temporary file renamed into place)."""
    path = chain_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{CHAIN_FILE}.tmp")
    temp.write_text(json.dumps(deployment.to_dict(), indent=2) + "\n")
    temp.replace(path)
    return path


def read_deployment(home: Path) -> Deployment:
    """``HOME/chain.json``; ``NotFoundError`` if absent, ``AitbcError`` if malformed."""
    return read_deployment_file(chain_file(home))


def read_deployment_file(path: Path) -> Deployment:
    """A deployment record at any ``path`` (a coordinator's ``--chain-file``); errors as
    :func:`read_deployment`'s."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise NotFoundError(
            f"no {path}: deploy the contracts first with: aitbc chain deploy --rpc URL --wallet NAME"
        ) from None
    except (OSError, ValueError) as e:
        raise AitbcError(f"cannot read {path}: {e}") from None
    try:
        if data.get("version") != _VERSION:
            raise ValueError(f"version {data.get('version')!r}, want {_VERSION}")
        for field in ("token", "escrow", "settlement_key", "minter"):
            if not is_hex_address(data[field]):
                raise ValueError(f"{field} is not an address")
        return Deployment(
            rpc=str(data["rpc"]),
            chain_id=int(data["chain_id"]),
            token=to_checksum_address(data["token"]),
            escrow=to_checksum_address(data["escrow"]),
            settlement_key=to_checksum_address(data["settlement_key"]),
            minter=to_checksum_address(data["minter"]),
            block=int(data["block"]),
            compiler=str(data["compiler"]),
            deployed_at=str(data["deployed_at"]),
            minter_wallet=_optional_name(data.get("minter_wallet")),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise AitbcError(f"{path} is not a deployment record: {e}") from None


def _optional_name(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    raise ValueError(f"minter_wallet is {value!r}, want a wallet's name or null")


def check_deployment(client: EvmClient, deployment: Deployment, *, cache_dir: Path | None = None) -> None:
    """Refuse a record that does not describe this chain: another chain id, or an address
    without the contract's code (a dev node restarted since, another deployment)."""
    if client.chain_id != deployment.chain_id:
        raise AitbcError(
            f"the node at {client.url} is chain {client.chain_id}, the contracts were deployed on chain "
            f"{deployment.chain_id}"
        )
    for name, address in ((AIT, deployment.token), (RUN_ESCROW, deployment.escrow)):
        code = bytes.fromhex(str(client.rpc.call("eth_getCode", address, "latest"))[2:])
        # Vyper appends the immutables (the escrow's token and key) to the runtime code
        if not code or not code.startswith(compiled(name, cache_dir=cache_dir).runtime):
            raise AitbcError(f"no {name} contract at {address} on the node at {client.url}: deploy again")
    # The same code with another token or key is another escrow: it would pay in a token of
    # someone else's minting, or be settled by a key the record does not name.
    _, escrow = contracts_of(client, deployment, cache_dir=cache_dir)
    for field in ("token", "settlement_key"):
        held, recorded = str(escrow.call(field)), str(getattr(deployment, field))
        if held.lower() != recorded.lower():
            raise AitbcError(
                f"the RunEscrow at {deployment.escrow} has {field} {held}, not {recorded} as recorded: "
                "not this deployment's escrow"
            )


def contracts_of(
    client: EvmClient, deployment: Deployment, *, cache_dir: Path | None = None
) -> tuple[Contract, Contract]:
    """The (token, escrow) contracts of a deployment, through ``client``."""
    token = Contract(client, deployment.token, compiled(AIT, cache_dir=cache_dir).abi)
    escrow = Contract(client, deployment.escrow, compiled(RUN_ESCROW, cache_dir=cache_dir).abi)
    return token, escrow
