"""What the documented examples rely on, one feature or refusal per test, against a real
local stack (``aitbc up --workers 2``): the agent's current run (methods without
``training_id``), uploads of folders and models (a folder uploaded while a run is
initializing becomes its dataset; ``create_data_shards`` cuts it, also from another
process), truthy ``ping_worker`` / ``verify_checkpoint`` results, and numeric prices."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import torch

from aitbc.storage.cid import cid_of_bytes
from aitbc.storage.unixfs_add import add_path
from aitbc.training.checkpoint import bytes_to_tensors
from aitbc_agent_sdk import (
    Agent,
    AgentConfig,
    AmbiguousRun,
    AsyncAgent,
    Conflict,
    Forbidden,
    InvalidArgument,
    NotFound,
)
from aitbc_agent_sdk.ipfs import to_bytes
from aitbc_agent_sdk.results import Liveness, Outcome, Validity


@pytest.fixture(scope="module")
def stack(tmp_path_factory, start_stack):
    with start_stack(tmp_path_factory.mktemp("current") / "home", workers=2) as (home, env, st):
        yield home


def _agent(home, wallet: str | None) -> Agent:
    a = Agent(AgentConfig(name="t", wallet_name=wallet, home=home))
    if wallet is not None:
        a.start()
    return a


@pytest.fixture
def folder(tmp_path):
    """A small real folder of text files, one in a subfolder."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    torch_dir = Path(torch.__file__).parent  # torch's own sources: real text
    for i, src in enumerate((torch_dir / "functional.py", torch_dir / "__init__.py")):
        (root / f"part{i}.py").write_bytes(src.read_bytes()[:20_000])
    (root / "sub" / "notes.txt").write_text("The agent's dataset, one folder of text files.\n" * 200)
    return root


# --- the current run ---------------------------------------------------------------------------------


def test_current_run_is_the_one_initialized(stack):
    with _agent(stack, "cur-init") as a:
        assert a.training_id is None
        tid = a.initialize_distributed_training("mlp", 1, 2)["training_id"]
        assert a.training_id == tid
        assert a.get_training_status()["training_id"] == tid  # no training_id: the current run
        assert a.get_all_workers() == [] and a.get_active_workers() == []
        other = a.initialize_distributed_training("mlp", 1, 2)["training_id"]
        assert a.get_training_status()["training_id"] == other  # the last one initialized
        a.get_training_status(tid)  # naming a run makes it current
        assert a.training_id == tid and a.get_results()["training_id"] == tid
        for t in (tid, other):
            a.stop_training(t)


def test_current_run_is_the_only_active_run_the_wallet_owns(stack):
    with _agent(stack, "cur-own") as owner:
        tid = owner.initialize_distributed_training("mlp", 1, 2)["training_id"]
    with _agent(stack, "cur-own") as fresh:  # another process, same wallet: finds the run itself
        assert fresh.get_training_progress()["phase"] == "initializing"
        assert fresh.training_id == tid
        fresh.stop_training()
    with _agent(stack, "cur-own") as later, pytest.raises(AmbiguousRun) as e:  # the run ended: none left
        later.get_all_workers()
    assert e.value.code == "no_current_run" and e.value.candidates == []
    assert "pass training_id" in e.value.detail and isinstance(e.value, InvalidArgument)


def test_several_active_runs_are_ambiguous(stack):
    with _agent(stack, "cur-two") as owner:
        ids = sorted(owner.initialize_distributed_training("mlp", 1, 2)["training_id"] for _ in range(2))
    try:
        with _agent(stack, "cur-two") as fresh, pytest.raises(AmbiguousRun) as e:
            fresh.get_all_checkpoints()
        assert e.value.code == "ambiguous_run" and sorted(e.value.candidates) == ids
        assert all(t in e.value.detail for t in ids) and "pass training_id" in e.value.detail
        assert e.value.exit_code == 2  # a usage error, as the CLI reports its own
    finally:
        with _agent(stack, "cur-two") as owner:
            for t in ids:
                owner.stop_training(t)


def test_a_read_only_agent_has_no_current_run(stack):
    with _agent(stack, None) as reader, pytest.raises(AmbiguousRun) as e:
        reader.get_training_status()
    assert e.value.code == "no_current_run"


