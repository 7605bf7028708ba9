"""End to end: live asynchronous training (``distribute --mode async``).

A real coordinator process and four worker processes on loopback; one worker sleeps
between its steps (``--step-delay``), many times slower than the others. With
``--buffer 2`` every two accepted updates are applied as a new version. Then, from the
database and the API:

- the run completes all its versions, most of them without any update of the slow
  worker (nobody waits for it);
- every accepted update's staleness (versions applied between its base and its
  round's) is at most ``--max-staleness``; the slow worker's updates are either
  accepted stale (down-weighted) or refused past the bound (a ``stale_update`` flag,
  no slash);
- each applied update is scored against the version it was trained from and settled
  exactly once (one settlement per contract and version, one ledger entry per key).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]

ROUNDS = 16
MAX_STALENESS = 3


def _staleness(rounds: dict[int, str], r: int, base: str) -> int:
    """Versions applied between ``base`` (the newest round before ``r`` with that checkpoint)
    and round ``r``'s own model (round ``r - 1``)."""
    b = max(k for k, cid in rounds.items() if cid == base and k < r)
    return r - 1 - b


def test_async_run_does_not_wait_for_a_slow_worker_and_settles_each_update_once(stack):
    stack.start_coordinator()
    fast = [f"fast{i}" for i in range(3)]
    # 40 steps: the slow worker's version takes >= 2 s; a fast one's >= 0.4 s, so the 32
    # updates of the run take the fast three >= 4 s, whatever the machine: the run is still
    # going when the slow worker's first update comes (a run without sleeps in the fast
    # workers could end first once their jobs were prepared before the first version)
    for name in fast:
        stack.start_worker(name, step_delay=0.01)
    stack.start_worker("slow", step_delay=0.05)
    stack.wait_offers(4)
    run_id = stack.init_run(workers=4)
    stack.start_run(
        run_id,
        workers=4,
        rounds=ROUNDS,
        local_steps=40,
        mode="async",
        buffer=2,
        max_staleness=MAX_STALENESS,
        staleness="polynomial:a=0.5",
        aggregator="mean",
    )
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]
    assert run["config"]["mode"] == "async" and run["config"]["buffer"] == 2

    recs = stack.api(f"/runs/{run_id}/rounds")["data"]
    assert [r["round"] for r in recs] == list(range(ROUNDS + 1))
    ckpt = {r["round"]: r["checkpoint_cid"] for r in recs}
    assert recs[-1]["val_loss"] < recs[0]["val_loss"], (recs[0]["val_loss"], recs[-1]["val_loss"])

    slow = stack.worker_id("slow")
    ups = stack.rows(
        "SELECT worker_id, round, status, base_cid FROM updates WHERE run_id = :r ORDER BY round, id", r=run_id
    )
    assert all(st == "accepted" for _, _, st, _ in ups), ups
    assert all(base is not None for *_, base in ups)  # async: every update names its version
    lag = {(w, r): _staleness(ckpt, r, base) for w, r, _, base in ups}
    assert all(0 <= s <= MAX_STALENESS for s in lag.values()), lag
    per_round: dict[int, list[str]] = {}
    for w, r, _, _ in ups:
        per_round.setdefault(r, []).append(w)
    # every version applied a full buffer of 2 (or, at its time bound, fewer: no deadline here)
    assert all(len(per_round.get(r, [])) == 2 for r in range(1, ROUNDS + 1)), per_round
    without_slow = [r for r in range(1, ROUNDS + 1) if slow not in per_round.get(r, [])]
    assert len(without_slow) >= ROUNDS // 2, per_round  # the versions went on without it
    fast_stale = [s for (w, _), s in lag.items() if w != slow and s > 0]
    assert fast_stale, lag  # a buffer filled while a fast worker trained: its update was late and counted less

    flags = stack.rows("SELECT worker_id, kind, reason FROM flags WHERE run_id = :r", r=run_id)
    refused = [reason for w, kind, reason in flags if kind == "stale_update"]
    slow_stale = [s for (w, _), s in lag.items() if w == slow and s > 0]
    assert refused or slow_stale, (flags, lag)  # the slow worker's work was refused past the bound, or down-weighted
    assert all(w == slow for w, kind, _ in flags if kind == "stale_update"), flags
    assert all(f"at most {MAX_STALENESS}" in reason for reason in refused), refused
    assert not [f for f in flags if f[1] in ("straggler", "rejected_update", "slashed")], flags

    a = run["asynchronous"]  # what monitor shows: the version, throughput, each worker's staleness
    assert (a["version"], a["applied"], a["refused_stale"]) == (ROUNDS, len(ups), len(refused)), a
    assert a["updates_per_second"] > 0
    last = {w: s for (w, _), s in sorted(lag.items(), key=lambda kv: kv[0][1])}
    assert {w["worker_id"]: w["staleness"] for w in run["workers"]} == {
        w["worker_id"]: last.get(w["worker_id"]) for w in run["workers"]
    }, run["workers"]  # null: no update applied yet
    shown = stack.cli("distributed-training", "monitor", "--training-id", run_id, "--once")
    assert shown.returncode == 0 and f"async version {ROUNDS}" in shown.stdout, shown.stdout + shown.stderr

    deadline = time.monotonic() + 120
    while not (pay := stack.api(f"/runs/{run_id}/payments"))["finalized"]:
        assert time.monotonic() < deadline, pay
        time.sleep(0.2)
    settled = stack.rows(
        "SELECT s.worker_id, s.round, s.paid FROM settlements s WHERE s.run_id = :r ORDER BY s.round", r=run_id
    )
    # one settlement per applied update: the same (worker, version) pairs, none twice
    assert sorted((w, r) for w, r, _ in settled) == sorted((w, r) for w, r, _, _ in ups), (settled, ups)
    paid = {}
    for w, _, amount in settled:
        paid[w] = paid.get(w, 0) + amount
    rows = {r["worker_id"]: r for r in pay["data"]}
    for w, total in paid.items():
        assert rows[w]["paid_micro"] == total and rows[w]["slashed_micro"] == 0, rows[w]


