"""Overlapping rounds (run option ``overlap``): which model an update may say it trained from.

With ``overlap`` 1 a worker trains round r+1 from the newest model it has while round r
closes, so its update names as ``base_cid`` the model round r started from (round
r - 1's checkpoint). The coordinator takes the round's own model or, with overlap, that
one; any other base is a 422 that records nothing. Without overlap only the round's own
model is a base. Progress of the round after the open one is taken only with overlap."""

from __future__ import annotations

import json
import time

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
    for bad in (3, -1):
        try:
            owner.post(f"/runs/{run_id}/distribute", {"rounds": 3, "overlap": bad})
        except api.ApiError as e:
            assert e.status == 422 and "overlap must be in [0, 2]" in e.detail, e
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


# --- overlap 2: an update sent before its round opens, trained from up to two rounds back ---


def _post(w, t, body):
    return w.post(f"/jobs/{t.jobs[w.wallet.address]}/updates", body)


def _view(w):
    return w.get(f"/workers/{w.wallet.address}/job", sign=True)["job"]


def _refused(api, w, t, body, status: int, code: str, says: str, *, flagged: bool = False) -> None:
    """``body`` is refused with ``status``/``code`` naming ``says``; nothing of its round is
    recorded (no update row; a ``wrong_round`` flag only where ``flagged``)."""
    r = body["round"]
    flags = "SELECT id FROM flags WHERE worker_id = :w AND kind = 'wrong_round'"
    before = t.coord.rows(flags, w=w.wallet.address)
    try:
        _post(w, t, body)
    except api.ApiError as e:
        assert (e.status, e.code) == (status, code), e
        assert says in e.detail, e
    else:
        raise AssertionError(f"{body} accepted")
    assert t.coord.rows("SELECT id FROM updates WHERE round = :r AND worker_id = :w", r=r, w=w.wallet.address) == []
    after = t.coord.rows(flags, w=w.wallet.address)
    assert (len(after) > len(before)) == flagged, (before, after)


