"""The audit (:func:`aitbc.ledger.chain.audit`) over a real ledger: entries written by
``Ledger.post`` into a real database (SQLite, or PostgreSQL with ``AITBC_TEST_DB``), owners' entries authorised by really signed requests,
then tampered with by raw SQL as someone with the database file would. Each tamper must
fail the audit naming the entry it touched."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from aitbc.ledger.book import Account, Entry, Head, Ledger, LedgerBase, LedgerError, RequestAuth
from aitbc.ledger.chain import (
    GENESIS,
    audit,
    entry_hash,
    escrow_account,
    micro,
    mint_account,
    signed_content,
    wallet_account,
)
from aitbc.ledger.signing import HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP, sign_request
from aitbc.ledger.wallet import Wallet

AIT = 1_000_000
MINT = mint_account("local")


def signed(
    wallet: Wallet, body: dict, field: str | None, path: str = "/v1/wallets/send", nonce: str | None = None
) -> RequestAuth:
    """``body`` as a request really signed by ``wallet``, kept as an entry's authorisation."""
    data = json.dumps(body).encode()
    h = sign_request(wallet, "POST", path, data, nonce=nonce)
    return RequestAuth(
        method="POST",
        path=path,
        body=data.decode(),
        timestamp=h[HEADER_TIMESTAMP],
        nonce=h[HEADER_NONCE],
        public_key=wallet.public_key,
        signature=h[HEADER_SIGNATURE],
        field=field,
    )


class Book:
    """A ledger in a new database of the backend under test, posting each entry in its own
    committed transaction."""

    def __init__(self, url: str, system: Wallet) -> None:
        self.engine = create_engine(url)
        LedgerBase.metadata.create_all(self.engine)
        self.system = system
        self.ledger = Ledger(system)

    def post(self, ledger: Ledger | None = None, **kw) -> int:
        with Session(self.engine) as s:
            e = (ledger or self.ledger).post(s, **kw)
            s.commit()
            return e.seq

    def sql(self, statement: str, **params) -> None:
        with self.engine.begin() as conn:
            conn.execute(text(statement), params)

    def read(self):
        with Session(self.engine) as s:
            h = s.get(Head, 1)
            return (
                [e.as_dict() for e in Ledger.entries(s)],
                Ledger.cached_balances(s),
                (h.seq, h.hash) if h else (0, GENESIS),
            )

    def audit(self, system_key: str | None = "default"):
        entries, cached, head = self.read()
        key = self.system.public_key if system_key == "default" else system_key
        return audit(entries, system_key=key, cached=cached, head=head)


def forge(
    book: Book,
    *,
    kind: str,
    debit: str,
    credit: str,
    amount: int,
    request: RequestAuth | None = None,
    signer: Wallet | None = None,
    key: str | None = None,
    refused_as: str = "unauthorised",
) -> int:
    """Write an entry as ``Ledger.post`` would, minus its checks (``Ledger.post`` refuses
    these): the coordinator's database written by someone else. First checks that
    ``post`` itself refuses it and writes nothing."""
    before = book.read()
    with Session(book.engine) as s, pytest.raises(LedgerError) as refused:
        book.ledger.post(s, kind=kind, debit=debit, credit=credit, amount=amount, request=request, key=key)
    assert refused.value.code == refused_as, refused.value
    assert book.read() == before
    with Session(book.engine) as s:
        head = s.get(Head, 1)
        e = {
            "seq": head.seq + 1,
            "prev_hash": head.hash,
            "network": "local",
            "kind": kind,
            "debit": debit,
            "credit": credit,
            "amount": amount,
            "memo": {},
            "key": key,
            "created_at": 1_764_440_000.0,
        }
        if request is None:
            w = signer or book.system
            e["signer"], e["auth"] = w.public_key, {"type": "entry"}
            e["signature"] = w.sign(signed_content(e))
        else:
            e["signer"], e["auth"], e["signature"] = request.public_key, request.as_auth(), request.signature
        e["hash"] = entry_hash(e)
        s.add(Entry(**e))
        for name, delta in ((debit, -amount), (credit, amount)):
            acct = s.get(Account, name) or Account(name=name, balance=0)
            acct.balance += delta
            s.add(acct)
        head.seq, head.hash = e["seq"], e["hash"]
        s.commit()
        return e["seq"]


@pytest.fixture(scope="module")
def people():
    return {n: Wallet.generate(n) for n in ("coordinator", "alice", "bob", "carol", "mallory")}


