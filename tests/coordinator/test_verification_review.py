"""A skeptic's review of verification of work (issue 15): ways an honest worker running
the provider daemon as shipped is refused or accused, found by reading the coordinator,
the daemon and blob retention together. Each test is the honest path, end to end against
a real coordinator (the database under test, real tensors, real local training); where
it fails today it is marked ``xfail(strict=True)`` naming the bug, so it turns into a
plain test once fixed.

Workers are either the daemon itself (:class:`aitbc.worker.daemon.Worker`, its
``train_round`` against the coordinator) or, where a network fault is the trigger (a lost
reply), the daemon's own round-start bookkeeping (``JobState.mark_round_start`` /
``restore_round_start``) around a :class:`LocalTrainer`, in the daemon's order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from sqlalchemy import select

from aitbc.client import ApiError
from aitbc.coordinator.app import create_app
from aitbc.coordinator.config import Settings
from aitbc.coordinator.storage import retention
from aitbc.coordinator.store.models import Update
from aitbc.core.compression import build_codec
from aitbc.core.options import parse_spec
from aitbc.replies.base import parse
from aitbc.replies.jobs import JobOrder, JobPoll
from aitbc.storage.cid import cid_of_bytes
from aitbc.training.batches import data_seed
from aitbc.training.checkpoint import flat_params, load_checkpoint, load_shard
from aitbc.training.data_spec import DataSpec
from aitbc.training.local import LocalConfig, LocalTrainer
from aitbc.training.models import build_model
from aitbc.training.proof import Recorder, boundaries
from aitbc.worker.config import WorkerSettings
from aitbc.worker.daemon import Worker
from aitbc.worker.records import JobState

from .conftest import serve, wait_for

MODEL_OPTIONS = {"hidden": [8]}  # d = 610
COORD = {"heartbeat_flush_seconds": 0.05, "max_blob_bytes": 1 << 20}
WAIT = 20.0
CONFIG = {"rounds": 3, "local_steps": 4, "batch_size": 8, "verify_rate": 1.0}


# --- coordinators -------------------------------------------------------------------------


@pytest.fixture
def new_coord(tmp_path: Path, databases: Any, api: Any) -> Iterator[Callable[..., Any]]:
    stops: list[Callable[[], None]] = []

    def make(**settings: Any) -> Any:
        coord, stop = api.start_on(databases, tmp_path / f"coord{len(stops)}", **{**COORD, **settings})
        stops.append(stop)
        return coord

    yield make
    for stop in stops:
        stop()


@pytest.fixture
def coord(new_coord):
    return new_coord()


class Stepped:
    """A coordinator whose round driver does not run on its own: the test calls
    :meth:`tick` (one pass of the driver, exactly as its thread makes it), so what the
    driver does between two requests is the test's to order."""

    def __init__(self, url: str, app: Any) -> None:
        self.url, self.app, self.ctx = url, app, app.state.ctx
        self.clients: list[Any] = []

    def client(self, name: str) -> Any:
        from aitbc.client import CoordinatorClient
        from aitbc.ledger.wallet import Wallet

        c = CoordinatorClient(self.url, Wallet.generate(name))
        self.clients.append(c)
        return c

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    def tick(self) -> None:
        self.app.state.driver.tick()

    def until(self, what: str, get: Callable[[], Any], ok: Callable[[Any], bool], ticks: int = 200) -> Any:
        for _ in range(ticks):
            v = get()
            if ok(v):
                return v
            self.tick()
        raise AssertionError(f"{what}: {v}")


def _start_stepped(databases: Any, home: Path, **settings: Any) -> tuple[Stepped, Callable[[], None]]:
    url = databases.new(home)
    cfg = {"home": home, "lease_seconds": 600.0, "tick_seconds": 0.05, "db_url": url, **COORD, **settings}
    app = create_app(Settings(**cfg), run_driver=False)
    base, stop_server = serve(app)
    st = Stepped(base, app)

    def stop() -> None:
        for c in st.clients:
            c.close()
        stop_server()
        databases.drop(url)

    return st, stop