def test_with_overlap_2_the_next_rounds_update_is_taken_before_its_round_opens(new_coordinator, api):
    """A job whose update of the open round is in may send the next round's at once: its
    view says ``train`` with ``send_round`` r+1 (and ``wait`` once that is in too); the
    update names its base (round r-1's model, or the one before) and, trained ahead, its
    own updates since as a chain of priors (round r+1's names r's, which names r-1's while
    the base is older). Once round r closes, round r+1 opens with it in and closes as soon
    as the rest arrive, the eager start counting in full."""
    t = api.start_training_run(new_coordinator(), 2, overlap=2, aggregator="mean", outer="fedavg", rounds=4)
    (wa, wb) = t.workers
    ckpt = _checkpoints(t)
    u1 = api.put_update(wa, _distinct(t.d, 1))
    _post(wa, t, api.update_body(1, u1))
    view = _view(wa)
    assert (view["round"], view["send_round"], view["action"], view["overlap"]) == (1, 2, "train", 2), view
    assert view["global_model_cid"] == ckpt[0]
    u2 = api.put_update(wa, torch.full((t.d,), 1e-3))
    assert _post(wa, t, api.update_body(2, u2, base_cid=ckpt[0], prior_cid=u1))["round"] == 2
    view = _view(wa)
    assert (view["round"], view["send_round"], view["action"]) == (1, 2, "wait"), view
    assert t.owner.get(f"/runs/{t.run_id}")["round"] == 1  # round 1 waits for wb

    _post(wb, t, api.update_body(1, api.put_update(wb, _distinct(t.d, 2))))
    wait_for("round 2 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)
    ckpt = _checkpoints(t)
    view = _view(wa)
    assert (view["round"], view["send_round"], view["action"]) == (2, 3, "train"), view
    # round 3 ahead from round 0's model: its chain covers rounds 2 and 1 (u2 names u1)
    u3 = api.put_update(wa, _distinct(t.d, 3))
    assert _post(wa, t, api.update_body(3, u3, base_cid=ckpt[0], prior_cid=u2))["status"] == "accepted"
    assert _view(wb)["send_round"] == 2  # wb has not sent round 2 yet
    _post(wb, t, api.update_body(2, api.put_update(wb, torch.full((t.d,), 2e-3))))
    wait_for("round 3 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 3, timeout=30)
    rows = {
        (r["worker_id"], r["round"]): r
        for r in t.coord.rows("SELECT worker_id, round, samples, base_cid, prior_cid, status FROM updates")
    }
    a2, b2, a3 = rows[(wa.wallet.address, 2)], rows[(wb.wallet.address, 2)], rows[(wa.wallet.address, 3)]
    assert (a2["base_cid"], a2["prior_cid"], a2["status"]) == (ckpt[0], u1, "accepted")
    assert (a3["base_cid"], a3["prior_cid"]) == (ckpt[0], u2)
    assert (b2["base_cid"], b2["prior_cid"]) == (None, None)
    # round 2: wa's eager start counts in full, as wb's own-model update does
    ckpt = _checkpoints(t)
    one, two = (bytes_to_tensors(t.owner.get_blob(ckpt[r])) for r in (1, 2))
    moved = torch.cat([(two[k] - one[k]).flatten() for k in sorted(one)])
    expected = (a2["samples"] * 1e-3 + b2["samples"] * 2e-3) / (a2["samples"] + b2["samples"])
    assert torch.allclose(moved, torch.full_like(moved, -expected), atol=1e-6), (moved.min().item(), expected)


def test_an_update_sent_ahead_is_refused_unless_it_fits(new_coordinator, api):
    """What an update of the next round must be (each refusal a 4xx that records nothing):
    sent after its job's update of the open round (409 ``wrong_round``, no flag: a protocol
    slip, not a lie), naming a base (422 ``wrong_base``), a base at most two rounds before
    its round's (a third is 422), a prior chain that reaches down to its base's round (a
    link with no prior of its own leaves a round out: 422 ``wrong_prior``), and two rounds
    ahead is a lie (409 ``wrong_round``, flagged). Overlap 1 takes no update ahead."""
    t = api.start_training_run(new_coordinator(), 2, overlap=2, rounds=4)
    (wa, wb) = t.workers
    ckpt = _checkpoints(t)
    early = api.put_update(wa, _distinct(t.d, 10))
    _refused(api, wa, t, api.update_body(2, early, base_cid=ckpt[0]), 409, "wrong_round", "sends round 1's first")
    u1 = api.put_update(wa, _distinct(t.d, 11))
    _post(wa, t, api.update_body(1, u1))
    _refused(api, wa, t, api.update_body(2, early), 422, "wrong_base", "names its base_cid")
    _refused(
        api, wa, t, api.update_body(3, early, base_cid=ckpt[0]), 409, "wrong_round", "the open round is 1", flagged=True
    )
    _post(wb, t, api.update_body(1, api.put_update(wb, _distinct(t.d, 12))))
    wait_for("round 2 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)
    ckpt = _checkpoints(t)
    u2 = api.put_update(wa, _distinct(t.d, 13))
    _post(wa, t, api.update_body(2, u2))  # from round 1's model, its own: no prior
    # round 3 from round 0's model names u2, which names nothing: round 1's update is left out
    _refused(
        api, wa, t, api.update_body(3, early, base_cid=ckpt[0], prior_cid=u2), 422, "wrong_prior", "leaves out round 1"
    )
    # from round 1's model the chain is u2 alone: taken
    assert _post(wa, t, api.update_body(3, early, base_cid=ckpt[1], prior_cid=u2))["status"] == "accepted"
    _post(wb, t, api.update_body(2, api.put_update(wb, _distinct(t.d, 14))))
    wait_for("round 3 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 3, timeout=30)
    # round 4 ahead: round 0's model is three rounds before its round's (round 3's)
    ckpt = _checkpoints(t)
    _post(wb, t, api.update_body(3, api.put_update(wb, _distinct(t.d, 15))))
    late = api.put_update(wb, _distinct(t.d, 16))
    _refused(api, wb, t, api.update_body(4, late, base_cid=ckpt[0]), 422, "wrong_base", "(overlap 2)")
    assert _post(wb, t, api.update_body(4, late, base_cid=ckpt[1]))["status"] == "accepted"  # stale, no prior

    t1 = api.start_training_run(new_coordinator(), 2, overlap=1, rounds=4)
    (w1, _) = t1.workers
    _post(w1, t1, api.update_body(1, api.put_update(w1, _distinct(t1.d, 17))))
    base = _checkpoints(t1)[0]
    _refused(
        api,
        w1,
        t1,
        api.update_body(2, api.put_update(w1, _distinct(t1.d, 18)), base_cid=base),
        409,
        "wrong_round",
        "the open round is 1",
        flagged=True,
    )
    assert _view(w1)["send_round"] == 1


def test_an_update_sent_ahead_by_a_job_rejected_meanwhile_is_withdrawn(new_coordinator, api):
    """A job's round-2 update arrives while round 1 is open; its round-1 update is then
    rejected at the close (past the norm bound; it is slashed and ejected when round 1 is
    settled): when round 2 opens its update is withdrawn, never aggregated, scored or paid,
    and its bytes no longer counted."""
    t = api.start_training_run(new_coordinator(), 3, overlap=2, rounds=3)
    (wa, wb, wx) = t.workers
    ckpt = _checkpoints(t)
    g = torch.Generator().manual_seed(5)
    base = 1e-3 * torch.randn(t.d, generator=g)
    ux = api.put_update(wx, torch.full((t.d,), 3e38))  # finite, correctly shaped, grossly large
    _post(wx, t, api.update_body(1, ux))
    ahead = api.put_update(wx, base)
    assert _post(wx, t, api.update_body(2, ahead, base_cid=ckpt[0], prior_cid=ux))["status"] == "accepted"
    bytes_with = t.coord.rows("SELECT bytes_up FROM runs WHERE id = :r", r=t.run_id)[0]["bytes_up"]
    for w in (wa, wb):
        _post(w, t, api.update_body(1, api.put_update(w, base + 1e-4 * torch.randn(t.d, generator=g))))
    wait_for("round 2 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)
    rows = t.coord.rows("SELECT worker_id, round, status FROM updates WHERE worker_id = :w", w=wx.wallet.address)
    assert [(r["round"], r["status"]) for r in rows] == [(1, "rejected")], rows
    size = t.coord.rows("SELECT size FROM updates WHERE round = 1 AND worker_id = :w", w=wa.wallet.address)[0]["size"]
    # the two round-1 updates in, the withdrawn one out (every update here is the same size)
    assert t.coord.rows("SELECT bytes_up FROM runs WHERE id = :r", r=t.run_id)[0]["bytes_up"] == bytes_with + size
    # round 2 closes on the two others, without it
    for w in (wa, wb):
        _post(w, t, api.update_body(2, api.put_update(w, base + 1e-4 * torch.randn(t.d, generator=g))))
    wait_for("round 3 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 3, timeout=30)
    rec = t.owner.get(f"/runs/{t.run_id}/rounds")["data"][2]
    assert (rec["accepted"], rec["rejected"]) == (2, 0), rec


def test_a_long_poll_after_a_round_waits_for_the_next_model_not_for_the_jobs_own_sends(new_coordinator, api):
    """``GET /workers/{id}/job?wait=..&after=r`` (overlap 2's look-ahead): a job whose view
    says ``train`` (send round 2 ahead) is not answered while round 1 is open, only once a
    round past it is; without ``after`` it is answered at once."""
    t = api.start_training_run(new_coordinator(), 2, overlap=2, rounds=4)
    (wa, wb) = t.workers
    _post(wa, t, api.update_body(1, api.put_update(wa, _distinct(t.d, 30))))
    path = f"/workers/{wa.wallet.address}/job"
    assert wa.get(path, params={"wait": 5}, sign=True)["job"]["send_round"] == 2  # at once: train
    t0 = time.monotonic()
    held = wa.get(path, params={"wait": 0.5, "after": 1}, sign=True)["job"]
    assert time.monotonic() - t0 >= 0.45 and held["round"] == 1, held  # held to its wait: round 1 is open
    _post(wb, t, api.update_body(1, api.put_update(wb, _distinct(t.d, 31))))
    view = wa.get(path, params={"wait": 30, "after": 1}, sign=True)["job"]
    assert (view["round"], view["send_round"], view["action"]) == (2, 2, "train"), view


def test_a_rejected_update_sent_ahead_stays_as_evidence_when_its_job_ends(new_coordinator, api):
    """A job sends a NaN update ahead of its round (recorded rejected, 422), then its owner
    ends the job before that round opens: the accepted updates of a gone job are withdrawn
    when their round opens, but a rejected one stays, and its round's settlement slashes
    the worker on it (leaving cannot erase the evidence)."""
    t = api.start_training_run(new_coordinator(), 3, overlap=2, rounds=3)
    (wa, wb, wx) = t.workers
    ckpt = _checkpoints(t)
    g = torch.Generator().manual_seed(7)
    ux = api.put_update(wx, 1e-3 * torch.randn(t.d, generator=g))
    _post(wx, t, api.update_body(1, ux))
    bad = torch.zeros(t.d)
    bad[3] = float("nan")
    try:
        _post(wx, t, api.update_body(2, api.put_update(wx, bad), base_cid=ckpt[0], prior_cid=ux))
    except api.ApiError as e:
        assert (e.status, e.code) == (422, "update_rejected") and "NaN" in e.detail, e
    else:
        raise AssertionError("a NaN update sent ahead was accepted")
    t.owner.post(f"/jobs/{t.jobs[wx.wallet.address]}/end", {"status": "released", "reason": "leaving"})
    for r in (1, 2):
        for w in (wa, wb):
            _post(w, t, api.update_body(r, api.put_update(w, 1e-3 * torch.randn(t.d, generator=g))))
        wait_for(f"round {r + 1} open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda n, r=r: n == r + 1)
    rows = t.coord.rows("SELECT round, status FROM updates WHERE worker_id = :w ORDER BY round", w=wx.wallet.address)
    assert [(r["round"], r["status"]) for r in rows] == [(1, "accepted"), (2, "rejected")], rows
    settled = "SELECT settled_round FROM runs WHERE id = :r"
    wait_for("round 2 settled", lambda: t.coord.rows(settled, r=t.run_id)[0]["settled_round"], lambda n: n >= 2)
    pay = {row["worker_id"]: row for row in t.owner.get(f"/runs/{t.run_id}/payments")["data"]}
    assert pay[wx.wallet.address]["status"] == "slashed", pay[wx.wallet.address]
    assert pay[wa.wallet.address]["status"] != "slashed" and pay[wb.wallet.address]["status"] != "slashed"


def _eager_round_two(api, t, u: torch.Tensor, d: torch.Tensor) -> dict:
    """Round 1: worker A sends ``u``, B sends ``-u`` (the mean leaves round 0's model as it
    was). Round 2: A, trained from round 0's model less ``u`` (an eager start), sends ``d``;
    B sends an update of its own. A's round-2 score once the books thread has it."""
    (wa, wb) = t.workers
    ua = api.put_update(wa, u)
    wa.post(f"/jobs/{t.jobs[wa.wallet.address]}/updates", api.update_body(1, ua))
    wb.post(f"/jobs/{t.jobs[wb.wallet.address]}/updates", api.update_body(1, api.put_update(wb, -u)))
    wait_for("round 2 open", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)
    ckpt = _checkpoints(t)
    body = api.update_body(2, api.put_update(wa, d), base_cid=ckpt[0], prior_cid=ua)
    assert wa.post(f"/jobs/{t.jobs[wa.wallet.address]}/updates", body)["status"] == "accepted"
    wb.post(f"/jobs/{t.jobs[wb.wallet.address]}/updates", api.update_body(2, api.put_update(wb, _distinct(t.d, 9))))
    scored = wait_for(
        "round 2 scored",
        lambda: t.coord.rows("SELECT worker_id, gain, own_gain, flags, quality FROM scores WHERE round = 2"),
        lambda rows: len(rows) == 2,
        timeout=60,
    )
    return next(r for r in scored if r["worker_id"] == wa.wallet.address)


def _flags(score: dict) -> list:
    """A score row's flags (a JSON string on SQLite, a list on PostgreSQL)."""
    return score["flags"] if isinstance(score["flags"], list) else json.loads(score["flags"])


def _descent(api, t, params: torch.Tensor, lr: float) -> torch.Tensor:
    """(d,) ``lr`` x the gradient of the loss of the model ``params`` on worker A's shard:
    a step of honest training (the update a worker sends is start - end)."""
    from aitbc.training.checkpoint import load_shard, set_flat_params
    from aitbc.training.local import loss_fn

    manifest = api.run_manifest(t)
    shard = t.coord.rows("SELECT shard_index FROM jobs WHERE id = :j", j=t.jobs[t.workers[0].wallet.address])
    x, y = load_shard(t.owner.get_blob(manifest["shards"][shard[0]["shard_index"]]["cid"]))
    model = api.run_model(t)
    set_flat_params(model, params)
    loss = loss_fn(model(x), y)  # as the worker's trainer takes it
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return lr * torch.cat([g.flatten() for g in grads])


def test_an_eager_update_is_credited_for_the_point_its_training_reached(new_coordinator, api):
    """An honest eager update: from its start (round 0's model less its own round-1 update
    ``u``) it trains a step ``g`` down its shard's loss, so it sends ``-u + g`` and ends at
    round 0's model less ``g``, better than round 1's model (round 0's here). Its gains are
    measured from the round's model to that end point: credited. Applied to the round's
    model instead (the rule before), ``-u + g`` lands at round 0's model plus ``u``: a
    large loss, unpaid."""
    t = api.start_training_run(new_coordinator(), 2, overlap=1, aggregator="mean", outer="fedavg", rounds=2)
    u = 1.0 * torch.randn(t.d, generator=torch.Generator().manual_seed(5))
    g = _descent(api, t, api.round_params(t, 0), lr=0.5)
    a = _eager_round_two(api, t, u, -u + g)
    assert a["own_gain"] > 0.01 and _flags(a) == [] and a["quality"] > 0, a


def test_an_eager_update_that_only_undoes_its_own_last_one_earns_nothing(new_coordinator, api):
    """Paid for leaving a bad start of its own making: a worker sends a worthless ``u``,
    then ``-u`` from its eager start (round 0's model less ``u``): from that start, a large
    gain; but it ends at round 0's model, which round 1's model already is. Measured from
    the round's model to where it ended, it gained nothing and earns nothing."""
    t = api.start_training_run(new_coordinator(), 2, overlap=1, aggregator="mean", outer="fedavg", rounds=2)
    u = 1.0 * torch.randn(t.d, generator=torch.Generator().manual_seed(5))
    a = _eager_round_two(api, t, u, -u)
    assert abs(a["gain"]) < 1e-3 and abs(a["own_gain"]) < 1e-3 and a["quality"] < 1e-3, a  # noise: a sliver


def test_an_eager_start_is_kept_until_scored_and_a_broken_chain_falls_back(new_coordinator, api):
    """Blob retention keeps an unsettled update's base (its eager start is rebuilt from it);
    a chain whose blobs are gone is judged at its round's model, not retried for ever."""
    from sqlalchemy import select

    from aitbc.coordinator.storage import retention
    from aitbc.coordinator.store.models import Update
    from aitbc.coordinator.verification import scoring

    coord = new_coordinator()
    t = api.start_training_run(coord, 2, overlap=1, aggregator="mean", outer="fedavg", rounds=3)
    u = 1.0 * torch.randn(t.d, generator=torch.Generator().manual_seed(5))
    _eager_round_two(api, t, u, -u)
    ckpt = _checkpoints(t)
    wait_for("round 2 settled", lambda: t.owner.get(f"/runs/{t.run_id}/payments")["settled_round"], lambda r: r == 2)
    with coord.ctx.session() as s:
        # keep 1: the newest 1 + overlap checkpoints (rounds 2 and 1) and those from the
        # settled round on; round 0's stays only as round 2's eager update's base
        assert ckpt[0] in retention.live_cids(s, keep_checkpoints=1)
        upd = s.scalars(
            select(Update).where(Update.run_id == t.run_id, Update.round == 2, Update.prior_cid.is_not(None))
        ).one()
        assert scoring._judged_at(coord.ctx, s, upd, ckpt[1]) == (ckpt[1], (ckpt[0], (upd.prior_cid,)))
        (coord.ctx.store.dir / upd.prior_cid).unlink()
        assert scoring._judged_at(coord.ctx, s, upd, ckpt[1]) == (ckpt[1], None)


def test_an_update_a_later_one_sent_ahead_names_cannot_be_dropped_alone(new_coordinator, api):
    """Overlap 2: a job's round-2 update, sent ahead, names its round-1 update as its prior.
    An owner's resend of round 1 would leave that chain pointing at nothing: a 409 naming
    why, and both updates stay."""
    t = api.start_training_run(new_coordinator(), 2, overlap=2, aggregator="mean", outer="fedavg", rounds=4)
    wa = t.workers[0]
    ckpt = _checkpoints(t)
    u1 = api.put_update(wa, _distinct(t.d, 1))
    _post(wa, t, api.update_body(1, u1))
    u2 = api.put_update(wa, _distinct(t.d, 2))
    _post(wa, t, api.update_body(2, u2, base_cid=ckpt[0], prior_cid=u1))
    job = t.jobs[wa.wallet.address]
    try:
        t.owner.post(f"/jobs/{job}/resend", {})
    except api.ApiError as e:
        assert (e.status, e.code) == (409, "update_sent_ahead") and "round 2" in e.detail, e
    else:
        raise AssertionError("resend of an update a later one names was taken")
    rows = t.coord.rows("SELECT round, cid FROM updates WHERE job_id = :j ORDER BY round", j=job)
    assert [(r["round"], r["cid"]) for r in rows] == [(1, u1), (2, u2)]
    assert t.coord.rows("SELECT count(*) AS n FROM flags WHERE kind = 'resend_requested'")[0]["n"] == 0
