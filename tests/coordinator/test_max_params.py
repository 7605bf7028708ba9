"""Model size against what can train it: the coordinator's run limit (``--max-params``)
refuses a model at init (a lower bound from its options) and when its data is attached (the
exact count), changing nothing; each offer states the largest model it trains, and hiring
passes over the offers too small for the run, saying how many. Real coordinators on
loopback, on the database under test (``AITBC_TEST_DB``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect, text

from aitbc import run_defaults
from aitbc.client import ApiError
from aitbc.coordinator.config import Settings
from aitbc.coordinator.live.runtime import check_replay_batch, eval_rows
from aitbc.coordinator.store.db import alembic_config
from aitbc.coordinator.store.models import Run
from aitbc.coordinator.workforce.hiring import assign_worker
from aitbc.errors import UsageError
from aitbc.settings import load_settings
from aitbc.storage.cid import cid_of_bytes
from aitbc.worker.config import WorkerSettings

# mlp parameters, with one input value and one class (the bound before the data is known)
# and on digits (64 inputs, 10 classes)
WIDE = {"hidden": [64, 64]}  # at least 64+64 + 64*64+64 + 64+1 = 4,353
SMALL = {"hidden": [16]}  # at least 16+16 + 16+1 = 49; on digits 64*16+16 + 16*10+10 = 1,210
TINY = {"hidden": [8]}  # on digits 64*8+8 + 8*10+10 = 610


@pytest.fixture(scope="module")
def limited(new_coordinator):
    """A coordinator whose operator trains at most 1,000 parameters."""
    return new_coordinator(max_params=1000)


def new_run(owner, options, *, budget: str = "10") -> dict:
    body = {"model_type": "mlp", "model_options": options, "dataset_size": "1GB", "target_workers": 2}
    return owner.post("/runs", {**body, "budget": budget})


def put_digits(owner, shards: int = 2) -> str:
    """Digits packaged in ``shards`` shards, every blob uploaded; the manifest's CID."""
    from aitbc.training.datasets import DataOptions, load_dataset
    from aitbc.training.packaging import manifest_bytes, package

    data = load_dataset("digits", DataOptions(seed=0))
    packaged = package(data, shards, seed=0)
    cids = []
    for blob in packaged.shards:
        cids.append(cid_of_bytes(blob))
        owner.put_blob(cids[-1], blob)
    val_cid = cid_of_bytes(packaged.val)
    owner.put_blob(val_cid, packaged.val)
    manifest = manifest_bytes(data, packaged, cids, val_cid, seed=0, alpha=None)
    owner.put_blob(cid := cid_of_bytes(manifest), manifest)
    return cid


# --- the coordinator's limit -------------------------------------------------------------


def test_the_limit_is_a_setting_with_the_run_default(monkeypatch, tmp_path):
    assert load_settings(Settings, {"home": tmp_path}).max_params == run_defaults.MAX_PARAMS == 1_000_000_000
    monkeypatch.setenv("AITBC_MAX_PARAMS", "5000")
    assert load_settings(Settings, {"home": tmp_path}).max_params == 5000
    assert load_settings(Settings, {"home": tmp_path, "max_params": 7}).max_params == 7  # the flag wins
    with pytest.raises(UsageError, match=r"^--max-params 0 is not allowed: input should be greater than or equal"):
        load_settings(Settings, {"home": tmp_path, "max_params": 0})
    monkeypatch.setenv("AITBC_MAX_PARAMS", "lots")
    with pytest.raises(UsageError, match=r"^AITBC_MAX_PARAMS='lots' is not allowed"):
        load_settings(Settings, {"home": tmp_path})


def test_a_model_over_the_limit_is_refused_at_init_and_nothing_is_made(limited, api):
    owner = limited.client("wide")
    owner.post("/wallets/fund", {"amount": "100"})
    before = limited.snapshot()
    with pytest.raises(ApiError) as e:
        new_run(owner, WIDE)
    api.assert_api_error(e, 422, "bad_model", "at least 4,353 parameters", "at most 1,000", "--max-params")
    assert limited.snapshot() == before
    assert owner.get(f"/wallets/{owner.wallet.address}/balance")["balance"] == "100"  # no budget escrowed
    assert new_run(owner, SMALL)["training_id"]  # within it: made


