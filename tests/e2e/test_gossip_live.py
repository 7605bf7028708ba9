"""End to end: live gossip training (``distribute --mode gossip``).

Real coordinator and worker processes on loopback. Workers train from their own models,
serve them by CID on their own ports (``--listen``), fetch their ring neighbours' models
peer to peer, check the signed records and the CIDs, and mix with the run's robust rule;
the coordinator only records the signed model CIDs, judges them and pays.

- A ring of 4 where one worker publishes sign-flipped models (``--attack sign-flip``):
  the honest workers' published models' validation loss falls, the consensus too, and the
  attacker's models are flagged ``gossip_outlier`` every round and never paid.
- A coordinator SIGKILL mid-run: the workers keep gossiping (their rounds advance while
  it is down), and once it restarts on the same database and home the record resumes
  (every round gets a record, the run completes).
- A worker without ``--listen`` still takes part: its models go through the coordinator.
- A worker serving corrupt blobs (``--cheat bad-blobs``) is flagged ``bad_peer_blob``; one
  signing two records a round (``--cheat equivocate``) is flagged ``equivocation``; a worker
  SIGKILLed mid-run and restarted never signs a round twice (so is never flagged for it).
- A worker SIGKILLed for good leaves the roster; the others draw the ring again without it.
- One configuration simulated and run live: the same CIDs and consensus losses.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from tests.e2e.conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.long]

ROUNDS = 8


def _start_workers(stack, names, *, listen=True, **kw):
    for name in names:
        extra = ("--listen", f"127.0.0.1:{free_port()}") if listen else ()
        stack.start_worker(name, extra=extra, **kw.get(name, {}))


def _gossip_run(stack, *, rounds=ROUNDS, workers=4, **extra):
    stack.wait_offers(workers)
    run_id = stack.init_run(workers=workers)
    stack.start_run(
        run_id,
        workers=workers,
        rounds=rounds,
        local_steps=20,
        mode="gossip",
        topology="ring",
        aggregator="median",
        **extra,
    )
    return run_id


def test_gossip_ring_with_a_sign_flipping_worker(stack):
    stack.start_coordinator()
    names = ["h0", "h1", "h2", "bad"]
    _start_workers(stack, names, bad={"attack": "sign-flip"})
    run_id = _gossip_run(stack)
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]
    assert run["config"]["mode"] == "gossip" and run["config"]["topology"] == "ring"

    bad = stack.worker_id("bad")
    honest = {stack.worker_id(n) for n in names[:3]}
    ups = stack.rows(
        "SELECT worker_id, round, status, val_loss, record FROM updates WHERE run_id = :r ORDER BY round, id", r=run_id
    )
    # every worker published a signed record every round (a ring of equal workers: nobody skips)
    assert sorted((w, r) for w, r, *_ in ups) == sorted((w, r) for w in [*honest, bad] for r in range(1, ROUNDS + 1))
    first = {w: v for w, r, st, v, _ in ups if r == 1 and w in honest}
    last = {w: v for w, r, st, v, _ in ups if r == ROUNDS and w in honest}
    assert all(last[w] < first[w] for w in honest), (first, last)  # each honest worker's model improves
    recs = stack.api(f"/runs/{run_id}/rounds")["data"]
    assert [r["round"] for r in recs] == list(range(ROUNDS + 1))
    assert recs[-1]["val_loss"] < recs[0]["val_loss"] * 0.75, (recs[0]["val_loss"], recs[-1]["val_loss"])

    flags = stack.rows("SELECT worker_id, kind, round FROM flags WHERE run_id = :r", r=run_id)
    bad_rounds = {r for w, kind, r in flags if w == bad and kind == "gossip_outlier"}
    assert len(bad_rounds) >= ROUNDS - 1, flags  # caught (round 1 included unless the models barely moved)
    assert not [f for f in flags if f[0] in honest], flags  # no honest worker flagged
    assert all(st == "rejected" for w, r, st, *_ in ups if w == bad and r in bad_rounds)

    g = run["gossip"]  # what monitor shows
    assert g["recorded_round"] == ROUNDS and g["spread"] is not None and g["spread"] >= 0, g
    shown = stack.cli("distributed-training", "monitor", "--training-id", run_id, "--once")
    assert shown.returncode == 0 and "consensus spread" in shown.stdout, shown.stdout + shown.stderr

    deadline = time.monotonic() + 120
    while not (pay := stack.api(f"/runs/{run_id}/payments"))["finalized"]:
        assert time.monotonic() < deadline, pay
        time.sleep(0.2)
    settled = stack.rows("SELECT worker_id, round, paid FROM settlements WHERE run_id = :r", r=run_id)
    paid = {}
    for w, _, amount in settled:
        paid[w] = paid.get(w, 0) + amount
    assert sum(1 for w, r, _ in settled if w == bad) == ROUNDS  # one settlement per contract and round
    assert paid.get(bad, 0) == sum(
        amount for w, r, amount in settled if w == bad and r not in bad_rounds
    )  # an outlier round is unpaid
    price = 1_000_000  # 1.00 AIT a round, in micro-AIT
    assert all(paid[w] == ROUNDS * price for w in honest), paid


def test_gossip_goes_on_while_the_coordinator_is_killed(stack):
    rounds = 14
    stack.start_coordinator()
    # 20 ms a step (sleeping, not computing): a round takes at least 0.8 s however loaded the
    # machine, so the kill lands with most of the run still to come
    slow = {"step_delay": 0.02}
    _start_workers(stack, ["l0", "l1", "l2"], l0=slow, l1=slow, l2=slow)
    _start_workers(stack, ["plain"], listen=False, plain=slow)  # reachable by nobody: through the coordinator
    stack.wait_offers(4)
    run_id = stack.init_run(workers=4)
    stack.start_run(
        run_id, workers=4, rounds=rounds, local_steps=40, mode="gossip", topology="ring", aggregator="median"
    )

    def trained(name: str) -> int:  # rounds the worker logged (the whole log: Stack.log is a tail)
        return (stack.root / f"{name}.log").read_text(errors="replace").count("gossip round")

    def published() -> int:
        return stack.rows("SELECT count(*) FROM updates WHERE run_id = :r", r=run_id)[0][0]

    listening = ("l0", "l1", "l2")
    deadline = time.monotonic() + 120
    while not all(trained(n) >= 2 for n in listening):
        assert time.monotonic() < deadline, {n: stack.log(n) for n in listening}
        time.sleep(0.1)
    stack.kill("coordinator")
    before = {n: trained(n) for n in listening}
    assert all(b <= rounds - 4 for b in before.values()), before  # most of the run is still to come
    deadline = time.monotonic() + 90
    while not all(trained(n) >= before[n] + 3 for n in listening):
        assert time.monotonic() < deadline, {n: stack.log(n) for n in listening}
        time.sleep(0.2)  # the reachable workers keep training and mixing while it is down
    held = published()
    stack.start_coordinator()
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]
    assert published() > held  # the backlog was published after the restart
    recs = stack.api(f"/runs/{run_id}/rounds")["data"]
    assert [r["round"] for r in recs] == list(range(rounds + 1))
    assert recs[-1]["val_loss"] < recs[0]["val_loss"] * 0.75, (recs[0]["val_loss"], recs[-1]["val_loss"])
    plain = stack.worker_id("plain")
    ok = stack.rows(
        "SELECT count(*) FROM updates WHERE run_id = :r AND worker_id = :w AND status = 'accepted'", r=run_id, w=plain
    )[0][0]
    assert ok >= rounds // 2  # its models reached the coordinator (it uploads them there)
    flags = stack.rows("SELECT worker_id, kind FROM flags WHERE run_id = :r", r=run_id)
    assert not [f for f in flags if f[1] in ("gossip_outlier", "bad_peer_blob", "rejected_update")], flags


def test_a_worker_serving_corrupt_models_is_caught_and_flagged(stack):
    """``--cheat bad-blobs``: its peer server flips a byte of every blob it serves. Its
    neighbours' CID checks catch it and report it; the coordinator's own fetch of a model it
    signed confirms it: flagged ``bad_peer_blob``, its rounds unpaid; the others train on."""
    stack.start_coordinator()
    _start_workers(stack, ["h0", "h1", "h2", "liar"], liar={"cheat": "bad-blobs"})
    run_id = _gossip_run(stack, rounds=4)
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]
    liar = stack.worker_id("liar")
    flags = stack.rows("SELECT worker_id, kind FROM flags WHERE kind = 'bad_peer_blob'")
    assert flags and all(w == liar for w, _ in flags), flags
    kept = stack.rows(
        "SELECT count(*) FROM updates WHERE run_id = :r AND worker_id = :w AND status = 'accepted'", r=run_id, w=liar
    )[0][0]
    assert kept == 0  # none of its corrupt models counted
    recs = stack.api(f"/runs/{run_id}/rounds")["data"]
    assert recs[-1]["val_loss"] < recs[0]["val_loss"], recs


def test_live_gossip_follows_the_simulated_trajectory(stack, tmp_path):
    """One small configuration (4 equal workers on a ring, the digits MLP, median mixing,
    6 rounds, seed 0) simulated (aitbc.sim.modes.run_gossip) and run live: the same core
    rules (aitbc.core.gossip: the ring draw and robust_combine, seeded by the round) and the
    same local training (each worker trains shard i from seed*100003+i on the round's own
    batch order, LocalTrainer.train_round(round=r)).

    - Round 1 is exact: every worker trains from the same initial model, so each live
      worker's published model (its signed CID) is bit for bit the simulated one of its
      shard, whatever the timing.
    - Later rounds are exact when every worker mixed its neighbours' models of the same
      round (the workers' logs: "(0 stale)"); the run's ``deadline`` (60 s) is each worker's
      wait for a neighbour, so on an idle machine they are. A worker that gave up waiting
      mixes a neighbour's older model (within max_staleness), as the simulator never does:
      then only the tolerance holds -- the coordinator's consensus validation loss within
      15% of the simulated consensus's each round (measured: identical when no mix is
      stale), and both falling to under half of the initial loss.
    """
    from aitbc.sim.config import SimConfig
    from aitbc.sim.runner import run_simulation

    rounds = 6
    settings = {"rounds": rounds, "local_steps": 40, "batch_size": 32, "lr": 1e-3, "aggregator": "median"}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers (OMP_NUM_THREADS=1): the same float reductions
    try:
        sim = run_simulation(
            SimConfig(workers=4, mode="gossip", topology="ring", dataset="digits", model="mlp", seed=0, **settings),
            home=tmp_path / "sim-home",
            out_dir=tmp_path / "sim",
        )
    finally:
        torch.set_num_threads(threads)
    rows = [row for row in map(json.loads, Path(sim.metrics_path).read_text().splitlines()) if "round" in row]
    sim_consensus = [sim.initial_val_loss] + [row["consensus_val_loss"] for row in rows]
    sim_cids = {row["round"]: row["published"] for row in rows}  # per round: shard i's model's CID

    stack.start_coordinator()
    names = [f"g{i}" for i in range(4)]
    _start_workers(stack, names)
    stack.wait_offers(4)
    run_id = stack.init_run(workers=4)
    stack.start_run(run_id, workers=4, mode="gossip", topology="ring", deadline=60, **settings)
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]
    live = [r["val_loss"] for r in stack.api(f"/runs/{run_id}/rounds")["data"]]
    ups = stack.rows(
        "SELECT j.shard_index, u.round, u.cid FROM updates u JOIN jobs j ON j.id = u.job_id WHERE u.run_id = :r",
        r=run_id,
    )
    live_cids = {(shard, r): cid for shard, r, cid in ups}

    assert len(live) == len(sim_consensus) == rounds + 1, (live, sim_consensus)
    assert abs(live[0] - sim_consensus[0]) < 1e-6, (live[0], sim_consensus[0])  # the same initial model
    assert [live_cids.get((i, 1)) for i in range(4)] == sim_cids[1]  # round 1: bit for bit
    logs = "".join((stack.root / f"{n}.log").read_text(errors="replace") for n in names)
    fresh = logs.count("gossip round") == 4 * rounds and logs.count("(0 stale)") == 4 * rounds
    if fresh:  # nobody mixed an older model: the live run is the simulation
        for r in range(1, rounds + 1):
            assert [live_cids.get((i, r)) for i in range(4)] == sim_cids[r], r
        assert all(abs(a - b) < 1e-5 for a, b in zip(live, sim_consensus)), (live, sim_consensus)
    assert all(abs(a - b) <= 0.15 * b for a, b in zip(live, sim_consensus)), (live, sim_consensus)
    assert live[-1] < live[0] / 2 and sim_consensus[-1] < sim_consensus[0] / 2, (live, sim_consensus)


def test_an_equivocating_worker_is_caught_flagged_and_slashed(stack):
    """``--cheat equivocate``: each round the worker serves its neighbours a record of one
    model and publishes another (both signed by it). Its neighbours report the records they
    mixed (``POST /v1/records/witnessed``); the coordinator holds two signed records of one
    round with different CIDs: flagged ``equivocation``, its model of the round rejected and
    unpaid, and, as that is proof, its bond burned and the worker ejected at the round's
    settlement. No honest worker is flagged; the run completes without it."""
    rounds = 4
    stack.start_coordinator()
    names = ["h0", "h1", "h2", "two"]
    for name in names:
        stack.start_worker(
            name,
            max_bond="5",
            funds="10",
            extra=("--listen", f"127.0.0.1:{free_port()}"),
            **({"cheat": "equivocate"} if name == "two" else {}),
        )
    stack.wait_offers(4)
    run_id = stack.init_run("--bond", "2", workers=4)
    stack.start_run(
        run_id, workers=4, rounds=rounds, local_steps=20, mode="gossip", topology="ring", aggregator="median"
    )
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]
    two = stack.worker_id("two")
    flags = stack.rows("SELECT worker_id, kind, round FROM flags WHERE run_id = :r", r=run_id)
    caught = {r for w, kind, r in flags if w == two and kind == "equivocation"}
    assert 1 in caught, flags  # its neighbours mixed the record it served in round 1
    assert all(w == two for w, *_ in flags), flags  # nobody else flagged
    ups = stack.rows("SELECT round, status FROM updates WHERE run_id = :r AND worker_id = :w", r=run_id, w=two)
    assert {r for r, _ in ups} == caught and all(st == "rejected" for _, st in ups), (ups, caught)
    proofs = stack.rows("SELECT round, cid FROM gossip_witnesses WHERE worker_id = :w", w=two)
    published = dict(stack.rows("SELECT round, cid FROM updates WHERE worker_id = :w", w=two))
    # (a proof of a later round, published by nobody, may be kept: it served records until ejected)
    assert caught <= {r for r, _ in proofs} and all(c != published[r] for r, c in proofs if r in caught), proofs
    # Slashed at the first settlement: its bond burned, its job ended, not paid for any round.
    (job,) = [w for w in run["workers"] if w["worker_id"] == two]
    assert job["job_status"] == "failed" and "provable misbehaviour" in job["end_reason"], job
    recs = stack.api(f"/runs/{run_id}/rounds")["data"]
    assert recs[-1]["val_loss"] < recs[0]["val_loss"], recs
    deadline = time.monotonic() + 120
    while not stack.api(f"/runs/{run_id}/payments")["finalized"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    pay = {p["worker_id"]: p for p in stack.api(f"/runs/{run_id}/payments")["data"]}
    assert pay[two]["status"] == "slashed" and pay[two]["slashed_micro"] == 2_000_000 and pay[two]["paid_micro"] == 0
    for name in ("h0", "h1", "h2"):
        honest = pay[stack.worker_id(name)]
        assert honest["status"] == "released" and honest["slashed_micro"] == 0 and honest["paid_micro"] > 0, honest
    burned = stack.rows("SELECT coalesce(sum(amount), 0) FROM ledger_entries WHERE kind = 'slash'")
    assert burned[0][0] == 2_000_000


def test_a_worker_restarted_mid_run_never_signs_a_round_twice(stack):
    """An honest worker cannot be framed by its own crash. While the coordinator is down a
    worker signs rounds its neighbours mix (and will report: their backlog) but the
    coordinator never records; it is then SIGKILLed. Restarted on the same home, it reads its
    log of signed records, publishes the backlog and resumes past its last round instead of
    training those rounds again from the consensus (which would sign other CIDs: two signed
    records of a round, equivocation). Nobody is flagged equivocation; the run completes."""
    rounds = 20
    stack.start_coordinator()
    # 50 ms a step: a round takes at least 2 s, so the others are still training when the
    # restarted worker and coordinator are up again (each takes seconds to start here)
    slow = {"step_delay": 0.05}
    names = ["v", "n1", "n2", "n3"]
    _start_workers(stack, names, **dict.fromkeys(names, slow))
    stack.wait_offers(4)
    run_id = stack.init_run(workers=4)
    stack.start_run(
        run_id, workers=4, rounds=rounds, local_steps=40, mode="gossip", topology="ring", aggregator="median"
    )

    def trained(name: str) -> int:
        return (stack.root / f"{name}.log").read_text(errors="replace").count("gossip round")

    deadline = time.monotonic() + 120
    while not all(trained(n) >= 2 for n in names):
        assert time.monotonic() < deadline, {n: stack.log(n) for n in names}
        time.sleep(0.1)
    stack.kill("coordinator")
    before = trained("v")
    assert before <= rounds - 5, before
    deadline = time.monotonic() + 90
    while trained("v") < before + 3:  # it signs rounds the coordinator does not see; its neighbours mix them
        assert time.monotonic() < deadline, stack.log("v")
        time.sleep(0.1)
    stack.kill("v")
    log = next((stack.root / "v").rglob("worker-gossip-records/*/*.jsonl"))
    signed = [json.loads(line)["record"]["round"] for line in log.read_text().splitlines()]
    recorded = (
        stack.rows(
            "SELECT max(round) FROM updates WHERE run_id = :r AND worker_id = :w", r=run_id, w=stack.worker_id("v")
        )[0][0]
        or 0
    )
    assert max(signed) > recorded  # rounds it signed that the coordinator never recorded
    lost = max(signed)
    _start_workers(stack, ["v"], v=slow)  # starting while the coordinator does
    stack.start_coordinator()
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]
    assert "signed records restored" in (stack.root / "v.log").read_text(errors="replace")
    signed = [json.loads(line)["record"]["round"] for line in log.read_text().splitlines()]
    assert len(signed) == len(set(signed)) and len(signed) > lost, signed  # it trained on; no round signed twice
    flags = stack.rows("SELECT worker_id, kind, reason FROM flags WHERE run_id = :r", r=run_id)
    # (its first models after the restart, trained from the last recorded consensus while
    # the others went on, may be judged outliers: statistical, unpaid, not a proof)
    assert not [f for f in flags if f[1] in ("equivocation", "bad_peer_blob", "rejected_update")], flags
    assert not [f for f in flags if f[0] != stack.worker_id("v")], flags


def test_a_neighbour_that_dies_leaves_the_ring_and_the_others_close_it(stack):
    """A worker SIGKILLed mid-run (not restarted) leaves the roster once its lease runs
    out: its two ring neighbours stop waiting for it and mixing its last model. Each live
    worker reads the roster again (every ``ROSTER_PERIOD`` s, sooner when a neighbour does
    not answer), sees it shrink and draws the ring again over the four left, so no round
    after that names the dead worker. The run completes with a record every round, its job
    ends for the lost lease, and nobody left is flagged."""
    rounds = 14
    stack.start_coordinator()  # a 3 s worker lease
    # 20 ms a step: a round takes at least 0.8 s, so most of the run comes after the kill
    slow = {"step_delay": 0.02}
    names = ["r0", "r1", "r2", "r3", "gone"]
    _start_workers(stack, names, **dict.fromkeys(names, slow))
    stack.wait_offers(5)
    run_id = stack.init_run(workers=5)
    stack.start_run(
        run_id, workers=5, rounds=rounds, local_steps=40, mode="gossip", topology="ring", aggregator="median"
    )

    def text(name: str) -> str:  # the whole log (Stack.log is a tail)
        return (stack.root / f"{name}.log").read_text(errors="replace")

    deadline = time.monotonic() + 120
    while not all(text(n).count("gossip round") >= 2 for n in names):
        assert time.monotonic() < deadline, {n: stack.log(n) for n in names}
        time.sleep(0.1)
    stack.kill("gone")
    left = names[:4]
    assert all(text(n).count("gossip round") <= rounds - 5 for n in left), {n: stack.log(n) for n in left}
    run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=300, what="the end")
    assert run["status"] == "complete", run["error"]

    gone = stack.worker_id("gone")
    job = next(w for w in run["workers"] if w["worker_id"] == gone)
    assert job["job_status"] == "failed" and "lease" in (job["end_reason"] or ""), job
    for n in left:
        log = text(n)
        changed = log.find("roster changed: 5 -> 4 workers")
        assert changed >= 0, stack.log(n)
        assert gone not in log[changed:], log[changed:][-3000:]  # never waited for, fetched or mixed again
    ups = stack.rows("SELECT worker_id, round FROM updates WHERE run_id = :r", r=run_id)
    for n in left:  # every worker left published every round
        assert {r for w, r in ups if w == stack.worker_id(n)} == set(range(1, rounds + 1)), n
    recs = stack.api(f"/runs/{run_id}/rounds")["data"]
    assert [r["round"] for r in recs] == list(range(rounds + 1))
    assert recs[-1]["val_loss"] < recs[0]["val_loss"] * 0.75, (recs[0]["val_loss"], recs[-1]["val_loss"])
    flags = stack.rows("SELECT worker_id, kind FROM flags WHERE run_id = :r AND worker_id != :g", r=run_id, g=gone)
    assert not [f for f in flags if f[1] != "straggler"], flags
