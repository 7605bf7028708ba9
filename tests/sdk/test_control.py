"""The SDK's manual-control and fault-tolerance operations against a real local stack
(``aitbc up --workers 4 --lease 4``: a coordinator and four worker processes): straggler
controls (fewer local steps, a split shard), a resend of a round's update, scaling a
manual run up and down, replacements, liveness, the error codes of refusals, and a worker
marked failed (and SIGKILLed) in an automatic run that the coordinator repairs itself.

The tests share the stack and run in file order; each one ends its runs (complete or
stopped) so that every worker is free again for the next. The last one kills a worker for
good, so it stays last."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from tests.conftest import wait_until

from aitbc.client import CoordinatorClient
from aitbc.ledger.wallet import load_wallet
from aitbc_agent_sdk import Agent, AgentConfig, Conflict, InvalidArgument, NotFound, Unprocessable

WORKERS = 4
LEASE = 4
TRAIN = {"batch_size": 32, "lr": 0.003}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, start_stack):
    with start_stack(tmp_path_factory.mktemp("sdk-control") / "home", workers=WORKERS, lease=LEASE) as (home, _, _):
        yield home


@pytest.fixture
def agent(stack, request):
    """A started, funded agent with a wallet of its own (one per test)."""
    with Agent(AgentConfig(name="control-test", wallet_name=f"ctl-{request.node.name[5:]}", home=stack)) as a:
        a.start()
        a.fund_wallet(100)
        _wait(
            lambda: len([o for o in a.get_available_workers() if not o["busy"]]) == WORKERS,
            20,
            "every worker free and live",
        )
        yield a


def _wait(pred, timeout: float, what: str):
    return wait_until(pred, what, timeout, poll=0.1)


def _manual_run(agent: Agent, *, workers: int, shards: int, rounds: int, local_steps: int) -> tuple[str, list, list]:
    """A manual run in phase distributing: ``workers`` hired at their asking price (best
    first), ``shards`` shards of digits, the training config set. Returns (id, contracts,
    shards)."""
    run = agent.initialize_distributed_training("mlp", 1, workers, control="manual", budget=30)
    assert run["phase"] == "initializing" and run["control"] == "manual"
    tid = run["training_id"]
    hired = []
    for _ in range(workers):
        offer = agent.find_replacement_worker(exclude=[h["worker_id"] for h in hired])
        assert offer is not None
        hired.append(agent.negotiate_worker_contract(offer["worker_id"], tid, offer["price"]))
    data = agent.create_data_shards(tid, num_shards=shards, data_path="digits")
    assert len(data) == shards
    moved = agent.update_training_phase(tid, "distributing", rounds=rounds, local_steps=local_steps, **TRAIN)
    assert moved["phase"] == "distributing" and moved["config"]["local_steps"] == local_steps
    return tid, hired, data


def _answered(agent: Agent, tid: str, n: int, timeout: float = 30) -> list[dict]:
    """Wait until the run's ``n`` active jobs have all sent the open round's update;
    returns them (every update must have been accepted)."""

    def all_in():
        active = [w for w in agent.get_training_status(tid)["workers"] if w["job_status"] == "active"]
        return active if len(active) == n and all(w["this_round"] for w in active) else None

    active = _wait(all_in, timeout, f"{n} updates for the open round of {tid}")
    assert [w["this_round"] for w in active] == ["accepted"] * n, active
    return active


def _aggregate(agent: Agent, tid: str, jobs: list[dict]) -> tuple[list[dict], dict]:
    """Close the open round, collect the jobs' updates and average them."""
    closed = agent.update_training_phase(tid, "aggregating")
    assert closed["phase"] == "aggregating"
    checkpoints = [agent.collect_checkpoint(j["worker_id"], j["job_id"]) for j in jobs]
    assert all(c["status"] == "accepted" and c["round"] == closed["round"] for c in checkpoints), checkpoints
    return checkpoints, agent.federated_average(checkpoints)


# --- 1. stragglers: fewer local steps, then a split shard ----------------------------------


