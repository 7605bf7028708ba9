"""Issue 12 parts 2 and 4 on a real coordinator (uvicorn, SQLite, the round driver), with
signed clients as workers, so each test decides exactly which update each one sends:

- a NaN update from a finite global model is still rejected and slashed;
- the norm bound at aggregation: a grossly large finite update is rejected and slashed, a
  moderately large one is scaled down and not punished;
- an aggregate that diverges is not committed: the run fails ``diverged``, nobody is
  flagged or slashed;
- a manual run's ``distributing`` phase refuses an out-of-range config like ``distribute``;
- ``trend`` (issue 17): from round 2 an update pointing against the model's last step is
  left out of the aggregate, and the round's scoring sees the same verdict.
"""

from __future__ import annotations

import pytest
import torch
from tests.conftest import wait_until

from aitbc.client import ApiError
from aitbc.core.aggregation import parse_aggregator

from .conftest import round_params


def _submit(api, t, w, job: str, update: torch.Tensor, r: int = 1) -> None:
    cid = api.put_update(w, update)
    w.post(f"/jobs/{job}/updates", api.update_body(r, cid))


def _payments(t) -> dict[str, dict]:
    return {row["worker_id"]: row for row in t.owner.get(f"/runs/{t.run_id}/payments")["data"]}


def _settled(t, r: int) -> None:
    settled = "SELECT settled_round FROM runs WHERE id = :r"
    wait_until(lambda: t.coord.rows(settled, r=t.run_id)[0]["settled_round"] >= r, what=f"round {r} settled")


def test_nan_update_from_a_finite_model_is_still_rejected_and_slashed(api, new_coordinator):
    t = api.start_training_run(new_coordinator(), 3)
    g = torch.Generator().manual_seed(0)
    (a, ja), (b, jb), (c, jc) = ((w, t.jobs[w.wallet.address]) for w in t.workers)
    _submit(api, t, a, ja, 1e-3 * torch.randn(t.d, generator=g))
    _submit(api, t, b, jb, 1e-3 * torch.randn(t.d, generator=g))
    bad = torch.zeros(t.d)
    bad[3] = float("nan")
    try:
        _submit(api, t, c, jc, bad)
        raise AssertionError("a NaN update was accepted")
    except ApiError as e:
        assert e.status == 422 and e.code == "update_rejected" and "NaN or Inf" in e.detail
    _settled(t, 1)
    pay = _payments(t)
    assert pay[c.wallet.address]["status"] == "slashed"
    assert pay[a.wallet.address]["status"] != "slashed" and pay[b.wallet.address]["status"] != "slashed"


def test_norm_bound_rejects_a_gross_update_and_clips_a_large_one(api, new_coordinator):
    t = api.start_training_run(new_coordinator(), 4)
    g = torch.Generator().manual_seed(1)
    (a, ja), (b, jb), (c, jc), (x, jx) = ((w, t.jobs[w.wallet.address]) for w in t.workers)
    base = 1e-3 * torch.randn(t.d, generator=g)  # (d,)
    _submit(api, t, a, ja, base + 1e-4 * torch.randn(t.d, generator=g))
    _submit(api, t, b, jb, base + 1e-4 * torch.randn(t.d, generator=g))
    _submit(api, t, c, jc, 5 * base)  # 5x the median: scaled down to 3x, not punished
    _submit(api, t, x, jx, torch.full((t.d,), 3e38))  # finite, correctly shaped, 1e40 x the median
    _settled(t, 1)
    rows = {
        r["worker_id"]: r
        for r in t.coord.rows("SELECT worker_id, status, reason FROM updates WHERE run_id = :r", r=t.run_id)
    }
    assert rows[x.wallet.address]["status"] == "rejected" and "median" in rows[x.wallet.address]["reason"]
    assert rows[c.wallet.address]["status"] == "accepted"
    rec = t.owner.get(f"/runs/{t.run_id}/rounds")["data"][1]
    assert (rec["accepted"], rec["rejected"], rec["skipped"]) == (3, 1, False)
    pay = _payments(t)
    assert pay[x.wallet.address]["status"] == "slashed"
    assert pay[c.wallet.address]["status"] != "slashed"
    flags = t.coord.rows("SELECT worker_id, kind FROM flags WHERE run_id = :r", r=t.run_id)
    assert {f["worker_id"] for f in flags if f["kind"] in ("rejected_update", "slashed")} == {x.wallet.address}


