"""End to end on a real chain: the coordinator SIGKILLed three times while it settles (its
``--settle-delay`` holds each round's settlement open for seconds), restarted each time on
the same home and database. Every round is paid exactly once on chain: one RoundSettled
event per round, each settlement row final, and the settlement key's nonce equal to the
rows (settlements and the finalize): no transaction sent twice, none reverted."""

from __future__ import annotations

import pytest
from tests.chain.e2e.conftest import key_of, settled_rounds
from tests.conftest import wait_until

pytestmark = [pytest.mark.chain, pytest.mark.long]

ROUNDS = 6
KILLS = 3
SETTLE_DELAY = "1.0"


def _snapshot(s, run_id: str) -> tuple[int, dict[int, str]]:
    """(settlement rows in the books, each chain_txs row's status by id)."""
    (n,) = s.rows("SELECT count(*) FROM settlements WHERE run_id = :r", r=run_id)[0]
    return n, {t["id"]: t["status"] for t in s.chain_txs(run_id)}


def _kill_conditions(s, run_id: str):
    """One condition a kill, each of the coordinator started last (measured against the
    snapshot taken at its start, so a kill never lands on state left by the one before):
    a settlement on its way to the chain; a round half-paid in the books; a settlement
    that went further (sent, mined or final) since the restart."""

    def sending(before):
        _, txs = _snapshot(s, run_id)
        return any(st in ("queued", "signed", "sent") and before[1].get(i) != st for i, st in txs.items())

    def half_paid(before):
        n, _ = _snapshot(s, run_id)
        (open_,) = s.rows(
            "SELECT count(*) FROM settlements s JOIN runs r ON r.id = s.run_id "
            "WHERE s.run_id = :r AND s.round > r.settled_round",
            r=run_id,
        )[0]
        return n > before[0] and open_ > 0

    def moved_on(before):
        _, txs = _snapshot(s, run_id)
        return any(st != "queued" and before[1].get(i) != st for i, st in txs.items())

    return sending, half_paid, moved_on


def test_three_sigkills_during_settlement_pay_every_round_once(evm_stack):
    s = evm_stack
    s.start_coordinator(settle_delay=float(SETTLE_DELAY))
    workers = {name: s.start_evm_worker(name, step_delay=0.02) for name in ("w0", "w1")}
    s.wait_offers(2)
    s.owner_address()
    run_id = s.init("--bond", "1")
    s.start_run(run_id, workers=2, rounds=ROUNDS, local_steps=5)

    at_kill = []  # the rows' (kind, round, status) as each SIGKILL came
    for cond in _kill_conditions(s, run_id):
        before = _snapshot(s, run_id)
        wait_until(lambda: cond(before), cond.__name__, timeout=300, poll=0.01)  # noqa: B023 - called at once
        s.kill("coordinator")
        at_kill.append((cond.__name__, [(t["kind"], t["round"], t["status"]) for t in s.chain_txs(run_id)]))
        s.start_coordinator(settle_delay=float(SETTLE_DELAY))
    print("chain_txs at each SIGKILL:", at_kill)

    s.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=600, what="the run's end")
    pay = wait_until(
        lambda: (p := s.payments(run_id))["settled"] and p["chain"]["final"] and p,
        "every transaction final",
        timeout=300,
        poll=0.2,
    )
    rows = s.chain_txs(run_id)
    assert {r["status"] for r in rows} == {"final"}, rows
    settles = sorted(r["round"] for r in rows if r["kind"] == "settle")
    assert settles == sorted(set(settles)) and len(settles) >= ROUNDS
    assert [r["kind"] for r in rows].count("finalize") == 1
    with s.client() as client:
        escrow = s.escrow(client)
        assert sorted(settled_rounds(escrow, key_of(pay))) == settles  # one event a round
        assert escrow.run(key_of(pay)).finalized
    assert s.settlement_nonce() == len(rows)  # one transaction a row: nothing resent, nothing reverted
    assert len({r["tx_hash"] for r in rows}) == len(rows)
    for row in pay["data"]:
        assert row["evm_address"] in workers.values()
    verified = s.cli("ledger", "verify", "--chain", "evm", "--chain-file", str(s.home("owner") / "chain.json"))
    assert verified.returncode == 0, verified.stderr