def test_data_that_makes_the_model_too_large_is_refused_and_nothing_changes(limited, api):
    owner = limited.client("small")
    owner.post("/wallets/fund", {"amount": "100"})
    run_id = new_run(owner, SMALL)["training_id"]  # at least 49 parameters: within the limit
    manifest = put_digits(owner)
    before = limited.snapshot()
    with pytest.raises(ApiError) as e:
        owner.post(f"/runs/{run_id}/data", {"manifest_cid": manifest, "source": "digits"})
    api.assert_api_error(e, 422, "bad_model", "1,210 parameters for this data", "at most 1,000")
    assert limited.snapshot() == before
    run = owner.get(f"/runs/{run_id}")
    assert run["status"] == "initializing" and run["manifest_cid"] is None, run


# A transformer of about 38.7 billion parameters: counted from its config, never built here.
HUGE = {"d_model": 8192, "n_layers": 48, "n_heads": 8, "context": 16}


def test_the_operators_limit_not_a_constant_governs(new_coordinator, server, api):
    """Past the default limit (a billion) a model is refused by a coordinator left at it, and
    taken by one whose operator raised it; the coordinator then reads its config (evaluation
    batches, a spot check's replay bound) with no second cap."""
    owner = server.client("huge")
    owner.post("/wallets/fund", {"amount": "100"})
    body = {"model_type": "transformer", "model_options": HUGE, "dataset_size": "1GB", "target_workers": 1}
    with pytest.raises(ApiError) as e:
        owner.post("/runs", body)
    api.assert_api_error(e, 422, "bad_model", "at most 1,000,000,000")
    roomy = new_coordinator(max_params=10**11)
    run_id = roomy.client("huge").post("/runs", body)["training_id"]
    with roomy.ctx.session() as s:
        run = s.get(Run, run_id)
        run.manifest = {"spec": {"task": "language", "input_shape": [16], "num_classes": 256}, "shards": []}
        assert eval_rows(run, 256 << 20) >= 1
        check_replay_batch(run, 0.0, 32)  # no spot checks: nothing to bound, and no cap refused it
        s.rollback()


# --- offers ---------------------------------------------------------------------------


def register(coord, name: str, max_params: int | None, gpu: str = "RTX4090"):
    c = coord.client(name)
    body = {"gpu": gpu, "price": "1.0", "availability": 0.99}
    c.post("/workers", body if max_params is None else {**body, "max_params": max_params})
    return c


def test_an_offer_states_the_largest_model_it_trains(new_coordinator, api):
    coord = new_coordinator()
    stated = register(coord, "stated", 123_456_789)
    unstated = register(coord, "unstated", None)
    offers = {o["worker_id"]: o for o in coord.client("viewer").get("/market/offers")["data"]}
    assert offers[stated.wallet.address]["max_params"] == 123_456_789
    assert offers[unstated.wallet.address]["max_params"] is None
    bad = coord.client("bad")
    before = coord.snapshot()
    for value in (0, -1, True, 1.5, "100", 10**16):
        with pytest.raises(ApiError) as e:
            bad.post("/workers", {"gpu": "RTX4090", "price": "1.0", "max_params": value})
        assert e.value.status == 422 and "max_params" in e.value.detail, (value, e.value.detail)
    assert coord.snapshot() == before


# --- hiring -------------------------------------------------------------------------------


@pytest.fixture
def market(new_coordinator, api) -> Iterator[tuple]:
    """A coordinator of its own (nobody else's offers), a run of 610 parameters on digits,
    and three offers: one of 600 (too small), one of a million, one stating no limit."""
    coord = new_coordinator()
    owner = coord.client("owner")
    run_id = api.create_run(owner, target_workers=2)  # an mlp of hidden [8]: TINY
    api.upload_digits(owner, run_id, 2)
    small = register(coord, "small", 600, gpu="H100")  # the best GPU: ranked first if it fitted
    big = register(coord, "big", 1_000_000)
    unstated = register(coord, "unstated", None)
    yield coord, owner, run_id, small, big, unstated


