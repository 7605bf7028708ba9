"""Fair exchange between an owner and its providers (issue 33, part 2), and hiring that
cannot hold the market without money (part 5).

- An accepted update is paid whatever the owner does next: a run stopped, failed or
  paused too long before its round closed pays each delivered update the contract's full
  price, once (``settle:<contract>:<round>``), before the escrow goes back; a manual
  run's owner who stops without paying has it paid from escrow at the refund.
- Every run has a round deadline (``run_defaults.DEADLINE`` unless the owner gave one): a
  job that sent nothing for its round within it loses its place (failed, flagged
  ``straggler``), whether the round then closes with the quorum or still waits.
- Hiring checks the owner's money first: an owner who cannot pay hires nobody (409
  ``insufficient_funds`` naming the shortfall, nothing written, no bond locked), one
  wallet cannot back hires on many runs, and hires of a run that never distributes
  expire with their bonds returned.
"""

from __future__ import annotations

import threading

import pytest
import torch

from aitbc import run_defaults
from aitbc.coordinator.store.repository import owned_run
from aitbc.coordinator.workforce.hiring import hire_offer
from aitbc.ledger.chain import escrow_account, wallet_account

AIT = 1_000_000


def balance(coord, address: str) -> int:
    with coord.ctx.session() as s:
        return coord.ctx.ledger.balance(s, wallet_account(address))


def account(coord, name: str) -> int:
    with coord.ctx.session() as s:
        return coord.ctx.ledger.balance(s, name)


def entries(coord, key: str) -> list[dict]:
    return coord.rows("SELECT * FROM ledger_entries WHERE key = :k", k=key)


def contract_of(coord, run_id: str, worker) -> str:
    rows = coord.rows(
        "SELECT id FROM contracts WHERE run_id = :r AND worker_id = :w", r=run_id, w=worker.wallet.address
    )
    return rows[0]["id"]


def deliver(api, t, worker, seed: int) -> str:
    """``worker`` sends a small valid update for round 1 of ``t``: accepted."""
    upd = torch.randn(t.d, generator=torch.Generator().manual_seed(seed)) * 1e-3
    cid = api.put_update(worker, upd)
    res = worker.post(f"/jobs/{t.jobs[worker.wallet.address]}/updates", api.update_body(1, cid))
    assert res["status"] == "accepted", res
    return cid


def finalized(api, t) -> dict:
    return api.wait_for(
        "the run's escrow to be finalized", lambda: t.owner.get(f"/runs/{t.run_id}/payments"), lambda p: p["finalized"]
    )


# --- fair exchange ------------------------------------------------------------------------


def test_an_owner_who_reads_the_updates_and_stops_before_the_close_pays_each_one(new_coordinator, api):
    """The free-riding owner: two providers deliver, a third (its sybil) stays silent so the
    round cannot close; the owner fetches the delivered blobs and stops. Each delivered
    update is paid its contract's full price, once; the silent one earns nothing."""
    coord = new_coordinator()
    t = api.start_training_run(coord, 3, prefix="fr")
    honest, sybil = t.workers[:2], t.workers[2]
    cids = [deliver(api, t, w, 100 + i) for i, w in enumerate(honest)]
    for cid in cids:  # what the free rider came for: the bytes are readable
        assert len(t.owner.get_blob(cid)) > 0
    escrow_before = account(coord, escrow_account(t.run_id))
    owner_before = balance(coord, t.owner.wallet.address)
    before = {w.wallet.address: balance(coord, w.wallet.address) for w in t.workers}
    assert t.owner.post(f"/runs/{t.run_id}/stop")["status"] == "stopped"
    pay = finalized(api, t)
    assert pay["rounds_closed"] == 0
    for w in honest:
        c = contract_of(coord, t.run_id, w)
        [entry] = entries(coord, f"settle:{c}:1")  # exactly one entry, at the full price (1 AIT per round)
        assert entry["amount"] == AIT and entry["credit"] == wallet_account(w.wallet.address)
        assert balance(coord, w.wallet.address) == before[w.wallet.address] + AIT
    assert balance(coord, sybil.wallet.address) == before[sybil.wallet.address]
    assert not entries(coord, f"settle:{contract_of(coord, t.run_id, sybil)}:1")
    by_worker = {r["worker_id"]: r for r in pay["data"]}
    assert [by_worker[w.wallet.address]["paid_micro"] for w in t.workers] == [AIT, AIT, 0]
    # the owner got back exactly the escrow less what it received
    assert balance(coord, t.owner.wallet.address) == owner_before + escrow_before - 2 * AIT
    assert account(coord, escrow_account(t.run_id)) == 0
    # the refund and the driver's next ticks move nothing more
    ledger = coord.rows("SELECT seq FROM ledger_entries ORDER BY seq")
    t.owner.post(f"/runs/{t.run_id}/refund")
    coord.settled()
    assert coord.rows("SELECT seq FROM ledger_entries ORDER BY seq") == ledger


