"""Async runs (``distribute`` with ``mode`` async): buffers, staleness, refusals.

A version is one applied buffer (a round): with ``buffer`` 1 every accepted update is
applied at once. An update names the version it was trained from (``base_cid``); its
staleness is the versions applied since; past ``max_staleness`` it is refused (409
``too_stale``, no update recorded, a ``stale_update`` flag that costs no reputation),
within it the update is scaled by the run's staleness rule. The combinations async cannot
take are one-line 422s that leave the run as it was."""

from __future__ import annotations

import torch

from aitbc.training.checkpoint import bytes_to_tensors

from .conftest import wait_for


def _round(t) -> int:
    return t.owner.get(f"/runs/{t.run_id}")["round"]


def _checkpoints(t) -> dict[int, str]:
    return {r["round"]: r["checkpoint_cid"] for r in t.owner.get(f"/runs/{t.run_id}/rounds")["data"]}


def _send(api, t, w, round: int, u: torch.Tensor, base: str | None) -> dict:
    cid = api.put_update(w, u)
    body = api.update_body(round, cid, **({"base_cid": base} if base else {}))
    return w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", body)


def test_refused_combinations_are_one_line_422s(new_coordinator, api):
    _, owner, run_id = api.hired_run(new_coordinator(), 2, prefix="c")
    cases = [
        ({"mode": "async", "topology": "ring"}, "topology is for mode gossip"),
        ({"mode": "async", "overlap": 1}, "overlap is for sync runs"),
        ({"mode": "async", "verify_rate": 0.1}, "spot checks (verify_rate > 0) are not available with mode async"),
        ({"mode": "async", "staleness": "bogus"}, "unknown staleness rule 'bogus'"),
        ({"mode": "async", "staleness": "polynomial:a=-1"}, "a must be >= 0"),
        ({"mode": "async", "max_staleness": -1}, "max_staleness must be in [0, 1000]"),
        ({"mode": "async", "buffer": 0}, "buffer must be in [1, 10000]"),
    ]
    api.refuses_distribute(owner, run_id, cases)
    assert owner.get(f"/runs/{run_id}")["status"] == "initializing"  # nothing changed


def test_buffer_larger_than_the_workers_is_refused(new_coordinator, api):
    coord = new_coordinator()
    try:
        api.start_training_run(coord, 2, mode="async", buffer=3)
    except api.ApiError as e:
        assert e.status == 422 and "buffer 3 exceeds max_workers (2)" in e.detail, e.detail
    else:
        raise AssertionError("a buffer no version can fill accepted")


