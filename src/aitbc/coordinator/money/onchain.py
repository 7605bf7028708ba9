"""Money on an EVM chain (``--chain evm``): the chain holds it, the books mirror it.

The owner deposits a run's escrow on chain and each hired provider posts its bond there;
the coordinator never moves either. It mirrors what the chain shows into its ledger, so
the books keep every entry they keep on a local coordinator (scoring, settlements, the
same audit), with money entering them only as a mirror:

- :func:`sync_deposit`: the run's on-chain deposit (a running total: a top-up adds) as
  ledger entries kind ``chain-deposit`` from ``mint:<network>`` into ``escrow:<run>``,
  one per total seen (key ``chain-deposit:<run>:<total>``), each the difference;
- :func:`sync_bond`: a contract's on-chain bond as kind ``chain-bond`` from
  ``mint:<network>`` into ``bond:<contract>`` (key ``chain-bond:<contract>``), once.

Both are idempotent by their keys and by the run's row lock: however often they run, the
chain's money enters the books once.
"""

from __future__ import annotations

from aitbc.coordinator.context import Context
from aitbc.replies.chain import ChainView, EvmChain, LocalChain


def chain_view(ctx: Context) -> ChainView:
    """``GET /v1/chain``: where this coordinator holds runs' money."""
    chain = ctx.chain
    if chain is None:
        return LocalChain(chain="local")
    d = chain.deployment
    return EvmChain(
        chain="evm",
        chain_id=d.chain_id,
        rpc=chain.rpc,
        token=d.token,
        escrow=d.escrow,
        settlement_key=d.settlement_key,
        confirmations=chain.confirmations,
    )