@pytest.fixture
def stepped(tmp_path: Path, databases: Any) -> Iterator[Callable[..., Stepped]]:
    """Start a stepped coordinator (settings as keywords), stopped after the test."""
    stops: list[Callable[[], None]] = []

    def make(**settings: Any) -> Stepped:
        st, stop = _start_stepped(databases, tmp_path / f"stepped{len(stops)}", **settings)
        stops.append(stop)
        return st

    yield make
    for stop in stops:
        stop()


# --- runs, jobs, updates ------------------------------------------------------------------


def provider(coord: Any, name: str) -> Any:
    """A funded provider offering its GPU (a plain signed client)."""
    w = coord.client(name)
    w.post("/wallets/fund", {"amount": "10"})
    w.post("/workers", {"gpu": "RTX4090", "price": "1", "availability": 0.99, "max_bond": "5"})
    return w


def daemon(coord: Any, home: Path, name: str) -> Worker:
    """The provider daemon itself, registered and funded (its loop is not started: the test
    calls ``train_round`` with the job the coordinator gives it)."""
    cfg = WorkerSettings(
        wallet=name, gpu="RTX4090", price="1", max_bond="5", availability=0.99, poll_seconds=1.0, progress_every=100
    )
    w = Worker(cfg, coordinator=coord.url, home=home / name)
    w.client.post("/wallets/fund", {"amount": "10"})
    w.register()
    return w


def new_run(coord: Any, api: Any, providers: list[Any], prefix: str, *, options: dict[str, Any] | None = None) -> Any:
    """An owner and a run (bond 2) with digits in one shard per provider, all of them hired,
    not yet distributed: ``(owner, run id)``."""
    owner = coord.client(f"{prefix}owner")
    owner.post("/wallets/fund", {"amount": "1000"})
    body = {
        "model_type": "mlp",
        "model_options": options or MODEL_OPTIONS,
        "dataset_size": "1GB",
        "target_workers": len(providers),
        "seed": 0,
        "budget": "100",
        "bond": "2",
    }
    run_id = owner.post("/runs", body)["training_id"]
    api.upload_digits(owner, run_id, len(providers))
    hired = owner.post(f"/runs/{run_id}/discover", {"required_workers": len(providers), "min_gpu": "RTX4090"})
    assert {c["worker_id"] for c in hired["contracts"]} == {p.wallet.address for p in providers}, hired
    return owner, run_id


def view(client: Any) -> JobOrder:
    """The job as the worker reads it (the daemon's ``train_round`` takes the typed order)."""
    job = parse(JobPoll, client.get(f"/workers/{client.wallet.address}/job", sign=True)).job
    assert job is not None
    return job


def post(coord: Any, api: Any, client: Any, path: str, body: Any) -> httpx.Response:
    with coord.http() as h:
        return api.signed_post(h, client.wallet, "/v1" + path, body)


def update_of(owner: Any, job_id: str, round: int) -> dict[str, Any] | None:
    ups = [u for u in owner.get(f"/jobs/{job_id}/updates")["data"] if u["round"] == round]
    return ups[0] if ups else None


def judged(u: dict[str, Any] | None) -> bool:
    return u is not None and u["verification"] not in ("challenged", "revealed")


def verdict(owner: Any, job_id: str, round: int = 1) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while True:
        u = update_of(owner, job_id, round)
        if judged(u):
            assert u is not None
            return u
        assert time.monotonic() < deadline, f"update of job {job_id} never judged: {u}"
        time.sleep(0.05)


def open_round(client: Any, rnd: int) -> dict[str, Any]:
    """The job view once round ``rnd`` is open for training."""
    return wait_for(f"round {rnd} open", lambda: view(client), lambda j: (j["round"], j["action"]) == (rnd, "train"))