def test_a_run_paused_too_long_is_stopped_and_pays_its_delivered_updates(new_coordinator, api):
    coord = new_coordinator(pause_seconds=1.0)
    t = api.start_training_run(coord, 2, prefix="pz")
    w = t.workers[0]
    deliver(api, t, w, 7)
    t.owner.post(f"/runs/{t.run_id}/pause")
    run = api.wait_for(
        "the paused run to stop", lambda: t.owner.get(f"/runs/{t.run_id}"), lambda r: r["status"] == "stopped"
    )
    assert "paused for over 1 s" in run["error"]
    finalized(api, t)
    [entry] = entries(coord, f"settle:{contract_of(coord, t.run_id, w)}:1")
    assert entry["amount"] == AIT


def test_a_manual_owner_who_stops_unpaid_has_the_delivered_update_paid_at_the_refund(new_coordinator, api):
    """Manual control: the owner pays by hand, but a delivered update of a round it never
    aggregated is due the full price; the refund pays it from escrow before anything
    goes back to the owner."""
    coord = new_coordinator()
    w = api.register_worker(coord, "mw0")
    owner = coord.client("mowner")
    owner.post("/wallets/fund", {"amount": "100"})
    run_id = owner.post(
        "/runs",
        {
            "model_type": "mlp",
            "model_options": api.MODEL_OPTIONS,
            "dataset_size": "1GB",
            "target_workers": 1,
            "budget": "20",
            "control": "manual",
        },
    )["training_id"]
    api.upload_digits(owner, run_id, 2)  # two shards (the test coordinator's largest blob); one job
    owner.post(f"/runs/{run_id}/contracts", {"worker_id": w.wallet.address, "price": "2"})
    owner.post(f"/runs/{run_id}/phase", {"phase": "distributing", "config": {"rounds": 3, "local_steps": 1}})
    shard = owner.get(f"/runs/{run_id}/shards")["data"][0]["shard_id"]
    job = owner.post(f"/runs/{run_id}/jobs", {"worker_id": w.wallet.address, "shard_id": shard})["job_id"]
    run = owner.post(f"/runs/{run_id}/phase", {"phase": "training"})
    cid = api.put_update(w, torch.full((run["config"]["d"],), 1e-3))
    assert w.post(f"/jobs/{job}/updates", api.update_body(1, cid))["status"] == "accepted"
    owner.get_blob(cid)
    owner.post(f"/runs/{run_id}/stop")
    coord.settled()
    before = balance(coord, w.wallet.address)
    out = owner.post(f"/runs/{run_id}/refund")
    assert out["finalized"] and out["data"][0]["due_micro"] == 2 * AIT and out["data"][0]["paid_micro"] == 2 * AIT
    assert balance(coord, w.wallet.address) == before + 2 * AIT
    assert balance(coord, owner.wallet.address) == 80 * AIT + 18 * AIT


# --- the default round deadline -------------------------------------------------------------


def test_every_run_has_a_round_deadline_by_default(new_coordinator, api):
    t = api.start_training_run(new_coordinator(), 2, prefix="dd")
    order = api.job_order(t.workers[0])
    run = t.owner.get(f"/runs/{t.run_id}")
    assert run["config"]["deadline"] is None  # the owner gave none ...
    started = coord_round_start(t)
    assert order["deadline_at"] == pytest.approx(started + run_defaults.DEADLINE)  # ... the default holds


def coord_round_start(t) -> float:
    return t.coord.rows("SELECT round_started_at FROM runs WHERE id = :r", r=t.run_id)[0]["round_started_at"]


# The round deadline of the silent-job tests: long enough that the provider who answers does so
# well within it on a loaded machine (at 1 s, under load, it too lost its place), short enough
# that the tests wait little for the silent one.
ANSWER_WITHIN = 10.0


