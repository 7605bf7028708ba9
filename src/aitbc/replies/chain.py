"""Where a coordinator holds runs' money: its own ledger, or an EVM chain's escrow contract
(``GET /v1/chain``). A client that deposits or bonds on chain reads the addresses here."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, RootModel

from aitbc.replies.base import Reply


class LocalChain(Reply):
    chain: Literal["local"] = Field(description="the coordinator's own ledger holds the money")


class EvmChain(Reply):
    chain: Literal["evm"] = Field(description="an EVM chain's escrow contract holds the money; the books mirror it")
    chain_id: int
    rpc: str = Field(description="the JSON-RPC URL the coordinator uses")
    token: str = Field(description="the AIT token's address (6 decimals: 1 unit = 1 micro-AIT)")
    escrow: str = Field(description="the RunEscrow contract's address")
    settlement_key: str = Field(description="the only address that settles and finalizes runs")
    confirmations: int = Field(description="blocks on a settlement, its own counted, before it is final")


ChainView = Annotated[LocalChain | EvmChain, Field(discriminator="chain")]


class ChainReply(RootModel[ChainView]):
    """``GET /v1/chain``'s reply: a :class:`LocalChain` or an :class:`EvmChain`, by ``chain``
    (one named schema in the API's document)."""
