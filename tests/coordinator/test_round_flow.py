"""What stands between a round's last update and the next round: nothing but the close.

The update is the round's last progress report (the worker sends none after it), and the
round driver's books thread evaluates, scores and settles a closed round while the next
one trains: a slow settlement never holds a round open, and each round is still settled
exactly once."""

from __future__ import annotations

import base64
import time

import pytest
import torch
from typer.testing import CliRunner

from aitbc.cli.main import app
from aitbc.client import ApiError
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.checkpoint import bytes_to_tensors

from .conftest import wait_for


def test_the_update_records_the_rounds_last_step_progress_and_speed(new_coordinator, api):
    t = api.start_training_run(new_coordinator(), 2, local_steps=4)
    w = t.workers[0]
    job = t.jobs[w.wallet.address]
    w.post(
        f"/jobs/{job}/progress",
        {"progress": 25.0, "loss": 2.0, "epoch": 0.1, "status": "training", "round": 1, "step": 1},
    )
    time.sleep(0.05)  # a measurable interval on the coordinator's clock
    cid = api.put_update(w, torch.zeros(t.d))
    w.post(f"/jobs/{job}/updates", api.update_body(1, cid, steps=4, epoch=0.4, train_loss=1.5))
    (row,) = t.coord.rows(
        "SELECT step, progress, epoch, loss, worker_status, progress_round, speed FROM jobs WHERE id = :j", j=job
    )
    assert row["speed"] and row["speed"] > 0  # 3 steps of 8 samples over the interval
    del row["speed"]
    assert row == {
        "step": 4,
        "progress": 100.0,
        "epoch": 0.4,
        "loss": 1.5,
        "worker_status": "uploaded",
        "progress_round": 1,
    }


def test_a_claimed_step_count_past_the_jobs_own_is_recorded_as_the_jobs(new_coordinator, api):
    t = api.start_training_run(new_coordinator(), 2, local_steps=4)
    w = t.workers[0]
    job = t.jobs[w.wallet.address]
    cid = api.put_update(w, torch.zeros(t.d))
    w.post(f"/jobs/{job}/updates", api.update_body(1, cid, steps=10**12))  # no overflow, no 500
    assert t.coord.rows("SELECT step FROM jobs WHERE id = :j", j=job) == [{"step": 4}]


def test_an_update_with_a_bad_epoch_is_refused_and_changes_nothing(new_coordinator, api):
    t = api.start_training_run(new_coordinator(), 2)
    w = t.workers[0]
    job = t.jobs[w.wallet.address]
    cid = api.put_update(w, torch.zeros(t.d))
    before = t.coord.snapshot()
    for epoch in (-1.0, "x"):
        try:
            w.post(f"/jobs/{job}/updates", api.update_body(1, cid, epoch=epoch))
        except api.ApiError as e:
            assert (e.status, e.code) == (422, "invalid_request")
        else:
            raise AssertionError(f"epoch {epoch!r} accepted")
    assert t.coord.snapshot() == before


