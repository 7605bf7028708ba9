"""Money through the API of a real coordinator: the faucet, transfers, balances, history,
the public ledger (paged entries, cached balances, head) and its audit, escrow at run
creation, and who may pay or refund. Every refusal is the JSON error shape and writes no
ledger entry."""

from __future__ import annotations

import json

import pytest

from aitbc.client import ApiError
from aitbc.ledger.book import LedgerError
from aitbc.ledger.chain import audit, escrow_account, mint_account, wallet_account
from aitbc.ledger.wallet import Wallet

AIT = 1_000_000
RUN_BODY = {"model_type": "mlp", "model_options": {"hidden": [8]}, "dataset_size": "1GB", "target_workers": 1}


def ledger_rows(coord) -> list[dict]:
    return coord.rows("SELECT * FROM ledger_entries ORDER BY seq")


def ledger_state(coord) -> tuple:
    return (
        ledger_rows(coord),
        coord.rows("SELECT * FROM ledger_accounts ORDER BY name"),
        coord.rows("SELECT * FROM ledger_head"),
    )


def funded(coord, name: str, amount: str):
    c = coord.client(name)
    c.post("/wallets/fund", {"amount": amount})
    return c


def api_audit(coord):
    """The audit as any outsider would run it: everything from the public API."""
    with coord.http() as h:
        info = h.get("/v1/ledger").json()
        entries, after = [], 0
        while after is not None:
            page = h.get("/v1/ledger/entries", params={"after": after, "limit": 3}).json()
            entries += page["data"]
            after = page["next"]
        cached = h.get("/v1/ledger/balances").json()["data"]
    return audit(entries, system_key=info["system_key"], cached=cached, head=(info["entries"], info["head"]))


# --- the faucet ---------------------------------------------------------------------------------


def test_fund_mints_into_the_signers_wallet(server):
    c = server.client("fund-ok")
    res = c.post("/wallets/fund", {"amount": "12.5"})
    assert res["address"] == c.wallet.address and res["amount"] == "12.5" and res["balance"] == "12.5"
    e = server.rows("SELECT * FROM ledger_entries WHERE seq = :s", s=res["entry"])[0]
    assert (e["kind"], e["debit"], e["credit"], e["amount"]) == (
        "mint",
        mint_account("local"),
        wallet_account(c.wallet.address),
        12_500_000,
    )
    res = c.post("/wallets/fund", {"amount": 0.5})  # a JSON number is taken too, exactly
    assert res["balance"] == "13"
    assert c.get(f"/wallets/{c.wallet.address}/balance") == {
        "address": c.wallet.address,
        "network": "local",
        "balance": "13",
        "balance_micro": 13 * AIT,
    }


@pytest.mark.parametrize(
    "body, status, code, words",
    [
        ({"amount": "0"}, 422, "bad_amount", ["more than 0"]),
        ({"amount": "-1"}, 422, "bad_amount", ["must be more than 0 AIT; got -1"]),
        ({"amount": "0.0000001"}, 422, "bad_price", ["more than 6 decimals"]),
        ({"amount": "1e-7"}, 422, "bad_price", ["more than 6 decimals"]),
        ({"amount": "ten"}, 422, "bad_price", ["not a number"]),
        ({"amount": True}, 422, "invalid_request", ["amount"]),
        ({"amount": "2000000"}, 422, "bad_amount", ["more than 0 and at most 1000000 AIT; got 2000000"]),
        ({"amount": "1", "network": "mainnet"}, 422, "bad_network", ["'mainnet' is not available", "--network local"]),
        ({"amount": "1", "network": "testnet"}, 422, "bad_network", ["'testnet' is not available"]),
        ({"amount": "1", "network": "devnet"}, 422, "bad_network", ["unknown network 'devnet'"]),
        ({}, 422, "invalid_request", ["amount"]),
    ],
)
def test_fund_refusals_write_nothing(server, api, body, status, code, words):
    before = ledger_state(server)
    with server.http() as h:
        api.assert_error(api.signed_post(h, Wallet.generate("f"), "/v1/wallets/fund", body), status, code, *words)
    assert ledger_state(server) == before