def test_straggler_controls(agent):
    tid, hired, data = _manual_run(agent, workers=2, shards=2, rounds=3, local_steps=8)
    w0, w1 = hired[0]["worker_id"], hired[1]["worker_id"]
    j0 = agent.send_training_job(w0, tid, data[0]["shard_id"])  # the run's local_steps
    j1 = agent.send_training_job(w1, tid, data[1]["shard_id"], {"local_steps": 6})
    assert (j0["worker_id"], j0["shard_index"], j0["config"]) == (w0, 0, {})
    assert (j1["worker_id"], j1["shard_index"], j1["config"]) == (w1, 1, {"local_steps": 6})
    assert agent.update_training_phase(tid, "training")["phase"] == "training"
    _answered(agent, tid, 2)

    # Fewer local steps from the next round: halved from the run's 8, or set outright.
    reduced = agent.reduce_worker_workload(w0)
    assert reduced and reduced["job_id"] == j0["job_id"] and reduced["job"]["config"] == {"local_steps": 4}
    assert agent.reduce_worker_workload(w1, local_steps=3)["job"]["config"] == {"local_steps": 3}
    assert agent.get_worker_job(w1)["config"]["local_steps"] == 3
    with pytest.raises(InvalidArgument) as e:
        agent.reduce_worker_workload(w0, factor=0)
    assert e.value.code == "bad_argument"
    assert agent.get_worker_job(w0)["config"] == {"local_steps": 4}  # the refusal changed nothing

    _, avg1 = _aggregate(agent, tid, [j0, j1])
    assert (avg1["round"], avg1["updates"]) == (1, 2)
    assert agent.update_training_phase(tid, "training")["round"] == 2
    _answered(agent, tid, 2)  # both reduced workers' next round arrived and was accepted
    assert {p["round_update"] for p in map(agent.get_worker_progress, (j0["job_id"], j1["job_id"]))} == {"accepted"}

    # Split the slow worker's shard while round 2 is open: it keeps the first half, a free
    # worker gets a job on the second.
    split = agent.reassign_partial_work(w0)
    assert split, split["detail"]
    kept, new = split["job"], split["new_job"]
    helper = new["worker_id"]
    assert kept["job_id"] == j0["job_id"] and kept["job_status"] == "active"
    assert new["job_id"] not in (j0["job_id"], j1["job_id"]) and new["job_status"] == "active"
    assert helper not in (w0, w1) and new["training_id"] == tid
    shards = {sh["shard_index"]: sh for sh in agent.get_shards(tid)}
    assert sorted(shards) == [0, 1, 2, 3]
    original, first, second = shards[0], shards[2], shards[3]
    assert original["samples"] == data[0]["samples"] and original["shard_id"] == data[0]["shard_id"]
    assert original["split_into"] == [2, 3] and original["jobs"] == []
    assert first["split_from"] == second["split_from"] == 0 and not first["split_into"] and not second["split_into"]
    assert first["samples"] + second["samples"] == original["samples"]
    assert first["samples"] == original["samples"] // 2
    assert first["jobs"] == [j0["job_id"]] and second["jobs"] == [new["job_id"]]
    assert shards[1]["jobs"] == [j1["job_id"]] and shards[1]["split_into"] is None
    assert (kept["shard_index"], kept["shard_cid"]) == (2, first["shard_id"])
    assert (new["shard_index"], new["shard_cid"]) == (3, second["shard_id"])
    with pytest.raises(Conflict) as e:  # a split shard takes no new jobs; its halves do
        agent.send_training_job(w0, tid, data[0]["shard_id"])
    assert e.value.code == "shard_split"

    # The helper joins round 2 at once; then round 3 has all three, each on its own shard.
    _answered(agent, tid, 3)
    ck2, avg2 = _aggregate(agent, tid, [kept, j1, new])
    assert (avg2["round"], avg2["updates"]) == (2, 3)
    by_job = {c["job_id"]: c for c in ck2}
    assert by_job[j0["job_id"]]["samples"] == original["samples"]  # sent before the split
    assert by_job[new["job_id"]]["samples"] == second["samples"]
    assert agent.update_training_phase(tid, "training")["round"] == 3
    _answered(agent, tid, 3)
    ck3, avg3 = _aggregate(agent, tid, [kept, j1, new])
    assert [c["samples"] for c in ck3] == [first["samples"], data[1]["samples"], second["samples"]]
    assert [c["worker_id"] for c in ck3] == [w0, w1, helper]
    # the workers' latest checkpoints, as example 3 reads them: one per current worker, this round's
    latest = agent.get_all_checkpoints()  # the current run: the one last named
    assert sorted(c["worker_id"] for c in latest) == sorted([w0, w1, helper])
    assert all(c["round"] == 3 and c["checkpoint_id"] == c["cid"] for c in latest)
    assert all(agent.verify_checkpoint(c) for c in latest)
    assert (avg3["round"], avg3["updates"]) == (3, 3)
    assert avg3["weights"] == [float(c["samples"]) for c in ck3]
    assert avg3["loss"] is not None and set(avg3["model"]) and all(t.dim() >= 1 for t in avg3["model"].values())
    assert agent.verify_checkpoint({"checkpoint_cid": avg3["model_id"], "round": 3})

    saved = agent.save_training_results(tid, avg3)
    assert saved["model_cid"] == avg3["model_id"] and saved["round"] == 3
    done = agent.update_training_phase(tid, "complete")
    assert done["phase"] == "complete" and done["rounds_completed"] == 3
    assert agent.get_results(tid)["model_cid"] == avg3["model_id"]
    assert not agent.get_active_workers(tid)