def _lost_place(coord, run_id: str, worker) -> dict:
    rows = coord.rows(
        "SELECT status, end_reason FROM jobs WHERE run_id = :r AND worker_id = :w", r=run_id, w=worker.wallet.address
    )
    return rows[0]


def test_a_silent_job_loses_its_place_when_its_round_cannot_close(new_coordinator, api):
    """Quorum 2 of 2, one provider silent: at the deadline the round cannot close, so the
    silent job loses its place (failed, flagged, bond kept for the end); with nobody to
    replace it the one who answered is all the round waits for, and it closes."""
    coord = new_coordinator()
    t = api.start_training_run(coord, 2, prefix="sq", deadline=ANSWER_WITHIN, quorum=2)
    talker, silent = t.workers
    deliver(api, t, talker, 3)
    run = api.wait_for("round 1 to close", lambda: t.owner.get(f"/runs/{t.run_id}"), lambda r: r["round"] >= 2)
    job = _lost_place(coord, t.run_id, silent)
    assert (
        job["status"] == "failed" and f"within its deadline of {ANSWER_WITHIN:g} s: lost its place" in job["end_reason"]
    )
    flags = coord.rows("SELECT kind, round FROM flags WHERE worker_id = :w", w=silent.wallet.address)
    assert flags == [{"kind": "straggler", "round": 1}]
    contract = [c for c in run["contracts"] if c["worker_id"] == silent.wallet.address][0]
    assert contract["status"] == "failed"


def test_a_silent_job_loses_its_place_when_its_round_closes_at_the_deadline(new_coordinator, api):
    coord = new_coordinator()
    t = api.start_training_run(coord, 2, prefix="sc", deadline=ANSWER_WITHIN, quorum=1)
    talker, silent = t.workers
    deliver(api, t, talker, 4)
    api.wait_for("round 1 to close", lambda: t.owner.get(f"/runs/{t.run_id}"), lambda r: r["round"] >= 2)
    rec = t.owner.get(f"/runs/{t.run_id}/rounds")["data"][1]
    assert rec["stragglers"] == [silent.wallet.address]
    assert _lost_place(coord, t.run_id, silent)["status"] == "failed"
    with pytest.raises(api.ApiError) as e:  # its late update finds its place gone
        cid = api.put_update(silent, torch.zeros(t.d))
        silent.post(f"/jobs/{t.jobs[silent.wallet.address]}/updates", api.update_body(1, cid))
    api.assert_api_error(e, 409, "job_not_active", "lost its place")


# --- hiring: the owner's money first --------------------------------------------------------------


_RUN = {"model_type": "mlp", "model_options": {"hidden": [8]}, "dataset_size": "1GB", "target_workers": 2}


def _unfunded_run(coord, api, owner, *, budget: str | None = None) -> str:
    body = dict(_RUN)
    if budget is not None:
        body["budget"] = budget
    run_id = owner.post("/runs", body)["training_id"]
    api.upload_digits(owner, run_id, 2)
    return run_id


def _bonded_worker(coord, name: str):
    w = coord.client(name)
    w.post("/wallets/fund", {"amount": "5"})
    w.post("/workers", {"gpu": "RTX4090", "price": "1", "availability": 0.99, "max_bond": "2"})
    return w


def test_an_owner_with_nothing_hires_nobody(new_coordinator, api):
    coord = new_coordinator()
    workers = [_bonded_worker(coord, f"nf{i}") for i in range(2)]
    owner = coord.client("broke")
    run_id = owner.post(
        "/runs",
        {
            "model_type": "mlp",
            "model_options": api.MODEL_OPTIONS,
            "dataset_size": "1GB",
            "target_workers": 2,
            "bond": "2",
        },
    )["training_id"]
    api.upload_digits(owner, run_id, 2)
    before = coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        owner.post(f"/runs/{run_id}/discover", {"required_workers": 2})
    api.assert_api_error(e, 409, "insufficient_funds", "needs 20 AIT", "holds 0 AIT", "short by 20 AIT", "no contract")
    with pytest.raises(api.ApiError) as e:
        owner.post(f"/runs/{run_id}/contracts", {"worker_id": workers[0].wallet.address, "price": "1"})
    api.assert_api_error(e, 409, "insufficient_funds", "short by 10 AIT", "aitbc wallet fund")
    assert coord.snapshot() == before  # no contract, no bond locked
    assert [balance(coord, w.wallet.address) for w in workers] == [5 * AIT, 5 * AIT]
    # funded, the same owner hires
    owner.post("/wallets/fund", {"amount": "20"})
    assert owner.post(f"/runs/{run_id}/discover", {"required_workers": 2})["count"] == 2
    assert [balance(coord, w.wallet.address) for w in workers] == [3 * AIT, 3 * AIT]