class Replica:
    """One provider's rounds exactly as ``Worker.train_round`` makes them (the same
    ``JobState``, ``mark_round_start`` before training, the commitment from the trainer's
    own settings, ``_restore_round_start`` when a reply says the update was not recorded),
    so a test can stand where the network fails it: a reply lost, a retry."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.state: JobState | None = None
        self.recorder: Recorder | None = None
        self.residual_in: torch.Tensor | None = None

    def train(self, job: dict[str, Any]) -> dict[str, Any]:
        """Train the job's open round; the update's blob is uploaded; its body returned."""
        assert job["action"] == "train", job
        if self.state is None:
            spec = job["data_spec"]
            model = build_model(
                job["model_type"],
                DataSpec(spec["task"], tuple(spec["input_shape"]), int(spec["num_classes"])),
                job["model_options"],
            )
            x, y = load_shard(self.client.get_blob(job["shard_cid"]))
            cfg = LocalConfig(
                steps=job["local_steps"], batch_size=job["batch_size"], optimizer=job["inner_opt"], lr=job["lr"]
            )
            name, opts = parse_spec(job["compression"], what="codec")
            codec = build_codec(
                name, opts, layout=[tuple(p.shape) for p in model.parameters()], error_feedback=job["error_feedback"]
            )
            trainer = LocalTrainer(model, x, y, cfg, seed=job["seed"])
            self.state = JobState(job["job_id"], trainer, codec, job["rounds"], shard_cid=job["shard_cid"])
        else:
            self.state.trainer.reconfigure(steps=job["local_steps"], batch_size=job["batch_size"], lr=job["lr"])
        state = self.state
        trainer = state.trainer
        load_checkpoint(trainer.model, self.client.get_blob(job["global_model_cid"]))
        start = flat_params(trainer.model)
        state.mark_round_start(job["round"])
        recorder = Recorder(trainer.cfg.steps)
        res = trainer.train_round(start, round=job["round"], recorder=recorder)
        residual_in = None
        if job["error_feedback"]:
            residual_in = (
                state.codec.residual.clone() if state.codec.residual is not None else torch.zeros(start.numel())
            )
        blob = state.codec.encode(res.delta)
        after = state.codec.residual if job["error_feedback"] else None
        proof = recorder.commitment(
            residual_in,
            after,
            batch_size=trainer.cfg.batch_size,
            lr=trainer.cfg.lr,
            data_seed=data_seed(job["seed"], job["round"]),
        ).to_json()
        self.recorder, self.residual_in = recorder, residual_in
        cid = cid_of_bytes(blob)
        self.client.put_blob(cid, blob)
        return {
            "round": job["round"],
            "cid": cid,
            "train_loss": res.loss,
            "train_accuracy": res.accuracy,
            "steps": res.steps,
            "compute_seconds": 0.1,
            "shard_cid": state.shard_cid,
            "proof": proof,
        }

    def send(self, coord: Any, api: Any, job: dict[str, Any], body: dict[str, Any]) -> httpx.Response:
        """POST the update; a refusal that says it was not recorded rolls the round back, as
        the daemon does."""
        r = post(coord, api, self.client, f"/jobs/{job['job_id']}/updates", body)
        if r.status_code >= 400 and r.json()["error"] not in ("update_rejected", "duplicate_update"):
            assert self.state is not None
            self.state.restore_round_start()
        return r

    def reveal(self, coord: Any, api: Any, job: dict[str, Any], challenge: dict[str, Any]) -> httpx.Response:
        assert self.recorder is not None
        steps = boundaries(self.recorder.steps, self.recorder.every)
        states = {}
        for b in challenge["boundaries"]:
            data = self.recorder.states[steps[int(b)]].to_bytes()
            states[str(b)] = cid_of_bytes(data)
            self.client.put_blob(states[str(b)], data)
        body = {"round": challenge["round"], "states": states}
        return post(coord, api, self.client, f"/jobs/{job['job_id']}/proofs", body)


# --- 1. an owner's lr change, then a resend ---------------------------------------------------


def test_a_round_resent_after_an_lr_change_passes_for_the_honest_daemon(coord, api, tmp_path):
    """The owner changes a job's lr mid-round and asks for the round again (both documented
    job controls). The daemon trains the round again with the lr its job view now gives,
    and states it in its proof; its re-run must pass. Today the daemon's round-start
    restore puts the old lr back into the optimizer, so the replay (at the stated lr) does
    not land: the honest update fails its check, is rejected, and the worker is slashed."""
    d = daemon(coord, tmp_path, "lrd")
    idle = provider(coord, "lri")  # never answers: round 1 stays open for the resend
    owner, run_id = new_run(coord, api, [d.client, idle], "lr")
    owner.post(f"/runs/{run_id}/distribute", CONFIG)
    api.wait_status(owner, run_id, "training")
    job = view(d.client)
    d.train_round(job)  # trains, sends, is challenged, reveals: the daemon's own round
    assert verdict(owner, job["job_id"])["verification"] == "passed"

    owner.post(f"/jobs/{job['job_id']}/config", {"lr": job["lr"] * 2})
    owner.post(f"/jobs/{job['job_id']}/resend")
    again = view(d.client)
    assert (again["action"], again["round"], again["lr"]) == ("train", 1, job["lr"] * 2), again
    d.train_round(again)
    u = verdict(owner, job["job_id"])
    assert (u["status"], u["verification"]) == ("accepted", "passed"), (
        u["status"],
        u["verification"],
        u["verify_detail"],
    )


# --- 2. revealed states and blob retention -----------------------------------------------------


def test_revealed_states_outlive_blob_retention_until_judged(stepped, api):
    """A reveal names blobs the driver has yet to read. Blob retention treats them as loose
    uploads: past ``max_loose_bytes`` (anyone with a wallet can upload junk to get there)
    or ``gc_grace_seconds`` (a restart, a queue of replays) they are deleted, and the
    driver then judges the honest worker's update failed: a provable fault, slashed. Here
    the driver's own two steps run in the order a tick can take them: retention, then the
    judgement."""
    st = stepped(max_loose_bytes=20_000, gc_interval_seconds=3600)
    w = provider(st, "gcw")
    owner, run_id = new_run(st, api, [w], "gc")
    owner.post(f"/runs/{run_id}/distribute", CONFIG)
    st.until("training", lambda: owner.get(f"/runs/{run_id}")["status"], lambda s: s == "training")
    job = view(w)
    rep = Replica(w)
    r = rep.send(st, api, job, rep.train(job))
    assert r.status_code == 201, r.text
    assert rep.reveal(st, api, job, r.json()["challenge"]).status_code == 200
    flood = st.client("flood")  # someone else's uploads, after the reveal: loose bytes past the cap
    for _ in range(3):
        data = torch.randn(2048).numpy().tobytes()
        flood.put_blob(cid_of_bytes(data), data)
    retention.run(st.ctx)
    u = st.until("judged", lambda: update_of(owner, job["job_id"], 1), judged)
    assert (u["status"], u["verification"]) == ("accepted", "passed"), (
        u["status"],
        u["verification"],
        u["verify_detail"],
    )


# --- 3. a lost reply, retried into a phase change -----------------------------------------------


def test_a_retry_of_a_recorded_update_does_not_lock_the_daemon_out(coord, api):
    """The daemon retries an update whose reply was lost. If the run was paused meanwhile
    (or the round closed), ``_round_gate`` answers the status before the duplicate: the
    daemon reads 'not recorded' and restores the optimizer to where the round began. The
    coordinator's chain check then refuses the next round's proof (its first optimizer
    state is neither fresh nor where the recorded update ended), and the daemon, restoring
    again on each 422, is refused every round from then on."""
    w = provider(coord, "rt")
    owner, run_id = new_run(coord, api, [w], "rt")
    owner.post(f"/runs/{run_id}/distribute", CONFIG)
    api.wait_status(owner, run_id, "training")
    rep = Replica(w)
    for rnd in (1, 2):
        job = open_round(w, rnd)
        body = rep.train(job)
        r = rep.send(coord, api, job, body)
        assert r.status_code == 201, r.text
        if rnd == 2:  # its reply is lost; the owner pauses; the daemon's retry reaches the paused run
            owner.post(f"/runs/{run_id}/pause")
            rep.send(coord, api, job, body)
            owner.post(f"/runs/{run_id}/resume")
        assert rep.reveal(coord, api, job, r.json()["challenge"]).status_code == 200
        assert verdict(owner, job["job_id"], rnd)["verification"] == "passed"
    job = wait_for("round 3 open", lambda: view(w), lambda j: (j["round"], j["action"]) == (3, "train"))
    r = rep.send(coord, api, job, rep.train(job))
    assert r.status_code == 201, r.text


# --- 4. a config change, then a pause ----------------------------------------------------------


def test_an_update_trained_before_a_config_change_and_a_pause_is_taken(coord, api):
    """The worker starts round 1 with lr a; the owner changes the job's lr to b, pauses
    the run and resumes it; the worker's update (trained at a, as the round began) arrives
    after the resume. The coordinator takes the settings from before a change made during
    the round; but resume() resets ``round_started_at``, so the change now looks older than
    the round and the honest update is refused (422 bad_proof): its round's work is lost."""
    w = provider(coord, "cp")
    owner, run_id = new_run(coord, api, [w], "cp")
    owner.post(f"/runs/{run_id}/distribute", CONFIG)
    api.wait_status(owner, run_id, "training")
    job = view(w)
    rep = Replica(w)
    body = rep.train(job)  # at the lr the round began with
    owner.post(f"/jobs/{job['job_id']}/config", {"lr": job["lr"] * 2})
    owner.post(f"/runs/{run_id}/pause")
    owner.post(f"/runs/{run_id}/resume")
    r = rep.send(coord, api, job, body)
    assert r.status_code == 201, r.text