# --- 2. a round's update sent again -----------------------------------------------------


def test_checkpoint_resend(agent):
    tid, hired, data = _manual_run(agent, workers=1, shards=1, rounds=1, local_steps=5)
    w = hired[0]["worker_id"]
    job = agent.send_training_job(w, tid, data[0]["shard_id"])
    agent.update_training_phase(tid, "training")
    _answered(agent, tid, 1)
    first = agent.collect_checkpoint(w, job["job_id"])
    assert (first["round"], first["worker_id"], first["job_id"], first["training_id"]) == (1, w, job["job_id"], tid)
    check = agent.verify_checkpoint(first)
    assert check["valid"] and check["cid"] == first["cid"] and check["worker_id"] == w, check

    res = agent.request_checkpoint_resend(w)
    assert (res["job_id"], res["round"], res["dropped"]) == (job["job_id"], 1, first["cid"])

    def resent():
        ups = agent.get_worker_checkpoints(job["job_id"])
        return ups if ups and ups[0]["created_at"] > first["created_at"] else None

    ups = _wait(resent, 30, "the worker to send round 1 again")
    assert len(ups) == 1, ups  # the dropped update is gone; only the new one is left
    again = ups[0]
    assert (again["round"], again["status"], again["worker_id"]) == (1, "accepted", w)
    assert agent.get_worker_progress(job["job_id"])["round_update"] == "accepted"

    agent.update_training_phase(tid, "aggregating")
    with pytest.raises(Conflict) as e:  # the round is closed: nothing to send again
        agent.request_checkpoint_resend(w)
    assert e.value.code == "bad_state"
    collected = agent.collect_checkpoint(w, job["job_id"])
    assert collected["cid"] == again["cid"] and collected["created_at"] == again["created_at"]
    avg = agent.federated_average([collected])
    assert (avg["round"], avg["updates"]) == (1, 1)
    agent.save_training_results(tid, avg["model_id"])  # a checkpoint CID works as well as the dict
    assert agent.update_training_phase(tid, "complete")["phase"] == "complete"


# --- 3. scaling a manual run, and a failed worker's shard moved -----------------------------


