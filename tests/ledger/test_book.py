"""``Ledger.post`` against a real database (SQLite, or PostgreSQL with ``AITBC_TEST_DB``): what it refuses (and that a refusal writes
nothing), the networks, exactly-once keys, conservation over many random postings, and
concurrent posters never forking the chain."""

from __future__ import annotations

import json
import random
import threading

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from aitbc.ledger.book import Head, Ledger, LedgerBase, LedgerError, RequestAuth, check_network
from aitbc.ledger.chain import audit, bond_account, escrow_account, mint_account, wallet_account
from aitbc.ledger.signing import HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP, sign_request
from aitbc.ledger.wallet import Wallet

AIT = 1_000_000
MINT = mint_account("local")


def signed(wallet: Wallet, body: dict, field: str | None, path: str = "/v1/wallets/send") -> RequestAuth:
    data = json.dumps(body).encode()
    h = sign_request(wallet, "POST", path, data)
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


@pytest.fixture(scope="module")
def system() -> Wallet:
    return Wallet.generate("coordinator")


@pytest.fixture(scope="module")
def alice() -> Wallet:
    return Wallet.generate("alice")


@pytest.fixture
def engine(db_url):
    """A new database of the backend under test holding the ledger's tables."""
    e = create_engine(db_url, **({"connect_args": {"timeout": 30}} if db_url.startswith("sqlite") else {}))
    LedgerBase.metadata.create_all(e)
    yield e
    e.dispose()


def post(engine, ledger: Ledger, **kw) -> int:
    with Session(engine) as s:
        e = ledger.post(s, **kw)
        s.commit()
        return e.seq


def state(engine) -> dict:
    """Every row of the three ledger tables."""
    with engine.connect() as conn:
        return {
            t: sorted(tuple(r) for r in conn.execute(text(f"SELECT * FROM {t}")))
            for t in ("ledger_entries", "ledger_accounts", "ledger_head")
        }


def check(engine, system: Wallet):
    with Session(engine) as s:
        h = s.get(Head, 1)
        return audit(
            [e.as_dict() for e in Ledger.entries(s)],
            system_key=system.public_key,
            cached=Ledger.cached_balances(s),
            head=(h.seq, h.hash) if h else (0, None),
        )


# --- refusals: nothing written ------------------------------------------------------------------


@pytest.mark.parametrize("amount", [0, -1, -5 * AIT, 1.5, 2.0, True, False, "5", None])
def test_bad_amounts_are_refused_with_no_write(engine, system, alice, amount):
    ledger = Ledger(system)
    post(engine, ledger, kind="mint", debit=MINT, credit=wallet_account(alice.address), amount=10 * AIT)
    before = state(engine)
    with Session(engine) as s:
        with pytest.raises(LedgerError) as e:
            ledger.post(s, kind="mint", debit=MINT, credit=wallet_account(alice.address), amount=amount)
        s.commit()  # even committing what is left writes nothing
    assert e.value.code == "bad_amount"
    assert "positive whole number of micro-AIT" in e.value.detail
    assert state(engine) == before


def test_overdraft_is_refused_with_no_write(engine, system, alice):
    ledger = Ledger(system)
    A = wallet_account(alice.address)
    post(engine, ledger, kind="mint", debit=MINT, credit=A, amount=3 * AIT)
    before = state(engine)
    with Session(engine) as s, pytest.raises(LedgerError) as e:
        ledger.post(
            s,
            kind="transfer",
            debit=A,
            credit="wallet:ait1other",
            amount=3 * AIT + 1,
            request=signed(alice, {"to": "ait1other", "amount": "4"}, "amount"),
        )
    assert e.value.code == "insufficient_funds"
    assert f"{A} holds {3 * AIT} micro-AIT; {3 * AIT + 1} needed" == e.value.detail
    assert state(engine) == before
    # Exactly the balance is fine.
    post(
        engine,
        ledger,
        kind="transfer",
        debit=A,
        credit="wallet:ait1other",
        amount=3 * AIT,
        request=signed(alice, {"to": "ait1other", "amount": "3"}, "amount"),
    )
    assert check(engine, system).ok


def test_overdraft_from_escrow_and_bond_is_refused(engine, system):
    ledger = Ledger(system)
    for debit in (escrow_account("run1"), bond_account("c1")):
        with Session(engine) as s, pytest.raises(LedgerError) as e:
            ledger.post(s, kind="settle", debit=debit, credit="wallet:ait1w", amount=1)
        assert e.value.code == "insufficient_funds"
    assert state(engine) == {"ledger_entries": [], "ledger_accounts": [], "ledger_head": []}


def test_first_post_refused_leaves_no_head_row(engine, system, alice):
    """The head row is created by the first post; a refused first post rolls it back."""
    with Session(engine) as s, pytest.raises(LedgerError):
        Ledger(system).post(s, kind="transfer", debit=wallet_account(alice.address), credit="wallet:ait1b", amount=1)
    assert state(engine)["ledger_head"] == []


