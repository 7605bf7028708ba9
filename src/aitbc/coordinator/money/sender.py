"""The chain sender: one thread (``chain-sender``) that sends the outbox's transactions
(:mod:`.outbox`) to the escrow contract, each exactly once across crashes, and counts their
confirmations.

Only the replica holding the driver lease sends (``ctx.lease.holds()``), and every status
it writes is in a transaction fenced by the lease (``ctx.lease.fence``): a replica that lost
the lease commits nothing. Rows go in id order; each moves by one step a pass:

- ``queued``: if the chain already shows the work done (the round settled, the run
  finalized), its transaction is found from the event and the row is ``mined``. Otherwise
  it is signed at the next nonce (the key's pending count, or one past the highest nonce of
  a row signed or sent and perhaps not in the node's pool yet), and the nonce, the signed
  bytes and the hash are committed (``signed``) *before* the broadcast (``sent``). A
  transaction whose estimate reverts (the contract refuses it) is ``failed`` with the
  contract's reason, and no nonce is used.
- ``signed``/``sent``: the receipt is looked for; none yet: the stored bytes are broadcast
  again (the same transaction, safe to repeat). Success: ``mined`` (block, gas used);
  a revert: ``failed``. If another transaction took the nonce, the chain is asked whether
  the work is done; if not, the row is signed anew.
- ``mined``: confirmations = head - block + 1; at ``confirmations`` it is ``final``. A
  receipt gone (a reorganisation) sends the row back to ``sent``.

So a SIGKILL anywhere leaves either an unsigned row (signed after the restart, after the
chain is asked) or a stored transaction (resent as the same bytes): a round is never paid
by two transactions, and the contract refuses a second settle of a round in any case.
A failed settle is logged and left (the run's finalize waits for every settle: without it
the run times out on chain, and its owner and providers take their money back there).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from eth_account.signers.local import LocalAccount
from sqlalchemy import func, select

from aitbc.chain.evm.client import EvmClient, Receipt, SendOutcome, SignedTx, TxReverted
from aitbc.chain.evm.contracts import MAX_SETTLE
from aitbc.chain.evm.escrow import Escrow, Payout
from aitbc.coordinator.context import Context
from aitbc.coordinator.money import outbox
from aitbc.coordinator.store.models import ChainTx, Run
from aitbc.coordinator.store.repository import row

log = logging.getLogger("aitbc.coordinator")
POLL_SECONDS = 0.5  # between passes; a dev chain mines in milliseconds
RETRY_SECONDS = 5.0  # after a failed pass (a node down, a key out of gas): one log line per try, not a flood


class SenderChain(Protocol):
    """What the sender needs of the chain (``ctx.chain``, a
    :class:`~aitbc.coordinator.chain_backend.ChainBackend`): the node, the escrow, the
    settlement key's account, and how many blocks (its own counted) make a transaction final."""

    @property
    def client(self) -> EvmClient: ...
    @property
    def escrow(self) -> Escrow: ...
    @property
    def account(self) -> LocalAccount: ...
    @property
    def confirmations(self) -> int: ...


