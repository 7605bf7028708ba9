"""Type checkers see the agents' methods: ``_methods.pyi`` is generated from the operation
table (and current), the package is marked typed, and mypy, run as a user runs it on
their own code, reports a wrong argument and accepts a right one."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import pytest

import aitbc_agent_sdk
from aitbc_agent_sdk import OPERATIONS
from aitbc_agent_sdk.stub import STUB, render, returns

PACKAGE = Path(aitbc_agent_sdk.__file__).parent


def test_stub_is_generated_from_the_operations():
    pytest.importorskip("ruff")  # the stub is written as ruff formats it (make lint installs ruff)
    text = render()
    assert STUB.read_text() == text, "the stub is stale: run python -m aitbc_agent_sdk.stub --write"
    for name in OPERATIONS:
        assert f"    def {name}(" in text and f"    async def {name}(" in text, name


def test_every_operation_declares_what_the_agents_return():
    for name, op in OPERATIONS.items():
        assert returns(op), name  # raises for an operation without '-> Op[T]'
        params = list(inspect.signature(op).parameters.values())[1:]
        assert all(p.annotation is not inspect.Parameter.empty for p in params), name


def test_package_is_marked_typed():
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE.parent / "aitbc" / "py.typed").is_file()  # the replies the agents return are aitbc's models
    assert STUB.parent == PACKAGE and STUB.name == "_methods.pyi"


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mypy_cache")  # shared: the second run reuses the SDK's analysis


def _mypy(tmp_path: Path, cache: Path, code: str) -> tuple[str, int]:
    api = pytest.importorskip("mypy.api")
    src = tmp_path / "user_code.py"
    src.write_text(textwrap.dedent(code))
    (tmp_path / "mypy.ini").write_text("[mypy]\n")  # a user's project: not this repository's settings
    stdout, stderr, status = api.run([str(src), "--config-file", str(tmp_path / "mypy.ini"), "--cache-dir", str(cache)])
    return stdout + stderr, status


@pytest.mark.long  # a minute or more on 2 cores: make test-long
def test_mypy_checks_calls_to_the_agents(tmp_path, mypy_cache):
    # The SDK is found as an installed package, so this also proves its py.typed marker.
    out, status = _mypy(
        tmp_path,
        mypy_cache,
        """
        from aitbc_agent_sdk import Agent, AgentConfig, AsyncAgent

        agent = Agent(AgentConfig(name="a"))
        run = agent.start_training("training_1", rounds="ten")
        count: int = agent.get_training_status("training_1")
        agent.initialize_distributed_training("mlp", 1, 2, control="remote")
        print(agent.get_results("training_1").final_val_los)


        async def main() -> None:
            results = await AsyncAgent(AgentConfig(name="a")).get_results("training_1")
            reveal_type(results)
        """,
    )
    assert status == 1, out
    assert 'Argument "rounds" to "start_training"' in out and 'incompatible type "str"; expected "int"' in out, out
    assert 'expression has type "TrainingStatus", variable has type "int"' in out, out
    assert 'Argument "control" to "initialize_distributed_training"' in out, out
    assert '"Results" has no attribute "final_val_los"' in out, out  # a misspelled field: a type error
    assert 'Revealed type is "aitbc.replies.results.Results"' in out, out
    assert "Found 4 errors" in out, out


def test_mypy_accepts_the_quick_start(tmp_path, mypy_cache):
    out, status = _mypy(
        tmp_path,
        mypy_cache,
        """
        import asyncio

        from aitbc_agent_sdk import Agent, AgentConfig, AsyncAgent

        with Agent(AgentConfig(name="a", wallet_name="w")) as agent:
            tid: str = agent.initialize_distributed_training("mlp", "10MB", 2, budget=30).training_id
            shards: list[str] = [s.shard_id for s in agent.create_data_shards(tid)]
            agent.discover_gpu_workers(min_gpu="RTX3090", required_workers=2, training_id=tid)
            agent.start_training(tid, rounds=3, local_steps=10, aggregator="median", deadline=30.0)
            worker = agent.get_worker_job("w1")
            if worker is not None:
                print(worker.job_id, worker["job_id"])  # by attribute, or by key as the JSON reads


        async def main() -> None:
            async with AsyncAgent(AgentConfig(name="a")) as a:
                await a.wait_for_completion("training_1", timeout=60)


        asyncio.run(main())
        """,
    )
    assert status == 0, out