def test_one_wallet_cannot_back_hires_on_many_runs(new_coordinator, api):
    coord = new_coordinator()
    a, b = (api.register_worker(coord, f"mr{i}") for i in range(2))
    owner = coord.client("spread")
    owner.post("/wallets/fund", {"amount": "15"})
    first, second = _unfunded_run(coord, api, owner), _unfunded_run(coord, api, owner)
    owner.post(f"/runs/{first}/contracts", {"worker_id": a.wallet.address, "price": "1"})  # counts on 10 AIT
    with pytest.raises(api.ApiError) as e:
        owner.post(f"/runs/{second}/contracts", {"worker_id": b.wallet.address, "price": "1"})
    api.assert_api_error(e, 409, "insufficient_funds", "other runs count on 10 AIT of it", "short by 5 AIT")
    # a budget covers its own run's hires
    funded = _unfunded_run(coord, api, owner, budget="5")
    with pytest.raises(api.ApiError) as e:
        owner.post(f"/runs/{funded}/contracts", {"worker_id": b.wallet.address, "price": "1"})
    api.assert_api_error(e, 409, "insufficient_funds", "needs 5 AIT beyond run")


def test_the_money_hires_count_on_stays_in_the_wallet_until_the_run_distributes_or_ends(new_coordinator, api):
    """An owner who hired cannot send away (nor escrow for another run) the money the hires
    count on, so it cannot hold the providers' bonds with nothing behind them: 409 naming
    what is held and what is free, nothing written. Distributing moves it into the run's
    escrow; a stopped run holds nothing."""
    coord = new_coordinator()
    a, b = api.register_worker(coord, "hd0"), api.register_worker(coord, "hd1", price="0.5")
    owner, sink = coord.client("holder"), coord.client("sink").wallet.address
    owner.post("/wallets/fund", {"amount": "25"})
    first = _unfunded_run(coord, api, owner)
    owner.post(f"/runs/{first}/contracts", {"worker_id": a.wallet.address, "price": "1"})  # holds 10 AIT
    before = coord.snapshot(), balance(coord, owner.wallet.address)
    for path, body, what in (
        ("/wallets/send", {"to": sink, "amount": "15.000001"}, f"sending to {sink} needs 15.000001 AIT"),
        ("/runs", {**_RUN, "budget": "16"}, "escrow for the budget needs 16 AIT"),
    ):
        with pytest.raises(api.ApiError) as e:
            owner.post(path, body)
        api.assert_api_error(e, 409, "insufficient_funds", "hold 10 AIT", what, "15 AIT is free")
        assert (coord.snapshot(), balance(coord, owner.wallet.address)) == before
    owner.post("/wallets/send", {"to": sink, "amount": "15"})  # what is free goes
    assert balance(coord, owner.wallet.address) == 10 * AIT
    owner.post("/wallets/fund", {"amount": "5"})
    second = _unfunded_run(coord, api, owner)
    owner.post(f"/runs/{second}/contracts", {"worker_id": b.wallet.address, "price": "0.5"})  # holds 5 AIT
    with pytest.raises(api.ApiError) as e:
        owner.post("/wallets/send", {"to": sink, "amount": "1"})
    api.assert_api_error(e, 409, "insufficient_funds", "hold 15 AIT", "0 AIT is free")
    # distributing first moves 3 x 1 AIT into its escrow; what it held beyond that is free
    owner.post(f"/runs/{first}/distribute", {"rounds": 3, "local_steps": 1, "batch_size": 8, "max_cost": "3"})
    assert account(coord, escrow_account(first)) == 3 * AIT
    owner.post("/wallets/send", {"to": sink, "amount": "7"})  # 5 left, all held by second
    with pytest.raises(api.ApiError) as e:
        owner.post("/wallets/send", {"to": sink, "amount": "0.000001"})
    api.assert_api_error(e, 409, "insufficient_funds", "hold 5 AIT", "0 AIT is free")
    owner.post(f"/runs/{second}/stop")  # a stopped run's hires hold nothing
    owner.post("/wallets/send", {"to": sink, "amount": "5"})
    assert balance(coord, owner.wallet.address) == 0