class ChainSender:
    """Sends ``ctx``'s outbox to ``chain`` while this replica holds the driver lease."""

    def __init__(self, ctx: Context, chain: SenderChain, *, poll: float = POLL_SECONDS) -> None:
        self.ctx, self.chain, self.poll = ctx, chain, poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chain-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=wait)

    def _loop(self) -> None:
        while not self._stop.is_set():
            wait = self.poll
            try:
                self.tick()
            except Exception:  # the node or the database unreachable, no gas: every step is redone later
                wait = max(self.poll, RETRY_SECONDS)
                log.exception("chain sender: pass failed; retrying in %g s", wait)
            self._stop.wait(wait)

    def tick(self) -> None:
        """One pass: queue what finalized runs owe, then move each open row one step."""
        if not self.ctx.lease.holds():
            return
        self._queue_finalizes()
        with self.ctx.session() as s:
            ids = s.scalars(select(ChainTx.id).where(ChainTx.status.in_(outbox.OPEN)).order_by(ChainTx.id)).all()
        for tx_id in ids:
            if self._stop.is_set() or not self.ctx.lease.holds():
                return
            self.step(tx_id)

    def step(self, tx_id: int) -> None:
        """Move row ``tx_id`` one step (see the module's docstring)."""
        with self.ctx.session() as s:
            tx = row(s, ChainTx, tx_id)
            s.expunge(tx)
        if tx.status == outbox.QUEUED:
            self._send(tx)
        elif tx.status in (outbox.SIGNED, outbox.SENT):
            self._follow(tx)
        elif tx.status == outbox.MINED:
            self._confirm(tx)

    # --- queued -----------------------------------------------------------------------------

    def _queue_finalizes(self) -> None:
        with self.ctx.session() as s:
            todo = outbox.runs_to_finalize(s)
        for run_id in todo:
            with self.ctx.session() as s:
                if not self.ctx.lease.fence(s):
                    return
                outbox.queue_finalize(self.ctx, s, row(s, Run, run_id))
                s.commit()

    def _send(self, tx: ChainTx) -> None:
        if self._done_on_chain(tx):
            return
        if tx.kind == outbox.SETTLE and len(lines := outbox.SettlePayload.of(tx.payload).lines) > MAX_SETTLE:
            self._fail(tx, f"{len(lines)} providers in one round; one settlement takes at most {MAX_SETTLE}")
            return
        try:
            signed = self._sign(tx, self._next_nonce())
        except TxReverted as e:  # the contract refuses it: sending would only burn gas
            self._fail(tx, str(e))
            return
        stored = self._write(
            tx,
            (outbox.QUEUED,),
            status=outbox.SIGNED,
            nonce=signed.nonce,
            raw_tx=signed.raw,
            tx_hash=signed.tx_hash,
            sender=self.ctx.lease.me,
        )
        if stored:  # committed before the broadcast: a crash from here resends these bytes
            self._broadcast(tx, signed)

    def _sign(self, tx: ChainTx, nonce: int) -> SignedTx:
        key, escrow, account = _key(tx), self.chain.escrow, self.chain.account
        if tx.kind == outbox.FINALIZE:
            return escrow.sign_finalize(account, key, nonce=nonce)
        lines = outbox.SettlePayload.of(tx.payload).lines
        payouts = [Payout(x.provider, x.amount, x.slash) for x in lines]
        return escrow.sign_settlement(account, key, tx.round, payouts, nonce=nonce)

    def _next_nonce(self) -> int:
        """The key's pending count, or one past a row signed or sent that the node may not
        hold (signed, then the process died before the broadcast): never a nonce twice."""
        with self.ctx.session() as s:
            stored = s.scalar(select(func.max(ChainTx.nonce)).where(ChainTx.status.in_((outbox.SIGNED, outbox.SENT))))
        pending = self.chain.client.pending_nonce(self.chain.account.address)
        return pending if stored is None else max(pending, int(stored) + 1)

    def _done_on_chain(self, tx: ChainTx) -> bool:
        """Whether the chain already shows ``tx``'s work (a send before a crash, or another
        sender's): then the row is marked mined with the transaction that did it."""
        key = _key(tx)
        if tx.kind == outbox.SETTLE:
            if not self.chain.escrow.settled(key, tx.round):
                return False
            topics: list[str | None] = [
                self._topic("RoundSettled"),
                "0x" + key.hex(),
                "0x" + tx.round.to_bytes(32, "big").hex(),
            ]
        else:
            topics = [self._topic("Finalized"), "0x" + key.hex()]
        escrow = self.chain.escrow
        logs = self.chain.client.logs(escrow.escrow.address, topics=topics, from_block=escrow.deployment.block)
        if not logs:
            return False  # a finalize not logged is not done
        receipt = self.chain.client.receipt(str(logs[0]["transactionHash"]))
        if receipt is None:
            return False  # its block was just reorganised away: look again next pass
        log.info("chain: %s of run %s round %d already on chain in %s", tx.kind, tx.run_id, tx.round, receipt.tx_hash)
        self._mined(tx, receipt, from_statuses=outbox.OPEN)
        return True

    def _topic(self, event: str) -> str:
        return self.chain.escrow.escrow.abi.event(event).topic

    # --- signed, sent -----------------------------------------------------------------------

    def _follow(self, tx: ChainTx) -> None:
        assert tx.tx_hash is not None and tx.raw_tx is not None and tx.nonce is not None
        receipt = self.chain.client.receipt(tx.tx_hash)
        if receipt is not None:
            self._landed(tx, receipt)
            return
        signed = SignedTx(sender=self.chain.account.address, nonce=tx.nonce, tx_hash=tx.tx_hash, raw=tx.raw_tx)
        self._broadcast(tx, signed)

    def _broadcast(self, tx: ChainTx, signed: SignedTx) -> None:
        outcome = self.chain.client.broadcast(signed).outcome
        if outcome != SendOutcome.NONCE_TAKEN:
            if tx.status != outbox.SENT:
                self._write(tx, (outbox.SIGNED,), status=outbox.SENT, sent_at=time.time())
            return
        # Another transaction of the key holds this nonce: this one can never be mined.
        if self._done_on_chain(tx):
            return
        log.warning("chain: %s of run %s round %d lost its nonce %d; signing it again", *_ids(tx), signed.nonce)
        self._write(
            tx, (outbox.SIGNED, outbox.SENT), status=outbox.QUEUED, nonce=None, raw_tx=None, tx_hash=None, sent_at=None
        )

    def _landed(self, tx: ChainTx, receipt: Receipt) -> None:
        if receipt.status:
            self._mined(tx, receipt, from_statuses=(outbox.SIGNED, outbox.SENT))
        else:
            self._fail(tx, f"transaction {receipt.tx_hash} reverted in block {receipt.block_number}")

    def _mined(self, tx: ChainTx, receipt: Receipt, *, from_statuses: tuple[str, ...]) -> None:
        depth = self.chain.client.block_number() - receipt.block_number + 1
        now = time.time()
        final = depth >= self.chain.confirmations
        written = self._write(
            tx,
            from_statuses,
            status=outbox.FINAL if final else outbox.MINED,
            tx_hash=receipt.tx_hash,
            block=receipt.block_number,
            gas_used=receipt.gas_used,
            confirmations=max(depth, 0),
            final_at=now if final else None,
        )
        if written and final:
            self.ctx.metrics.chain_tx_final.observe(max(0.0, now - tx.created_at))

    def _fail(self, tx: ChainTx, error: str) -> None:
        log.error("chain: %s of run %s round %d failed: %s", *_ids(tx), error)
        self._write(tx, outbox.OPEN, status=outbox.FAILED, error=error)

    # --- mined ------------------------------------------------------------------------------

    def _confirm(self, tx: ChainTx) -> None:
        assert tx.tx_hash is not None
        receipt = self.chain.client.receipt(tx.tx_hash)
        if receipt is None:  # reorganised out of the chain: resent from its stored bytes
            log.warning("chain: %s of run %s round %d left the chain; sending it again", *_ids(tx))
            back = outbox.SENT if tx.raw_tx is not None else outbox.QUEUED
            self._write(tx, (outbox.MINED,), status=back, block=None, confirmations=0)
            return
        if not receipt.status:
            self._fail(tx, f"transaction {receipt.tx_hash} reverted in block {receipt.block_number}")
            return
        self._mined(tx, receipt, from_statuses=(outbox.MINED,))

    # --- the fenced write -------------------------------------------------------------------

    def _write(self, tx: ChainTx, from_statuses: tuple[str, ...], **values: object) -> bool:
        """Set ``values`` on row ``tx`` if it is still in one of ``from_statuses``, in a
        transaction fenced by the driver lease; whether it committed."""
        with self.ctx.session() as s:
            if not self.ctx.lease.fence(s):
                s.rollback()
                return False
            current = s.get(ChainTx, tx.id, with_for_update=True)
            if current is None or current.status not in from_statuses:
                s.rollback()
                return False
            for name, value in values.items():
                setattr(current, name, value)
            s.commit()
        for name, value in values.items():
            setattr(tx, name, value)
        return True


def _key(tx: ChainTx) -> bytes:
    return bytes.fromhex(str(tx.payload["key"]).removeprefix("0x"))


def _ids(tx: ChainTx) -> tuple[str, str, int]:
    return tx.kind, tx.run_id, tx.round
