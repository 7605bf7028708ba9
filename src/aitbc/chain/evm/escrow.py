"""The escrow and the token of a deployment, as Python: read a run, a contract, a balance;
deposit, top up, bond, withdraw, refund, mint; sign a round's settlement at most once.

A run is known on chain by its key, :func:`~aitbc.chain.evm.contracts.run_key` (the
owner's address and the run id): the owner deposits under the run id's ref and the
contract derives the key from the sender. :meth:`Escrow.find_key` finds a run's key from
its ``Deposited`` events when the owner is not known (scanning from the deployment's
block). Every transaction here waits for its receipt; a revert is one line naming what
was refused and the contract's reason (:class:`~aitbc.chain.evm.client.TxReverted`).

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
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

from aitbc.chain.evm.client import EvmClient, Receipt, SignedTx, TxReverted
from aitbc.chain.evm.contracts import MAX_SETTLE, run_key, run_ref
from aitbc.chain.evm.deploy import Deployment, contracts_of
from aitbc.errors import AitbcError

ZERO_ADDRESS = "0x" + "00" * 20


@dataclass(frozen=True, slots=True)
class Payout:
    """One contract's line of a round's settlement: micro-AIT earned, and whether its bond burns."""

    provider: str  # the provider's EVM address
    amount: int
    slash: bool = False


@dataclass(frozen=True, slots=True)
class RunView:
    """A run on chain at the latest block (``owner`` the zero address: no such run).
    Amounts in micro-AIT, times in the chain's seconds."""

    owner: str
    price: int
    timeout: int
    escrow: int  # left: deposited, not yet settled to a provider or refunded
    deposited: int  # every deposit and top-up together
    last_post: int
    finalized: bool
    timed_out: bool  # past its deadline unfinalized (the contract logs TimedOut at the first close after)
    deadline: int  # when it times out unless the settlement key posts before (0: no run)
    open: bool  # deposited, neither finalized nor timed out: settlements and bonds go in

    @property
    def exists(self) -> bool:
        return int(self.owner, 16) != 0

    @property
    def state(self) -> str:
        """One word: ``none``, ``open``, ``finalized`` or ``timed out``."""
        if not self.exists:
            return "none"
        if self.open:
            return "open"
        return "finalized" if self.finalized else "timed out"


@dataclass(frozen=True, slots=True)
class ContractView:
    """A provider's contract in a run: its bond held (0 once burned or withdrawn) and what
    it earned and has not withdrawn, in micro-AIT."""

    bonded: bool
    bond: int
    earned: int
    slashed: bool


@dataclass(frozen=True, slots=True)
class Deposit:
    """One ``Deposited`` event: a run opened under ``key`` by ``owner``."""

    key: bytes
    owner: str
    amount: int
    price: int
    timeout: int
    block: int
    tx_hash: str