@pytest.fixture
def book(db_url, people) -> Iterator[Book]:
    """Seven entries of every authorisation: mints, transfers, an escrow, a settlement, a refund."""
    b = Book(db_url, people["coordinator"])
    alice, bob = people["alice"], people["bob"]
    A, B = wallet_account(alice.address), wallet_account(bob.address)
    b.post(kind="mint", debit=MINT, credit=A, amount=100 * AIT, memo={"faucet": True})  # 1
    b.post(kind="mint", debit=MINT, credit=B, amount=50 * AIT, memo={"faucet": True})  # 2
    b.post(
        kind="transfer",
        debit=A,
        credit=B,
        amount=5 * AIT,
        memo={"to": bob.address},  # 3
        request=signed(alice, {"to": bob.address, "amount": "5"}, "amount"),
    )
    b.post(
        kind="escrow",
        debit=A,
        credit=escrow_account("run1"),
        amount=20 * AIT,
        key="escrow:run1:0",  # 4
        request=signed(alice, {"model_type": "mlp", "budget": "20"}, "budget", "/v1/runs"),
    )
    b.post(
        kind="settle",
        debit=escrow_account("run1"),
        credit=B,
        amount=3 * AIT,
        key="settle:c1:1",  # 5
        memo={"run": "run1", "round": 1},
    )
    b.post(
        kind="transfer",
        debit=B,
        credit=A,
        amount=1 * AIT,
        memo={"to": alice.address},  # 6
        request=signed(bob, {"to": alice.address, "amount": "1.000000"}, "amount"),
    )
    b.post(
        kind="refund",
        debit=escrow_account("run1"),
        credit=A,
        amount=17 * AIT,
        key="refund:run1",  # 7
        memo={"run": "run1"},
    )
    yield b
    b.engine.dispose()


def assert_fails_at(result, seq: int | None, *words: str) -> None:
    assert not result.ok, result
    assert result.bad_seq == seq, (result.bad_seq, result.problem)
    for w in words:
        assert w in result.problem, (w, result.problem)
    line = result.describe()
    assert line.startswith(f"entry {seq}" if seq else "ledger:"), line
    assert "\n" not in line


# --- a sound ledger -------------------------------------------------------------------------


def test_a_sound_ledger_passes(book, people):
    r = book.audit()
    assert r.ok, r.describe()
    assert r.entries == 7
    assert r.minted == 150 * AIT
    A, B = wallet_account(people["alice"].address), wallet_account(people["bob"].address)
    assert r.balances[A] == (100 - 5 - 20 + 1 + 17) * AIT
    assert r.balances[B] == (50 + 5 + 3 - 1) * AIT
    assert r.balances[escrow_account("run1")] == 0
    assert sum(v for k, v in r.balances.items() if not k.startswith("mint:")) == r.minted
    assert r.describe().startswith("ledger OK: 7 entries, head ")


def test_audit_of_entries_as_the_api_sends_them(book):
    """JSON there and back (floats, nested dicts) changes no hash."""
    entries, cached, head = book.read()
    wire = json.loads(json.dumps({"data": entries, "balances": cached}))
    r = audit(wire["data"], system_key=book.system.public_key, cached=wire["balances"], head=head)
    assert r.ok, r.describe()


def test_each_entry_hash_covers_its_signature(book):
    entries, _, _ = book.read()
    e = dict(entries[0])
    assert entry_hash(e) == e["hash"]
    e["signature"] = "0" * 128
    assert entry_hash(e) != entries[0]["hash"]


def test_micro_parses_decimal_ait_exactly():
    assert micro("1.2") == 1_200_000
    assert micro(5) == 5 * AIT
    assert micro("0.000001") == 1
    assert micro("0.0000001") is None
    assert micro("NaN") is None and micro("abc") is None and micro("inf") is None


# --- tampering with the stored ledger --------------------------------------------------------


def test_edited_amount_fails_at_that_entry(book):
    book.sql("UPDATE ledger_entries SET amount = amount + 1 WHERE seq = 3")
    assert_fails_at(book.audit(), 3, "hash does not match")


def test_edited_amount_with_matching_cached_balances_still_fails(book, people):
    """Fixing the cached balances to match does not hide an edited entry."""
    A, B = wallet_account(people["alice"].address), wallet_account(people["bob"].address)
    book.sql("UPDATE ledger_entries SET amount = amount + 1000000 WHERE seq = 3")
    book.sql("UPDATE ledger_accounts SET balance = balance - 1000000 WHERE name = :a", a=A)
    book.sql("UPDATE ledger_accounts SET balance = balance + 1000000 WHERE name = :b", b=B)
    assert_fails_at(book.audit(), 3, "hash does not match")