# --- 5. a state larger than the coordinator takes ------------------------------------------------


def test_a_verifying_run_whose_states_cannot_be_uploaded_is_refused_or_revealable(new_coord, api):
    """The model checkpoint (4 bytes a parameter) and the update fit under the coordinator's
    ``max_blob_bytes``, the state a challenge asks for (params and AdamW's two moments) does
    not. With the default 256 MiB blob limit that is every model past ~22M parameters. Either distributing such a run is refused, naming the limit, or the
    honest worker's reveal goes through; today neither: PUT 413, the check goes
    unanswered, the update is unpaid and the job ends failed, every round, for everyone
    (and the daemon's ``_answer`` lets that ApiError out of ``run()`` on the job-view path)."""
    coord = new_coord(max_blob_bytes=256 << 10)  # the 2-shard digits fit, as in the harness
    options = {"hidden": [512]}  # d = 38,410: checkpoint 154 kB, an AdamW state 461 kB
    w, idle = provider(coord, "big"), provider(coord, "bigi")
    owner, run_id = new_run(coord, api, [w, idle], "big", options=options)
    r = post(coord, api, owner, f"/runs/{run_id}/distribute", CONFIG)
    if r.status_code == 422:
        assert "max_blob" in r.text, r.text
        return
    assert r.status_code < 300, r.text
    api.wait_status(owner, run_id, "training")
    job = view(w)
    rep = Replica(w)
    r = rep.send(coord, api, job, rep.train(job))
    assert r.status_code == 201, r.text
    assert rep.reveal(coord, api, job, r.json()["challenge"]).status_code == 200
    assert verdict(owner, job["job_id"])["verification"] == "passed"


