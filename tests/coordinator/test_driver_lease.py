"""The driver lease (coordinator/store/lease.py): one holder at a time by compare-and-set, on the
backend under test; and two coordinators on one database and one home: exactly one
drives, either answers a worker the other registered, a heartbeat to either keeps the
worker live for both, and a clean stop hands the rounds over."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from sqlalchemy import select, update
from tests.conftest import wait_until

from aitbc.coordinator.store.db import make_engine, make_sessions
from aitbc.coordinator.store.lease import DriverLease
from aitbc.coordinator.store.models import DriverLease as LeaseRow
from aitbc.coordinator.store.models import Offer

PERIOD = 30.0  # long: no lease in these tests runs out by itself unless a test waits for it


@pytest.fixture
def sessions(tmp_path, databases):
    url = databases.new(tmp_path / "db")
    engine = make_engine(url)
    yield make_sessions(engine)
    engine.dispose()
    databases.drop(url)


class Clock:
    """A replica's monotonic clock, moved by the test: how long it believes its lease."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _holder(sessions) -> str | None:
    with sessions() as s:
        return s.scalar(select(LeaseRow.holder))


def _run_out(sessions) -> None:
    """The holder stopped renewing and a whole period went by, on the database's clock."""
    with sessions() as s:
        s.execute(update(LeaseRow).values(expires_at=LeaseRow.expires_at - 2 * PERIOD))
        s.commit()


