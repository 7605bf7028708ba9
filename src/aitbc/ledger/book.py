"""The ledger's tables and the one way to write them (:class:`Ledger.post`).

Append-only: entries are only ever inserted. Each post takes the ledger's head row for
writing first (SQLite's write lock, a row lock elsewhere), so concurrent posts line up
one after another and the chain never forks. Balances are cached per account and updated
in the same transaction as the entry; :func:`aitbc.ledger.chain.audit` checks the cache
against the entries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypedDict

from sqlalchemy import JSON, BigInteger, Float, Integer, String, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from aitbc.json_value import JSONObject

# LedgerError and the networks live in the pure chain module (no SQLAlchemy): the CLI checks
# --network without importing the database layer. Re-exported here.
from aitbc.ledger.chain import (  # noqa: F401
    GENESIS,
    NETWORKS,
    REFUSED_NETWORKS,
    STANDING_FIELDS,
    LedgerError,
    check_authorisation,
    check_network,
    entry_hash,
    signed_content,
)
from aitbc.ledger.wallet import Wallet


class EntryFields(TypedDict):
    """An entry's signed content: every column but the signature and the hash."""

    seq: int
    prev_hash: str
    network: str
    kind: str
    debit: str
    credit: str
    amount: int
    memo: JSONObject
    key: str | None
    signer: str
    auth: JSONObject  # {"type": "entry"} or a RequestAuth's as_auth (checked by check_authorisation)
    created_at: float


class SignedEntry(EntryFields):
    signature: str


class EntryRecord(SignedEntry):
    """An entry's row as JSON reads it (``Entry.as_dict``)."""

    hash: str


class LedgerBase(DeclarativeBase):
    pass


class Entry(LedgerBase):
    __tablename__ = "ledger_entries"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    prev_hash: Mapped[str] = mapped_column(String(64))
    network: Mapped[str] = mapped_column(String(16))
    kind: Mapped[str] = mapped_column(String(16), index=True)
    debit: Mapped[str] = mapped_column(String(100), index=True)
    credit: Mapped[str] = mapped_column(String(100), index=True)
    amount: Mapped[int] = mapped_column(BigInteger)
    memo: Mapped[JSONObject] = mapped_column(JSON)
    key: Mapped[str | None] = mapped_column(String(200), unique=True)  # idempotency: once per key, ever
    signer: Mapped[str] = mapped_column(String(64))
    auth: Mapped[JSONObject] = mapped_column(JSON)
    signature: Mapped[str] = mapped_column(String(128), index=True)  # a signed request authorises one entry
    created_at: Mapped[float] = mapped_column(Float)

    def as_dict(self) -> EntryRecord:
        return EntryRecord(
            seq=self.seq,
            hash=self.hash,
            prev_hash=self.prev_hash,
            network=self.network,
            kind=self.kind,
            debit=self.debit,
            credit=self.credit,
            amount=self.amount,
            memo=self.memo,
            key=self.key,
            signer=self.signer,
            auth=self.auth,
            signature=self.signature,
            created_at=self.created_at,
        )


class Account(LedgerBase):
    __tablename__ = "ledger_accounts"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    balance: Mapped[int] = mapped_column(BigInteger, default=0)


class Head(LedgerBase):
    """One row: the chain's head, taken for writing by every post."""

    __tablename__ = "ledger_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, default=0)
    hash: Mapped[str] = mapped_column(String(64), default=GENESIS)


def _create_head(s: Session) -> None:
    """Insert the head row unless it exists. Concurrent first writes each try: on PostgreSQL
    and SQLite ``ON CONFLICT DO NOTHING`` makes the losers wait for the winner's commit and
    then do nothing (a plain INSERT failed them on the duplicate key: a 500)."""
    values = {"id": 1, "seq": 0, "hash": GENESIS}
    dialect = s.get_bind().dialect.name
    if dialect == "postgresql":
        s.execute(pg_insert(Head).values(**values).on_conflict_do_nothing(index_elements=["id"]))
    elif dialect == "sqlite":
        s.execute(sqlite_insert(Head).values(**values).on_conflict_do_nothing(index_elements=["id"]))
    else:  # other databases: a savepoint, so a lost race leaves this transaction usable
        try:
            with s.begin_nested():
                s.add(Head(**values))
        except IntegrityError:
            pass


@dataclass(frozen=True, slots=True)
class RequestAuth:
    """A wallet owner's signed HTTP request, kept as the authorisation of an entry."""

    method: str
    path: str
    body: str
    timestamp: str
    nonce: str
    public_key: str
    signature: str
    field: str | None = None  # the body field bounding the amount, if any

    def as_auth(self) -> JSONObject:
        return {
            "type": "request",
            "method": self.method,
            "path": self.path,
            "body": self.body,
            "timestamp": self.timestamp,
            "nonce": self.nonce,
            "field": self.field,
        }

    @classmethod
    def from_dict(cls, d: JSONObject) -> RequestAuth:
        """The request :meth:`as_dict` stored (``TypeError`` for a field that is not text)."""
        field = d.get("field")
        return cls(
            method=_text(d, "method"),
            path=_text(d, "path"),
            body=_text(d, "body"),
            timestamp=_text(d, "timestamp"),
            nonce=_text(d, "nonce"),
            public_key=_text(d, "public_key"),
            signature=_text(d, "signature"),
            field=None if field is None else _text(d, "field"),
        )

    def as_dict(self) -> JSONObject:
        return {**self.as_auth(), "public_key": self.public_key, "signature": self.signature}