def test_edited_memo_fails_at_that_entry(book):
    book.sql("""UPDATE ledger_entries SET memo = '{"run": "run2", "round": 1}' WHERE seq = 5""")
    assert_fails_at(book.audit(), 5, "hash does not match")


def test_deleted_entry_fails_at_its_place(book):
    book.sql("DELETE FROM ledger_entries WHERE seq = 4")
    r = book.audit()
    assert_fails_at(r, 4, "out of sequence", "expected entry 4", "found entry 5")


def test_deleted_last_entry_fails_against_the_head(book):
    book.sql("DELETE FROM ledger_entries WHERE seq = 7")
    assert_fails_at(book.audit(), 7, "missing", "head is entry 7")


def test_entry_appended_past_the_head_fails(book, people):
    """An extra entry (even a validly signed one) the head row never recorded."""
    with Session(book.engine) as s:
        book.ledger.post(s, kind="mint", debit=MINT, credit=wallet_account(people["carol"].address), amount=AIT)
        s.commit()
    book.sql("UPDATE ledger_head SET seq = 7, hash = (SELECT hash FROM ledger_entries WHERE seq = 7)")
    assert_fails_at(book.audit(), 8, "not the ledger's recorded head")


def test_swapped_entries_fail_at_the_first_of_them(book):
    book.sql("UPDATE ledger_entries SET seq = -1 WHERE seq = 3")
    book.sql("UPDATE ledger_entries SET seq = 3 WHERE seq = 4")
    book.sql("UPDATE ledger_entries SET seq = 4 WHERE seq = -1")
    assert_fails_at(book.audit(), 3, "does not link")


def test_edited_cached_balance_fails_naming_the_account(book, people):
    B = wallet_account(people["bob"].address)
    book.sql("UPDATE ledger_accounts SET balance = balance + 1 WHERE name = :b", b=B)
    r = book.audit()
    assert_fails_at(r, None, "cached balance of " + B)


def test_cached_balance_of_an_unknown_account_fails(book):
    book.sql("INSERT INTO ledger_accounts (name, balance) VALUES ('wallet:ait1ghost', 5)")
    assert_fails_at(book.audit(), None, "wallet:ait1ghost")


def test_rehashed_chain_is_caught_by_the_next_coordinator_signature(book):
    """Someone who edits a request-signed entry and recomputes every hash after it still
    cannot re-sign the coordinator's next entry, whose signature covers the link."""
    entries, cached, head = book.read()
    entries[2]["memo"] = {"to": "someone else"}
    for i in range(2, len(entries)):
        if i > 2:
            entries[i]["prev_hash"] = entries[i - 1]["hash"]
        entries[i]["hash"] = entry_hash(entries[i])
    r = audit(entries, system_key=book.system.public_key)
    assert_fails_at(r, 5, "coordinator signature does not verify")


# --- forged entries (the coordinator itself, or whoever holds its database) -----------------


def test_request_entry_over_the_signed_amount_fails(book, people):
    alice, carol = people["alice"], people["carol"]
    seq = forge(
        book,
        kind="transfer",
        debit=wallet_account(alice.address),
        credit=wallet_account(carol.address),
        amount=5 * AIT + 1,
        request=signed(alice, {"to": carol.address, "amount": "5"}, "amount"),
    )
    assert_fails_at(book.audit(), seq, "exceeds", "'amount'")


def test_request_entry_at_the_signed_amount_passes(book, people):
    alice, carol = people["alice"], people["carol"]
    book.post(
        kind="transfer",
        debit=wallet_account(alice.address),
        credit=wallet_account(carol.address),
        amount=5 * AIT,
        request=signed(alice, {"to": carol.address, "amount": "5"}, "amount"),
    )
    assert book.audit().ok


def test_request_signed_entry_debiting_someone_elses_wallet_fails(book, people):
    alice, bob, mallory = people["alice"], people["bob"], people["mallory"]
    seq = forge(
        book,
        kind="transfer",
        debit=wallet_account(bob.address),
        credit=wallet_account(mallory.address),
        amount=AIT,
        request=signed(alice, {"to": mallory.address, "amount": "1"}, "amount"),
    )
    assert_fails_at(book.audit(), seq, f"signed by {alice.address} cannot debit wallet:{bob.address}")