def test_a_slow_settlement_does_not_hold_the_next_round_and_each_round_settles_once(new_coordinator, api, tmp_path):
    home = tmp_path / "home"
    coord = new_coordinator(settle_delay=1.5)  # 2 contracts: round 1's settlement takes >= 3 s
    t = api.start_training_run(coord, 2)
    run = f"/runs/{t.run_id}"

    sign = torch.tensor([1.0, -1.0]).repeat((t.d + 1) // 2)[: t.d]

    def send(r: int) -> None:  # two different updates (equal ones: the second is a copy, flagged)
        for i, w in enumerate(t.workers):
            cid = api.put_update(w, 1e-3 * r * (1 + 0.5 * (-1) ** i * sign))
            w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", api.update_body(r, cid))

    send(1)
    wait_for("round 2 open", lambda: t.owner.get(run)["round"], lambda r: r == 2, timeout=30)
    t0 = time.monotonic()
    send(2)
    view = wait_for("round 3 open", lambda: t.owner.get(run), lambda v: v["round"] == 3, timeout=30)
    assert time.monotonic() - t0 < 2.5, "round 2 closed only after round 1 was paid"
    assert t.owner.get(f"{run}/payments")["settled_round"] < 2, view  # paid after, not before
    res = t.owner.get(f"{run}/results")  # the results say how far their scores reach
    assert res["rounds_completed"] == 2 and res["settled_round"] < 2
    cli = [
        "distributed-training",
        "results",
        "--training-id",
        t.run_id,
        "--coordinator",
        coord.url,
        "--home",
        str(home),
    ]
    shown = CliRunner().invoke(app, cli, env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "of 2 rounds settled so far" in shown.output, shown.output
    send(3)
    wait_for(
        "complete and settled", lambda: t.owner.get(f"{run}/payments")["settled_round"], lambda r: r == 3, timeout=60
    )
    settled = coord.rows(
        "SELECT round, COUNT(*) AS n FROM settlements WHERE run_id = :r GROUP BY round ORDER BY round", r=t.run_id
    )
    assert settled == [{"round": r, "n": 2} for r in (1, 2, 3)]  # each contract once a round
    res = t.owner.get(f"{run}/results")
    assert res["settled_round"] == 3 and all(w["score"] is not None for w in res["workers"])
    shown = CliRunner().invoke(app, cli, env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "Contribution scores" in shown.output and "so far" not in shown.output
    scores = coord.rows("SELECT round, COUNT(*) AS n FROM scores WHERE run_id = :r GROUP BY round", r=t.run_id)
    assert sorted((s["round"], s["n"]) for s in scores) == [(1, 2), (2, 2), (3, 2)]
    evaluated = wait_for(
        "every round evaluated",
        lambda: coord.rows("SELECT round, val_loss FROM rounds WHERE run_id = :r ORDER BY round", r=t.run_id),
        lambda rows: all(r["val_loss"] is not None for r in rows),
        timeout=30,
    )
    assert [r["round"] for r in evaluated] == [0, 1, 2, 3]
    wait_for("finalized", lambda: t.owner.get(f"{run}/payments")["finalized"], lambda f: f, timeout=60)
    shards = coord.ctx.books_shards  # scoring read the shards through the cache; the end dropped them
    assert shards is not None and len(shards) == 0 and shards.nbytes == 0


def test_the_outer_momentum_carries_from_round_to_round_as_stored(new_coordinator, api):
    """DiLoCo's outer Nesterov momentum over three rounds: the round's aggregate g_r (the
    samples-weighted mean of two different updates around r x 1e-3) gives buf_r = 0.9
    buf_(r-1) + g_r, and the model moves by -0.7 (g_r + 0.9 buf_r). The state each close
    keeps in memory for the next is the one it stored."""
    t = api.start_training_run(
        new_coordinator(), 2, aggregator="mean", outer="diloco", outer_options={"lr": 0.7, "momentum": 0.9}
    )
    sign = torch.tensor([1.0, -1.0]).repeat((t.d + 1) // 2)[: t.d]  # (d,) +-1: the two updates differ
    buf = torch.zeros(t.d)
    for r in (1, 2, 3):
        ups = {}
        for w, side in zip(t.workers, (1.0, -1.0), strict=True):
            ups[w.wallet.address] = u = r * 1e-3 * (1 + 0.5 * side * sign)
            w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", api.update_body(r, api.put_update(w, u)))
        wait_for(f"round {r} recorded", lambda: len(t.owner.get(f"/runs/{t.run_id}/rounds")["data"]), r.__lt__)
        rows = t.coord.rows("SELECT worker_id, samples FROM updates WHERE round = :r", r=r)
        samples = {row["worker_id"]: row["samples"] for row in rows}
        g = sum(samples[a] * u for a, u in ups.items()) / sum(samples.values())
        buf = 0.9 * buf + g
        moved = api.round_params(t, r) - api.round_params(t, r - 1)
        assert torch.allclose(moved, -0.7 * (g + 0.9 * buf), atol=1e-6), (r, moved[:3], g[:3])
        cid = t.coord.rows("SELECT outer_state_cid FROM runs WHERE id = :r", r=t.run_id)[0]["outer_state_cid"]
        stored = bytes_to_tensors(t.owner.get_blob(cid))["momentum_buffer"]
        assert torch.allclose(stored, buf, atol=1e-7)
        rt = t.coord.ctx.runtimes.get(t.run_id)
        if rt is not None and rt.outer_cid == cid:  # the run's runtime (dropped once the run ends)
            assert torch.equal(rt.outer_state["momentum_buffer"], stored)


def test_a_poll_asking_for_inline_models_gets_the_round_model_whole_and_only_while_it_trains(new_coordinator, api):
    """``GET /workers/{id}/job?inline=N``: the round's model comes inside the answer (base64)
    when it is at most N bytes and the worker has it to train; a bound outside 0..4 MiB is a
    422 naming the parameter."""
    t = api.start_training_run(new_coordinator(), 2)
    w = t.workers[0]
    path = f"/workers/{w.wallet.address}/job"
    view = w.get(path, params={"inline": 4 << 20}, sign=True)["job"]
    data = base64.b64decode(view["global_model"], validate=True)
    assert cid_of_bytes(data) == view["global_model_cid"] and data == t.owner.get_blob(view["global_model_cid"])
    assert w.get(path, params={"inline": len(data) - 1}, sign=True)["job"]["global_model"] is None  # too large
    assert w.get(path, sign=True)["job"]["global_model"] is None  # not asked
    for bad in (-1, (4 << 20) + 1, "lots"):
        with pytest.raises(ApiError) as e:
            w.get(path, params={"inline": bad}, sign=True)
        api.assert_api_error(e, 422, e.value.code, "inline")
    w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", api.update_body(1, api.put_update(w, torch.zeros(t.d))))
    after = w.get(path, params={"inline": 4 << 20}, sign=True)["job"]
    # the other worker has not answered: the round stays open, and this worker has nothing to train
    assert after["action"] == "wait" and after["global_model"] is None
