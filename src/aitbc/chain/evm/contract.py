"""A deployed contract: its address and ABI over an :class:`EvmClient`.

``call`` reads (no transaction); ``sign`` prepares a transaction at a nonce of the
caller's choosing (to keep, then ``client.broadcast``, for the at-most-once sending
described in :mod:`aitbc.chain.evm.client`); ``transact`` signs, sends and waits;
``events`` reads decoded logs from a block range.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

from aitbc.chain.evm.abi import Abi, Event
from aitbc.chain.evm.client import EvmClient, Receipt, SignedTx
from aitbc.errors import AitbcError


class Deployable(Protocol):
    """A compiled contract (:class:`aitbc.chain.evm.contracts.Compiled`): its ABI (the
    compiler's JSON) and creation bytecode."""

    @property
    def name(self) -> str: ...
    @property
    def abi(self) -> list[dict[str, Any]]: ...
    @property
    def bytecode(self) -> bytes: ...


class Contract:
    """The contract at ``address`` with ``abi``, through ``client``."""

    def __init__(self, client: EvmClient, address: str, abi: Abi | list[dict[str, Any]]) -> None:
        self.client = client
        self.address = to_checksum_address(address)
        self.abi = abi if isinstance(abi, Abi) else Abi(abi)

    def call(self, name: str, *args: Any, block: str = "latest") -> Any:
        """A view's result (one value, or a tuple for several)."""
        data = self.client.call(self.address, self.abi.encode_call(name, *args), block=block)
        return self.abi.decode_result(name, data)

    def sign(self, account: LocalAccount, name: str, *args: Any, nonce: int | None = None) -> SignedTx:
        return self.client.sign(account, to=self.address, data=self.abi.encode_call(name, *args), nonce=nonce)

    def transact(self, account: LocalAccount, name: str, *args: Any, timeout: float = 120.0) -> Receipt:
        return self.client.transact(account, to=self.address, data=self.abi.encode_call(name, *args), timeout=timeout)

    def events(
        self,
        name: str | None = None,
        *,
        indexed: Sequence[str | None] = (),
        from_block: int = 0,
        to_block: int | None = None,
    ) -> list[Event]:
        """The contract's events (only ``name``'s when given) in the block range, in chain
        order; ``indexed``: the topics (0x + 64 hex) its indexed arguments must have, in
        their order, None for any (the node filters: a scan reads only the matches)."""
        if indexed and name is None:
            raise AitbcError("filtering events on their indexed arguments needs the event's name")
        topics: list[str | None] | None = [self.abi.event(name).topic, *indexed] if name is not None else None
        logs = self.client.logs(self.address, topics=topics, from_block=from_block, to_block=to_block)
        decoded = (self.abi.decode_log(log) for log in logs)
        return [event for event in decoded if event is not None]

    def receipt_events(self, receipt: Receipt) -> list[Event]:
        """This contract's events in one transaction's receipt."""
        mine = (log for log in receipt.logs if to_checksum_address(str(log["address"])) == self.address)
        decoded = (self.abi.decode_log(log) for log in mine)
        return [event for event in decoded if event is not None]


def deploy(
    client: EvmClient, account: LocalAccount, compiled: Deployable, *args: Any, timeout: float = 120.0
) -> Contract:
    """Create ``compiled`` with constructor ``args`` from ``account``; the deployed contract."""
    abi = Abi(compiled.abi)
    receipt = client.transact(account, to=None, data=compiled.bytecode + abi.encode_constructor(*args), timeout=timeout)
    if receipt.contract_address is None:
        raise AitbcError(f"deploying {compiled.name}: transaction {receipt.tx_hash} created no contract")
    return Contract(client, receipt.contract_address, abi)