def test_duplicate_key_is_refused_with_no_write(engine, system, alice):
    ledger = Ledger(system)
    kw = dict(kind="settle", debit=MINT, credit=wallet_account(alice.address), amount=AIT, key="settle:X:1")
    assert post(engine, ledger, **kw) == 1
    before = state(engine)
    with Session(engine) as s, pytest.raises(LedgerError) as e:
        ledger.post(s, **kw)
    assert e.value.code == "duplicate"
    assert "settle:X:1" in e.value.detail
    assert state(engine) == before
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM ledger_entries WHERE key = 'settle:X:1'")) == 1


def test_duplicate_key_in_the_same_transaction_is_refused(engine, system, alice):
    ledger = Ledger(system)
    with Session(engine) as s:
        ledger.post(s, kind="mint", debit=MINT, credit=wallet_account(alice.address), amount=AIT, key="k")
        with pytest.raises(LedgerError) as e:
            ledger.post(s, kind="mint", debit=MINT, credit=wallet_account(alice.address), amount=AIT, key="k")
        assert e.value.code == "duplicate"
        s.commit()
    assert len(state(engine)["ledger_entries"]) == 1
    assert check(engine, system).ok


def test_debit_equal_credit_is_refused(engine, system, alice):
    A = wallet_account(alice.address)
    with Session(engine) as s, pytest.raises(LedgerError) as e:
        Ledger(system).post(s, kind="transfer", debit=A, credit=A, amount=1)
    assert e.value.code == "bad_amount" and "to itself" in e.value.detail
    assert state(engine)["ledger_entries"] == []


def test_networks():
    assert check_network("local") == "local"
    for name in ("mainnet", "testnet"):
        with pytest.raises(LedgerError) as e:
            check_network(name)
        assert e.value.code == "bad_network"
        assert f"network {name!r} is not available" in e.value.detail and "--network local" in e.value.detail
    for name in ("Local", "devnet", ""):
        with pytest.raises(LedgerError) as e:
            check_network(name)
        assert e.value.code == "bad_network" and "unknown network" in e.value.detail


def test_a_ledger_on_a_refused_network_cannot_be_made(system):
    with pytest.raises(LedgerError):
        Ledger(system, "mainnet")


# --- entries ------------------------------------------------------------------------------------


def test_entries_chain_and_balances(engine, system, alice):
    ledger = Ledger(system)
    A = wallet_account(alice.address)
    post(engine, ledger, kind="mint", debit=MINT, credit=A, amount=10 * AIT, memo={"faucet": True}, now=1000.0)
    post(
        engine,
        ledger,
        kind="escrow",
        debit=A,
        credit=escrow_account("r"),
        amount=4 * AIT,
        key="escrow:r:0",
        request=signed(alice, {"budget": "4"}, "budget", "/v1/runs"),
    )
    with Session(engine) as s:
        e1, e2 = Ledger.entries(s)
        assert (e1.seq, e1.prev_hash, e1.created_at, e1.signer) == (1, "0" * 64, 1000.0, system.public_key)
        assert (e2.seq, e2.prev_hash, e2.signer, e2.auth["type"], e2.auth["field"]) == (
            2,
            e1.hash,
            alice.public_key,
            "request",
            "budget",
        )
        assert s.get(Head, 1).hash == e2.hash
        assert Ledger.balance(s, A) == 6 * AIT
        assert Ledger.balance(s, escrow_account("r")) == 4 * AIT
        assert Ledger.balance(s, "wallet:nobody") == 0
        assert Ledger.cached_balances(s) == {MINT: -10 * AIT, A: 6 * AIT, escrow_account("r"): 4 * AIT}
        assert [e.seq for e in Ledger.entries(s, account=A)] == [1, 2]
        assert [e.seq for e in Ledger.entries(s, after=1)] == [2]
        assert [e.seq for e in Ledger.entries(s, limit=1)] == [1]
        assert Ledger.has_key(s, "escrow:r:0") and not Ledger.has_key(s, "escrow:r:1")
    assert check(engine, system).ok