def test_request_entry_crediting_another_than_the_signed_to_fails(book, people):
    alice, bob, mallory = people["alice"], people["bob"], people["mallory"]
    seq = forge(
        book,
        kind="transfer",
        debit=wallet_account(alice.address),
        credit=wallet_account(mallory.address),
        amount=AIT,
        request=signed(alice, {"to": bob.address, "amount": "1"}, "amount"),
    )
    assert_fails_at(book.audit(), seq, "sends to " + bob.address)


def test_request_about_a_run_may_only_credit_its_escrow(book, people):
    alice, mallory = people["alice"], people["mallory"]
    seq = forge(
        book,
        kind="escrow",
        debit=wallet_account(alice.address),
        credit=wallet_account(mallory.address),
        amount=AIT,
        request=signed(alice, {"rounds": 3}, None, "/v1/runs/run9/distribute"),
    )
    assert_fails_at(book.audit(), seq, "about run run9")


def test_run_request_crediting_its_escrow_passes(book, people):
    alice = people["alice"]
    book.post(
        kind="escrow",
        debit=wallet_account(alice.address),
        credit=escrow_account("run9"),
        amount=AIT,
        request=signed(alice, {"rounds": 3}, None, "/v1/runs/run9/distribute"),
    )
    assert book.audit().ok


def test_replayed_request_fails(book, people):
    alice, bob = people["alice"], people["bob"]
    req = signed(alice, {"to": bob.address, "amount": "2"}, "amount")
    kw = dict(kind="transfer", debit=wallet_account(alice.address), credit=wallet_account(bob.address), amount=2 * AIT)
    book.post(**kw, request=req)
    seq = forge(book, **kw, request=req, refused_as="duplicate")
    assert_fails_at(book.audit(), seq, "replays the signed request that authorised entry 8")


def test_a_nonce_reused_in_a_new_request_is_not_a_replay(book, people):
    """Clients pick nonces; the server forgets them after its window. A new request
    (another timestamp) with an old nonce is a new authorisation."""
    alice, bob = people["alice"], people["bob"]
    kw = dict(kind="transfer", debit=wallet_account(alice.address), credit=wallet_account(bob.address), amount=AIT)
    first = signed(alice, {"to": bob.address, "amount": "1"}, "amount", nonce="ab" * 16)
    book.post(**kw, request=first)
    second = signed(alice, {"to": bob.address, "amount": "1"}, "amount", nonce="ab" * 16)
    if second.timestamp == first.timestamp:  # same millisecond: make it a different request
        second = signed(alice, {"to": bob.address, "amount": "1.0"}, "amount", nonce="ab" * 16)
    book.post(**kw, request=second)
    assert book.audit().ok


def test_a_providers_max_bond_covers_each_of_its_bonds(book, people):
    """A worker's signed registration (max_bond) is a standing limit: one per contract."""
    bob = people["bob"]
    reg = signed(bob, {"gpu": "RTX4090", "price": "1", "max_bond": "4"}, "max_bond", "/v1/workers")
    for c in ("c1", "c2"):
        book.post(
            kind="bond",
            debit=wallet_account(bob.address),
            credit=f"bond:{c}",
            amount=4 * AIT,
            key=f"bond:{c}",
            request=reg,
        )
    assert book.audit().ok
    seq = forge(
        book,
        kind="bond",
        debit=wallet_account(bob.address),
        credit="bond:c3",
        amount=4 * AIT + 1,
        key="bond:c3",
        request=reg,
    )
    assert_fails_at(book.audit(), seq, "'max_bond'")


def test_request_with_an_edited_body_fails(book, people):
    alice, bob = people["alice"], people["bob"]
    req = signed(alice, {"to": bob.address, "amount": "1"}, "amount")
    forged = dataclasses.replace(req, body=json.dumps({"to": bob.address, "amount": "90"}))
    seq = forge(
        book,
        kind="transfer",
        debit=wallet_account(alice.address),
        credit=wallet_account(bob.address),
        amount=90 * AIT,
        request=forged,
    )
    assert_fails_at(book.audit(), seq, "request signature does not verify")


def test_mint_not_signed_by_the_system_key_fails(book, people):
    rogue = Ledger(people["mallory"])
    seq = book.post(rogue, kind="mint", debit=MINT, credit=wallet_account(people["mallory"].address), amount=AIT)
    assert_fails_at(book.audit(), seq, "not the coordinator's key")
    # Without the system key pinned, any self-signed mint would pass: the key must come
    # from somewhere trusted (the CLI insists on one).
    assert book.audit(system_key=None).ok


