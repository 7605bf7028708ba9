"""End to end on a real chain: two coordinator replicas on one PostgreSQL database, both
settling on the chain with the same settlement wallet. Only the replica that holds the
driver lease sends: once the first settlement is final the driver is SIGKILLed, the other
takes the lease and sends the rest; every row's sender is a replica seen holding the
lease, and the chain saw exactly as many transactions from the settlement key as there
are rows (none sent twice across the takeover)."""

from __future__ import annotations

import socket

import httpx
import pytest
from tests.chain.e2e.conftest import key_of, settled_rounds, started_stack
from tests.conftest import PG_URL, wait_until

pytestmark = [pytest.mark.chain, pytest.mark.long]

ROUNDS = 8


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _health(url: str) -> dict:
    return httpx.get(url + "/v1/health", timeout=5).json()


@pytest.fixture
def pg_stack(tmp_path, databases):
    if not PG_URL:
        pytest.skip("AITBC_TEST_PG_URL is not set: replicas share a PostgreSQL database")
    with started_stack(tmp_path, databases, backend="postgresql") as s:
        yield s


def test_only_the_lease_holder_sends_settlements(pg_stack):
    s = pg_stack
    urls = {"a": s.url, "b": f"http://127.0.0.1:{_free_port()}"}
    flags = ("--driver-lease", "2.0", "--heartbeat-flush", "0.5")
    s.start_coordinator(name="a", lease=6.0, extra=flags)
    wait_until(lambda: _health(urls["a"])["driving"], "a driving", 30)
    s.start_coordinator(name="b", lease=6.0, port=int(urls["b"].rsplit(":", 1)[1]), extra=flags)
    both = f"{urls['a']},{urls['b']}"
    s.env["AITBC_COORDINATOR"] = both
    for name in ("w0", "w1"):
        s.start_evm_worker(name, step_delay=0.02, coordinator=both)
    s.wait_offers(2)
    s.owner_address()
    run_id = s.init("--bond", "1")
    s.start_run(run_id, workers=2, rounds=ROUNDS, local_steps=5)

    live = dict(urls)
    driving: set[str] = set()  # every replica seen holding the lease

    def watch() -> list[str]:
        healths = {n: _health(u) for n, u in live.items()}
        driving.update(h["replica"] for h in healths.values() if h["driving"])
        return [n for n, h in healths.items() if h["driving"]]

    # the first settlement on chain, then the driver is SIGKILLed: the other takes the sending over
    wait_until(lambda: watch() and any(t["status"] == "final" for t in s.chain_txs(run_id)), "a final tx", 300, 0.2)
    (killed,) = wait_until(watch, "one driver", 30)
    first_sender = {t["sender"] for t in s.chain_txs(run_id) if t["status"] == "final"}
    s.kill(killed)
    del live[killed]
    (survivor,) = live
    s.url = urls[survivor]
    wait_until(lambda: watch() == [survivor], f"{survivor} driving", 60, 0.2)

    def ended() -> bool:
        watch()
        return s.api(f"/runs/{run_id}")["status"] in ("complete", "failed")

    wait_until(ended, "the run's end", timeout=600, poll=0.3)
    pay = wait_until(
        lambda: ended() and (p := s.payments(run_id))["settled"] and p["chain"]["final"] and p,
        "every tx final",
        300,
        0.3,
    )
    rows = s.chain_txs(run_id)
    senders = {r["sender"] for r in rows}
    assert len(driving) == 2 and first_sender <= driving
    assert senders <= driving, (rows, driving)  # a replica signed only while it held the lease
    assert _health(urls[survivor])["replica"] in senders  # the survivor sent what was left
    assert {r["status"] for r in rows} == {"final"}
    assert s.settlement_nonce() == len(rows)  # transactions on chain = rows: none sent twice across the takeover
    with s.client() as client:
        settles = sorted(r["round"] for r in rows if r["kind"] == "settle")
        assert sorted(settled_rounds(s.escrow(client), key_of(pay))) == settles