def test_add_remove_and_reassign(agent):
    tid, hired, data = _manual_run(agent, workers=2, shards=3, rounds=2, local_steps=5)
    w0, w1 = hired[0]["worker_id"], hired[1]["worker_id"]
    j0 = agent.send_training_job(w0, tid, data[0]["shard_id"])
    j1 = agent.send_training_job(w1, tid, data[1]["shard_id"])
    agent.update_training_phase(tid, "training")

    added = agent.add_worker(training_id=tid)  # the best free worker, at its asking price
    w2, contract, job = added["worker_id"], added["contract"], added["job"]
    assert w2 not in (w0, w1)
    assert (contract["worker_id"], contract["training_id"]) == (w2, tid)
    assert job is not None and job["worker_id"] == w2 and job["job_status"] == "active"
    assert (job["shard_index"], job["shard_cid"]) == (2, data[2]["shard_id"])  # the shard nobody had
    assert [sh["jobs"] for sh in agent.get_shards(tid)] == [[j0["job_id"]], [j1["job_id"]], [job["job_id"]]]
    status = agent.get_training_status(tid)
    assert {c["worker_id"]: c["status"] for c in status["contracts"]} == {w0: "working", w1: "working", w2: "working"}
    _answered(agent, tid, 3)  # the new worker trains the open round too

    removed = agent.remove_worker(w2, tid)
    assert (removed["job_id"], removed["job_status"]) == (job["job_id"], "released")
    assert removed["end_reason"] == "removed by the owner"
    assert {w["worker_id"] for w in agent.get_active_workers(tid)} == {w0, w1}
    assert agent.get_shards(tid)[2]["jobs"] == []
    assert agent.ping_worker(w2)["busy"] is False  # let go: free for other runs
    with pytest.raises(NotFound) as e:
        agent.remove_worker(w2, tid)
    assert e.value.code == "no_active_job"

    # A manual run's agent moves a failed worker's shard itself.
    failed = agent.mark_worker_failed(w1, reason="test: w1 failed")
    assert (failed["job_id"], failed["job_status"], failed["end_reason"]) == (j1["job_id"], "failed", "test: w1 failed")
    again = agent.mark_worker_failed(w1)  # already failed: the job as it is, nothing ended twice
    assert (
        again["already_failed"] is True and again["job_id"] == j1["job_id"] and again["end_reason"] == "test: w1 failed"
    )
    assert agent.get_shards(tid)[1]["jobs"] == []  # the coordinator leaves a manual run's shard alone
    time.sleep(0.5)
    assert agent.get_shards(tid)[1]["jobs"] == []
    moved = agent.reassign_job(j1["job_id"])
    assert moved["worker_id"] not in (w0, w1) and moved["replaces"] == j1["job_id"]
    assert (moved["shard_index"], moved["job_status"]) == (1, "active")
    with pytest.raises(Conflict) as e:
        agent.reassign_job(j1["job_id"])
    assert e.value.code == "already_replaced"
    _answered(agent, tid, 2)
    assert {w["shard_index"] for w in agent.get_active_workers(tid)} == {0, 1}

    stopped = agent.stop_training(tid)
    assert stopped["status"] == "stopped"
    assert not agent.get_active_workers(tid)


# --- 5. replacements and liveness -----------------------------------------------------------


def test_find_replacement_and_ping(agent):
    offers = agent.get_available_workers()
    best = agent.find_replacement_worker()
    assert best is not None and best["busy"] is False
    others = [o for o in offers if o["gpu_type"] != best["gpu_type"]]
    want = min(others, key=lambda o: o["worker_id"])
    spelled = want["gpu_type"].lower().replace("rtx", "rtx ")  # "rtx 3080": normalized like the offers
    preferred = agent.find_replacement_worker(spelled)
    assert (preferred["worker_id"], preferred["gpu_type"]) == (want["worker_id"], want["gpu_type"])
    assert (
        agent.find_replacement_worker(best["gpu_type"], exclude=[best["worker_id"]])["worker_id"] != best["worker_id"]
    )

    w = best["worker_id"]
    ping = agent.ping_worker(w)
    assert ping["alive"] is True and ping["status"] == "online" and 0 <= ping["last_heartbeat_age"] <= LEASE
    for _ in range(5):  # a heartbeat in the very same millisecond would be age 0.000
        strict = agent.ping_worker(w, max_age=0.0)
        if strict["last_heartbeat_age"] > 0:
            break
    assert strict["alive"] is False and strict["status"] == "online"
    assert agent.ping_worker(w, max_age=LEASE)["alive"] is True
    with pytest.raises(NotFound) as e:
        agent.ping_worker("ait1" + "0" * 40)
    assert e.value.code == "unknown_worker"

    # Every worker hired by one run: nobody is free.
    run = agent.initialize_distributed_training("mlp", 1, WORKERS, control="manual", budget=30)
    tid = run["training_id"]
    try:
        for o in offers:
            agent.negotiate_worker_contract(o["worker_id"], tid, o["price"])
        assert agent.find_replacement_worker() is None
        assert agent.find_replacement_worker(want["gpu_type"]) is None
        assert agent.ping_worker(w)["busy"] is True and agent.ping_worker(w)["alive"] is True
        with pytest.raises(NotFound) as e:
            agent.add_worker(training_id=tid)
        assert e.value.code == "no_free_worker"
    finally:
        agent.stop_training(tid)
    assert agent.find_replacement_worker() is not None


# --- 6. refusals -----------------------------------------------------------------------------