def test_unsigned_fund_is_refused(server, api):
    before = ledger_state(server)
    with server.http() as h:
        api.assert_error(h.post("/v1/wallets/fund", json={"amount": "1"}), 401, "missing_signature")
    assert ledger_state(server) == before


# --- transfers ------------------------------------------------------------------------------------


def test_send_moves_money_signed_by_the_sender(server):
    alice, bob = funded(server, "send-a", "10"), server.client("send-b")
    res = alice.post("/wallets/send", {"to": bob.wallet.address, "amount": "2.25"})
    assert res == {
        "from": alice.wallet.address,
        "to": bob.wallet.address,
        "amount": "2.25",
        "entry": res["entry"],
        "balance": "7.75",
    }
    assert bob.get(f"/wallets/{bob.wallet.address}/balance")["balance_micro"] == 2_250_000
    e = server.rows("SELECT * FROM ledger_entries WHERE seq = :s", s=res["entry"])[0]
    assert e["kind"] == "transfer" and e["signer"] == alice.wallet.public_key
    auth = e["auth"] if isinstance(e["auth"], dict) else json.loads(e["auth"])  # PostgreSQL's JSON reads as a dict
    assert auth["field"] == "amount"
    assert api_audit(server).ok


def test_send_refusals_write_nothing(server, api):
    alice, bob = funded(server, "send-ref-a", "3"), server.client("send-ref-b")
    to = bob.wallet.address
    cases = [
        (
            {"to": to, "amount": "3.000001"},
            409,
            "insufficient_funds",
            [f"wallet {alice.wallet.address} holds 3 AIT", "3.000001 AIT needed", "aitbc wallet fund WALLET 0.000001"],
        ),
        ({"to": to, "amount": "0"}, 422, "bad_amount", ["more than 0"]),
        ({"to": to, "amount": "-1"}, 422, "bad_amount", ["must be more than 0 AIT; got -1"]),
        ({"to": to, "amount": "0.0000001"}, 422, "bad_price", ["more than 6 decimals"]),
        ({"to": to, "amount": "1.5.0"}, 422, "bad_price", []),
        ({"to": "ait1xyz", "amount": "1"}, 422, "bad_address", ["'ait1xyz' is not a wallet address"]),
        ({"to": "bob", "amount": "1"}, 422, "bad_address", []),
        ({"to": to.upper(), "amount": "1"}, 422, "bad_address", []),
        ({"to": alice.wallet.address, "amount": "1"}, 422, "bad_address", ["same wallet"]),
        ({"to": to, "amount": "1", "network": "mainnet"}, 422, "bad_network", ["not available"]),
        ({"to": to, "amount": "1", "network": "testnet"}, 422, "bad_network", ["not available"]),
        ({"amount": "1"}, 422, "invalid_request", ["to"]),
    ]
    before = ledger_state(server)
    with server.http() as h:
        for body, status, code, words in cases:
            api.assert_error(api.signed_post(h, alice.wallet, "/v1/wallets/send", body), status, code, *words)
    assert ledger_state(server) == before
    with pytest.raises(ApiError) as e:  # a wallet nobody funded
        server.client("send-ref-empty").post("/wallets/send", {"to": to, "amount": "1"})
    api.assert_api_error(e, 409, "insufficient_funds", "holds 0 AIT")
    assert ledger_state(server) == before


# --- reading: balances, history, the ledger ----------------------------------------------------


