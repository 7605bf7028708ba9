"""The rounds thread closes a due round on every poke, but its housekeeping (leases,
refills, challenges, stuck runs) runs at most once a tick: a small model's rounds poke it
several times a tick, and each pass was CPU taken from workers sharing the machine."""

from __future__ import annotations

import time

from aitbc.coordinator.config import Settings
from aitbc.coordinator.context import build_context
from aitbc.coordinator.rounds import driver as driver_module
from aitbc.coordinator.rounds.driver import RoundDriver


def test_pokes_advance_rounds_each_time_and_housekeep_once_a_tick(tmp_path, monkeypatch):
    ctx = build_context(Settings(home=tmp_path, tick_seconds=0.5, driver_lease_seconds=5.0))
    driver = RoundDriver(ctx)
    assert ctx.lease.tick(steal=True) and ctx.lease.holds()  # this replica drives
    calls = {"advance": 0, "housekeeping": 0}
    real_stuck = driver_module.workforce.fail_stuck_runs

    def advance_due(now: float) -> bool:
        calls["advance"] += 1
        return False

    def fail_stuck_runs(*a, **k):
        calls["housekeeping"] += 1
        return real_stuck(*a, **k)

    monkeypatch.setattr(driver, "_advance_due", advance_due)
    monkeypatch.setattr(driver_module.workforce, "fail_stuck_runs", fail_stuck_runs)

    for _ in range(5):  # five pokes within a tick
        driver._poked_rounds()
    assert calls == {"advance": 5, "housekeeping": 1}
    time.sleep(0.55)  # a tick later: the next poke housekeeps again
    driver._poked_rounds()
    assert calls == {"advance": 6, "housekeeping": 2}
    driver.tick_rounds()  # a full pass (a timeout, a test stepping the driver) always does
    assert calls == {"advance": 7, "housekeeping": 3}
    ctx.lease.release()
    ctx.engine.dispose()
