"""The job long poll's ``known``: a worker tells the coordinator which job it holds, and a
job other than that one is news at once, even while it waits (its run not yet training,
or its update of the open round in), so the worker fetches its shard and builds its model
before its first round; its own job that says ``wait`` is held to the poll's ``wait``.
A bad ``known`` or ``after`` is a 422, and no other signer reads the view."""

from __future__ import annotations

import time

import torch


def test_a_job_the_worker_does_not_hold_answers_at_once_even_while_it_waits(new_coordinator, api):
    t = api.start_training_run(new_coordinator(), 2)
    w = t.workers[0]
    job = t.jobs[w.wallet.address]
    cid = api.put_update(w, 1e-3 * torch.randn(t.d, generator=torch.Generator().manual_seed(1)))
    w.post(f"/jobs/{job}/updates", api.update_body(1, cid))  # round 1 waits for the other worker
    path = f"/workers/{w.wallet.address}/job"
    t0 = time.monotonic()
    view = w.get(path, params={"wait": 10, "known": ""}, sign=True)["job"]
    assert time.monotonic() - t0 < 5 and (view["job_id"], view["action"]) == (job, "wait"), view
    t0 = time.monotonic()
    view = w.get(path, params={"wait": 0.5, "known": job}, sign=True)["job"]
    assert time.monotonic() - t0 >= 0.45 and view["action"] == "wait", view  # its own job: held
    t0 = time.monotonic()
    view = w.get(path, params={"wait": 10, "known": "job_someotherone"}, sign=True)["job"]
    assert time.monotonic() - t0 < 5 and view["job_id"] == job, view  # a job it no longer holds: news
    for name, bad in (("known", "x" * 65), ("after", -1), ("after", "one")):
        try:
            w.get(path, params={"wait": 0, name: bad}, sign=True)
        except api.ApiError as e:
            assert e.status == 422 and name in e.detail, e
        else:
            raise AssertionError(f"{name}={bad!r} accepted")
    # another signer cannot read this worker's view, whatever it asks
    other = t.workers[1]
    try:
        other.get(path, params={"wait": 0, "known": "", "after": 0}, sign=True)
    except api.ApiError as e:
        assert e.status == 403, e
    else:
        raise AssertionError("another worker read this worker's job view")


def test_a_worker_holds_the_poll_on_a_job_it_has_seen_but_not_prepared(new_coordinator, api, tmp_path):
    """A real worker whose gossip job says ``wait`` (it published every round; the record
    waits for the others) does not prepare that job, yet names it as ``known``: each poll
    is held, not answered at once over and over (a busy loop that starved a gossip ring)."""
    import threading

    from aitbc.ledger.records import make_record
    from aitbc.worker.config import WorkerSettings
    from aitbc.worker.daemon import Worker

    t = api.start_training_run(new_coordinator(), 2, mode="gossip", topology="ring", aggregator="median")
    a = t.workers[0]
    job = t.jobs[a.wallet.address]
    base = api.round_params(t, 0)
    for r in (1, 2, 3):  # every round of the run: its next is past the last, so its view says wait
        cid = api.put_update(a, base + 1e-3 * torch.randn(t.d, generator=torch.Generator().manual_seed(r)))
        signed = make_record(a.wallet, training_id=t.run_id, job_id=job, round=r, cid=cid, samples=10, train_loss=0.5)
        a.post(f"/jobs/{job}/records", signed)
    assert a.get(f"/workers/{a.wallet.address}/job", sign=True)["job"]["action"] == "wait"

    worker = Worker(WorkerSettings(wallet="a", poll_seconds=1.0), coordinator=t.coord.url, home=tmp_path)
    worker.wallet = worker.client.wallet = a.wallet  # the hired worker's key
    worker.register = worker.registered.set  # type: ignore[method-assign]  # registered by the test's client, alive
    polls = []
    poll = worker._poll
    worker._poll = lambda *args, **kw: polls.append(time.monotonic()) or poll(*args, **kw)  # type: ignore[method-assign]
    loop = threading.Thread(target=worker._run, daemon=True)
    loop.start()
    time.sleep(3.0)
    worker.stop.set()
    loop.join(10)
    assert not loop.is_alive()
    assert worker.job is None  # a gossip job that says wait is not prepared
    assert 2 <= len(polls) <= 6, len(polls)  # the first answered at once (a job it had not seen), the rest held