def test_balance_and_history(server, api):
    alice, bob = funded(server, "hist-a", "5"), server.client("hist-b")
    for amount in ("1", "0.5", "0.25"):
        alice.post("/wallets/send", {"to": bob.wallet.address, "amount": amount})
    with server.http() as h:
        hist = h.get(f"/v1/wallets/{alice.wallet.address}/history").json()
        assert hist["count"] == 4
        assert [e["kind"] for e in hist["data"]] == ["mint", "transfer", "transfer", "transfer"]
        assert [e["amount_ait"] for e in hist["data"]] == ["5", "1", "0.5", "0.25"]
        seqs = [e["seq"] for e in hist["data"]]
        assert seqs == sorted(seqs)
        last2 = h.get(f"/v1/wallets/{alice.wallet.address}/history", params={"limit": 2}).json()
        assert [e["seq"] for e in last2["data"]] == seqs[-2:]  # the newest, oldest first
        assert h.get(f"/v1/wallets/{bob.wallet.address}/balance").json()["balance"] == "1.75"
        nobody = Wallet.generate("n").address
        assert h.get(f"/v1/wallets/{nobody}/balance").json()["balance_micro"] == 0
        assert h.get(f"/v1/wallets/{nobody}/history").json() == {"data": [], "count": 0}
        api.assert_error(h.get("/v1/wallets/not-an-address/balance"), 422, "bad_address")
        api.assert_error(h.get("/v1/wallets/ait1zz/history"), 422, "bad_address")
        api.assert_error(h.get(f"/v1/wallets/{nobody}/history", params={"limit": 0}), 422, "invalid_request", "limit")


def test_ledger_info_pages_and_balances(server, api):
    funded(server, "pages", "1")
    with server.http() as h:
        info = h.get("/v1/ledger").json()
        assert info["network"] == "local"
        assert info["system_key"] == server.ctx.ledger.system.public_key
        rows = ledger_rows(server)
        assert info["entries"] == len(rows) == info["stored"] and info["head"] == rows[-1]["hash"]
        seen, after, pages = [], 0, 0
        while after is not None:
            page = h.get("/v1/ledger/entries", params={"after": after, "limit": 2}).json()
            assert page["count"] == len(page["data"]) <= 2
            seen += page["data"]
            after, pages = page["next"], pages + 1
        assert [e["seq"] for e in seen] == [r["seq"] for r in rows]
        assert pages >= len(rows) // 2
        assert all(e["amount_ait"] for e in seen)
        cached = h.get("/v1/ledger/balances").json()
        assert cached["count"] == len(cached["data"])
        assert sum(cached["data"].values()) == 0  # every entry has two legs
        api.assert_error(h.get("/v1/ledger/entries", params={"limit": 0}), 422, "invalid_request")
        api.assert_error(h.get("/v1/ledger/entries", params={"after": -1}), 422, "invalid_request")
    r = api_audit(server)
    assert r.ok, r.describe()
    assert r.minted == -cached["data"][mint_account("local")]


# --- runs: escrow, payments, refunds ------------------------------------------------------------


def test_budget_from_an_unfunded_wallet_is_refused_and_writes_nothing(server, api):
    owner = server.client("escrow-poor")
    before = ledger_state(server)
    with pytest.raises(ApiError) as e:
        owner.post("/runs", {**RUN_BODY, "budget": "50"})
    api.assert_api_error(
        e,
        409,
        "insufficient_funds",
        f"wallet {owner.wallet.address} holds 0 AIT",
        "50 AIT needed",
        "aitbc wallet fund WALLET 50",
    )
    assert server.rows("SELECT id FROM runs WHERE owner = :o", o=owner.wallet.address) == []
    assert ledger_state(server) == before
    owner.post("/wallets/fund", {"amount": "20"})  # still short: says by how much
    with pytest.raises(ApiError) as e:
        owner.post("/runs", {**RUN_BODY, "budget": "50"})
    api.assert_api_error(e, 409, "insufficient_funds", "holds 20 AIT", "aitbc wallet fund WALLET 30")
    assert server.rows("SELECT id FROM runs WHERE owner = :o", o=owner.wallet.address) == []


def test_budget_from_a_funded_wallet_is_escrowed(server):
    owner = funded(server, "escrow-rich", "60")
    run_id = owner.post("/runs", {**RUN_BODY, "budget": "50"})["training_id"]
    assert server.rows("SELECT id FROM runs WHERE owner = :o", o=owner.wallet.address) == [{"id": run_id}]
    e = ledger_rows(server)[-1]
    assert (e["kind"], e["debit"], e["credit"], e["amount"], e["key"], e["signer"]) == (
        "escrow",
        wallet_account(owner.wallet.address),
        escrow_account(run_id),
        50 * AIT,
        f"escrow:{run_id}:0",
        owner.wallet.public_key,
    )
    assert owner.get(f"/wallets/{owner.wallet.address}/balance")["balance"] == "10"
    assert owner.get(f"/runs/{run_id}/payments")["escrow_balance"] == "50"
    assert api_audit(server).ok