def test_conservation_over_many_random_postings(engine, system):
    """Mints, transfers, escrows, settlements, bonds, slashes and refunds at random (some
    refused): afterwards the audit passes and what is held sums to what was minted."""
    rng = random.Random(20261129)
    ledger = Ledger(system)
    people = [Wallet.generate(f"p{i}") for i in range(4)]
    wallets = [wallet_account(p.address) for p in people]
    pots = [escrow_account("r1"), escrow_account("r2"), bond_account("c1")]
    refused = 0
    for i in range(150):
        op = rng.random()
        amount = rng.randint(1, 30 * AIT)
        who = rng.randrange(len(people))
        try:
            if op < 0.2:
                post(engine, ledger, kind="mint", debit=MINT, credit=wallets[who], amount=amount)
            elif op < 0.55:
                to = people[(who + rng.randrange(1, len(people))) % len(people)].address
                body = {"to": to, "amount": f"{amount / AIT:.6f}"}
                post(
                    engine,
                    ledger,
                    kind="transfer",
                    debit=wallets[who],
                    credit=wallet_account(to),
                    amount=amount,
                    request=signed(people[who], body, "amount"),
                )
            elif op < 0.75:
                pot = rng.choice(pots)
                body = {"budget": f"{amount / AIT:.6f}"}
                post(
                    engine,
                    ledger,
                    kind="escrow",
                    debit=wallets[who],
                    credit=pot,
                    amount=amount,
                    request=signed(people[who], body, "budget", "/v1/runs"),
                )
            else:
                pot = rng.choice(pots)
                post(
                    engine,
                    ledger,
                    kind=rng.choice(["settle", "refund", "slash"]),
                    debit=pot,
                    credit=rng.choice(wallets + pots),
                    amount=amount,
                    key=f"k{i}",
                )
        except LedgerError as e:
            assert e.code in ("insufficient_funds", "bad_amount"), e
            refused += 1
    r = check(engine, system)
    assert r.ok, r.describe()
    assert refused > 0 and r.entries == 150 - refused
    held = sum(v for k, v in r.balances.items() if not k.startswith("mint:"))
    assert held == r.minted == -r.balances[MINT]
    assert all(v >= 0 for k, v in r.balances.items() if not k.startswith("mint:"))


def test_concurrent_posters_never_fork_the_chain(engine, system):
    """Two threads posting at once: one chain, every sequence number once, balances exact."""
    ledger = Ledger(system)
    errors: list[BaseException] = []

    def poster(name: str) -> None:
        try:
            for i in range(25):
                post(engine, ledger, kind="mint", debit=MINT, credit=f"wallet:{name}", amount=i + 1, key=f"{name}:{i}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=poster, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    r = check(engine, system)
    assert r.ok, r.describe()
    assert r.entries == 50
    assert r.balances["wallet:a"] == r.balances["wallet:b"] == sum(range(1, 26))


def test_entries_their_authorisation_does_not_cover_are_refused_with_no_write(engine, system, alice):
    """What the audit would refuse, ``post`` refuses first: the ledger is append-only."""
    ledger = Ledger(system)
    bob = Wallet.generate("bob")
    A, B = wallet_account(alice.address), wallet_account(bob.address)
    for w in (A, B):
        post(engine, ledger, kind="mint", debit=MINT, credit=w, amount=10 * AIT)
    before = state(engine)
    cases = [
        (
            dict(debit=B, credit=A, amount=AIT, request=signed(alice, {"to": alice.address, "amount": "1"}, "amount")),
            f"cannot debit {B}",
        ),
        (
            dict(
                debit=A, credit=B, amount=AIT + 1, request=signed(alice, {"to": bob.address, "amount": "1"}, "amount")
            ),
            "exceeds",
        ),
        (
            dict(
                debit=A,
                credit="wallet:ait1x",
                amount=AIT,
                request=signed(alice, {"to": bob.address, "amount": "1"}, "amount"),
            ),
            "sends to",
        ),
        (dict(debit=A, credit=B, amount=AIT), "without its owner's signed request"),
        (
            dict(debit=MINT, credit=A, amount=AIT, request=signed(alice, {"amount": "1"}, "amount")),
            "cannot debit mint:",
        ),
    ]
    for kw, words in cases:
        with Session(engine) as s, pytest.raises(LedgerError) as e:
            ledger.post(s, kind="transfer", **kw)
        assert e.value.code == "unauthorised" and words in e.value.detail, e.value.detail
    assert state(engine) == before


def test_a_signed_request_authorises_one_entry(engine, system, alice):
    ledger = Ledger(system)
    A = wallet_account(alice.address)
    post(engine, ledger, kind="mint", debit=MINT, credit=A, amount=10 * AIT)
    req = signed(alice, {"to": "ait1b", "amount": "1"}, "amount")
    assert post(engine, ledger, kind="transfer", debit=A, credit="wallet:ait1b", amount=AIT, request=req) == 2
    before = state(engine)
    with Session(engine) as s, pytest.raises(LedgerError) as e:
        ledger.post(s, kind="transfer", debit=A, credit="wallet:ait1b", amount=AIT, request=req)
    assert e.value.code == "duplicate" and "already authorised entry 2" in e.value.detail
    assert state(engine) == before
    # A provider's registration (max_bond) stands for each of its bonds.
    reg = signed(alice, {"gpu": "RTX4090", "max_bond": "2"}, "max_bond", "/v1/workers")
    for c in ("c1", "c2"):
        post(engine, ledger, kind="bond", debit=A, credit=bond_account(c), amount=2 * AIT, key=f"bond:{c}", request=reg)
    assert check(engine, system).ok