def _text(d: JSONObject, key: str) -> str:
    value = d[key]
    if not isinstance(value, str):
        raise TypeError(f"signed request field {key!r} is {value!r}, not text")
    return value


class Ledger:
    """Posting and reading. ``system`` is the coordinator's wallet: it signs the entries it
    authorises itself (faucet mints, settlements, refunds, slashing, bond returns)."""

    def __init__(self, system: Wallet, network: str = "local") -> None:
        self.system, self.network = system, check_network(network)

    def post(
        self,
        s: Session,
        *,
        kind: str,
        debit: str,
        credit: str,
        amount: int,
        memo: JSONObject | None = None,
        key: str | None = None,
        request: RequestAuth | None = None,
        now: float | None = None,
    ) -> Entry:
        """Append one entry in the caller's transaction (the caller commits). Refused with
        no write: a non-positive or non-integer amount, a repeated ``key``, an overdraft,
        and an entry its authorisation does not cover (``unauthorised``: a request not
        signed by the debited wallet's owner, an amount over the signed limit, a wallet
        debited by the coordinator's own signature; see ``chain.check_authorisation``)."""
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            raise LedgerError("bad_amount", f"amount must be a positive whole number of micro-AIT, got {amount!r}")
        if debit == credit:
            raise LedgerError("bad_amount", f"cannot move money from {debit} to itself")
        if debit.startswith("burn:"):
            raise LedgerError("unauthorised", f"{debit} holds burned money; it never moves again")
        head = self.lock(s)
        if key is not None and s.scalar(select(Entry.seq).where(Entry.key == key)) is not None:
            raise LedgerError("duplicate", f"an entry with key {key!r} already exists")
        if request is not None and request.field not in STANDING_FIELDS:
            used = s.scalar(
                select(Entry.seq).where(Entry.signature == request.signature, Entry.signer == request.public_key)
            )
            if used is not None:
                raise LedgerError("duplicate", f"this signed request already authorised entry {used}")
        if not debit.startswith("mint:"):
            have = self.balance(s, debit)
            if have < amount:
                raise LedgerError("insufficient_funds", f"{debit} holds {have} micro-AIT; {amount} needed")
        auth: JSONObject = {"type": "entry"} if request is None else request.as_auth()
        fields: EntryFields = {
            "seq": head.seq + 1,
            "prev_hash": head.hash,
            "network": self.network,
            "kind": kind,
            "debit": debit,
            "credit": credit,
            "amount": amount,
            "memo": memo or {},
            "key": key,
            "signer": self.system.public_key if request is None else request.public_key,
            "auth": auth,
            "created_at": round(time.time() if now is None else now, 6),
        }
        signature = self.system.sign(signed_content(fields)) if request is None else request.signature
        e: SignedEntry = {**fields, "signature": signature}
        # Refuse what the audit would refuse: a ledger is append-only, so an entry written
        # here that does not verify would fail every audit from now on.
        why = check_authorisation(e, self.system.public_key)
        if why:
            raise LedgerError("unauthorised", f"entry refused: {why}")
        record: EntryRecord = {**e, "hash": entry_hash(e)}
        entry = Entry(**record)
        s.add(entry)
        for name, delta in ((debit, -amount), (credit, amount)):
            acct = s.get(Account, name)
            if acct is None:
                acct = Account(name=name, balance=0)
                s.add(acct)
            acct.balance += delta
        head.seq, head.hash = record["seq"], record["hash"]
        s.flush()
        return entry

    @staticmethod
    def lock(s: Session) -> Head:
        """Take the ledger's write lock for the rest of the caller's transaction (what every
        post does first): the head row, updated so other writers wait (SQLite's write lock,
        a row lock elsewhere), then re-read. A caller that decides from balances before it
        posts (or instead of posting) takes it first, so no concurrent post can spend the
        money it counted until it commits."""
        locked = s.execute(update(Head).where(Head.id == 1).values(seq=Head.seq))
        assert isinstance(locked, CursorResult)  # an UPDATE's result counts its rows
        if locked.rowcount == 0:  # the first write: create the head row, then lock it
            _create_head(s)
            s.execute(update(Head).where(Head.id == 1).values(seq=Head.seq))
        head = s.get(Head, 1)
        assert head is not None  # written just above if it was not there
        s.refresh(head)
        return head

    @staticmethod
    def balance(s: Session, account: str) -> int:
        return s.scalar(select(Account.balance).where(Account.name == account)) or 0

    @staticmethod
    def entries(s: Session, *, after: int = 0, limit: int | None = None, account: str | None = None) -> list[Entry]:
        q = select(Entry).where(Entry.seq > after).order_by(Entry.seq)
        if account is not None:
            q = q.where((Entry.debit == account) | (Entry.credit == account))
        if limit is not None:
            q = q.limit(limit)
        return list(s.scalars(q).all())

    @staticmethod
    def cached_balances(s: Session) -> dict[str, int]:
        return {a.name: a.balance for a in s.scalars(select(Account)).all() if a.balance != 0}

    @staticmethod
    def has_key(s: Session, key: str) -> bool:
        return s.scalar(select(Entry.seq).where(Entry.key == key)) is not None