def test_diverged_aggregate_is_not_committed_and_nobody_is_slashed(api, new_coordinator):
    t = api.start_training_run(new_coordinator(), 3)
    for w in t.workers:  # all alike (no outlier to blame), together far past any sane model
        _submit(api, t, w, t.jobs[w.wallet.address], torch.full((t.d,), -50.0))
    run = wait_until(
        lambda: (r := t.owner.get(f"/runs/{t.run_id}"))["status"] == "failed" and r, what="the run failing"
    )
    assert run["error"].startswith("diverged: round 1's validation loss"), run["error"]
    assert [r["round"] for r in t.owner.get(f"/runs/{t.run_id}/rounds")["data"]] == [0]
    wait_until(lambda: t.owner.get(f"/runs/{t.run_id}/payments")["finalized"], what="finalized")
    assert all(row["status"] != "slashed" for row in _payments(t).values())
    assert t.coord.rows("SELECT kind FROM flags WHERE run_id = :r", r=t.run_id) == []
    bal = t.owner.get("/ledger/balances")["data"]
    assert bal.get(f"escrow:{t.run_id}", 0) == 0 and bal.get("burn:local", 0) == 0
    # The owner received the three accepted updates and could read them (an owner's in-range
    # outer lr can make the coordinator's aggregate diverge while the raw updates stay useful
    # to it): each is paid as delivered, its full price once (issue 33); the rest came back.
    assert bal[f"wallet:{t.owner.wallet.address}"] == 1000_000_000 - 3 * 1_000_000
    assert all(bal[f"wallet:{w.wallet.address}"] == 1_000_000 for w in t.workers)


def test_manual_distributing_phase_refuses_an_out_of_range_config(api, new_coordinator):
    coord = new_coordinator()
    owner = coord.client("manual-owner")
    owner.post("/wallets/fund", {"amount": "1000"})
    run = owner.post(
        "/runs",
        {
            "model_type": "mlp",
            "model_options": api.MODEL_OPTIONS,
            "dataset_size": "1GB",
            "target_workers": 2,
            "budget": "10",
            "control": "manual",
        },
    )
    run_id = run["training_id"]
    api.upload_digits(owner, run_id, 2)
    for i in range(2):
        api.register_worker(coord, f"m{i}")
    assert owner.post(f"/runs/{run_id}/discover", {"required_workers": 2, "min_gpu": "RTX4090"})["count"] == 2
    before = coord.snapshot()
    for config, message in [
        ({"outer_options": {"lr": 1e30}}, "lr must be in (0, 10]"),
        ({"lr": 2.0}, "lr must be in [1e-08, 1]"),
        ({"batch_size": 100_000}, "batch_size must be in [1, 65536]"),
        ({"quorum": 20_000}, "quorum must be in [1, 10000]"),
    ]:
        try:
            owner.post(f"/runs/{run_id}/phase", {"phase": "distributing", "config": {"rounds": 2, **config}})
            raise AssertionError(f"{config} was accepted")
        except ApiError as e:
            assert e.status == 422 and message in e.detail, (config, e.detail)
    assert coord.snapshot() == before


