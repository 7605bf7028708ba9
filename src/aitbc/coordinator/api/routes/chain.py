from __future__ import annotations

from fastapi import APIRouter

from aitbc.coordinator.api.deps import CtxDep
from aitbc.coordinator.money.onchain import chain_view
from aitbc.replies.chain import ChainReply

router = APIRouter(tags=["chain"])


@router.get("/chain", response_model=ChainReply)
def chain(ctx: CtxDep) -> ChainReply:
    """Where this coordinator holds runs' money: its own ledger (``local``), or an EVM
    chain's escrow contract (``evm``: the chain, the contracts' addresses, the settlement key
    and the confirmations a settlement needs), which owners deposit into and providers bond
    on before their runs train."""
    return chain_view(ctx)