def test_two_hires_on_two_runs_of_one_owner_are_counted_one_after_the_other(new_coordinator, api):
    """On PostgreSQL two requests run at once: a hire on one run, checked and not yet
    committed, must be counted by a hire on the owner's other run, so the second waits for
    the first (the ledger's write lock, taken before the wallet is counted) and is refused.
    Without the lock both read the same 15 AIT and both hire. (SQLite has one writer at a
    time: the run lock alone lines them up.)"""
    coord = new_coordinator()
    if coord.ctx.engine.dialect.name != "postgresql":
        pytest.skip("SQLite runs one writing transaction at a time")
    a, b = (api.register_worker(coord, f"cc{i}") for i in range(2))
    owner = coord.client("racer")
    owner.post("/wallets/fund", {"amount": "15"})
    first, second = _unfunded_run(coord, api, owner), _unfunded_run(coord, api, owner)
    outcome: dict = {}

    def hire_on_second() -> None:
        try:
            outcome["hired"] = owner.post(f"/runs/{second}/contracts", {"worker_id": b.wallet.address, "price": "1"})
        except api.ApiError as e:
            outcome["refused"] = e

    def blocked_on_a_lock() -> int:
        return coord.rows(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )[0]["n"]

    with coord.ctx.session() as s:  # the first hire, as its request does it, held open before its commit
        hire_offer(coord.ctx, s, owned_run(s, first, owner.wallet.address), a.wallet.address, AIT)
        other = threading.Thread(target=hire_on_second)
        other.start()
        api.wait_for(
            "the second hire to wait for the first (or to finish)",
            lambda: (other.is_alive(), blocked_on_a_lock()),
            lambda v: not v[0] or v[1] > 0,
        )
        s.commit()
    other.join(60)
    assert "hired" not in outcome, "both hires passed on one wallet's 15 AIT"
    e = outcome["refused"]
    assert (e.status, e.code) == (409, "insufficient_funds") and "other runs count on 10 AIT of it" in e.detail, e
    assert [c["status"] for c in owner.get(f"/runs/{first}")["contracts"]] == ["hired"]
    assert owner.get(f"/runs/{second}")["contracts"] == []


def test_hires_of_a_run_that_never_distributes_expire_and_their_bonds_come_back(new_coordinator, api):
    coord = new_coordinator(hire_seconds=1.0)
    w = _bonded_worker(coord, "ex0")
    owner = coord.client("slowpoke")
    owner.post("/wallets/fund", {"amount": "100"})
    run_id = owner.post(
        "/runs",
        {
            "model_type": "mlp",
            "model_options": api.MODEL_OPTIONS,
            "dataset_size": "1GB",
            "target_workers": 1,
            "bond": "2",
        },
    )["training_id"]
    api.upload_digits(owner, run_id, 2)
    [contract] = owner.post(f"/runs/{run_id}/discover", {"required_workers": 1})["contracts"]
    assert balance(coord, w.wallet.address) == 3 * AIT
    api.wait_for("the bond to come back", lambda: balance(coord, w.wallet.address), lambda b: b == 5 * AIT)
    run = owner.get(f"/runs/{run_id}")
    assert run["status"] == "initializing" and run["contracts"][0]["status"] == "released"
    assert len(entries(coord, f"bond-return:{contract['contract_id']}")) == 1
    with pytest.raises(api.ApiError) as e:  # nothing left to distribute to
        owner.post(f"/runs/{run_id}/distribute", {"rounds": 1, "max_cost": "5"})
    api.assert_api_error(e, 409, "no_workers")
    # the provider is free again: another run may hire it
    other = owner.post(
        "/runs",
        {"model_type": "mlp", "model_options": api.MODEL_OPTIONS, "dataset_size": "1GB", "target_workers": 1},
    )["training_id"]
    api.upload_digits(owner, other, 2)
    assert owner.post(f"/runs/{other}/discover", {"required_workers": 1})["count"] == 1