# --- 6. a codec that keeps state across rounds ------------------------------------------------------


def test_an_honest_powersgd_update_passes_its_check_in_the_second_round(coord, api):
    """``compression: powersgd`` (warm start on by default) keeps the last call's ``Q`` in
    the codec: the daemon keeps one codec for its job, so round 2's update is encoded from
    round 1's ``Q``. The coordinator's ``check_update`` encodes the committed work with a
    fresh codec, whose first call starts from the seeded Gaussian: the bytes differ, and
    the honest update fails ('the update sent is not the codec's encoding of the work
    committed'), provably, so the worker is slashed. Either the warm start is part of what
    is committed and revealed (as the error-feedback residual is), or a verifying run
    refuses a codec that keeps state (422 naming it)."""
    w = provider(coord, "ps")
    owner, run_id = new_run(coord, api, [w], "ps")
    r = post(coord, api, owner, f"/runs/{run_id}/distribute", {**CONFIG, "compression": "powersgd:rank=2"})
    if r.status_code == 422:
        assert "powersgd" in r.text, r.text
        return
    assert r.status_code < 300, r.text
    api.wait_status(owner, run_id, "training")
    rep = Replica(w)
    for rnd in (1, 2):
        job = open_round(w, rnd)
        r = rep.send(coord, api, job, rep.train(job))
        assert r.status_code == 201, r.text
        assert rep.reveal(coord, api, job, r.json()["challenge"]).status_code == 200
        u = verdict(owner, job["job_id"], rnd)
        assert (u["status"], u["verification"]) == ("accepted", "passed"), (rnd, u["verify_detail"])