def test_hiring_passes_over_offers_too_small_and_says_how_many(market, api):
    coord, owner, run_id, small, big, unstated = market
    before = coord.snapshot()
    with pytest.raises(ApiError) as e:
        owner.post(f"/runs/{run_id}/discover", {"required_workers": 3})
    api.assert_api_error(e, 409, "not_enough_workers", "610 parameters (1 too small)", "3 required")
    assert coord.snapshot() == before  # no contracts, no bonds
    found = owner.post(f"/runs/{run_id}/discover", {"required_workers": 2})
    assert {r["worker_id"] for r in found["ranked"]} == {big.wallet.address, unstated.wallet.address}
    assert {c["worker_id"] for c in found["contracts"]} == {big.wallet.address, unstated.wallet.address}
    assert {r["worker_id"]: r["max_params"] for r in found["ranked"]} == {
        big.wallet.address: 1_000_000,
        unstated.wallet.address: None,
    }


def test_hiring_a_named_offer_too_small_is_refused(market, api):
    coord, owner, run_id, small, _, _ = market
    before = coord.snapshot()
    with pytest.raises(ApiError) as e:
        owner.post(f"/runs/{run_id}/contracts", {"worker_id": small.wallet.address, "price": "5"})
    api.assert_api_error(e, 409, "worker_too_small", "at most 600 parameters", "has 610")
    assert coord.snapshot() == before


def test_an_automatic_replacement_skips_offers_too_small(market):
    """The driver's hire for an orphaned shard (``assign_worker``) takes the best free offer
    that can train the run, never one too small, however well it ranks."""
    coord, _, run_id, small, big, unstated = market
    ctx = coord.ctx
    with ctx.session() as s:
        run = s.get(Run, run_id)
        job = assign_worker(ctx, s, run, 0, now=time.time())
        assert job is not None and job.worker_id != small.wallet.address
        assert job.worker_id in (big.wallet.address, unstated.wallet.address)
        second = assign_worker(ctx, s, run, 1, now=time.time())
        assert second is not None and second.worker_id not in (small.wallet.address, job.worker_id)
        assert assign_worker(ctx, s, run, 0, now=time.time()) is None  # only the small one is left
        s.rollback()


# --- the worker's setting ----------------------------------------------------------------


def test_the_workers_max_params_setting(monkeypatch):
    assert load_settings(WorkerSettings, {}).max_params is None  # derived from the device
    monkeypatch.setenv("AITBC_WORKER_MAX_PARAMS", "2000000")
    assert load_settings(WorkerSettings, {}).max_params == 2_000_000
    assert load_settings(WorkerSettings, {"max_params": 5}).max_params == 5
    with pytest.raises(UsageError, match=r"^--max-params 0 is not allowed"):
        load_settings(WorkerSettings, {"max_params": 0})


# --- the migration --------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path, databases) -> Iterator[str]:
    url = databases.new(tmp_path / "coord", backend=request.param)
    yield url
    databases.drop(url)


def offer_columns(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns("offers")}
    finally:
        engine.dispose()


def test_offer_max_params_migration_upgrades_and_downgrades(url):
    """0012 adds ``offers.max_params`` (null for the offers already there: no stated limit)
    and takes it away again, the offers' other values kept."""
    cfg = alembic_config(url)
    command.upgrade(cfg, "0011")
    assert "max_params" not in offer_columns(url)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO offers (id, public_key, gpu, device, price, availability, reputation, status, "
                    "flags, max_bond, last_heartbeat, registered_at) VALUES "
                    "('w1', 'k', 'RTX4090', '{}', 1000000, 0.9, 2.5, 'online', 0, 0, 1.0, 1.0)"
                )
            )
        command.upgrade(cfg, "0012")
        with engine.begin() as conn:
            assert conn.execute(text("SELECT id, max_params FROM offers")).all() == [("w1", None)]
            conn.execute(text("UPDATE offers SET max_params = 3000000000"))  # past 32 bits
            assert conn.execute(text("SELECT max_params FROM offers")).scalar() == 3_000_000_000
        command.downgrade(cfg, "0011")
        assert "max_params" not in offer_columns(url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT id, gpu, price FROM offers")).all() == [("w1", "RTX4090", 1_000_000)]
    finally:
        engine.dispose()