def test_live_async_follows_the_simulated_trajectory(stack, tmp_path):
    """One small configuration (4 equal workers, buffer 2, 12 versions, the digits MLP)
    simulated (aitbc.sim.modes.run_async) and run live: the same core rules (buffer size,
    staleness weight and bound: aitbc.core.staleness). The arrival order of live updates is
    not deterministic (which two workers fill a buffer, how stale the others are), so the
    trajectories cannot be equal; compared: the same initial model and validation loss,
    the first version within 5% (two fresh updates from the initial model either way,
    from different shards), both decreasing to under a quarter of the initial loss, and the
    final validation loss within 50% of the simulated one."""
    from aitbc.sim.config import SimConfig
    from aitbc.sim.runner import run_simulation

    settings = {"rounds": 12, "local_steps": 40, "batch_size": 32, "lr": 1e-3, "aggregator": "mean"}
    async_opts = {"buffer": 2, "max_staleness": 4, "staleness": "polynomial:a=0.5"}
    sim = run_simulation(
        SimConfig(workers=4, mode="async", dataset="digits", model="mlp", **settings, **async_opts),
        home=tmp_path / "sim-home",
        out_dir=tmp_path / "sim",
    )
    sim_losses = [sim.initial_val_loss] + [
        row["val_loss"] for row in map(json.loads, Path(sim.metrics_path).read_text().splitlines()) if "round" in row
    ]

    stack.start_coordinator()
    for i in range(4):
        stack.start_worker(f"w{i}")
    stack.wait_offers(4)
    run_id = stack.init_run(workers=4)
    stack.start_run(run_id, workers=4, mode="async", **settings, **async_opts)
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]
    live = [r["val_loss"] for r in stack.api(f"/runs/{run_id}/rounds")["data"]]

    assert len(live) == len(sim_losses) == 13, (live, sim_losses)
    assert abs(live[0] - sim_losses[0]) < 1e-6, (live[0], sim_losses[0])  # the same model and validation split
    assert abs(live[1] - sim_losses[1]) <= 0.05 * sim_losses[1], (live[1], sim_losses[1])
    assert live[-1] < live[0] / 4 and sim_losses[-1] < sim_losses[0] / 4, (live, sim_losses)
    assert abs(live[-1] - sim_losses[-1]) <= 0.5 * sim_losses[-1], (live, sim_losses)
