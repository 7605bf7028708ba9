"""Money on the local network for anyone with a wallet: the faucet and transfers. Each is
one ledger entry, authorised by the signer's own request (a transfer) or a recorded mint
(the faucet on the local network only).
"""

from __future__ import annotations

import dataclasses

from sqlalchemy.orm import Session

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import ApiError, unprocessable
from aitbc.coordinator.money.escrow import ledger_error, require_network, require_unheld
from aitbc.coordinator.money.onchain import refuse_on_chain
from aitbc.coordinator.schemas import WalletFund, WalletSend
from aitbc.ledger.book import Ledger, LedgerError, RequestAuth
from aitbc.ledger.chain import mint_account, wallet_account
from aitbc.replies.money import Funded, Sent
from aitbc.units import MICRO, ait, format_price, parse_amount

MAX_FAUCET = 1_000_000 * MICRO  # micro-AIT per request


def check_address(text: str) -> str:
    """``text`` if it is a wallet address (``ait1`` + 40 lowercase hex digits); 422 otherwise."""
    if not (text.startswith("ait1") and len(text) == 44 and all(c in "0123456789abcdef" for c in text[4:])):
        raise unprocessable("bad_address", f"{text!r} is not a wallet address (ait1 + 40 hex digits)")
    return text


def fund(ctx: Context, s: Session, body: WalletFund, *, address: str) -> Funded:
    """The local faucet: mint ``amount`` into the signer's wallet (a recorded mint)."""
    refuse_on_chain(ctx, "the local faucet", "mint AIT on chain (aitbc chain fund WALLET AMOUNT on a dev chain)")
    require_network(ctx, body.network)
    amount = parse_amount(body.amount)
    if amount > MAX_FAUCET:
        raise unprocessable("bad_amount", f"the faucet gives at most {format_price(MAX_FAUCET)} AIT per request")
    e = ctx.ledger.post(
        s,
        kind="mint",
        debit=mint_account(ctx.ledger.network),
        credit=wallet_account(address),
        amount=amount,
        memo={"faucet": True, "requested_by": address},
    )
    s.commit()
    return Funded(
        address=address,
        amount=ait(amount),
        entry=e.seq,
        balance=ait(Ledger.balance(s, wallet_account(address))),
    )


def send(ctx: Context, s: Session, body: WalletSend, *, address: str, request: RequestAuth) -> Sent:
    """Move ``amount`` from the signer's wallet to the address ``to`` (signed by the sender);
    not the money its runs' hires hold (:func:`.escrow.require_unheld`)."""
    refuse_on_chain(ctx, "a transfer between wallets here", "send AIT on chain from your EVM account")
    require_network(ctx, body.network)
    amount = parse_amount(body.amount)
    check_address(body.to)
    if body.to == address:
        raise unprocessable("bad_address", "cannot send to the same wallet")
    require_unheld(ctx, s, address, amount, what=f"sending to {body.to}")  # hires' money stays put
    try:
        e = ctx.ledger.post(
            s,
            kind="transfer",
            debit=wallet_account(address),
            credit=wallet_account(body.to),
            amount=amount,
            memo={"to": body.to},
            request=dataclasses.replace(request, field="amount"),
        )
    except LedgerError as err:
        if err.code == "insufficient_funds":
            have = Ledger.balance(s, wallet_account(address))
            raise ApiError(
                409,
                "insufficient_funds",
                f"wallet {address} holds {format_price(have)} AIT; {format_price(amount)} AIT needed; "
                f"fund it with: aitbc wallet fund WALLET {format_price(amount - have)}",
            ) from None
        raise ledger_error(err) from None
    s.commit()
    return Sent(
        from_=address,
        to=body.to,
        amount=ait(amount),
        entry=e.seq,
        balance=ait(Ledger.balance(s, wallet_account(address))),
    )