def test_stale_updates_are_weighted_and_refused_past_the_bound(new_coordinator, api):
    t = api.start_training_run(
        new_coordinator(),
        2,
        mode="async",
        buffer=1,
        max_staleness=1,
        staleness="polynomial:a=1",
        aggregator="mean",
        outer="fedavg",
        rounds=5,
    )
    cfg = t.owner.get(f"/runs/{t.run_id}")["config"]
    assert (cfg["mode"], cfg["buffer"], cfg["max_staleness"]) == ("async", 1, 1)
    wa, wb = t.workers
    ck = _checkpoints(t)
    view = wb.get(f"/workers/{wb.wallet.address}/job", sign=True)["job"]
    assert view["mode"] == "async" and view["global_model_cid"] == ck[0]

    # A sends twice: versions 1 and 2 (buffer 1: each update is a version)
    _send(api, t, wa, 1, 1e-3 * torch.randn(t.d, generator=torch.Generator().manual_seed(1)), ck[0])
    wait_for("version 1", lambda: _round(t), lambda r: r == 2, timeout=30)
    ck = _checkpoints(t)
    _send(api, t, wa, 2, 1e-3 * torch.randn(t.d, generator=torch.Generator().manual_seed(2)), ck[1])
    wait_for("version 2", lambda: _round(t), lambda r: r == 3, timeout=30)
    ck = _checkpoints(t)

    # B trained from version 0: two versions behind, the bound is 1
    try:
        _send(api, t, wb, 1, torch.full((t.d,), 1e-3), ck[0])
    except api.ApiError as e:
        assert (e.status, e.code) == (409, "too_stale") and "2 versions behind" in e.detail, e
    else:
        raise AssertionError("an update past max_staleness accepted")
    assert t.coord.rows("SELECT id FROM updates WHERE worker_id = :w", w=wb.wallet.address) == []
    flags = t.coord.rows("SELECT kind FROM flags WHERE worker_id = :w", w=wb.wallet.address)
    assert [f["kind"] for f in flags] == ["stale_update"]
    offer = t.coord.rows("SELECT flags, reputation FROM offers WHERE id = :w", w=wb.wallet.address)[0]
    assert offer["flags"] == 0  # slowness is no fault

    # a base that is no version of this run: 422, nothing written
    try:
        _send(api, t, wb, 1, torch.full((t.d,), 1e-3), "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku")
    except api.ApiError as e:
        assert (e.status, e.code) == (422, "wrong_base"), e
    else:
        raise AssertionError("a foreign base accepted")

    # B trained from version 1: one behind, counts (1 + 1)^-1 = a half; applied as version 3
    reply = _send(api, t, wb, 2, torch.full((t.d,), 2e-3), ck[1])
    assert reply["round"] == 3
    wait_for("version 3", lambda: _round(t), lambda r: r == 4, timeout=30)
    ck = _checkpoints(t)
    two, three = (bytes_to_tensors(t.owner.get_blob(ck[r])) for r in (2, 3))
    moved = torch.cat([(three[k] - two[k]).flatten() for k in sorted(two)])  # (d,)
    assert torch.allclose(moved, torch.full_like(moved, -1e-3), atol=1e-6), (moved.min(), moved.max())

    run = t.owner.get(f"/runs/{t.run_id}")
    lag = {w["worker_id"]: w["staleness"] for w in run["workers"]}
    assert lag == {wa.wallet.address: 0, wb.wallet.address: 1}
    assert run["asynchronous"]["version"] == 3 and run["asynchronous"]["refused_stale"] == 1

    # the same update again (its reply lost): a duplicate, not a second entry in a later buffer
    row = t.coord.rows("SELECT cid FROM updates WHERE worker_id = :w", w=wb.wallet.address)[0]
    try:
        wb.post(f"/jobs/{t.jobs[wb.wallet.address]}/updates", api.update_body(4, row["cid"], base_cid=ck[3]))
    except api.ApiError as e:
        assert (e.status, e.code) == (409, "duplicate_update"), e
    else:
        raise AssertionError("a resent update recorded twice")
    # a version not yet published: refused
    cid = api.put_update(wa, torch.full((t.d,), 1e-3))
    try:
        wa.post(f"/jobs/{t.jobs[wa.wallet.address]}/updates", api.update_body(9, cid))
    except api.ApiError as e:
        assert (e.status, e.code) == (409, "wrong_round"), e
    else:
        raise AssertionError("an update for an unpublished version accepted")


def test_a_buffer_takes_one_update_per_job(new_coordinator, api):
    """Buffer 2: one job cannot fill it with two updates (one per job and buffer); the
    second worker's update completes it, and nobody is flagged a straggler."""
    t = api.start_training_run(new_coordinator(), 2, mode="async", buffer=2, aggregator="mean", rounds=3)
    wa, wb = t.workers
    ck = _checkpoints(t)
    _send(api, t, wa, 1, torch.full((t.d,), 1e-3), ck[0])
    try:  # the same job twice in one buffer
        _send(api, t, wa, 1, torch.full((t.d,), 2e-3), ck[0])
    except api.ApiError as e:
        assert (e.status, e.code) == (409, "duplicate_update"), e
    else:
        raise AssertionError("two updates of one job in one buffer")
    _send(api, t, wb, 1, torch.full((t.d,), 3e-3), ck[0])
    wait_for("version 1", lambda: _round(t), lambda r: r == 2, timeout=30)
    recs = t.owner.get(f"/runs/{t.run_id}/rounds")["data"]
    assert recs[1]["accepted"] == 2 and recs[1]["stragglers"] == []


def test_an_owner_driven_run_cannot_be_async(new_coordinator, api):
    coord = new_coordinator()
    w = api.register_worker(coord, "m0")
    owner = coord.client("manual-owner")
    owner.post("/wallets/fund", {"amount": "1000"})
    run = owner.post(
        "/runs", {"model_type": "mlp", "dataset_size": "1GB", "target_workers": 1, "control": "manual", "budget": "100"}
    )
    run_id = run["training_id"]
    api.upload_digits(owner, run_id, 2)
    owner.post(f"/runs/{run_id}/contracts", {"worker_id": w.wallet.address, "price": "1"})
    try:
        owner.post(f"/runs/{run_id}/phase", {"phase": "distributing", "config": {"rounds": 2, "mode": "async"}})
    except api.ApiError as e:
        assert e.status == 422 and "mode async needs automatic control" in e.detail, e
    else:
        raise AssertionError("an owner-driven async run accepted")
    assert owner.get(f"/runs/{run_id}")["status"] == "initializing"