def _skew(monkeypatch, seconds: float) -> None:
    """This process's wall clock (as a replica on another machine would have it) off by ``seconds``."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


def test_one_holder_until_its_lease_runs_out(sessions):
    ca, cb = Clock(), Clock()
    a = DriverLease(sessions, "replica_a", PERIOD, clock=ca)
    b = DriverLease(sessions, "replica_b", PERIOD, clock=cb)
    assert a.tick() and not b.tick()
    assert a.holds() and not b.holds() and _holder(sessions) == "replica_a"
    holder, left = a.holder() or ("", 0.0)
    assert holder == "replica_a" and 0 < left <= PERIOD  # a period from the database's now
    ca.t += 0.3 * PERIOD
    assert a.tick()  # renewed (a quarter period passed)
    cb.t += 10 * PERIOD
    assert not b.tick()  # B's own clock says nothing about A's lease
    ca.t += 0.75 * PERIOD + 0.01
    assert not a.holds()  # A stops believing, a quarter period before the database lets B in
    _run_out(sessions)
    assert b.tick() and _holder(sessions) == "replica_b"
    assert not a.tick() and not a.holds()  # A comes back: standing by
    assert b.tick()


def test_the_lease_runs_out_by_the_databases_clock(sessions):
    """No test hand: a short lease left to run out is taken by the next claim."""
    a, b = DriverLease(sessions, "replica_a", 0.5), DriverLease(sessions, "replica_b", PERIOD)
    assert a.tick()
    wait_until(b.tick, "A's 0.5 s lease run out by the database's clock", 30)
    assert _holder(sessions) == "replica_b" and not a.tick()


@pytest.mark.parametrize("skew", [30.0, 3600.0])
def test_a_replica_whose_clock_runs_ahead_cannot_take_a_live_lease(sessions, monkeypatch, skew):
    """Issue 33: a replica 30 s ahead took the lease from its live holder (the expiry was
    judged by each replica's own clock) and failed every worker. Now the database judges."""
    a, b = DriverLease(sessions, "replica_a", PERIOD), DriverLease(sessions, "replica_b", PERIOD)
    assert a.tick()
    _skew(monkeypatch, skew)
    assert not b.tick() and not b.holds()
    assert _holder(sessions) == "replica_a" and a.tick() and a.holds()
    assert b.offset == pytest.approx(-skew, abs=5)  # B knows how far off it is (and logs it)
    b.release()  # standing by, it gives up nothing
    assert _holder(sessions) == "replica_a" and not b.tick()


def test_a_replica_whose_clock_runs_behind_takes_an_expired_lease_at_once(sessions, monkeypatch):
    """The other way: a clock 30 s behind would have waited 30 s past the expiry (a stall)."""
    a = DriverLease(sessions, "replica_a", 0.5)
    assert a.tick()
    _skew(monkeypatch, -30.0)
    b = DriverLease(sessions, "replica_b", PERIOD)
    wait_until(b.tick, "B (30 s behind) taking A's 0.5 s lease", 20)
    holder, left = b.holder() or ("", 0.0)
    assert holder == "replica_b" and 0 < left <= PERIOD


def test_a_fenced_write_of_an_ex_holder_is_refused(sessions):
    a, b = DriverLease(sessions, "replica_a", PERIOD), DriverLease(sessions, "replica_b", PERIOD)
    assert a.tick()
    assert b.tick(steal=True)  # (SQLite: a restarted coordinator takes over at once)
    assert a.holds()  # A, paused, still believes ...
    with sessions() as s:
        assert not a.fence(s)  # ... but its transaction finds the row taken
        s.rollback()
    assert not a.holds()
    with sessions() as s:
        assert b.fence(s)
        s.commit()


def test_racing_claims_never_both_win(sessions):
    clock = Clock()
    leases = [DriverLease(sessions, f"replica_{i}", PERIOD, clock=clock) for i in range(3)]
    for _ in range(10):
        go, won = threading.Barrier(len(leases)), []

        def claim(lease: DriverLease, go: threading.Barrier = go, won: list[str] = won) -> None:
            go.wait()
            if lease.tick():
                won.append(lease.me)

        threads = [threading.Thread(target=claim, args=(x,)) for x in leases]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert len(won) == 1, won
        assert _holder(sessions) == won[0]
        clock.t += PERIOD  # the next race after the winner's lease ran out
        _run_out(sessions)


def test_the_local_lock_lets_one_live_process_take_over_at_start(tmp_path, sessions):
    """SQLite: the lease may be taken from an unexpired holder only by the process that
    holds the lock file beside the database, which no other live process does."""
    lock = tmp_path / "coordinator.db.driver-lock"
    a = DriverLease(sessions, "replica_a", PERIOD, local_lock=lock)
    b = DriverLease(sessions, "replica_b", PERIOD, local_lock=lock)
    assert a.sole_local() and a.tick(steal=True)
    assert not b.sole_local()  # a lives: b stands by and steals nothing
    assert not b.tick(steal=b.sole_local()) and a.holds()
    a.release()  # (a process killed by SIGKILL drops its lock the same way: the kernel closes it)
    assert b.sole_local() and b.tick(steal=True)
    assert DriverLease(sessions, "replica_c", PERIOD).sole_local() is False  # no lock file: never
    b.release()


def test_a_released_lease_is_taken_at_once(sessions):
    a, b = DriverLease(sessions, "replica_a", PERIOD), DriverLease(sessions, "replica_b", PERIOD)
    assert a.tick() and not b.tick()
    a.release()
    assert not a.holds() and b.tick()


# --- two coordinators ------------------------------------------------------------------


def _driving(coord) -> bool:
    return coord.http().get("/v1/health").json()["driving"]


def test_two_coordinators_one_driver(tmp_path, databases, api):
    url = databases.new(tmp_path / "db")
    home = tmp_path / "home"  # shared: blobs and the coordinator's wallet
    fast = dict(db_url=url, driver_lease_seconds=1.0, heartbeat_flush_seconds=0.1)
    first, stop_first = api.start_coordinator(home, **fast)
    try:
        api.wait_for("first driving", lambda: _driving(first), bool)
        second, stop_second = api.start_coordinator(home, **fast)
    except BaseException:
        stop_first()
        databases.drop(url)
        raise
    try:
        # exactly one drives (the first: on SQLite too, its local lock tells the second it is alive)
        pair = (first, second)
        for _ in range(20):
            states = [_driving(c) for c in pair]
            assert states.count(True) <= 1, states
            time.sleep(0.1)

        # health and the metrics agree on who drives (read one after the other: with a 1 s
        # lease on a loaded machine the lease may move between two reads, so until they agree)
        def views() -> list[tuple[bool, bool]]:
            return [(_driving(c), "aitbc_driving 1.0" in c.http().get("/metrics").text) for c in pair]

        agreed = api.wait_for(
            "one driver, as health and metrics say",
            views,
            lambda v: all(h == m for h, m in v) and sum(h for h, _ in v) == 1,
        )
        driver = pair[[h for h, _ in agreed].index(True)]
        standby = second if driver is first else first
        health = standby.http().get("/v1/health").json()
        assert health["replica"] == standby.ctx.lease.me

        # a worker registered with the standby heartbeats to the driver (known from the database) ...
        w = api.register_worker(standby, "w")
        at_driver = driver.client("w", wallet=w.wallet)
        assert at_driver.post("/workers/heartbeat")["ok"]
        # ... and a heartbeat to the standby reaches the driver's liveness (its lease judging)
        beat = w.post("/workers/heartbeat")["time"]
        api.wait_for(
            "the standby's heartbeat at the driver",
            lambda: driver.ctx.liveness.last_seen(w.wallet.address) or 0.0,
            lambda seen: seen >= beat,
        )
        with driver.ctx.session() as s:  # the later beat is kept in the database, whoever flushed last
            api.wait_for(
                "the heartbeat in the database",
                lambda: s.scalar(select(Offer.last_heartbeat).where(Offer.id == w.wallet.address)),
                lambda t: t >= beat,
            )
            s.rollback()
        # an unknown worker is still refused by either
        stranger = standby.client("stranger")
        with pytest.raises(api.ApiError) as e:
            stranger.post("/workers/heartbeat")
        api.assert_api_error(e, 404, "unknown_worker")

        # a clean stop releases the lease: the other drives within a few of its periods
        (stop_first if driver is first else stop_second)()
        api.wait_for("takeover", lambda: _driving(standby), bool, timeout=10)
    finally:
        for stop in (stop_first, stop_second):
            stop()
        databases.drop(url)


# --- clients with several coordinator URLs -------------------------------------------------


def _dead_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens


def test_a_client_fails_over_to_the_next_coordinator(server, api):
    from aitbc.client import CoordinatorClient, Unreachable
    from aitbc.errors import AitbcError
    from aitbc.ledger.wallet import Wallet

    dead = _dead_url()
    with CoordinatorClient(f"{dead}, {server.url}/", Wallet.generate("w")) as c:
        assert c.get("/health")["status"] == "ok"
        assert c.base_url == server.url  # and stays there
        assert c.post("/wallets/fund", {"amount": "1"})["balance"]  # a signed request, sent once
        cid = c.put_blob(api.cid_of_bytes(b"replicas"), b"replicas")["cid"]
        assert c.get_blob(cid) == b"replicas"
    with CoordinatorClient(f"{dead},{_dead_url()}") as c, pytest.raises(Unreachable, match=dead):
        c.get("/health")
    with pytest.raises(AitbcError, match="none empty"):
        CoordinatorClient(f"{server.url},,{dead}")


def test_an_agent_fails_over_to_the_next_coordinator(server, tmp_path):
    from aitbc_agent_sdk import Agent, AgentConfig, CoordinatorUnreachable, InvalidArgument

    dead = _dead_url()
    config = AgentConfig(name="a", home=tmp_path, wallet_name=None, coordinator_url=f"{dead},{server.url}")
    with Agent(config) as agent:
        assert isinstance(agent.get_market_offers(), list)
        assert agent._url == server.url
    dead_only = AgentConfig(name="a", home=tmp_path, wallet_name=None, coordinator_url=f"{dead},{_dead_url()}")
    with Agent(dead_only) as agent, pytest.raises(CoordinatorUnreachable, match=dead):
        agent.get_market_offers()
    with pytest.raises(InvalidArgument, match="none empty"):
        AgentConfig(name="a", home=tmp_path, coordinator_url=f"{server.url},")


def test_an_async_agent_fails_over_to_the_next_coordinator(server, tmp_path):
    import asyncio

    from aitbc_agent_sdk import AgentConfig, AsyncAgent, CoordinatorUnreachable

    dead = _dead_url()

    async def go() -> None:
        config = AgentConfig(name="a", home=tmp_path, wallet_name=None, coordinator_url=f"{dead},{server.url}")
        async with AsyncAgent(config) as agent:
            assert isinstance(await agent.get_market_offers(), list)
            assert agent._url == server.url
        dead_only = AgentConfig(name="a", home=tmp_path, wallet_name=None, coordinator_url=f"{dead},{_dead_url()}")
        async with AsyncAgent(dead_only) as agent:
            with pytest.raises(CoordinatorUnreachable, match=dead):
                await agent.get_market_offers()

    asyncio.run(go())


# --- a replica that does not hold the lease moves nothing ------------------------------


def test_no_round_closes_or_settles_without_the_lease(tmp_path, databases, api):
    """Round 1's every update is in, but another replica holds the lease: the round stays
    open (no close, no settlement) until that lease is released; then this coordinator
    takes it, closes the round and settles it, once."""
    coord, stop = api.start_on(databases, tmp_path / "home", driver_lease_seconds=1.0)
    keep = threading.Event()
    try:
        t = api.start_training_run(coord, 2)
        # the intruder's lease outlasts any stall of its renewing thread on a loaded machine
        intruder = DriverLease(coord.ctx.sessions, "replica_intruder", 30.0)
        assert intruder.tick(steal=True)
        api.wait_for("the driver stands by", lambda: coord.ctx.lease.holds(), lambda held: not held)

        def renew() -> None:
            while not keep.wait(0.1):
                intruder.tick()

        renewer = threading.Thread(target=renew, daemon=True)
        renewer.start()
        for w in t.workers:
            cid = api.put_update(w, torch.full((t.d,), 0.01))
            w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", api.update_body(1, cid))
        time.sleep(3.0)  # a dozen of the driver's ticks and three lease periods: it must not move
        run = t.owner.get(f"/runs/{t.run_id}")
        assert (run["status"], run["round"], run["rounds_completed"]) == ("training", 1, 0)
        assert coord.rows("SELECT count(*) AS n FROM settlements") == [{"n": 0}]
        assert not coord.http().get("/v1/health").json()["driving"]

        keep.set()
        renewer.join(10)
        intruder.release()
        api.wait_for("round 1 settled", lambda: t.owner.get(f"/runs/{t.run_id}/payments")["settled_round"], bool)
        assert coord.http().get("/v1/health").json()["driving"]
        rows = coord.rows("SELECT contract_id, round FROM settlements ORDER BY contract_id")
        assert len(rows) == 2 and {r["round"] for r in rows} == {1}
    finally:
        keep.set()
        stop()


# --- replay protection shared by the replicas ----------------------------------------------


def test_a_request_replayed_to_the_other_replica_is_refused(tmp_path, databases, api):
    """A captured signed request is accepted once across the replicas: the second replica
    finds its nonce in the shared table (PostgreSQL), and the money moved once."""
    if databases.backend != "postgresql":
        pytest.skip("replicas share nonces on PostgreSQL (AITBC_TEST_DB=postgresql, make test-pg)")
    url = databases.new(tmp_path / "db")
    home = tmp_path / "home"
    first, stop_first = api.start_coordinator(home, db_url=url)
    try:
        second, stop_second = api.start_coordinator(home, db_url=url)
    except BaseException:
        stop_first()
        databases.drop(url)
        raise
    try:
        assert first.ctx.nonces.shared and second.ctx.nonces.shared
        w = api.Wallet.generate("w")
        data = json.dumps({"amount": "3"}).encode()
        headers = {"content-type": "application/json", **api.sign_request(w, "POST", "/v1/wallets/fund", data)}
        with first.http() as h:
            assert h.post("/v1/wallets/fund", content=data, headers=headers).status_code == 201
        before = second.snapshot()
        with second.http() as h:
            r = h.post("/v1/wallets/fund", content=data, headers=headers)
        api.assert_error(r, 401, "replayed_nonce", "already used")
        assert second.snapshot() == before
        with first.http() as h:  # and to the first again, as before
            api.assert_error(h.post("/v1/wallets/fund", content=data, headers=headers), 401, "replayed_nonce")
        assert first.client("w", wallet=w).get(f"/wallets/{w.address}/balance")["balance_micro"] == 3_000_000
    finally:
        for stop in (stop_first, stop_second):
            stop()
        databases.drop(url)


def test_shared_nonces_accept_each_nonce_once_until_it_expires(tmp_path, databases):
    from aitbc.coordinator.store.nonces import SharedNonces, nonce_store
    from aitbc.ledger.signing import NonceCache

    url = databases.new(tmp_path / "db")
    engine = make_engine(url)
    try:
        if databases.backend != "postgresql":
            assert isinstance(nonce_store(engine, 10.0), NonceCache)  # one process: in memory
            return
        a, b = SharedNonces(engine, 10.0), SharedNonces(engine, 10.0)
        t = 1000.0
        assert a.check_and_add("00" * 16, t, t) and not b.check_and_add("00" * 16, t, t + 1)
        assert not a.check_and_add("00" * 16, t, t + 9.9)  # still within its window
        assert b.check_and_add("00" * 16, t + 11, t + 11)  # expired: taken over, as the memory cache forgets
        assert not a.check_and_add("00" * 16, t + 11, t + 12)

        # racing replicas: of many given one nonce at once, exactly one accepts
        stores = [SharedNonces(engine, 10.0) for _ in range(4)]
        for k in range(10):
            nonce, go, won = f"a{k:031x}", threading.Barrier(len(stores)), []

            def claim(store: SharedNonces, nonce: str = nonce, go: threading.Barrier = go, won: list = won) -> None:
                go.wait()
                if store.check_and_add(nonce, t, t):
                    won.append(store)

            threads = [threading.Thread(target=claim, args=(s,)) for s in stores]
            for th in threads:
                th.start()
            for th in threads:
                th.join(30)
            assert len(won) == 1, won

        # expired rows are purged (about twice a window), unexpired ones kept
        fresh = SharedNonces(engine, 10.0)
        assert fresh.check_and_add("ff" * 16, 5000.0, 5000.0)
        assert len(fresh) == 1  # everything stamped at t (1000) expired by 5000 and is gone
    finally:
        engine.dispose()
        databases.drop(url)