# --- 7. the replay's dropout and other threads of the coordinator ------------------------------------


def _replay_while_seeding(seeders: int) -> tuple[bool, float, str]:
    """An honest round of a transformer with dropout, then its whole stretch re-run as the
    driver does while ``seeders`` threads build the run's model as the
    API threads do (``build_initial_model``: distribute, on_submit's start digest, a manual
    aggregate's runtime), interval by interval (``check_interval``): ``(all ok, the largest
    error, the first failure's detail)``."""
    from aitbc.coordinator.live.runtime import build_initial_model
    from aitbc.coordinator.store.models import Run
    from aitbc.training.checks import Replay, check_interval

    vocab, t = 32, 16
    spec = {"task": "language", "input_shape": [t], "num_classes": vocab}
    run = Run(
        id="review",
        seed=0,
        model_type="transformer",
        model_options={"d_model": 32, "n_layers": 1, "n_heads": 2, "context": t, "dropout": 0.3},
        manifest={"spec": spec},
    )
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, vocab, (64, t), generator=g)
    y = torch.randint(0, vocab, (64, t), generator=g)
    cfg = LocalConfig(steps=48, batch_size=8, optimizer="adamw", lr=1e-3)
    model = build_initial_model(run, [])
    start = flat_params(model)
    rec = Recorder(cfg.steps)
    LocalTrainer(model, x, y, cfg, seed=11).train_round(start, round=3, recorder=rec)
    c = rec.commitment(None, None)
    steps = boundaries(c.steps, c.every)
    replay_cfg = LocalConfig(steps=cfg.steps, batch_size=8, optimizer="adamw", lr=1e-3)
    r = Replay(build_initial_model(run, []), x, y, replay_cfg, data_seed(11, 3))
    stop = threading.Event()

    def api_thread() -> None:
        while not stop.is_set():
            build_initial_model(run, [])

    threads = [threading.Thread(target=api_thread, daemon=True) for _ in range(seeders)]
    for th in threads:
        th.start()
    try:
        verdicts = [check_interval(c, i, rec.states[steps[i]], rec.states[steps[i + 1]], r) for i in range(c.intervals)]
    finally:
        stop.set()
        for th in threads:
            th.join()
    bad = [v for v in verdicts if not v.ok]
    return not bad, max(v.error or 0.0 for v in verdicts), bad[0].detail if bad else "all intervals replay"


def test_an_honest_dropout_interval_replays_when_nothing_else_seeds_torch():
    """The control of the next test: alone, the re-run of an honest dropout round is bit-exact."""
    ok, error, detail = _replay_while_seeding(0)
    assert ok and error == 0.0, detail


def test_an_honest_dropout_interval_replays_while_api_threads_build_models():
    """The round driver re-runs intervals in its thread; ``train_step`` seeds each step's
    dropout with ``torch.manual_seed`` inside ``fork_rng``, i.e. on the process's one
    global CPU generator. ``build_initial_model`` (called from request threads: distribute,
    the start digest of ``on_submit``, a manual aggregate) reseeds that generator at any
    moment, so a replay's dropout masks can come from the run's seed instead of the
    step's: the honest update 'does not replay' and is slashed. Transformer runs with
    ``dropout > 0`` are exposed."""
    ok, _, detail = _replay_while_seeding(2)
    assert ok, detail


