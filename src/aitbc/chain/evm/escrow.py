"""A round's settlement on the escrow contract, sent at most once.

The coordinator's settlement key settles a round of a run in one transaction for all its
contracts. To survive a crash between signing and knowing the outcome, a caller:

1. asks :meth:`Escrow.settled` first: a round already settled on chain is never sent again
   (the contract also reverts a second settle of a round, so even a racing sender cannot
   pay twice);
2. signs with :meth:`Escrow.sign_settlement` and keeps the :class:`SignedTx` (its nonce
   and raw bytes) before broadcasting;
3. after a crash, broadcasts the kept transaction again (``client.broadcast`` is safe to
   repeat), and waits for its receipt and confirmations.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

from aitbc.chain.evm.client import EvmClient, SignedTx
from aitbc.chain.evm.contracts import MAX_SETTLE, run_key
from aitbc.chain.evm.deploy import Deployment, contracts_of
from aitbc.errors import AitbcError


@dataclass(frozen=True, slots=True)
class Payout:
    """One contract's line of a round's settlement: micro-AIT earned, and whether its bond burns."""

    provider: str  # the provider's EVM address
    amount: int
    slash: bool = False


class Escrow:
    """The escrow and token of a deployment, through ``client``."""

    def __init__(self, client: EvmClient, deployment: Deployment, *, cache_dir: Path | None = None) -> None:
        self.client = client
        self.deployment = deployment
        self.token, self.contract = contracts_of(client, deployment, cache_dir=cache_dir)

    def settled(self, run_id: str, round_: int) -> bool:
        """Whether round ``round_`` of run ``run_id`` is settled on chain (at the latest block)."""
        return bool(self.contract.call("settled", run_key(run_id), round_))

    def sign_settlement(
        self, key: LocalAccount, run_id: str, round_: int, payouts: list[Payout], *, nonce: int | None = None
    ) -> SignedTx:
        """The settlement of one round, signed by the settlement key (providers in the
        increasing address order the contract wants); ``nonce`` None: the key's pending count."""
        if len(payouts) > MAX_SETTLE:
            raise AitbcError(f"a round settles at most {MAX_SETTLE} contracts in one transaction, got {len(payouts)}")
        ordered = sorted(payouts, key=lambda p: int(p.provider, 16))
        return self.contract.sign(
            key,
            "settle",
            run_key(run_id),
            round_,
            [to_checksum_address(p.provider) for p in ordered],
            [p.amount for p in ordered],
            [p.slash for p in ordered],
            nonce=nonce,
        )