def test_async_agent_has_the_current_run_too(stack):
    import asyncio

    async def go():
        async with AsyncAgent(AgentConfig(name="t", wallet_name="cur-async", home=stack)) as a:
            await a.start()
            tid = (await a.initialize_distributed_training("mlp", 1, 2))["training_id"]
            assert (await a.get_training_status())["training_id"] == tid
            await a.stop_training()
            return tid

    tid = asyncio.run(go())
    with _agent(stack, None) as reader:
        assert reader.get_training_status(tid)["phase"] == "stopped"


# --- uploads and the run's dataset -------------------------------------------------------------------


def test_a_folder_uploaded_while_initializing_becomes_the_dataset(stack, folder):
    with _agent(stack, "up-folder") as a:
        tid = a.initialize_distributed_training(
            "transformer", "1MB", 3, control="manual", model_options={"context": 32, "d_model": 32}
        )["training_id"]
        cid = a.upload_to_ipfs(path=folder, pin=True)
        assert cid == add_path(folder).root  # the UnixFS root of the folder
        run = a.get_training_status()
        assert run["data_source"] == f"ipfs://{cid}" and run["shards"] == 3
        # cut again, into 2 (a manual run takes any number): from the same folder
        shards = a.create_data_shards(training_id=tid, num_shards=2)
        assert [s["shard_index"] for s in shards] == [0, 1] and all(s["shard_id"].startswith("b") for s in shards)
        assert a.get_training_status()["shards"] == 2
        # the same number again: the shards as they are, nothing re-cut
        assert a.create_data_shards(training_id=tid, num_shards=2) == shards
    # another process, without the folder: it is read back from the coordinator by its CID
    with _agent(stack, "up-folder") as other:
        again = other.create_data_shards(num_shards=3)
        assert len(again) == 3 and other.get_training_status()["data_source"] == f"ipfs://{cid}"
        other.stop_training()


def test_uploads_outside_the_data_phases_are_not_datasets(stack, folder):
    with _agent(stack, "up-late") as a:
        a.initialize_distributed_training("mlp", 1, 2)
        a.stop_training()
        cid = a.upload_to_ipfs(path=folder / "sub" / "notes.txt")  # a file: stored, the run has ended
        assert cid == add_path(folder / "sub" / "notes.txt").root
        assert a.get_training_status()["data_source"] is None
        with pytest.raises(Conflict) as e:
            a.create_data_shards(num_shards=2)
        assert e.value.code == "bad_state" and "initializing or distributing" in e.value.detail


def test_create_data_shards_without_a_dataset_is_refused(stack):
    with _agent(stack, "up-none") as a:
        a.initialize_distributed_training("mlp", 1, 2)
        with pytest.raises(Conflict) as e:
            a.create_data_shards(num_shards=2)
        assert e.value.code == "no_data" and "upload_to_ipfs(path=" in e.value.detail
        a.stop_training()


def test_upload_data_takes_bytes_models_and_state_dicts(stack):
    with _agent(stack, None) as reader, _agent(stack, "up-data") as a:
        assert a.upload_to_ipfs(data=b"hello") == cid_of_bytes(b"hello")
        model = torch.nn.Linear(3, 2)
        from_model = a.upload_to_ipfs(data=model)
        from_state = a.upload_to_ipfs(data=model.state_dict())
        assert from_model == from_state  # the same safetensors checkpoint
        stored = bytes_to_tensors(_blob(reader, from_model))
        assert set(stored) == {"weight", "bias"} and torch.equal(stored["weight"], model.weight.detach())
        assert from_model == cid_of_bytes(to_bytes(model))  # a safetensors checkpoint of the state dict


def _blob(agent: Agent, cid: str) -> bytes:
    from aitbc_agent_sdk.checkpoints import _download

    return agent._run(_download(cid))


@pytest.mark.parametrize(
    ("kwargs", "error", "code"),
    [
        ({}, InvalidArgument, "bad_argument"),
        ({"path": "x", "data": b"y"}, InvalidArgument, "bad_argument"),
        ({"path": "/no/such/folder"}, NotFound, "not_found"),
        ({"data": 3}, InvalidArgument, "bad_argument"),
        ({"data": {"w": [1, 2]}}, InvalidArgument, "bad_argument"),
    ],
)
def test_upload_refusals(stack, kwargs, error, code):
    with _agent(stack, "up-bad") as a, pytest.raises(error) as e:
        a.upload_to_ipfs(**kwargs)
    assert e.value.code == code, e.value


