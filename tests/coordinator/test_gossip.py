"""Gossip runs on the coordinator (``distribute`` with ``mode`` gossip): the config it
refuses, the signed model records it refuses (each a one-line error, nothing written),
and a round's record closing on the consensus of the published models."""

from __future__ import annotations

import time

import pytest
import torch

from aitbc.core.compression import build_codec
from aitbc.ledger.records import make_record
from aitbc.ledger.wallet import Wallet

from .conftest import round_params, update_blob, wait_for

OTHER_CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"


def test_refused_combinations_are_one_line_422s(new_coordinator, api):
    _, owner, run_id = api.hired_run(new_coordinator(), 3, prefix="g")
    cases = [
        ({"mode": "gossip", "topology": "star"}, "unknown --topology 'star'; allowed: ring, random:K"),
        ({"mode": "gossip", "topology": "random:3"}, "needs 1 <= K < workers (3), got K=3"),
        ({"mode": "gossip", "topology": "random:x"}, "needs an integer K"),
        ({"mode": "gossip", "topology": "ring:2"}, "unknown --topology 'ring:2'"),
        ({"mode": "sync", "topology": "ring"}, "topology is for mode gossip"),
        ({"mode": "gossip", "overlap": 1}, "overlap is for sync runs"),
        ({"mode": "gossip", "verify_rate": 0.1}, "spot checks (verify_rate > 0)"),
        ({"mode": "gossip", "buffer": 2}, "buffer is for mode async"),
        ({"mode": "gossip", "error_feedback": True}, "error feedback has nothing to carry"),
        ({"mode": "gossip", "outer": "diloco"}, "takes no outer step"),
        ({"mode": "gossip", "compression": "topk:ratio=0.1"}, "would destroy whole models"),
        ({"mode": "gossip", "compression": "bogus"}, "bogus"),
        ({"mode": "gossip", "aggregator": "krum:f=1"}, "krum"),  # 3 models a mix: krum needs n >= 2f+3
    ]
    api.refuses_distribute(owner, run_id, cases)
    run = owner.get(f"/runs/{run_id}")
    assert run["status"] == "initializing" and not run["config"]  # nothing changed


def _publish(w, t, r: int, cid: str, **over):
    signed = make_record(
        w.wallet, training_id=t.run_id, job_id=t.jobs[w.wallet.address], round=r, cid=cid, samples=10, train_loss=0.5
    )
    signed["record"].update(over)
    return signed


def _count(t) -> int:
    return t.coord.rows("SELECT count(*) AS n FROM updates WHERE run_id = :r", r=t.run_id)[0]["n"]