@pytest.fixture(scope="module")
def budget_run(server):
    owner = funded(server, "pay-owner", "30")
    return owner, owner.post("/runs", {**RUN_BODY, "budget": "25"})["training_id"]


def test_payment_signed_by_anyone_but_the_owner_is_forbidden(server, api, budget_run):
    _, run_id = budget_run
    before = ledger_state(server)
    with pytest.raises(ApiError) as e:
        funded(server, "pay-mallory", "1").post(f"/runs/{run_id}/payments", {"contract_id": "c", "amount": "1"})
    api.assert_api_error(e, 403, "forbidden", f"run {run_id} belongs to")
    before = (before[0] + ledger_rows(server)[len(before[0]) :], *before[1:])  # mallory's own faucet mint
    assert ledger_rows(server) == before[0]
    with pytest.raises(ApiError) as e:
        server.client("pay-stranger").post(f"/runs/{run_id}/refund", {})
    api.assert_api_error(e, 403, "forbidden")
    assert ledger_rows(server) == before[0]


def test_owner_payment_to_an_unknown_contract_is_refused(server, api, budget_run):
    owner, run_id = budget_run
    before = ledger_state(server)
    with pytest.raises(ApiError) as e:
        owner.post(f"/runs/{run_id}/payments", {"contract_id": "contract_nope", "amount": "1"})
    api.assert_api_error(e, 404, "unknown_contract")
    assert ledger_state(server) == before


def test_refund_of_a_run_that_has_not_ended_is_refused(server, api, budget_run):
    owner, run_id = budget_run
    before = ledger_state(server)
    with pytest.raises(ApiError) as e:
        owner.post(f"/runs/{run_id}/refund", {})
    api.assert_api_error(e, 409, "bad_state", "stop it first")
    assert ledger_state(server) == before


def test_refund_after_stop_returns_the_escrow_exactly_once(server, api, budget_run):
    owner, run_id = budget_run
    owner.post(f"/runs/{run_id}/stop", {})
    first = owner.post(f"/runs/{run_id}/refund", {})
    assert first["escrow_balance"] == "0"
    again = owner.post(f"/runs/{run_id}/refund", {})
    assert again["escrow_balance"] == "0" and again["finalized"] is True
    refunds = server.rows("SELECT * FROM ledger_entries WHERE key = :k", k=f"refund:{run_id}")
    assert len(refunds) == 1 and refunds[0]["amount"] == 25 * AIT
    assert refunds[0]["credit"] == wallet_account(owner.wallet.address)
    assert owner.get(f"/wallets/{owner.wallet.address}/balance")["balance"] == "30"
    assert api_audit(server).ok


def test_settling_twice_is_impossible(server):
    """The ledger key of a settlement is written once, ever: the second post is refused."""
    ctx = server.ctx
    owner = funded(server, "settle-owner", "5")
    run_id = owner.post("/runs", {**RUN_BODY, "budget": "4"})["training_id"]
    worker = wallet_account(Wallet.generate("settle-w").address)
    kw = dict(kind="settle", debit=escrow_account(run_id), credit=worker, amount=AIT, key=f"settle:{run_id}:1")
    with ctx.session() as s:
        ctx.ledger.post(s, **kw)
        s.commit()
    with ctx.session() as s:
        with pytest.raises(LedgerError) as e:
            ctx.ledger.post(s, **kw)
        s.rollback()
    assert e.value.code == "duplicate"
    assert len(server.rows("SELECT seq FROM ledger_entries WHERE key = :k", k=f"settle:{run_id}:1")) == 1
    assert ctx.ledger.balance(ctx.session(), worker) == AIT
    assert api_audit(server).ok