def test_mint_authorised_by_a_request_fails(book, people):
    mallory = people["mallory"]
    seq = forge(
        book,
        kind="mint",
        debit=MINT,
        credit=wallet_account(mallory.address),
        amount=AIT,
        request=signed(mallory, {"amount": "1"}, "amount", "/v1/wallets/fund"),
    )
    assert_fails_at(book.audit(), seq, "cannot debit mint:local")


def test_the_coordinator_cannot_debit_a_wallet(book, people):
    """The coordinator's own signature moves money out of faucets, escrows and bonds only."""
    seq = forge(
        book,
        kind="settle",
        debit=wallet_account(people["alice"].address),
        credit=wallet_account(people["mallory"].address),
        amount=AIT,
    )
    assert_fails_at(book.audit(), seq, "without its owner's signed request")


def test_overdraft_written_behind_the_ledgers_back_fails(book, people):
    """An entry spending more than the wallet held, written past ``post``'s check."""
    entries, _, _ = book.read()
    alice, carol = people["alice"], people["carol"]
    have = audit(entries).balances[wallet_account(alice.address)]
    req = signed(alice, {"to": carol.address, "amount": str(have // AIT + 1)}, "amount")
    e = {
        "seq": 8,
        "prev_hash": entries[-1]["hash"],
        "network": "local",
        "kind": "transfer",
        "debit": wallet_account(alice.address),
        "credit": wallet_account(carol.address),
        "amount": have + 1,
        "memo": {},
        "key": None,
        "signer": alice.public_key,
        "auth": req.as_auth(),
        "created_at": 1.0,
        "signature": req.signature,
    }
    e["hash"] = entry_hash(e)
    assert_fails_at(audit([*entries, e], system_key=book.system.public_key), 8, "overdraws")


@pytest.mark.parametrize("amount", [0, -5, 1.5, True, "7"])
def test_non_positive_or_non_integer_amount_written_behind_the_ledgers_back_fails(book, amount):
    entries, _, _ = book.read()
    e = {
        "seq": 8,
        "prev_hash": entries[-1]["hash"],
        "network": "local",
        "kind": "mint",
        "debit": MINT,
        "credit": "wallet:x",
        "amount": amount,
        "memo": {},
        "key": None,
        "signer": book.system.public_key,
        "auth": {"type": "entry"},
        "created_at": 1.0,
    }
    e["signature"] = book.system.sign(signed_content(e))
    e["hash"] = entry_hash(e)
    assert_fails_at(audit([*entries, e], system_key=book.system.public_key), 8, "not a positive integer")


def test_malformed_entry_fails_without_a_traceback(book):
    entries, _, _ = book.read()
    del entries[1]["auth"]
    assert_fails_at(audit(entries), 2, "malformed entry")


# --- money mirrored from an EVM chain -------------------------------------------------------


def test_chain_mirrors_out_of_the_mint_pass(book):
    """A coordinator on an EVM chain records a run's deposit and a contract's bond as the
    chain shows them: out of the mint, signed by itself, into the escrow and the bond."""
    book.post(
        kind="chain-deposit", debit=MINT, credit=escrow_account("run2"), amount=8 * AIT, key="chain-deposit:run2:8"
    )
    book.post(kind="chain-bond", debit=MINT, credit="bond:c2", amount=2 * AIT, key="chain-bond:c2")
    r = book.audit()
    assert r.ok, r.describe()
    assert (r.balances[escrow_account("run2")], r.balances["bond:c2"]) == (8 * AIT, 2 * AIT)


def test_a_chain_mirror_into_a_wallet_fails(book, people):
    seq = forge(book, kind="chain-deposit", debit=MINT, credit=wallet_account(people["mallory"].address), amount=AIT)
    assert_fails_at(book.audit(), seq, "credits an escrow account, not wallet:")


def test_a_chain_bond_out_of_an_escrow_fails(book):
    book.post(
        kind="chain-deposit", debit=MINT, credit=escrow_account("run2"), amount=8 * AIT, key="chain-deposit:run2:8"
    )
    seq = forge(book, kind="chain-bond", debit=escrow_account("run2"), credit="bond:c2", amount=AIT)
    assert_fails_at(book.audit(), seq, "comes out of the mint, not out of escrow:run2")


def test_a_chain_deposit_by_a_signed_request_fails(book, people):
    alice = people["alice"]
    seq = forge(
        book,
        kind="chain-deposit",
        debit=wallet_account(alice.address),
        credit=escrow_account("run2"),
        amount=AIT,
        request=signed(alice, {"budget": "1"}, "budget", "/v1/runs/run2/distribute"),
    )
    assert_fails_at(book.audit(), seq, "only the coordinator records one")