# --- 8. the daemon's loop and a refused reveal ---------------------------------------------------------


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the bug: the loop's exception
def test_the_daemon_keeps_running_when_a_reveal_upload_is_refused(new_coord, api, tmp_path):
    """The daemon answers a challenge from the update's reply (inside ``train_round``,
    whose ApiError ``run()`` catches) and again from the job view while it is unanswered
    (outside any ``try``, once). A refused upload of a state there (the 429 a busy
    coordinator answers past ``max_uploads``) is an ApiError, which ended ``run()``: the
    provider's process stopped for good. The refusal is made at the daemon's client (a busy
    coordinator cannot be timed here); the coordinator is real."""
    coord = new_coord()
    cfg = WorkerSettings(
        wallet="loop", gpu="RTX4090", price="1", max_bond="5", availability=0.99, poll_seconds=0.5, progress_every=100
    )
    d = Worker(cfg, coordinator=coord.url, home=tmp_path / "loop")
    d.client.post("/wallets/fund", {"amount": "10"})
    real_put = d.client.put_blob
    refused: list[str] = []

    def busy(cid: str, data: bytes) -> Any:
        if data[8:].lstrip(b" ").startswith(b"{") and b"aitbc.proof/1" in data[:4096]:  # a state blob
            refused.append(cid)
            raise ApiError(429, "too_many_uploads", "16 blob uploads are in flight; retry shortly")
        return real_put(cid, data)

    d.client.put_blob = busy  # type: ignore[method-assign]
    loop = threading.Thread(target=d.run, name="daemon", daemon=True)
    loop.start()
    try:
        wait_for("registered", lambda: d.registered.is_set(), bool)
        idle = provider(coord, "loopi")
        owner, run_id = new_run(coord, api, [d.client, idle], "loop")
        r = post(coord, api, owner, f"/runs/{run_id}/distribute", CONFIG)
        assert r.status_code < 300, r.text
        job_id = wait_for("its job", lambda: view(d.client)["job_id"], bool)
        wait_for("its update", lambda: update_of(owner, job_id, 1), lambda u: u is not None)
        wait_for("a refused state upload", lambda: len(refused), bool)
        time.sleep(2.0)  # several polls: each finds the challenge unanswered
        assert loop.is_alive(), "the daemon's loop ended"
    finally:
        d.stop.set()
        loop.join(15)


def test_a_revealed_state_lost_by_the_coordinator_is_no_fault_of_the_worker(stepped, api):
    """A revealed blob this coordinator no longer holds (a disk mishap, an operator's clean-up)
    proves nothing against the worker: the check is recorded as ``error``, the update keeps
    the heuristic score (as one not drawn), nobody is slashed, and the round goes on."""
    st = stepped(gc_interval_seconds=3600)
    w = provider(st, "lost")
    owner, run_id = new_run(st, api, [w], "lost")
    owner.post(f"/runs/{run_id}/distribute", CONFIG)
    st.until("training", lambda: owner.get(f"/runs/{run_id}")["status"], lambda s: s == "training")
    job = view(w)
    rep = Replica(w)
    r = rep.send(st, api, job, rep.train(job))
    assert r.status_code == 201, r.text
    ch = r.json()["challenge"]
    assert rep.reveal(st, api, job, ch).status_code == 200
    with st.ctx.session() as s:
        revealed = s.scalar(select(Update.revealed).where(Update.job_id == job["job_id"]))
    st.ctx.store.delete(next(iter(revealed["states"].values())))
    u = st.until("judged", lambda: update_of(owner, job["job_id"], 1), judged)
    assert (u["status"], u["verification"]) == ("accepted", "error"), u
    assert "gone from the store" in u["verify_detail"], u
    rnd = st.until("closed", lambda: owner.get(f"/runs/{run_id}/rounds")["data"], lambda d: len(d) >= 2)
    assert rnd[1]["accepted"] == 1
    assert owner.get(f"/runs/{run_id}")["verification"]["errors"] == 1
