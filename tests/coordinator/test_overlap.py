"""Overlapping rounds (run option ``overlap``): which model an update may say it trained from.

With ``overlap`` 1 a worker trains round r+1 from the newest model it has while round r
closes, so its update names as ``base_cid`` the model round r started from (round
r - 1's checkpoint). The coordinator takes the round's own model or, with overlap, that
one; any other base is a 422 that records nothing. Without overlap only the round's own
model is a base. Progress of the round after the open one is taken only with overlap."""

from __future__ import annotations

import torch

from aitbc.training.checkpoint import bytes_to_tensors

from .conftest import wait_for


def _distinct(d: int, seed: int) -> torch.Tensor:
    """An update of its own (equal updates from two workers read as a copy)."""
    return 1e-3 * torch.randn(d, generator=torch.Generator().manual_seed(seed))


def _send_round(api, t, r: int) -> None:
    for i, w in enumerate(t.workers):
        cid = api.put_update(w, _distinct(t.d, 100 * r + i))
        w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", api.update_body(r, cid))


def _checkpoints(t) -> dict[int, str]:
    return {r["round"]: r["checkpoint_cid"] for r in t.owner.get(f"/runs/{t.run_id}/rounds")["data"]}


def _round_two_open(api, t) -> dict[int, str]:
    _send_round(api, t, 1)
    wait_for("round 2 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)
    return _checkpoints(t)


def test_with_overlap_an_update_may_start_from_the_model_before_the_rounds(new_coordinator, api):
    t = api.start_training_run(new_coordinator(), 2, overlap=1)
    assert t.owner.get(f"/runs/{t.run_id}")["config"]["overlap"] == 1
    w = t.workers[0]
    job = t.jobs[w.wallet.address]
    # round 2 is under way before round 1 closes: its progress is taken
    w.post(f"/jobs/{job}/progress", {"progress": 10.0, "status": "training", "round": 2, "step": 1})
    ckpt = _round_two_open(api, t)
    view = w.get(f"/workers/{w.wallet.address}/job", sign=True)["job"]
    assert (view["round"], view["overlap"], view["global_model_cid"]) == (2, 1, ckpt[1])

    for bad in ("bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku", "x"):
        cid = api.put_update(w, _distinct(t.d, 7))
        try:
            w.post(f"/jobs/{job}/updates", api.update_body(2, cid, base_cid=bad))
        except api.ApiError as e:
            assert (e.status, e.code) == (422, "wrong_base") and ckpt[0] in e.detail and ckpt[1] in e.detail, e
        else:
            raise AssertionError(f"base {bad!r} accepted")
        # nothing recorded (the books thread may be scoring round 1 meanwhile: no whole snapshot)
        assert t.coord.rows("SELECT id FROM updates WHERE round = 2") == []
        assert t.coord.rows("SELECT id FROM flags WHERE round = 2") == []

    cid = api.put_update(w, _distinct(t.d, 8))
    reply = w.post(f"/jobs/{job}/updates", api.update_body(2, cid, base_cid=ckpt[0]))
    assert reply["status"] == "accepted"
    w2 = t.workers[1]
    cid = api.put_update(w2, _distinct(t.d, 9))
    assert w2.post(f"/jobs/{t.jobs[w2.wallet.address]}/updates", api.update_body(2, cid, base_cid=ckpt[1]))
    wait_for("round 3 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 3, timeout=30)
    rounds = t.owner.get(f"/runs/{t.run_id}/rounds")["data"]
    assert rounds[2]["accepted"] == 2  # both applied to the newest model


def test_without_overlap_only_the_rounds_own_model_is_a_base(new_coordinator, api):
    t = api.start_training_run(new_coordinator(), 2)
    w = t.workers[0]
    job = t.jobs[w.wallet.address]
    try:
        w.post(f"/jobs/{job}/progress", {"progress": 10.0, "status": "training", "round": 2, "step": 1})
    except api.ApiError as e:
        assert (e.status, e.code) == (409, "wrong_round")
    else:
        raise AssertionError("progress of a round not open accepted without overlap")
    ckpt = _round_two_open(api, t)
    cid = api.put_update(w, _distinct(t.d, 10))
    try:
        w.post(f"/jobs/{job}/updates", api.update_body(2, cid, base_cid=ckpt[0]))
    except api.ApiError as e:
        assert (e.status, e.code) == (422, "wrong_base") and "overlap" not in e.detail, e
    else:
        raise AssertionError("the previous round's model accepted as a base without overlap")
    reply = w.post(f"/jobs/{job}/updates", api.update_body(2, cid, base_cid=ckpt[1]))  # its own: fine
    assert reply["status"] == "accepted"


def test_overlap_is_bounded(new_coordinator, api):
    coord = new_coordinator()
    owner = coord.client("bounded")
    run_id = api.create_run(owner)
    for bad in (2, -1):
        try:
            owner.post(f"/runs/{run_id}/distribute", {"rounds": 3, "overlap": bad})
        except api.ApiError as e:
            assert e.status == 422 and "overlap must be in [0, 1]" in e.detail, e
        else:
            raise AssertionError(f"overlap {bad} accepted")


def test_an_update_from_the_model_before_counts_by_the_staleness_rule(new_coordinator, api):
    """Round 2 with one update from round 0's model (u_a = 1e-3 everywhere) and one from
    round 1's (u_b = 2e-3): the mean takes u_a at half (``polynomial:a=1`` at one round
    late), so every parameter moves by -(s_a 0.5e-3 + s_b 2e-3) / (s_a + s_b) (an update is a
    pseudo-gradient: old - new)."""
    t = api.start_training_run(new_coordinator(), 2, overlap=1, aggregator="mean", outer="fedavg")
    ckpt = _round_two_open(api, t)
    (wa, wb) = t.workers
    cid = api.put_update(wa, torch.full((t.d,), 1e-3))
    wa.post(f"/jobs/{t.jobs[wa.wallet.address]}/updates", api.update_body(2, cid, base_cid=ckpt[0]))
    cid = api.put_update(wb, torch.full((t.d,), 2e-3))
    wb.post(f"/jobs/{t.jobs[wb.wallet.address]}/updates", api.update_body(2, cid))
    wait_for("round 3 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 3, timeout=30)
    rows = {r["worker_id"]: r for r in t.coord.rows("SELECT worker_id, samples, base_cid FROM updates WHERE round = 2")}
    a, b = rows[wa.wallet.address], rows[wb.wallet.address]
    assert (a["base_cid"], b["base_cid"]) == (ckpt[0], None)
    expected = (a["samples"] * 0.5e-3 + b["samples"] * 2e-3) / (a["samples"] + b["samples"])
    ckpt = _checkpoints(t)
    one, two = (bytes_to_tensors(t.owner.get_blob(ckpt[r])) for r in (1, 2))
    moved = torch.cat([(two[k] - one[k]).flatten() for k in sorted(one)])  # (d,) in any fixed order: all equal
    assert moved.numel() == t.d and torch.allclose(moved, torch.full_like(moved, -expected), atol=1e-6), (
        moved.min().item(),
        moved.max().item(),
        expected,
    )


def _send_round_cids(api, t, r: int) -> dict[str, str]:
    """Round ``r``'s updates from every worker; its update CID by worker address."""
    cids = {}
    for i, w in enumerate(t.workers):
        cid = api.put_update(w, _distinct(t.d, 100 * r + i))
        w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", api.update_body(r, cid))
        cids[w.wallet.address] = cid
    return cids


def test_an_update_trained_ahead_from_its_own_previous_update_counts_in_full(new_coordinator, api):
    """An eager start: round 2 trained from round 0's model less the worker's own round-1
    update (``prior_cid``) began about where round 1's model is, so it is not stale: the
    mean takes it at weight 1 (u_a = 1e-3 everywhere, u_b = 2e-3 from round 1's model), and
    its row keeps both the base and the prior."""
    t = api.start_training_run(new_coordinator(), 2, overlap=1, aggregator="mean", outer="fedavg")
    sent = _send_round_cids(api, t, 1)
    wait_for("round 2 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)
    ckpt = _checkpoints(t)
    (wa, wb) = t.workers
    cid = api.put_update(wa, torch.full((t.d,), 1e-3))
    body = api.update_body(2, cid, base_cid=ckpt[0], prior_cid=sent[wa.wallet.address])
    assert wa.post(f"/jobs/{t.jobs[wa.wallet.address]}/updates", body)["status"] == "accepted"
    cid = api.put_update(wb, torch.full((t.d,), 2e-3))
    wb.post(f"/jobs/{t.jobs[wb.wallet.address]}/updates", api.update_body(2, cid))
    wait_for("round 3 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 3, timeout=30)
    rows = {
        r["worker_id"]: r
        for r in t.coord.rows("SELECT worker_id, samples, base_cid, prior_cid FROM updates WHERE round = 2")
    }
    a, b = rows[wa.wallet.address], rows[wb.wallet.address]
    assert (a["base_cid"], a["prior_cid"]) == (ckpt[0], sent[wa.wallet.address])
    assert (b["base_cid"], b["prior_cid"]) == (None, None)
    expected = (a["samples"] * 1e-3 + b["samples"] * 2e-3) / (a["samples"] + b["samples"])  # both in full
    ckpt = _checkpoints(t)
    one, two = (bytes_to_tensors(t.owner.get_blob(ckpt[r])) for r in (1, 2))
    moved = torch.cat([(two[k] - one[k]).flatten() for k in sorted(one)])
    assert torch.allclose(moved, torch.full_like(moved, -expected), atol=1e-6), (moved.min().item(), expected)


def test_a_prior_is_only_the_jobs_own_update_of_the_round_before_on_an_update_trained_ahead(new_coordinator, api):
    """``prior_cid`` names this job's own update of the round before, on an update trained
    from the model before the round's; another worker's update, a blob that is no update of
    that round, or a prior on an update of the round's own model is a 422 ``wrong_prior``
    that records nothing."""
    t = api.start_training_run(new_coordinator(), 2, overlap=1)
    sent = _send_round_cids(api, t, 1)
    wait_for("round 2 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)
    ckpt = _checkpoints(t)
    (wa, wb) = t.workers
    job = t.jobs[wa.wallet.address]
    stranger = api.put_update(wa, _distinct(t.d, 55))  # stored, but no update of round 1
    cid = api.put_update(wa, _distinct(t.d, 56))
    for base, prior, says in (
        (ckpt[0], sent[wb.wallet.address], "is not this job's update of round 1"),
        (ckpt[0], stranger, "is not this job's update of round 1"),
        (ckpt[0], "x" * 101, None),  # longer than a CID: the schema's 422
        (ckpt[1], sent[wa.wallet.address], "only for an update trained ahead"),
        (None, sent[wa.wallet.address], "only for an update trained ahead"),
    ):
        try:
            wa.post(f"/jobs/{job}/updates", api.update_body(2, cid, base_cid=base, prior_cid=prior))
        except api.ApiError as e:
            assert e.status == 422 and (says is None or (e.code == "wrong_prior" and says in e.detail)), e
        else:
            raise AssertionError(f"prior {prior!r} on base {base!r} accepted")
        assert t.coord.rows("SELECT id FROM updates WHERE round = 2") == []
        assert t.coord.rows("SELECT id FROM flags WHERE round = 2") == []
    body = api.update_body(2, cid, base_cid=ckpt[0], prior_cid=sent[wa.wallet.address])
    assert wa.post(f"/jobs/{job}/updates", body)["status"] == "accepted"


def test_without_overlap_no_update_names_a_prior(new_coordinator, api):
    t = api.start_training_run(new_coordinator(), 2)
    sent = _send_round_cids(api, t, 1)
    wait_for("round 2 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)
    w = t.workers[0]
    cid = api.put_update(w, _distinct(t.d, 57))
    try:
        w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", api.update_body(2, cid, prior_cid=sent[w.wallet.address]))
    except api.ApiError as e:
        assert (e.status, e.code) == (422, "wrong_prior") and "overlap 1" in e.detail, e
    else:
        raise AssertionError("a prior accepted without overlap")
    assert t.coord.rows("SELECT id FROM updates WHERE round = 2") == []
