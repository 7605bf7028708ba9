"""Money on the local network: the faucet, balances, transfers, history, and the
ledger itself (every entry, for anyone to audit)."""

from __future__ import annotations

from fastapi import APIRouter, Query
from sqlalchemy import func, select

from aitbc.coordinator.api.deps import CtxDep, SessionDep, SignerDep
from aitbc.coordinator.api.responses import errors
from aitbc.coordinator.money import wallets
from aitbc.coordinator.money.wallets import check_address
from aitbc.coordinator.runs.views import entry_view
from aitbc.coordinator.schemas import WalletFund, WalletSend
from aitbc.ledger.book import Entry, Head, Ledger
from aitbc.ledger.chain import wallet_account
from aitbc.replies.base import Page
from aitbc.replies.money import Balance, Balances, Entries, EntryView, Funded, LedgerInfo, Sent
from aitbc.units import ait

router = APIRouter(tags=["ledger"])
MAX_SEQ = 2**31 - 1  # the largest sequence number the column holds on every backend (INTEGER on PostgreSQL)


@router.post("/wallets/fund", status_code=201, response_model=Funded, responses=errors(422))
def fund(body: WalletFund, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> Funded:
    """The local faucet: mint ``amount`` into the signer's wallet (a recorded mint)."""
    return wallets.fund(ctx, s, body, address=signer.address)


@router.post("/wallets/send", status_code=201, response_model=Sent, responses=errors(409, 422))
def send(body: WalletSend, ctx: CtxDep, s: SessionDep, signer: SignerDep) -> Sent:
    """Move ``amount`` from the signer's wallet to the address ``to`` (signed by the sender)."""
    return wallets.send(ctx, s, body, address=signer.address, request=signer.auth())


@router.get("/wallets/{address}/balance", response_model=Balance, responses=errors(422))
def balance(address: str, ctx: CtxDep, s: SessionDep) -> Balance:
    check_address(address)
    micro = Ledger.balance(s, wallet_account(address))
    return Balance(address=address, network=ctx.ledger.network, balance=ait(micro), balance_micro=micro)


@router.get("/wallets/{address}/history", response_model=Page[EntryView], responses=errors(422))
def history(address: str, s: SessionDep, limit: int = Query(100, ge=1, le=10_000)) -> Page[EntryView]:
    """The wallet's most recent ``limit`` entries, oldest first."""
    account = wallet_account(check_address(address))
    rows = s.scalars(
        select(Entry)
        .where((Entry.debit == account) | (Entry.credit == account))
        .order_by(Entry.seq.desc())
        .limit(limit)
    ).all()[::-1]
    return Page[EntryView](data=[entry_view(e) for e in rows], count=len(rows))


@router.get("/ledger", response_model=LedgerInfo)
def info(ctx: CtxDep, s: SessionDep) -> LedgerInfo:
    """The network, the coordinator's public key (it signs settlements) and the head: the
    one the ledger records as it writes (``ledger_head``), not the newest entry found, so
    an audit sees entries deleted from the end of the chain."""
    head = s.get(Head, 1)
    return LedgerInfo(
        network=ctx.ledger.network,
        system_key=ctx.ledger.system.public_key,
        entries=head.seq if head else 0,
        head=head.hash if head and head.seq else None,
        stored=s.scalar(select(func.count()).select_from(Entry)) or 0,
    )


@router.get("/ledger/entries", response_model=Entries, responses=errors(422))
def entries(
    s: SessionDep, after: int = Query(0, ge=0, le=MAX_SEQ), limit: int = Query(1000, ge=1, le=10_000)
) -> Entries:
    """Entries in chain order after sequence number ``after`` (page with ``next``)."""
    rows = Ledger.entries(s, after=after, limit=limit)
    return Entries(
        data=[entry_view(e) for e in rows],
        count=len(rows),
        next=rows[-1].seq if len(rows) == limit else None,
    )


@router.get("/ledger/balances", response_model=Balances)
def balances(s: SessionDep) -> Balances:
    """The cached balance of every account (the audit checks them against the entries)."""
    data = Ledger.cached_balances(s)
    return Balances(data=data, count=len(data))