@pytest.mark.parametrize("cold", [False, True], ids=["remembered", "rebuilt"])
def test_trend_leaves_out_an_update_against_the_last_step_and_scoring_agrees(api, new_coordinator, cold):
    """``rebuilt``: the driver forgets the step it took (as after a restart) and rebuilds
    the trend from rounds 0 and 1's checkpoints."""
    t = api.start_training_run(new_coordinator(), 4, aggregator="trend:f=1+median")
    g = torch.Generator().manual_seed(2)
    (a, ja), (b, jb), (c, jc), (x, jx) = ((w, t.jobs[w.wallet.address]) for w in t.workers)
    base = 1e-3 * torch.randn(t.d, generator=g)  # (d,) the direction every honest update shares
    for w, j in ((a, ja), (b, jb), (c, jc), (x, jx)):  # round 1: no trend yet, all honest
        _submit(api, t, w, j, base + 3e-4 * torch.randn(t.d, generator=g))
    wait_until(lambda: t.owner.get(f"/runs/{t.run_id}")["round"] == 2, what="round 2 open")
    if cold:
        t.coord.ctx.runtimes[t.run_id].steps.clear()
    honest = [base + 3e-4 * torch.randn(t.d, generator=g) for _ in range(3)]
    for (w, j), u in zip(((a, ja), (b, jb), (c, jc)), honest, strict=True):
        _submit(api, t, w, j, u, r=2)
    _submit(api, t, x, jx, -0.5 * torch.stack(honest).mean(0), r=2)  # IPM: near the centre, backwards
    _settled(t, 2)

    step = round_params(t, 1) - round_params(t, 2)  # fedavg, lr 1: the aggregate itself
    # the median of the three honest updates; of all four it would differ
    torch.testing.assert_close(step, torch.stack(honest).median(0).values, rtol=0, atol=1e-6)
    assert not torch.allclose(step, torch.stack([*honest, -0.5 * torch.stack(honest).mean(0)]).median(0).values)
    kept = {
        r["worker_id"]: r["kept"]
        for r in t.coord.rows("SELECT worker_id, kept FROM scores WHERE run_id = :r AND round = 2", r=t.run_id)
    }
    assert kept[x.wallet.address] == 0.0
    # the median of three keeps one update per coordinate: the honest shares cover them all
    assert all(kept[w.wallet.address] > 0 for w in (a, b, c))
    assert abs(sum(kept[w.wallet.address] for w in (a, b, c)) - 1.0) < 1e-9


@pytest.mark.parametrize("cold", [False, True], ids=["remembered", "rebuilt"])
def test_centered_clip_starts_from_the_last_step_live(api, new_coordinator, cold):
    """``centered-clip:start=previous``: round 2's clipping starts from the model's last step,
    round 0's checkpoint minus round 1's, the reference the simulator passes too. Round 1 has
    none and starts from the medoid. ``rebuilt``: the driver forgets the step (as after a
    restart) and rebuilds it from the checkpoints."""
    spec = "centered-clip:start=previous"
    t = api.start_training_run(new_coordinator(), 4, aggregator=spec)
    g = torch.Generator().manual_seed(4)
    pairs = [(w, t.jobs[w.wallet.address]) for w in t.workers]
    base = 1e-3 * torch.randn(t.d, generator=g)  # (d,) the direction every honest update shares
    one = [base + 3e-4 * torch.randn(t.d, generator=g) for _ in pairs]
    for (w, j), u in zip(pairs, one, strict=True):
        _submit(api, t, w, j, u)
    wait_until(lambda: t.owner.get(f"/runs/{t.run_id}")["round"] == 2, what="round 2 open")
    if cold:
        t.coord.ctx.runtimes[t.run_id].steps.clear()
    honest = [base + 3e-4 * torch.randn(t.d, generator=g) for _ in range(3)]
    two = [*honest, -0.5 * torch.stack(honest).mean(0)]  # the last one IPM: near the centre, backwards
    for (w, j), u in zip(pairs, two, strict=True):
        _submit(api, t, w, j, u, r=2)
    _settled(t, 2)

    samples = {
        r["worker_id"]: float(r["samples"])
        for r in t.coord.rows("SELECT worker_id, samples FROM updates WHERE run_id = :r AND round = 2", r=t.run_id)
    }
    w2 = torch.tensor([samples[w.wallet.address] for w, _ in pairs])
    first_step = round_params(t, 0) - round_params(t, 1)  # fedavg, lr 1: round 1's aggregate
    torch.testing.assert_close(first_step, parse_aggregator(spec)(torch.stack(one), w2), rtol=0, atol=1e-6)
    step = round_params(t, 1) - round_params(t, 2)
    expected = parse_aggregator(spec)(torch.stack(two), w2, reference=first_step)
    torch.testing.assert_close(step, expected, rtol=0, atol=1e-6)
    from_medoid = parse_aggregator("centered-clip")(torch.stack(two), w2)
    assert float((expected - from_medoid).abs().max()) > 1e-5  # the start made a difference