def test_refusals(agent):
    auto = agent.initialize_distributed_training("mlp", 1, 1)["training_id"]
    with pytest.raises(Conflict) as e:  # an automatic run's owner may take it over, but not by a move it cannot make
        agent.update_training_phase(auto, "training")
    assert (e.value.status, e.value.code) == (409, "bad_state")
    assert agent.get_training_status(auto)["control"] == "automatic"  # the refused move took nothing over
    with pytest.raises(Conflict) as e:
        agent.send_training_job(agent.get_available_workers()[0]["worker_id"], auto, "bafkreinope")
    assert e.value.code == "automatic_control"
    with pytest.raises(InvalidArgument) as e:
        agent.update_training_phase(auto, "paused")
    assert e.value.code == "bad_phase" and e.value.status is None
    with pytest.raises(InvalidArgument) as e:
        agent.update_training_phase(auto, "training", rounds=3)
    assert e.value.code == "bad_config"
    with pytest.raises(InvalidArgument) as e:
        agent.federated_average([])
    assert e.value.code == "bad_argument" and e.value.status is None
    agent.stop_training(auto)

    tid, hired, data = _manual_run(agent, workers=1, shards=1, rounds=2, local_steps=5)
    w = hired[0]["worker_id"]
    job = agent.send_training_job(w, tid, data[0]["shard_id"])
    with pytest.raises(NotFound) as e:  # distributing: no round is open, nothing was sent
        agent.collect_checkpoint(w, job["job_id"])
    assert (e.value.status, e.value.code) == (404, "no_checkpoint")
    with pytest.raises(InvalidArgument) as e:  # someone else's job
        agent.collect_checkpoint("ait1" + "0" * 40, job["job_id"])
    assert e.value.code == "bad_argument"
    with pytest.raises(Conflict) as e:
        agent.send_training_job(w, tid, data[0]["shard_id"])
    assert e.value.code == "worker_busy"
    with pytest.raises(Conflict) as e:
        agent.update_training_phase(tid, "complete")
    assert e.value.code == "bad_state"

    agent.update_training_phase(tid, "training")
    with pytest.raises(Conflict) as e:  # still training: the round is not closed
        agent.federated_average([{"cid": "bafkreinope", "training_id": tid}])
    assert e.value.code == "bad_state"
    unknown = agent.upload_to_ipfs(data=b"not a checkpoint of this run")
    with pytest.raises(Unprocessable) as e:
        agent.save_training_results(tid, unknown)
    assert (e.value.status, e.value.code) == (422, "not_a_model")
    initial = agent.get_round_checkpoints(tid)[0]
    assert initial["round"] == 0
    with pytest.raises(Unprocessable) as e:  # the initial model was never aggregated
        agent.save_training_results(tid, initial["checkpoint_cid"])
    assert e.value.code == "unknown_model"

    _answered(agent, tid, 1)
    agent.update_training_phase(tid, "aggregating")
    with pytest.raises(Conflict) as e:
        agent.update_training_phase(tid, "training")
    assert e.value.code == "not_aggregated"
    with pytest.raises(Unprocessable) as e:
        agent.federated_average([{"cid": unknown, "training_id": tid}])
    assert e.value.code == "unknown_update"
    agent.stop_training(tid)
    assert agent.get_training_status(tid)["phase"] == "stopped"


# --- regressions: default weights after a split; a failed offer and a stale heartbeat ---------------


def test_split_round_default_weights_follow_update_samples(agent):
    tid, hired, data = _manual_run(agent, workers=1, shards=1, rounds=1, local_steps=5)
    w = hired[0]["worker_id"]
    agent.send_training_job(w, tid, data[0]["shard_id"])
    agent.update_training_phase(tid, "training")
    _answered(agent, tid, 1)
    split = agent.reassign_partial_work(w)  # after w sent round 1, trained on the whole shard
    _answered(agent, tid, 2)
    try:
        checkpoints, avg = _aggregate(agent, tid, [split["job"], split["new_job"]])
        whole, half = data[0]["samples"], data[0]["samples"] - data[0]["samples"] // 2
        assert [c["samples"] for c in checkpoints] == [whole, half]  # what each update was trained on
    finally:
        agent.stop_training(tid)
    # FedAvg weighs an update by the samples it was trained on (what collect_checkpoint
    # reports, and what examples/phase_driven.py passes explicitly): [whole, half].
    assert avg["weights"] == [float(whole), float(half)], avg["weights"]


