"""Money on the local network: the faucet, balances, transfers, history, and the
ledger itself (every entry, for anyone to audit)."""

from __future__ import annotations

from fastapi import APIRouter, Query
from sqlalchemy import func, select

from aitbc.coordinator.api.deps import CtxDep, SessionDep, SignerDep
from aitbc.coordinator.errors import ApiError, unprocessable
from aitbc.coordinator.payments import ledger_error, require_network
from aitbc.coordinator.schemas import WalletFund, WalletSend
from aitbc.ledger.book import Entry, Head, Ledger, LedgerError
from aitbc.ledger.chain import mint_account, wallet_account
from aitbc.units import format_price, parse_amount

router = APIRouter(tags=["ledger"])
MAX_FAUCET = 1_000_000 * 1_000_000  # micro-AIT per request


def _address(text: str) -> str:
    if not (text.startswith("ait1") and len(text) == 44 and all(c in "0123456789abcdef" for c in text[4:])):
        raise unprocessable("bad_address", f"{text!r} is not a wallet address (ait1 + 40 hex digits)")
    return text


def entry_view(e: Entry) -> dict:
    return {**e.as_dict(), "amount_ait": format_price(e.amount)}


@router.post("/wallets/fund", status_code=201)
def fund(body: WalletFund, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> dict:
    """The local faucet: mint ``amount`` into the signer's wallet (a recorded mint)."""
    require_network(ctx, body.network)
    amount = parse_amount(body.amount)
    if amount > MAX_FAUCET:
        raise unprocessable("bad_amount", f"the faucet gives at most {format_price(MAX_FAUCET)} AIT per request")
    e = ctx.ledger.post(
        s,
        kind="mint",
        debit=mint_account(ctx.ledger.network),
        credit=wallet_account(signer.address),
        amount=amount,
        memo={"faucet": True, "requested_by": signer.address},
    )
    s.commit()
    return {
        "address": signer.address,
        "amount": format_price(amount),
        "entry": e.seq,
        "balance": format_price(Ledger.balance(s, wallet_account(signer.address))),
    }


@router.post("/wallets/send", status_code=201)
def send(body: WalletSend, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> dict:
    """Move ``amount`` from the signer's wallet to the address ``to`` (signed by the sender)."""
    require_network(ctx, body.network)
    amount = parse_amount(body.amount)
    _address(body.to)
    if body.to == signer.address:
        raise unprocessable("bad_address", "cannot send to the same wallet")
    try:
        e = ctx.ledger.post(
            s,
            kind="transfer",
            debit=wallet_account(signer.address),
            credit=wallet_account(body.to),
            amount=amount,
            memo={"to": body.to},
            request=signer.auth("amount"),
        )
    except LedgerError as err:
        if err.code == "insufficient_funds":
            have = Ledger.balance(s, wallet_account(signer.address))
            raise ApiError(
                409,
                "insufficient_funds",
                f"wallet {signer.address} holds {format_price(have)} AIT; {format_price(amount)} AIT needed; "
                f"fund it with: aitbc wallet fund WALLET {format_price(amount - have)}",
            ) from None
        raise ledger_error(err) from None
    s.commit()
    return {
        "from": signer.address,
        "to": body.to,
        "amount": format_price(amount),
        "entry": e.seq,
        "balance": format_price(Ledger.balance(s, wallet_account(signer.address))),
    }


@router.get("/wallets/{address}/balance")
def balance(address: str, ctx: CtxDep, s: SessionDep) -> dict:
    _address(address)
    micro = Ledger.balance(s, wallet_account(address))
    return {"address": address, "network": ctx.ledger.network, "balance": format_price(micro), "balance_micro": micro}


@router.get("/wallets/{address}/history")
def history(address: str, s: SessionDep, limit: int = Query(100, ge=1, le=10_000)) -> dict:
    """The wallet's most recent ``limit`` entries, oldest first."""
    account = wallet_account(_address(address))
    rows = s.scalars(
        select(Entry)
        .where((Entry.debit == account) | (Entry.credit == account))
        .order_by(Entry.seq.desc())
        .limit(limit)
    ).all()[::-1]
    return {"data": [entry_view(e) for e in rows], "count": len(rows)}


@router.get("/ledger")
def info(ctx: CtxDep, s: SessionDep) -> dict:
    """The network, the coordinator's public key (it signs settlements) and the head: the
    one the ledger records as it writes (``ledger_head``), not the newest entry found, so
    an audit sees entries deleted from the end of the chain."""
    head = s.get(Head, 1)
    return {
        "network": ctx.ledger.network,
        "system_key": ctx.ledger.system.public_key,
        "entries": head.seq if head else 0,
        "head": head.hash if head and head.seq else None,
        "stored": s.scalar(select(func.count()).select_from(Entry)) or 0,
    }


@router.get("/ledger/entries")
def entries(s: SessionDep, after: int = Query(0, ge=0), limit: int = Query(1000, ge=1, le=10_000)) -> dict:
    """Entries in chain order after sequence number ``after`` (page with ``next``)."""
    rows = Ledger.entries(s, after=after, limit=limit)
    return {
        "data": [entry_view(e) for e in rows],
        "count": len(rows),
        "next": rows[-1].seq if len(rows) == limit else None,
    }


@router.get("/ledger/balances")
def balances(s: SessionDep) -> dict:
    """The cached balance of every account (the audit checks them against the entries)."""
    data = Ledger.cached_balances(s)
    return {"data": data, "count": len(data)}