def test_an_owner_who_drops_a_delivered_update_pays_it_and_cannot_drop_that_round_again(new_coordinator, api):
    """``resend`` of an accepted update: the owner had it, so it is paid as delivered first;
    the same round cannot be asked for again for nothing (409, nothing changed)."""
    coord = new_coordinator()
    t = api.start_training_run(coord, 2, prefix="rs")
    w = t.workers[0]
    job = t.jobs[w.wallet.address]
    first = deliver(api, t, w, 21)
    before = balance(coord, w.wallet.address)
    assert t.owner.post(f"/jobs/{job}/resend")["dropped"] == first
    [entry] = entries(coord, f"settle:{contract_of(coord, t.run_id, w)}:1")
    assert entry["amount"] == AIT and balance(coord, w.wallet.address) == before + AIT
    deliver(api, t, w, 22)  # trained and sent again
    snap = coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        t.owner.post(f"/jobs/{job}/resend")
    api.assert_api_error(e, 409, "already_resent", "already dropped once and paid", "from round 2")
    assert coord.snapshot() == snap and balance(coord, w.wallet.address) == before + AIT


def test_a_manual_owner_who_leaves_delivered_updates_out_of_its_aggregate_pays_them(new_coordinator, api):
    """Manual control: the owner aggregates none of the two delivered updates (the round is
    skipped, both left out); each is still due its full price, paid from escrow at the
    refund, once."""
    coord = new_coordinator()
    workers = [api.register_worker(coord, f"ex{i}") for i in range(2)]
    owner = coord.client("exowner")
    owner.post("/wallets/fund", {"amount": "100"})
    body = {"model_type": "mlp", "model_options": api.MODEL_OPTIONS, "dataset_size": "1GB", "target_workers": 2}
    run_id = owner.post("/runs", {**body, "budget": "30", "control": "manual"})["training_id"]
    api.upload_digits(owner, run_id, 2)
    for w in workers:
        owner.post(f"/runs/{run_id}/contracts", {"worker_id": w.wallet.address, "price": "1"})
    owner.post(f"/runs/{run_id}/phase", {"phase": "distributing", "config": {"rounds": 2, "local_steps": 1}})
    shards = owner.get(f"/runs/{run_id}/shards")["data"]
    jobs = [
        owner.post(f"/runs/{run_id}/jobs", {"worker_id": w.wallet.address, "shard_id": sh["shard_id"]})["job_id"]
        for w, sh in zip(workers, shards)
    ]
    d = owner.post(f"/runs/{run_id}/phase", {"phase": "training"})["config"]["d"]
    for i, (w, job) in enumerate(zip(workers, jobs)):
        cid = api.put_update(w, torch.full((d,), 1e-3 * (i + 1)))
        assert w.post(f"/jobs/{job}/updates", api.update_body(1, cid))["status"] == "accepted"
        owner.get_blob(cid)
    owner.post(f"/runs/{run_id}/phase", {"phase": "aggregating"})
    assert owner.post(f"/runs/{run_id}/aggregate", {"updates": []})["skipped"] is True
    owner.post(f"/runs/{run_id}/phase", {"phase": "complete"})
    coord.settled()
    before = [balance(coord, w.wallet.address) for w in workers]
    out = owner.post(f"/runs/{run_id}/refund")
    assert [r["due_micro"] for r in out["data"]] == [AIT, AIT] and [r["paid_micro"] for r in out["data"]] == [AIT, AIT]
    assert [balance(coord, w.wallet.address) for w in workers] == [b + AIT for b in before]
    assert balance(coord, owner.wallet.address) == 70 * AIT + 28 * AIT


def test_hiring_mid_run_counts_the_rounds_left_against_escrow_and_wallet(new_coordinator, api):
    coord = new_coordinator()
    t = api.start_training_run(coord, 2, prefix="mid")  # 3 rounds, 100 AIT budget escrowed
    t.owner.post("/wallets/send", {"to": coord.client("sink").wallet.address, "amount": "900"})  # the rest goes
    dear = api.register_worker(coord, "dear", price="50")
    before = coord.snapshot()
    with pytest.raises(api.ApiError) as e:  # 3 rounds left x (1 + 1 + 50) = 156 > 100 escrowed + 0
        t.owner.post(f"/runs/{t.run_id}/contracts", {"worker_id": dear.wallet.address, "price": "50"})
    api.assert_api_error(e, 409, "insufficient_funds", "for 3 rounds left", "needs 56 AIT", "short by 56 AIT")
    assert coord.snapshot() == before
    cheap = api.register_worker(coord, "cheap", price="1")  # 3 x 3 = 9: the escrow covers it
    assert (
        t.owner.post(f"/runs/{t.run_id}/contracts", {"worker_id": cheap.wallet.address, "price": "1"})["status"]
        == "hired"
    )