def test_marked_failed_offer_stays_off_market(agent, stack):
    tid, hired, data = _manual_run(agent, workers=1, shards=1, rounds=1, local_steps=5)
    w = hired[0]["worker_id"]
    agent.send_training_job(w, tid, data[0]["shard_id"])
    info = json.loads((stack / "stack.json").read_text())
    proc = next(p for p in info["processes"] if p.get("address") == w)
    cmd = proc["cmd"]
    wallet = load_wallet(Path(cmd[cmd.index("--home") + 1]), cmd[cmd.index("--wallet") + 1])
    os.kill(proc["pid"], signal.SIGSTOP)  # the worker goes silent (resumed below)
    try:
        with CoordinatorClient(info["coordinator"], wallet, timeout=5) as c:
            c.post("/workers/heartbeat", {})  # its last heartbeat, just before it went silent
        failed = agent.mark_worker_failed(w, reason="test: silent")
        assert failed["job_status"] == "failed"
        time.sleep(2.6)  # the coordinator writes buffered heartbeats to the offers every 2 s
        ping = agent.ping_worker(w)
        spare = agent.find_replacement_worker(ping["gpu_type"])
        agent.stop_training(tid)
    finally:
        os.kill(proc["pid"], signal.SIGCONT)
    # Not heard from since it was marked failed: it must stay off the market ("until it
    # heartbeats again", mark_worker_failed's docstring).
    assert spare is None or spare["worker_id"] != w, spare
    assert (ping["status"], ping["alive"]) == ("failed", False), ping


# --- 4. a worker marked failed in an automatic run ----------------------------------------------


def test_mark_worker_failed_automatic(agent, stack):
    tid = agent.initialize_distributed_training("mlp", 1, 2, budget=30)["training_id"]
    agent.create_data_shards(tid, data_path="digits")
    ranked = agent.discover_gpu_workers(required_workers=2, training_id=tid)  # ranks and hires in one step
    hired = {r["worker_id"] for r in ranked if r["hired"]}
    assert len(hired) == 2
    agent.start_training(tid, rounds=25, local_steps=20, **TRAIN)

    def running():
        st = agent.get_training_status(tid)
        active = [w for w in st["workers"] if w["job_status"] == "active"]
        return active if st["phase"] in ("training", "aggregating") and st["round"] >= 2 and len(active) == 2 else None

    victim = _wait(running, 60, "round 2 of the automatic run")[0]
    w = victim["worker_id"]
    # The worker dies (SIGKILL) and its owner's agent marks it failed at once, well before
    # the coordinator's own lease would run out.
    pid = next(p["pid"] for p in json.loads((stack / "stack.json").read_text())["processes"] if p.get("address") == w)
    os.kill(pid, signal.SIGKILL)
    failed = agent.mark_worker_failed(w, reason="test: killed")
    assert (failed["job_id"], failed["job_status"], failed["end_reason"]) == (
        victim["job_id"],
        "failed",
        "test: killed",
    )
    assert failed["training_id"] == tid and failed["worker_id"] == w

    def replaced():
        return [j for j in agent.get_active_workers(tid) if j["shard_index"] == victim["shard_index"]]

    new = _wait(replaced, 20, f"a new job on shard {victim['shard_index']}")
    assert len(new) == 1 and new[0]["worker_id"] not in hired and new[0]["job_id"] != victim["job_id"]
    assert agent.get_training_status(tid)["phase"] in ("training", "aggregating")  # still running when repaired

    final = agent.wait_for_completion(tid, timeout=120, poll=0.5)
    assert final["phase"] == "complete" and final["rounds_completed"] == 25
    jobs = {j["job_id"]: j for j in agent.get_training_status(tid)["workers"]}
    assert victim["job_id"] not in {j["job_id"] for j in agent.get_all_workers(tid)}  # replaced: not a current worker
    assert jobs[victim["job_id"]]["job_status"] == "failed" and jobs[victim["job_id"]]["end_reason"] == "test: killed"
    assert jobs[new[0]["job_id"]]["rounds_done"] >= 1
    ping = _wait(
        lambda: (p := agent.ping_worker(w))["last_heartbeat_age"] > LEASE and dict(p),  # a dead worker's ping is falsy
        2 * LEASE + 5,
        "the dead worker's last heartbeat to be a lease old",
    )
    assert ping["alive"] is False  # (its status may read online again: see test_marked_failed_offer_stays_off_market)