def test_bad_records_are_refused_and_change_nothing(new_coordinator, api):
    t = api.start_training_run(new_coordinator(), 3, mode="gossip", topology="ring", aggregator="median")
    wa, wb, wc = t.workers
    view = wa.get(f"/workers/{wa.wallet.address}/job", sign=True)["job"]
    g = view["gossip"]
    assert view["mode"] == "gossip" and view["action"] == "train" and g["topology"] == "ring" and g["next_round"] == 1
    assert [e["worker"] for e in g["roster"]] == [w.wallet.address for w in sorted(t.workers, key=_shard(t))]
    assert {e["public_key"] for e in g["roster"]} == {w.wallet.public_key for w in t.workers}
    assert all(e["url"] is None for e in g["roster"])  # nobody advertised: models go through the coordinator

    base = round_params(t, 0)
    models = {
        w.wallet.address: base + 1e-3 * torch.randn(t.d, generator=torch.Generator().manual_seed(i))
        for i, w in enumerate(t.workers)
    }
    cids = {}
    for w in t.workers:
        blob = update_blob(models[w.wallet.address])
        cids[w.wallet.address] = _put(w, blob)
    job_a = t.jobs[wa.wallet.address]
    good = _publish(wa, t, 1, cids[wa.wallet.address])
    forger = Wallet.generate("forger")
    forged = make_record(
        forger, training_id=t.run_id, job_id=job_a, round=1, cid=cids[wa.wallet.address], samples=10, train_loss=0.5
    )
    forged["record"]["worker"] = wa.wallet.address  # claims to be A, signed by another key
    unsigned = {"record": good["record"], "signature": "00" * 64}
    other_run = make_record(
        wa.wallet, training_id="training_000000000000", job_id=job_a, round=1, cid=OTHER_CID, samples=1, train_loss=None
    )
    other_job = make_record(
        wa.wallet,
        training_id=t.run_id,
        job_id=t.jobs[wb.wallet.address],
        round=1,
        cid=OTHER_CID,
        samples=1,
        train_loss=None,
    )
    cases = [
        (wa, job_a, unsigned, 422, "bad_record", "signature does not verify"),
        (wa, job_a, forged, 422, "bad_record", "signature does not verify"),
        (wa, job_a, {"record": good["record"], "signature": good["signature"], "extra": 1}, 422, None, None),
        (
            wa,
            job_a,
            {**good, "record": {**good["record"], "round": 2}},
            422,
            "bad_record",
            "signature",
        ),  # altered after signing
        (wa, job_a, other_run, 422, "wrong_record", "the record is for run 'training_000000000000'"),
        (wa, job_a, other_job, 422, "wrong_record", "this is job"),
        (wa, t.jobs[wb.wallet.address], good, 403, None, None),  # someone else's job
        (
            wa,
            job_a,
            make_record(
                wa.wallet, training_id=t.run_id, job_id=job_a, round=0, cid=OTHER_CID, samples=1, train_loss=None
            ),
            422,
            "bad_record",
            "round must be",
        ),
        (
            wa,
            job_a,
            make_record(
                wa.wallet, training_id=t.run_id, job_id=job_a, round=4, cid=OTHER_CID, samples=1, train_loss=None
            ),
            422,
            "bad_record",
            "[1, 3]",
        ),
        (
            wa,
            job_a,
            make_record(
                wa.wallet, training_id=t.run_id, job_id=job_a, round=1, cid="not-a-cid", samples=1, train_loss=None
            ),
            422,
            "bad_cid",
            "CIDv1",
        ),
        (
            wa,
            job_a,
            make_record(
                wa.wallet, training_id=t.run_id, job_id=job_a, round=1, cid=OTHER_CID, samples=1, train_loss="low"
            ),
            422,
            "bad_record",
            "train_loss",
        ),
    ]
    for w, job, body, status, code, words in cases:
        try:
            w.post(f"/jobs/{job}/records", body)
        except api.ApiError as e:
            assert e.status == status and (code is None or e.code == code), (body, e)
            assert words is None or words in e.detail, (words, e.detail)
            assert "\n" not in e.detail
        else:
            raise AssertionError(f"accepted: {body}")
        assert _count(t) == 0  # nothing written
    assert (
        t.coord.rows(
            "SELECT count(*) AS n FROM flags",
        )[0]["n"]
        == 0
    )

    assert wa.post(f"/jobs/{job_a}/records", good)["duplicate"] is False
    assert wa.post(f"/jobs/{job_a}/records", good)["duplicate"] is True  # its reply was lost: sent again
    assert _count(t) == 1  # (a second CID for the round: equivocation, the test below)
    assert wb.get(f"/jobs/{job_a}/records", params={"round": 1}) == good  # a neighbour's view of it

    # the other two publish: round 1's record closes on the consensus of the three models
    for w in (wb, wc):
        w.post(f"/jobs/{t.jobs[w.wallet.address]}/records", _publish(w, t, 1, cids[w.wallet.address]))
    wait_for("round 1 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)
    rec = t.owner.get(f"/runs/{t.run_id}/rounds")["data"][1]
    consensus = round_params(t, 1)
    expected = torch.stack(list(models.values())).median(dim=0).values
    assert torch.allclose(consensus, expected, atol=1e-6)  # the run's rule (median) over the models
    assert rec["val_loss"] is not None
    detail = t.owner.get(f"/runs/{t.run_id}")
    assert detail["gossip"]["recorded_round"] == 1 and detail["gossip"]["spread"] > 0, detail["gossip"]

    # a record for the closed round: 409, nothing written
    n = _count(t)
    try:
        wa.post(f"/jobs/{job_a}/records", good)
    except api.ApiError as e:
        assert (e.status, e.code) == (409, "round_closed"), e
    else:
        raise AssertionError("a record for a closed round accepted")
    assert _count(t) == n


def test_a_sync_run_takes_no_records(new_coordinator, api):
    t = api.start_training_run(new_coordinator(), 2)
    w = t.workers[0]
    try:
        w.post(f"/jobs/{t.jobs[w.wallet.address]}/records", _publish(w, t, 1, OTHER_CID))
    except api.ApiError as e:
        assert (e.status, e.code) == (409, "not_gossip"), e
    else:
        raise AssertionError("a record for a sync run accepted")
    assert _count(t) == 0


def _shard(t):
    rows = {
        r["worker_id"]: r["shard_index"]
        for r in t.coord.rows("SELECT worker_id, shard_index FROM jobs WHERE run_id = :r", r=t.run_id)
    }
    return lambda w: rows[w.wallet.address]


def _put(w, blob: bytes) -> str:
    from aitbc.storage.cid import cid_of_bytes

    cid = cid_of_bytes(blob)
    w.put_blob(cid, blob)
    return cid


def _witness(w, *signed):
    return w.post("/records/witnessed", {"records": list(signed)})["data"]


def _flags(t) -> list[tuple[str, int, str]]:
    rows = t.coord.rows("SELECT worker_id, round, kind FROM flags WHERE run_id = :r ORDER BY id", r=t.run_id)
    return [(r["worker_id"], r["round"], r["kind"]) for r in rows]


def _status(t, w, r: int) -> str:
    rows = t.coord.rows("SELECT status FROM updates WHERE job_id = :j AND round = :r", j=t.jobs[w.wallet.address], r=r)
    return rows[0]["status"]


def test_equivocation_is_proved_by_two_signed_records_and_flagged(new_coordinator, api):
    """A worker that signs two records of one round naming different models (one served to
    a neighbour, another published) is flagged ``equivocation`` whichever the coordinator
    sees first, and its model of the round is not counted; an honest worker is never."""
    t = api.start_training_run(new_coordinator(), 3, mode="gossip", topology="ring", aggregator="median")
    wa, wb, wc = t.workers
    base = round_params(t, 0)
    cids = {}
    for i, name in enumerate(["a1", "a2", "b1", "b2", "c1"]):
        blob = update_blob(base + 1e-3 * torch.randn(t.d, generator=torch.Generator().manual_seed(i)))
        cids[name] = _put(wa, blob)

    # A served a1 to B (B reports what it received: nothing to compare yet, kept), then
    # publishes a2 for the same round: caught at publish
    a1 = _publish(wa, t, 1, cids["a1"])
    assert [v["verdict"] for v in _witness(wb, a1)] == ["kept"]
    assert [v["verdict"] for v in _witness(wc, a1)] == ["consistent"]  # C received the same: one copy kept
    assert t.coord.rows("SELECT count(*) AS n FROM gossip_witnesses")[0]["n"] == 1
    with pytest.raises(api.ApiError) as e:
        wa.post(f"/jobs/{t.jobs[wa.wallet.address]}/records", _publish(wa, t, 1, cids["a2"]))
    api.assert_api_error(e, 409, "conflicting_record", "equivocation")
    assert _flags(t) == [(wa.wallet.address, 1, "equivocation")]
    assert _status(t, wa, 1) == "rejected"  # its published model of the round is not counted

    # B publishes b1, then C reports the b2 that B served it: caught at the report
    assert wb.post(f"/jobs/{t.jobs[wb.wallet.address]}/records", _publish(wb, t, 1, cids["b1"]))["duplicate"] is False
    assert [v["verdict"] for v in _witness(wc, _publish(wb, t, 1, cids["b1"]))] == ["consistent"]
    reply = _witness(wc, _publish(wb, t, 1, cids["b2"]))
    assert [(v["worker"], v["round"], v["verdict"]) for v in reply] == [(wb.wallet.address, 1, "equivocation")]
    assert _flags(t) == [(wa.wallet.address, 1, "equivocation"), (wb.wallet.address, 1, "equivocation")]
    assert _status(t, wb, 1) == "rejected"
    _witness(wa, _publish(wb, t, 1, cids["b2"]))  # reported again: flagged once a round
    assert len(_flags(t)) == 2
    assert t.coord.rows("SELECT count(*) AS n FROM offers WHERE flags > 0")[0]["n"] == 2

    # B publishes the other CID too: still one flag; the record it published first stays
    with pytest.raises(api.ApiError) as e:
        wb.post(f"/jobs/{t.jobs[wb.wallet.address]}/records", _publish(wb, t, 1, cids["b2"]))
    api.assert_api_error(e, 409, "conflicting_record")
    assert (
        len(_flags(t)) == 2
        and wc.get(f"/jobs/{t.jobs[wb.wallet.address]}/records", params={"round": 1})["record"]["cid"] == cids["b1"]
    )

    # C is honest: round 1 closes on its model alone (the equivocators' are not counted)
    wc.post(f"/jobs/{t.jobs[wc.wallet.address]}/records", _publish(wc, t, 1, cids["c1"]))
    wait_for("round 1 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)
    c1 = t.coord.ctx.store.get_bytes(cids["c1"])
    from aitbc.core.compression import decode

    assert torch.equal(round_params(t, 1), decode(c1).to(round_params(t, 1).dtype))
    assert not [f for f in _flags(t) if f[0] == wc.wallet.address]

    # a record of the closed round: the same CID is refused as closed; another is equivocation
    with pytest.raises(api.ApiError) as e:
        wc.post(f"/jobs/{t.jobs[wc.wallet.address]}/records", _publish(wc, t, 1, cids["c1"]))
    api.assert_api_error(e, 409, "round_closed")
    assert not [f for f in _flags(t) if f[0] == wc.wallet.address]

    # Two records under one key are proof: at round 1's settlement both equivocators are
    # unpaid, their contracts slashed and their jobs ended; C is paid its price.
    paid = _paid_when_settled(t, 1, 3)
    assert paid[wa.wallet.address] == paid[wb.wallet.address] == 0 and paid[wc.wallet.address] > 0
    assert _contracts(t) == {wa.wallet.address: "slashed", wb.wallet.address: "slashed", wc.wallet.address: "working"}
    assert _job_status(t) == {wa.wallet.address: "failed", wb.wallet.address: "failed", wc.wallet.address: "active"}


def _paid_when_settled(t, r: int, n: int) -> dict[str, int]:
    q = "SELECT worker_id, paid FROM settlements WHERE run_id = :r AND round = :n"
    rows = wait_for(f"round {r} settled", lambda: t.coord.rows(q, r=t.run_id, n=r), lambda rows: len(rows) == n, 60)
    return {row["worker_id"]: row["paid"] for row in rows}


def _contracts(t) -> dict[str, str]:
    rows = t.coord.rows("SELECT worker_id, status FROM contracts WHERE run_id = :r", r=t.run_id)
    return {row["worker_id"]: row["status"] for row in rows}


def _job_status(t) -> dict[str, str]:
    rows = t.coord.rows("SELECT worker_id, status FROM jobs WHERE run_id = :r", r=t.run_id)
    return {row["worker_id"]: row["status"] for row in rows}


def test_a_proof_that_comes_after_the_round_was_paid_still_slashes(new_coordinator, api):
    """The round closed and was paid before anyone reported the second record: what it
    was paid stays paid, and the contract is slashed at once (its bond answers for it). A
    proof of an unsettled round (C, scored but waiting its turn to be paid) makes that
    round unpaid instead, and the settlement slashes."""
    coord = new_coordinator(settle_delay=3.0)  # contracts are settled one by one, 3 s apart
    t = api.start_training_run(coord, 3, mode="gossip", topology="ring", aggregator="median")
    wa, wb, wc = t.workers
    base = round_params(t, 0)
    cids = {}
    for i, name in enumerate(["a1", "b1", "c1", "a2", "c2"]):
        cids[name] = _put(wa, update_blob(base + 1e-3 * torch.randn(t.d, generator=torch.Generator().manual_seed(i))))
    for w, name in ((wa, "a1"), (wb, "b1"), (wc, "c1")):
        w.post(f"/jobs/{t.jobs[w.wallet.address]}/records", _publish(w, t, 1, cids[name]))
    order = sorted(
        t.workers,
        key=lambda w: t.coord.rows(
            "SELECT id FROM contracts WHERE run_id = :r AND worker_id = :w", r=t.run_id, w=w.wallet.address
        )[0]["id"],
    )
    first, last = order[0], order[-1]  # settled first, and last (the contracts' order)
    q = "SELECT worker_id, paid FROM settlements WHERE run_id = :r AND round = 1"
    wait_for("the first settlement", lambda: t.coord.rows(q, r=t.run_id), lambda rows: len(rows) >= 1, timeout=60)
    assert len(t.coord.rows(q, r=t.run_id)) < 3  # the last contract waits its turn
    second = {first.wallet.address: "a2", last.wallet.address: "c2"}
    names = {wa.wallet.address: "a1", wb.wallet.address: "b1", wc.wallet.address: "c1"}
    reporter = next(w for w in t.workers if w not in (first, last))
    for w in (first, last):
        reply = _witness(reporter, _publish(w, t, 1, cids[second[w.wallet.address]]))
        assert [v["verdict"] for v in reply] == ["equivocation"], (names, reply)
    paid = _paid_when_settled(t, 1, 3)
    assert paid[first.wallet.address] > 0  # paid before the proof: stays paid
    assert paid[last.wallet.address] == 0  # not yet paid: unpaid
    assert paid[reporter.wallet.address] > 0
    contracts = _contracts(t)
    assert contracts[first.wallet.address] == contracts[last.wallet.address] == "slashed"
    assert contracts[reporter.wallet.address] == "working"
    kinds = {(w, k) for w, _, k in _flags(t)}
    assert {(first.wallet.address, "slashed"), (last.wallet.address, "slashed")} <= kinds
    assert not [k for w, k in kinds if w == reporter.wallet.address]


def test_a_witness_report_cannot_frame_an_honest_worker(new_coordinator, api):
    """Every record in a report must verify against its signer's own key, name its run and
    job, a round of the run and a CID: a forged, unsigned, altered or other-run record is
    refused with a one-line 4xx and nothing changes (a bad record in a batch refuses the
    batch)."""
    coord = new_coordinator()
    t = api.start_training_run(coord, 3, mode="gossip", topology="ring", aggregator="median")
    wa, wb, wc = t.workers
    job_c = t.jobs[wc.wallet.address]
    cid = _put(wa, update_blob(round_params(t, 0)))
    published = _publish(wc, t, 1, cid)
    wc.post(f"/jobs/{job_c}/records", published)
    forger = Wallet.generate("forger")
    forged = make_record(forger, training_id=t.run_id, job_id=job_c, round=1, cid=OTHER_CID, samples=10, train_loss=0.5)
    forged["record"]["worker"] = wc.wallet.address  # claims to be C, signed by another key
    altered = _publish(wc, t, 1, cid)
    altered["record"]["cid"] = OTHER_CID  # changed after C signed it
    other_run = make_record(
        wc.wallet, training_id="training_000000000000", job_id=job_c, round=1, cid=OTHER_CID, samples=1, train_loss=None
    )
    stranger = coord.client("stranger")  # signs its requests, but registered nowhere
    outsider = api.register_worker(coord, "outsider")  # a worker with no job in the run
    cases = [
        (wa, [forged], 422, "bad_record", "signature does not verify"),
        (wa, [{"record": published["record"], "signature": "00" * 64}], 422, "bad_record", "signature does not verify"),
        (wa, [altered], 422, "bad_record", "signature does not verify"),
        (wa, [published, altered], 422, "bad_record", "records[1]"),  # one bad record refuses the batch
        (wa, [other_run], 422, "wrong_record", "for run 'training_000000000000'"),
        (
            wa,
            [{**published, "record": {**published["record"], "job_id": "job_nonexistent"}}],
            422,
            "bad_record",
            "no job",
        ),
        (wa, [_publish(wc, t, 4, OTHER_CID)], 422, "bad_record", "[1, 3]"),
        (wa, [_publish(wc, t, 1, "not-a-cid")], 422, "bad_cid", "CIDv1"),
        (wa, [], 422, None, None),
        (wa, [{"record": published["record"]}], 422, None, None),
        (outsider, [_publish(wc, t, 1, OTHER_CID)], 403, "forbidden", "no job in run"),
        (stranger, [_publish(wc, t, 1, OTHER_CID)], 404, "unknown_worker", None),
    ]
    before = coord.snapshot()
    for w, records, status, code, words in cases:
        with pytest.raises(api.ApiError) as e:
            w.post("/records/witnessed", {"records": records})
        assert e.value.status == status and (code is None or e.value.code == code), (records, e.value)
        assert words is None or words in e.value.detail, (words, e.value.detail)
        assert "\n" not in e.value.detail
        assert coord.snapshot() == before, records  # nothing written
    assert not _flags(t)
    assert [v["verdict"] for v in _witness(wa, published)] == ["consistent"]  # the real one is C's published record
    after = coord.snapshot()
    assert not _flags(t) and all(after[k] == before[k] for k in ("updates", "flags", "gossip_witnesses", "offers"))


def _progress(w, job: str, r: int, step: int, seconds: float) -> None:
    w.post(
        f"/jobs/{job}/progress",
        {"progress": 100.0 * step / 40, "status": "training", "round": r, "step": step, "seconds": seconds},
    )


def _due_now(t) -> bool:
    from aitbc.coordinator.rounds.gossip_close import _due
    from aitbc.coordinator.store.models import Run

    with t.coord.ctx.session() as s:
        return _due(s, s.get(Run, t.run_id), now=time.time())


def test_the_record_leaves_out_early_only_a_worker_whose_own_pace_misses_the_deadline(new_coordinator, api):
    """With the quorum in, the record of a round closes before the deadline without a worker
    whose own signed progress (40 steps a round, 10 s a step: past twice the 60 s deadline)
    says it cannot publish the round in time; a worker that claims to be fast is waited for
    (as without reports), another worker cannot report for it (403, nothing written), and a
    report past the run's rounds is refused."""
    t = api.start_training_run(
        new_coordinator(), 4, mode="gossip", topology="ring", aggregator="mean", deadline=60, quorum=3, local_steps=40
    )
    wa, wb, wc, wd = t.workers
    job = {w: t.jobs[w.wallet.address] for w in t.workers}
    base = round_params(t, 0)
    gen = torch.Generator().manual_seed(0)

    def publish(w, r: int) -> None:
        cid = _put(w, update_blob(base + 1e-3 * torch.randn(t.d, generator=gen)))
        w.post(f"/jobs/{job[w]}/records", _publish(w, t, r, cid))

    # round 1: A, B and C publish; D is missing and has said nothing of its pace: waited for
    for w in (wa, wb, wc):
        publish(w, 1)
    assert not _due_now(t)
    # C (it published) cannot report for D's job to have it left out
    before = t.coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        _progress(wc, job[wd], 1, 4, 40.0)
    assert e.value.status == 403 and "\n" not in e.value.detail
    assert t.coord.snapshot() == before and not _due_now(t)
    # D claims to be fast (its report is not trusted, and need not be: it only keeps the
    # record waiting for D, up to the deadline, as without reports)
    _progress(wd, job[wd], 1, 1, 0.01)
    _progress(wd, job[wd], 1, 39, 0.1)
    assert not _due_now(t)
    assert t.owner.get(f"/runs/{t.run_id}")["round"] == 1
    publish(wd, 1)  # and it did publish: the round closes on all four
    wait_for("round 1 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)

    # round 2: a report past the run's 3 rounds is refused, nothing written
    t.coord.settled()
    before = t.coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        _progress(wa, job[wa], 4, 4, 0.1)
    assert (e.value.status, e.value.code) == (409, "wrong_round") and "3 rounds" in e.value.detail
    assert t.coord.snapshot() == before
    _progress(wa, job[wa], 3, 4, 0.1)  # a gossip worker ahead of the record reports its own round: taken
    # A, B and D publish; C, one round behind, reports its own pace: 4 steps in 40 s (10 s a
    # step, 36 steps left: past 2 x 60 s): the record closes now, without C
    for w in (wa, wb, wd):
        publish(w, 2)
    _progress(wc, job[wc], 2, 1, 10.0)
    assert not _due_now(t)  # one step in: too early to judge its pace
    _progress(wc, job[wc], 2, 4, 40.0)
    wait_for("round 2 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 3, timeout=30)
    rows = t.coord.rows("SELECT worker_id FROM updates WHERE run_id = :r AND round = 2", r=t.run_id)
    assert sorted(r["worker_id"] for r in rows) == sorted(w.wallet.address for w in (wa, wb, wd))
    # its record of the closed round comes too late: refused, nothing written
    with pytest.raises(api.ApiError) as e:
        publish(wc, 2)
    assert (e.value.status, e.value.code) == (409, "round_closed")


def test_reported_records_are_kept_only_while_they_can_still_be_compared(new_coordinator, api):
    """A reported record of a job that has not published its round is kept to compare with
    the job's own record; once the round is closed that record can no longer come (refused
    as closed), so the close drops what was kept, and a report of a closed round stores
    nothing. A proof of equivocation stays: it is the signed record."""
    t = api.start_training_run(
        new_coordinator(), 3, mode="gossip", topology="ring", aggregator="mean", deadline=2, quorum=2
    )
    wa, wb, wc = t.workers
    base = round_params(t, 0)
    cids = {}
    for i, name in enumerate(["a1", "b1", "b2", "c1", "c2"]):
        cids[name] = _put(wa, update_blob(base + 1e-3 * torch.randn(t.d, generator=torch.Generator().manual_seed(i))))
    assert [v["verdict"] for v in _witness(wa, _publish(wc, t, 1, cids["c1"]))] == ["kept"]  # C served it; silent since
    wa.post(f"/jobs/{t.jobs[wa.wallet.address]}/records", _publish(wa, t, 1, cids["a1"]))
    wb.post(f"/jobs/{t.jobs[wb.wallet.address]}/records", _publish(wb, t, 1, cids["b1"]))
    assert [v["verdict"] for v in _witness(wc, _publish(wb, t, 1, cids["b2"]))] == ["equivocation"]
    assert t.coord.rows("SELECT count(*) AS n FROM gossip_witnesses")[0]["n"] == 2
    wait_for("round 1 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)
    kept = t.coord.rows("SELECT worker_id, round, cid FROM gossip_witnesses")
    assert [(k["worker_id"], k["round"], k["cid"]) for k in kept] == [(wb.wallet.address, 1, cids["b2"])]  # the proof
    # a report of the closed round: nothing to compare with, and nothing stored
    assert [v["verdict"] for v in _witness(wa, _publish(wc, t, 1, cids["c2"]))] == ["unmatched"]
    assert t.coord.rows("SELECT count(*) AS n FROM gossip_witnesses")[0]["n"] == 1


def test_a_round_closing_keeps_the_records_of_later_rounds(new_coordinator, api):
    """Gossip workers keep their own clocks: a record of a later round published while the
    record is at an earlier one is the worker's, whatever an earlier round's judgement of
    it. The outlier flagged in round 1 still has its rounds 2 and 3 once round 2 closes
    (withdrawing updates sent ahead is for sync runs with overlap 2 only)."""
    t = api.start_training_run(new_coordinator(), 4, mode="gossip", topology="ring", aggregator="median")
    bad = t.workers[-1]
    base = round_params(t, 0)
    gen = torch.Generator().manual_seed(0)

    def publish(w, r: int) -> None:
        scale = 100.0 if w is bad else 1e-3  # far from the consensus: an outlier
        cid = _put(w, update_blob(base + scale * torch.randn(t.d, generator=gen)))
        w.post(f"/jobs/{t.jobs[w.wallet.address]}/records", _publish(w, t, r, cid))

    for w in t.workers:
        publish(w, 1)
    publish(bad, 2)
    publish(bad, 3)  # ahead of the record by two rounds
    wait_for("round 1 judged", lambda: _flags(t), lambda f: (bad.wallet.address, 1, "gossip_outlier") in f, 60)
    for w in t.workers[:-1]:
        publish(w, 2)
    wait_for("round 2 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r >= 3, timeout=30)
    rows = t.coord.rows("SELECT round FROM updates WHERE job_id = :j ORDER BY round", j=t.jobs[bad.wallet.address])
    assert [r["round"] for r in rows] == [1, 2, 3]


def test_a_proven_equivocator_records_no_more_rounds_and_is_not_waited_for(new_coordinator, api):
    """Once a worker is flagged ``equivocation`` its job records no new round (a one-line
    409, nothing written) until settlement ejects it, and the record's rounds close on the
    others: a worker proven dishonest adds nothing more to the consensus."""
    t = api.start_training_run(new_coordinator(), 3, mode="gossip", topology="ring", aggregator="median")
    wa, wb, wc = t.workers
    base = round_params(t, 0)
    gen = torch.Generator().manual_seed(0)

    def cid() -> str:
        return _put(wa, update_blob(base + 1e-3 * torch.randn(t.d, generator=gen)))

    def post(w, r: int, c: str):
        return w.post(f"/jobs/{t.jobs[w.wallet.address]}/records", _publish(w, t, r, c))

    post(wa, 1, cid())
    with pytest.raises(api.ApiError) as e:
        post(wa, 1, cid())  # a second record of round 1: proof
    api.assert_api_error(e, 409, "conflicting_record", "equivocation")
    a2 = cid()
    before = t.coord.snapshot()
    with pytest.raises(api.ApiError) as e:
        post(wa, 2, a2)
    api.assert_api_error(e, 409, "ejection_pending", "round 1")
    assert "\n" not in e.value.detail and t.coord.snapshot() == before  # nothing written
    for r in (1, 2):
        post(wb, r, cid())
        post(wc, r, cid())
    wait_for("round 2 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r >= 3, timeout=30)
    rows = t.coord.rows("SELECT worker_id FROM updates WHERE run_id = :r AND round = 2", r=t.run_id)
    assert sorted(r["worker_id"] for r in rows) == sorted(w.wallet.address for w in (wb, wc))


# --- copies: a model signed first by another job earns nothing ------------------------------


def _models(t, n: int, seed: int = 100) -> list[torch.Tensor]:
    base = round_params(t, 0)
    return [base + 1e-3 * torch.randn(t.d, generator=torch.Generator().manual_seed(seed + i)) for i in range(n)]


def test_a_model_signed_first_by_another_job_earns_nothing(new_coordinator, api):
    """A worker that signs a neighbour's CID as its own is flagged ``gossip_copy`` and its
    model is not counted, also when it publishes before the neighbour does (the neighbour
    claimed its record first: a worker with a server reports its own record before it
    serves it), and when the CID is of an earlier round; the neighbour is never blamed."""
    t = api.start_training_run(new_coordinator(), 3, mode="gossip", topology="ring", aggregator="median")
    wa, wb, wc = t.workers
    a1, b1, c1, c2 = (_put(wa, update_blob(m)) for m in _models(t, 4))
    job = {w: t.jobs[w.wallet.address] for w in t.workers}

    assert [v["verdict"] for v in _witness(wa, _publish(wa, t, 1, a1))] == ["kept"]  # A's claim, before serving it
    wb.post(f"/jobs/{job[wb]}/records", _publish(wb, t, 1, a1))  # B copies it, and is first to publish
    assert _flags(t) == [(wb.wallet.address, 1, "gossip_copy")] and _status(t, wb, 1) == "rejected"
    wa.post(f"/jobs/{job[wa]}/records", _publish(wa, t, 1, a1))  # A's own: kept
    assert _status(t, wa, 1) == "accepted"
    wc.post(f"/jobs/{job[wc]}/records", _publish(wc, t, 1, c1))
    wait_for("round 1 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)

    # round 2: C signs A's round-1 model as its round 2: a CID another job published before
    wa.post(f"/jobs/{job[wa]}/records", _publish(wa, t, 2, b1))
    wc.post(f"/jobs/{job[wc]}/records", _publish(wc, t, 2, a1))
    wb.post(f"/jobs/{job[wb]}/records", _publish(wb, t, 2, c2))
    assert _flags(t) == [(wb.wallet.address, 1, "gossip_copy"), (wc.wallet.address, 2, "gossip_copy")]
    wait_for("round 2 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 3, timeout=30)

    paid = {}
    for r in (1, 2):
        for w, amount in _paid_when_settled(t, r, 3).items():
            paid[w] = paid.get(w, 0) + amount
    assert paid[wb.wallet.address] == _paid_when_settled(t, 2, 3)[wb.wallet.address] > 0  # its own round 2 only
    assert paid[wc.wallet.address] == _paid_when_settled(t, 1, 3)[wc.wallet.address] > 0  # its own round 1 only
    assert paid[wa.wallet.address] == 2 * paid[wb.wallet.address]


def test_a_copy_with_small_noise_is_caught_and_the_original_kept(new_coordinator, api):
    """B publishes A's model plus noise of 0.05% of the honest spread (another CID): at the
    close it is far nearer A's model than honest training puts two models, and B signed it
    after A claimed its own: B is flagged ``gossip_copy`` and left out of the consensus; A,
    C and D are kept. In round 2, C publishes A's round-1 model with other noise: a copy of
    an earlier round's model, flagged too."""
    t = api.start_training_run(new_coordinator(), 4, mode="gossip", topology="ring", aggregator="median")
    wa, wb, wc, wd = t.workers
    ma, mc, md, ma2, mb2, md2 = _models(t, 6)
    spread = float((ma - mc).norm())
    noise = torch.randn(t.d, generator=torch.Generator().manual_seed(7))
    mb = ma + 0.0005 * spread * noise / noise.norm()
    job = {w: t.jobs[w.wallet.address] for w in t.workers}
    cid = {name: _put(wa, update_blob(m)) for name, m in dict(a=ma, b=mb, c=mc, d=md).items()}
    _witness(wa, _publish(wa, t, 1, cid["a"]))  # A claims, then serves
    _witness(wb, _publish(wb, t, 1, cid["b"]))  # B claims its copy after it read A's
    for w, name in ((wb, "b"), (wa, "a"), (wc, "c"), (wd, "d")):
        w.post(f"/jobs/{job[w]}/records", _publish(w, t, 1, cid[name]))
    wait_for("round 1 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=30)
    assert _flags(t) == [(wb.wallet.address, 1, "gossip_copy")]
    assert [_status(t, w, 1) for w in t.workers] == ["accepted", "rejected", "accepted", "accepted"]
    expected = torch.stack([ma, mc, md]).median(dim=0).values  # the consensus: without the copy
    assert torch.allclose(round_params(t, 1), expected, atol=1e-6)

    mc2 = ma + 0.0005 * spread * noise / noise.norm() * -1  # C: A's round-1 model, other noise
    for w, m in ((wa, ma2), (wb, mb2), (wc, mc2), (wd, md2)):
        w.post(f"/jobs/{job[w]}/records", _publish(w, t, 2, _put(wa, update_blob(m))))
    wait_for("round 2 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 3, timeout=30)
    assert _flags(t) == [(wb.wallet.address, 1, "gossip_copy"), (wc.wallet.address, 2, "gossip_copy")]


# --- slow and endless peers -------------------------------------------------------------------


class _BadPeer:
    """A worker's real peer server (aitbc.worker.peers.BlobServer) holding one model and
    serving it badly (``trickle``: a byte every 2 s; ``endless``: bytes for ever after it)."""

    def __init__(self, tmp, blob: bytes, how: str) -> None:
        from aitbc.storage.blobstore import LocalBlobStore
        from aitbc.worker.peers import BlobServer

        self.store = LocalBlobStore(tmp / "peer", durable=False)
        self.cid = self.store.put_bytes(blob)
        self.server = BlobServer("127.0.0.1", 0, lambda c: self.store.dir / c if self.store.has(c) else None)
        self.server.misbehave = how
        self.url = f"http://127.0.0.1:{self.server.port}"


def test_a_slow_peer_holds_only_its_own_round_up_to_the_deadline(new_coordinator, api, tmp_path, monkeypatch):
    """A's model comes a byte every 2 s. The round is due on records, but the driver does
    not wait on the fetch: it runs on a thread of its own while a second gossip run on the
    same coordinator closes two rounds; A's round closes once the fetch's wall-clock
    deadline passed (whatever the trickle), A's model excluded: unpaid, not flagged."""
    from aitbc.coordinator.transfer import peers

    monkeypatch.setattr(peers, "FETCH_SECONDS", 20.0)
    coord = new_coordinator()
    t = api.start_training_run(coord, 3, mode="gossip", topology="ring", aggregator="median")
    other = api.start_training_run(coord, 3, mode="gossip", topology="ring", aggregator="median")
    wa, wb, wc = t.workers
    ma, mb, mc = _models(t, 3)
    slow = _BadPeer(tmp_path, update_blob(ma), "trickle")
    try:
        coord.ctx.peers.advertise(wa.wallet.address, slow.url)
        for w, m in ((wa, None), (wb, mb), (wc, mc)):
            cid = slow.cid if m is None else _put(w, update_blob(m))
            w.post(f"/jobs/{t.jobs[w.wallet.address]}/records", _publish(w, t, 1, cid))
        key = (wa.wallet.address, slow.cid)
        wait_for("the coordinator fetching A's model", lambda: coord.ctx.peers.fetches.pending(key), bool)
        for r in (1, 2):
            models = _models(other, 3, seed=200 + 10 * r)
            for w, m in zip(other.workers, models, strict=True):
                w.post(f"/jobs/{other.jobs[w.wallet.address]}/records", _publish(w, other, r, _put(w, update_blob(m))))
            wait_for(
                f"the other run's round {r}",
                lambda: other.owner.get(f"/runs/{other.run_id}")["round"],
                lambda n, r=r: n > r,
                15,
            )
        assert coord.ctx.peers.fetches.pending(key)  # still fetching A's model...
        assert t.owner.get(f"/runs/{t.run_id}")["round"] == 1  # ...and only its round waits for it
        wait_for("round 1 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=90)
        assert [_status(t, w, 1) for w in t.workers] == ["excluded", "accepted", "accepted"]
        assert not _flags(t) and not coord.ctx.store.has(slow.cid)
    finally:
        slow.server.close()


def test_an_endless_peer_is_refused_at_the_models_size_and_flagged(new_coordinator, api, tmp_path):
    """A's server sends its model, then bytes for ever: the coordinator stops at the run's
    model size (exactly known from its codec and parameter count), keeps nothing, and flags
    A ``bad_peer_blob``: the bytes it served for the CID it signed are not that CID."""
    from aitbc.core.gossip import model_bytes

    coord = new_coordinator()
    t = api.start_training_run(coord, 3, mode="gossip", topology="ring", aggregator="median")
    wa, wb, wc = t.workers
    ma, mb, mc = _models(t, 3)
    run = t.owner.get(f"/runs/{t.run_id}")
    blob = build_codec(run["config"]["compression"], {}).encode(ma)
    assert len(blob) == model_bytes(run["config"]["compression"], t.d)
    endless = _BadPeer(tmp_path, blob, "endless")
    try:
        coord.ctx.peers.advertise(wa.wallet.address, endless.url)
        for w, m in ((wa, None), (wb, mb), (wc, mc)):
            cid = endless.cid if m is None else _put(w, update_blob(m))
            w.post(f"/jobs/{t.jobs[w.wallet.address]}/records", _publish(w, t, 1, cid))
        wait_for("round 1 recorded", lambda: t.owner.get(f"/runs/{t.run_id}")["round"], lambda r: r == 2, timeout=60)
        assert _flags(t) == [(wa.wallet.address, 1, "bad_peer_blob")]
        assert [_status(t, w, 1) for w in t.workers] == ["rejected", "accepted", "accepted"]
        assert not coord.ctx.store.has(endless.cid)
    finally:
        endless.server.close()