class Escrow:
    """The escrow and token of a deployment, through ``client``: ``escrow`` and ``token``
    are the two contracts, for what the methods here do not cover."""

    def __init__(self, client: EvmClient, deployment: Deployment, *, cache_dir: Path | None = None) -> None:
        self.client = client
        self.deployment = deployment
        self.token, self.escrow = contracts_of(client, deployment, cache_dir=cache_dir)

    # --- reads ------------------------------------------------------------------------

    def run(self, key: bytes) -> RunView:
        """Run ``key`` as the chain holds it now."""
        r = self.escrow.call("runs", key)
        owner, price, timeout, escrow, deposited, last_post, finalized, timed_out = r
        is_open = bool(self.escrow.call("is_open", key))
        exists = int(owner, 16) != 0
        return RunView(
            owner=to_checksum_address(owner),
            price=price,
            timeout=timeout,
            escrow=escrow,
            deposited=deposited,
            last_post=last_post,
            finalized=bool(finalized),
            timed_out=bool(timed_out) or (exists and not finalized and not is_open),
            deadline=last_post + timeout if exists else 0,
            open=is_open,
        )

    def contract(self, key: bytes, provider: str) -> ContractView:
        """Provider ``provider``'s contract in run ``key`` (all zero: none)."""
        bonded, bond, earned, slashed = self.escrow.call("contracts", key, to_checksum_address(provider))
        return ContractView(bonded=bool(bonded), bond=bond, earned=earned, slashed=bool(slashed))

    def settled(self, key: bytes, round_: int) -> bool:
        """Whether round ``round_`` of run ``key`` is settled on chain (at the latest block)."""
        return bool(self.escrow.call("settled", key, round_))

    def token_balance(self, address: str) -> int:
        """``address``'s AIT, in micro-AIT."""
        return int(self.token.call("balanceOf", to_checksum_address(address)))

    def deposits(self, run_id: str) -> list[Deposit]:
        """Every run deposited under ``run_id``'s ref, in chain order (one per owner)."""
        events = self.escrow.events(
            "Deposited", indexed=[None, None, "0x" + run_ref(run_id).hex()], from_block=self.deployment.block
        )
        return [
            Deposit(
                key=e.args["key"],
                owner=e.args["owner"],
                amount=e.args["amount"],
                price=e.args["price"],
                timeout=e.args["timeout"],
                block=e.block_number,
                tx_hash=e.tx_hash,
            )
            for e in events
            if e.args["run_id"] == run_ref(run_id)
        ]

    def find_key(self, run_id: str, owner: str | None = None) -> tuple[bytes, str] | None:
        """(key, owner) of run ``run_id``: ``owner``'s if given (None if it deposited no
        such run), else the first deposit under the run id; None if there is none."""
        if owner is not None:
            key = run_key(owner, run_id)
            view = self.run(key)
            return (key, view.owner) if view.exists else None
        found = self.deposits(run_id)
        return (found[0].key, found[0].owner) if found else None

    # --- transactions -----------------------------------------------------------------

    def deposit(self, account: LocalAccount, run_id: str, amount: int, price: int, timeout: int) -> Receipt:
        """Open ``account``'s run ``run_id`` (key :func:`run_key`) with ``amount`` micro-AIT
        of escrow, approving the escrow first."""
        self._approve(account, amount)
        return self._send(account, "deposit", run_ref(run_id), amount, price, timeout, what=f"deposit for {run_id!r}")

    def top_up(self, account: LocalAccount, key: bytes, amount: int) -> Receipt:
        """Add ``amount`` to the escrow of ``account``'s open run ``key``, approving first."""
        self._approve(account, amount)
        return self._send(account, "top_up", key, amount, what=f"top-up of run 0x{key.hex()}")

    def post_bond(self, account: LocalAccount, key: bytes, amount: int) -> Receipt:
        """Bond ``amount`` (0 allowed) in run ``key`` from ``account``, approving first."""
        self._approve(account, amount)
        return self._send(account, "post_bond", key, amount, what=f"bond in run 0x{key.hex()}")

    def withdraw(self, account: LocalAccount, key: bytes) -> Receipt:
        return self._send(account, "withdraw", key, what=f"withdraw from run 0x{key.hex()}")

    def refund(self, account: LocalAccount, key: bytes) -> Receipt:
        return self._send(account, "refund", key, what=f"refund of run 0x{key.hex()}")

    def mint(self, minter: LocalAccount, to: str, amount: int) -> Receipt:
        """Mint ``amount`` micro-AIT to ``to`` (the token's minter only)."""
        try:
            return self.token.transact(minter, "mint", to_checksum_address(to), amount)
        except TxReverted as e:
            raise TxReverted(f"minting {amount} micro-AIT to {to} refused: {_reason(e)}") from None

    def sign_settlement(
        self, key_account: LocalAccount, key: bytes, round_: int, payouts: list[Payout], *, nonce: int | None = None
    ) -> SignedTx:
        """The settlement of one round, signed by the settlement key (providers in the
        increasing address order the contract wants); ``nonce`` None: the key's pending count."""
        if len(payouts) > MAX_SETTLE:
            raise AitbcError(f"a round settles at most {MAX_SETTLE} contracts in one transaction, got {len(payouts)}")
        ordered = sorted(payouts, key=lambda p: int(p.provider, 16))
        return self.escrow.sign(
            key_account,
            "settle",
            key,
            round_,
            [to_checksum_address(p.provider) for p in ordered],
            [p.amount for p in ordered],
            [p.slash for p in ordered],
            nonce=nonce,
        )

    def sign_finalize(self, key_account: LocalAccount, key: bytes, *, nonce: int | None = None) -> SignedTx:
        """Run ``key``'s finalization, signed by the settlement key."""
        return self.escrow.sign(key_account, "finalize", key, nonce=nonce)

    def _approve(self, account: LocalAccount, amount: int) -> None:
        """Let the escrow take ``amount`` of ``account``'s AIT (nothing sent if it may already)."""
        if amount <= 0:
            return
        held = int(self.token.call("allowance", account.address, self.escrow.address))
        if held >= amount:
            return
        try:
            self.token.transact(account, "approve", self.escrow.address, amount)
        except TxReverted as e:
            raise TxReverted(f"approving the escrow for {amount} micro-AIT refused: {_reason(e)}") from None

    def _send(self, account: LocalAccount, name: str, *args: Any, what: str) -> Receipt:
        try:
            return self.escrow.transact(account, name, *args)
        except TxReverted as e:
            raise TxReverted(f"{what} refused: {_reason(e)}") from None


def _reason(error: TxReverted) -> str:
    """The contract's reason in a revert's message (what follows 'reverted: ')."""
    return str(error).split(" reverted: ", 1)[-1]