# --- truthy results and numbers ----------------------------------------------------------------


def test_ping_and_verify_are_truthy_exactly_when_alive_or_valid(stack):
    with _agent(stack, None) as a:
        w = a.get_market_offers()[0]
        ping = a.ping_worker(w["worker_id"])
        assert isinstance(ping, Liveness) and ping and ping["alive"] is True
        stale = a.ping_worker(w["worker_id"], max_age=0.0)
        assert not stale and stale["alive"] is False and stale["last_heartbeat_age"] >= 0
        assert Liveness.model_validate_json(stale.model_dump_json()) == stale  # JSON there and back
        bad = a.verify_checkpoint(cid_of_bytes(b"never uploaded"))
        assert isinstance(bad, Validity) and not bad and bad["detail"]
    with _agent(stack, "verify-ok") as owner:
        cid = owner.upload_to_ipfs(data=torch.nn.Linear(2, 2))
        ok = owner.verify_checkpoint(cid)
        assert ok and ok["valid"] is True
    assert not Outcome(done=False, worker_id="w", detail="nobody free") and Outcome(done=True, worker_id="w", detail="")


def test_prices_are_exact_decimals_beside_their_micro_ait(stack):
    with _agent(stack, "prices") as a:
        a.fund_wallet(20)  # hiring needs price x 10 rounds in hand (issue 33)
        free = a.get_available_workers()
        assert free and all(isinstance(o["price"], Decimal) and o["price"] * 10**6 == o["price_micro"] for o in free)
        found = a.discover_gpu_workers(required_workers=1)
        assert 1 / (found[0]["price"] + 1) > 0  # the documentation's arithmetic
        tid = a.initialize_distributed_training("mlp", 1, 1)["training_id"]
        c = a.negotiate_worker_contract(worker_id=found[0]["worker_id"], training_id=tid, price=found[0]["price"])
        assert set(c.keys()) >= {"contract_id", "price", "price_micro"} and c.price == found[0].price
        assert c["price_micro"] == found[0]["price_micro"]
        a.stop_training()


def test_create_data_shards_recuts_while_distributing_until_jobs_are_sent(stack, folder):
    with _agent(stack, "up-dist") as a:
        a.fund_wallet(100)
        a.initialize_distributed_training("transformer", "1MB", 3, model_options={"context": 32, "d_model": 32})
        cid = a.upload_to_ipfs(path=folder)  # the run's dataset: 3 shards, one per target worker
        hired = [
            a.negotiate_worker_contract(worker_id=w["worker_id"], price=w["price"])
            for w in a.discover_gpu_workers(required_workers=2)
        ]
        assert a.update_training_phase(phase="distributing")["control"] == "manual"  # the owner took it over
        shards = a.create_data_shards(num_shards=2)  # cut again, now one per hired worker
        assert len(shards) == 2 and a.get_training_status()["shards"] == 2
        assert a.get_training_status()["data_source"] == f"ipfs://{cid}"
        a.send_training_job(worker_id=hired[0]["worker_id"], shard_id=shards[0]["shard_id"])
        with pytest.raises(Conflict) as e:  # a job trains on these shards now: they stay
            a.create_data_shards(num_shards=3)
        assert e.value.code == "jobs_sent"
        assert a.get_training_status()["shards"] == 2
        a.stop_training()


def test_an_upload_never_becomes_another_owners_dataset(stack, folder):
    with _agent(stack, "up-owner") as owner, _agent(stack, "up-other") as other:
        tid = owner.initialize_distributed_training("mlp", 1, 2)["training_id"]
        other.get_training_status(tid)  # reading it makes it the other agent's current run
        cid = other.upload_to_ipfs(path=folder)  # stored, and nothing else: not other's run
        assert cid == add_path(folder).root
        assert owner.get_training_status()["data_source"] is None
        with pytest.raises(Forbidden):  # nor can it cut the owner's run
            other.create_data_shards(data_path="digits", num_shards=2)
        assert owner.get_training_status()["manifest_cid"] is None
        owner.stop_training()
