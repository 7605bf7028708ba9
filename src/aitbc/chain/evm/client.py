"""An EVM chain through JSON-RPC: sign, send at most once, wait for receipts and
confirmations, read events.

Transactions are EIP-1559 (type 2), signed here with ``eth-account``; the node never holds
a key. Sending is split so that a crash anywhere leaves nothing sent twice:

1. :meth:`EvmClient.sign` fixes the nonce (by default the sender's *pending* count, so a
   transaction still in the node's pool is counted) and returns a :class:`SignedTx`, the
   raw bytes and hash. A caller that must survive a crash keeps it (or its nonce) before
   step 2. Signing is deterministic (RFC 6979): the same fields give the same hash.
2. :meth:`EvmClient.broadcast` sends it, and may be called again with the same
   transaction after a crash: a transaction the node has already (pooled or mined) is
   ``ALREADY_SENT``, and one whose nonce another transaction of the sender took is
   ``NONCE_TAKEN`` (it can never be mined). Two transactions signed with one nonce are
   never both mined, so a resend that reuses the nonce cannot pay twice.
3. A caller that lost the signed transaction asks the contract whether the work is done
   (for a settlement: the escrow's "is (run, round) settled" view) before signing anew.

:meth:`EvmClient.wait_receipt` raises :class:`TxReverted` for a failed transaction;
:meth:`EvmClient.wait_confirmations` returns once the receipt's block is ``n`` deep (the
block itself is the first confirmation) and the transaction is still in the chain.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from eth_abi import decode
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

from aitbc.chain.evm.rpc import JsonRpc, RpcError
from aitbc.errors import AitbcError

GAS_MARGIN = 1.25  # estimates are exact for the state they ran on; the state may move by the time it mines
_ERROR_STRING = bytes.fromhex("08c379a0")  # Error(string): a revert with a reason


class TxReverted(AitbcError):
    """A transaction (or its estimate) reverted: the contract refused it."""


class ChainTimeout(AitbcError):
    """A receipt or a confirmation did not come within the time given."""


class SendOutcome(StrEnum):
    SENT = "sent"  # the node took it now
    ALREADY_SENT = "already_sent"  # this very transaction was pooled or mined before
    NONCE_TAKEN = "nonce_taken"  # another transaction of the sender holds this nonce: this one never mines


@dataclass(frozen=True, slots=True)
class SignedTx:
    """A signed transaction, ready to broadcast (again): keep it to resend after a crash."""

    sender: str
    nonce: int
    tx_hash: str  # 0x + 64 hex
    raw: str  # 0x + the signed bytes


@dataclass(frozen=True, slots=True)
class Sent:
    tx_hash: str
    nonce: int
    outcome: SendOutcome


@dataclass(frozen=True, slots=True)
class Receipt:
    tx_hash: str
    block_number: int
    block_hash: str
    status: bool
    gas_used: int
    contract_address: str | None
    logs: list[dict[str, Any]]


def revert_reason(data: Any) -> str | None:
    """The reason string of a revert's data (``Error(string)``), else None."""
    if not isinstance(data, str) or not data.startswith("0x"):
        return None
    raw = bytes.fromhex(data[2:])
    if raw[:4] != _ERROR_STRING:
        return None
    try:
        return str(decode(["string"], raw[4:])[0])
    except Exception:  # noqa: BLE001 - malformed revert data has no reason to show, whatever eth_abi raises
        return None


def _hex(value: int) -> str:
    return hex(value)


class EvmClient:
    """One EVM node (``url``): reads, signing, sending, receipts and logs."""

    def __init__(self, url: str, *, timeout: float = 30.0, poll: float = 0.1) -> None:
        self.rpc = JsonRpc(url, timeout=timeout)
        self.poll = poll
        self._chain_id: int | None = None

    @property
    def url(self) -> str:
        return self.rpc.url

    @property
    def chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = int(self.rpc.call("eth_chainId"), 16)
        return self._chain_id

    def block_number(self) -> int:
        return int(self.rpc.call("eth_blockNumber"), 16)

    def balance(self, address: str) -> int:
        """The address's ether balance, in wei."""
        return int(self.rpc.call("eth_getBalance", to_checksum_address(address), "latest"), 16)

    def pending_nonce(self, address: str) -> int:
        """The next nonce of ``address``, counting its transactions still in the pool."""
        return int(self.rpc.call("eth_getTransactionCount", to_checksum_address(address), "pending"), 16)

    def mined_nonce(self, address: str) -> int:
        """How many transactions of ``address`` are mined."""
        return int(self.rpc.call("eth_getTransactionCount", to_checksum_address(address), "latest"), 16)

    def call(self, to: str, data: bytes, *, sender: str | None = None, block: str = "latest") -> bytes:
        """A read-only call's return bytes; ``TxReverted`` if it reverts."""
        request: dict[str, str] = {"to": to_checksum_address(to), "data": "0x" + data.hex()}
        if sender is not None:
            request["from"] = to_checksum_address(sender)
        try:
            result = self.rpc.call("eth_call", request, block)
        except RpcError as e:
            raise _reverted(e, f"call to {to}") from None
        return bytes.fromhex(str(result)[2:])

    def estimate_gas(self, sender: str, to: str | None, data: bytes, value: int = 0) -> int:
        request: dict[str, str] = {"from": to_checksum_address(sender), "data": "0x" + data.hex(), "value": _hex(value)}
        if to is not None:
            request["to"] = to_checksum_address(to)
        try:
            return int(self.rpc.call("eth_estimateGas", request), 16)
        except RpcError as e:
            raise _reverted(e, f"transaction to {to}" if to else "contract creation") from None

    def fees(self) -> tuple[int, int]:
        """(max fee, priority fee) per gas: twice the latest base fee plus the tip, which
        stays valid through several blocks of rising base fees."""
        tip = int(self.rpc.call("eth_maxPriorityFeePerGas"), 16)
        block = self.rpc.call("eth_getBlockByNumber", "latest", False)
        base = int(block.get("baseFeePerGas", "0x0"), 16)
        return 2 * base + tip, tip

    def sign(
        self,
        account: LocalAccount,
        *,
        to: str | None,
        data: bytes = b"",
        value: int = 0,
        nonce: int | None = None,
        gas: int | None = None,
    ) -> SignedTx:
        """Sign a transaction (``to`` None: a contract creation). ``nonce`` None takes the
        sender's pending count; the gas is estimated (a revert shows here as ``TxReverted``)."""
        if nonce is None:
            nonce = self.pending_nonce(account.address)
        if gas is None:
            gas = int(self.estimate_gas(account.address, to, data, value) * GAS_MARGIN)
        max_fee, tip = self.fees()
        tx: dict[str, Any] = {
            "type": 2,
            "chainId": self.chain_id,
            "nonce": nonce,
            "value": value,
            "data": data,
            "gas": gas,
            "maxFeePerGas": max_fee,
            "maxPriorityFeePerGas": tip,
        }
        if to is not None:
            tx["to"] = to_checksum_address(to)
        signed = Account.sign_transaction(tx, account.key)
        return SignedTx(
            sender=account.address,
            nonce=nonce,
            tx_hash="0x" + signed.hash.hex(),
            raw="0x" + signed.raw_transaction.hex(),
        )

    def broadcast(self, signed: SignedTx) -> Sent:
        """Send ``signed``; safe to repeat (see the module's docstring for the outcomes)."""
        try:
            self.rpc.call("eth_sendRawTransaction", signed.raw)
            return Sent(signed.tx_hash, signed.nonce, SendOutcome.SENT)
        except RpcError as e:
            message = e.message.lower()
            if "already known" in message or "already imported" in message or "known transaction" in message:
                return Sent(signed.tx_hash, signed.nonce, SendOutcome.ALREADY_SENT)
            if "nonce too low" in message or "underpriced" in message or "replacement" in message:
                if self.receipt(signed.tx_hash) is not None or self._pooled(signed.tx_hash):
                    return Sent(signed.tx_hash, signed.nonce, SendOutcome.ALREADY_SENT)
                return Sent(signed.tx_hash, signed.nonce, SendOutcome.NONCE_TAKEN)
            raise

    def _pooled(self, tx_hash: str) -> bool:
        return self.rpc.call("eth_getTransactionByHash", tx_hash) is not None

    def receipt(self, tx_hash: str) -> Receipt | None:
        raw = self.rpc.call("eth_getTransactionReceipt", tx_hash)
        if raw is None:
            return None
        contract = raw.get("contractAddress")
        return Receipt(
            tx_hash=str(raw["transactionHash"]),
            block_number=int(raw["blockNumber"], 16),
            block_hash=str(raw["blockHash"]),
            status=int(raw.get("status", "0x1"), 16) == 1,
            gas_used=int(raw["gasUsed"], 16),
            contract_address=to_checksum_address(contract) if contract else None,
            logs=list(raw.get("logs", [])),
        )

    def wait_receipt(self, tx_hash: str, *, timeout: float = 120.0) -> Receipt:
        """The mined transaction's receipt; ``TxReverted`` if it failed, ``ChainTimeout``
        if it is not mined within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while (found := self.receipt(tx_hash)) is None:
            if time.monotonic() > deadline:
                raise ChainTimeout(f"transaction {tx_hash} was not mined within {timeout:g} s at {self.url}")
            time.sleep(self.poll)
        if not found.status:
            raise TxReverted(f"transaction {tx_hash} reverted in block {found.block_number}")
        return found

    def wait_confirmations(self, receipt: Receipt, confirmations: int, *, timeout: float = 600.0) -> Receipt:
        """``receipt`` once its block has ``confirmations`` blocks on it counting itself,
        re-read then: a reorganisation that dropped or moved the transaction is waited out."""
        if confirmations < 1:
            raise AitbcError(f"confirmations must be >= 1, got {confirmations}")
        deadline = time.monotonic() + timeout
        while True:
            current = self.receipt(receipt.tx_hash)
            if current is not None and self.block_number() - current.block_number + 1 >= confirmations:
                return current
            if time.monotonic() > deadline:
                raise ChainTimeout(
                    f"transaction {receipt.tx_hash} did not reach {confirmations} confirmations within {timeout:g} s"
                )
            time.sleep(self.poll)

    def transact(
        self, account: LocalAccount, *, to: str | None, data: bytes = b"", value: int = 0, timeout: float = 120.0
    ) -> Receipt:
        """Sign, send and wait for the receipt (no crash-safety: see :meth:`sign`)."""
        signed = self.sign(account, to=to, data=data, value=value)
        self.broadcast(signed)
        return self.wait_receipt(signed.tx_hash, timeout=timeout)

    def logs(
        self, address: str, *, topics: list[str | None] | None = None, from_block: int = 0, to_block: int | None = None
    ) -> list[dict[str, Any]]:
        """Raw logs of ``address`` in blocks ``from_block``..``to_block`` (None: the latest);
        a range past the head is empty (some nodes refuse it)."""
        if from_block > (self.block_number() if to_block is None else to_block):
            return []
        query: dict[str, Any] = {
            "address": to_checksum_address(address),
            "fromBlock": _hex(from_block),
            "toBlock": "latest" if to_block is None else _hex(to_block),
        }
        if topics:
            query["topics"] = topics
        return list(self.rpc.call("eth_getLogs", query))

    def close(self) -> None:
        self.rpc.close()

    def __enter__(self) -> EvmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reverted(error: RpcError, what: str) -> AitbcError:
    """A revert as ``TxReverted`` with its reason; any other node error as it was."""
    reason = revert_reason(error.data)
    if reason is not None:
        return TxReverted(f"{what} reverted: {reason}")
    if "revert" in error.message.lower():
        return TxReverted(f"{what} reverted: {error.message}")
    return error
