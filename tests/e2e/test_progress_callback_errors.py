"""A ``progress`` callback that raises, on a real coordinator: the caller gets its own
exception back (not an ``AgentError``), sync and async, whatever the stage (hashing, a
streamed upload, packaging, a streamed download); the run's dataset is not attached (its
pieces are stored first, the manifest attached last), no partial blob is left in the
coordinator's folder, and the same call without the callback then succeeds."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

from aitbc_agent_sdk import Agent, AgentConfig, AsyncAgent

pytestmark = pytest.mark.slow


class Stop(Exception):
    """The caller's own reason to stop."""


def stopping_at(stage: str, after: int = 0):
    """A callback that raises :class:`Stop` on its ``after``-th call (from 0) of ``stage``."""
    seen = {"n": 0}

    def progress(name: str, done: int, total: int) -> None:
        if name == stage:
            if seen["n"] >= after:
                raise Stop(f"{name} {done}/{total}")
            seen["n"] += 1

    return progress


def leftovers(coordinator: Path) -> list[str]:
    """Files in the blob folder that are not whole blobs (named by their CID)."""
    blobs = coordinator / "blobs"
    return [p for p in os.listdir(blobs) if not p.startswith("b")] if blobs.is_dir() else []


def test_a_raising_callback_ends_the_call_with_its_own_exception(stack, tmp_path: Path) -> None:
    stack.start_coordinator()
    run_id = stack.init_run(workers=2)
    config = AgentConfig(name="t", wallet_name="my-agent-wallet", coordinator_url=stack.url, home=stack.root / "owner")
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "big.bin").write_bytes(os.urandom(1_500_000))

    def run() -> dict:
        return httpx.get(f"{stack.url}/v1/runs/{run_id}", timeout=10).json()

    with Agent(config) as agent:
        for stage, after in (("upload", 2), ("package", 0)):  # mid-stream, and in the operation itself
            with pytest.raises(Stop):
                agent.upload_data(run_id, "digits", progress=stopping_at(stage, after))
            assert run()["data_source"] is None and run()["shards"] == 0, run()
        for stage, after in (("hash", 1), ("upload", 2)):  # a local step (offloaded), a streamed upload
            with pytest.raises(Stop):
                agent.upload_to_ipfs(path=folder, pin=False, training_id=run_id, progress=stopping_at(stage, after))
            assert run()["data_source"] is None, run()
        assert leftovers(stack.root / "coordinator") == []
        cid = agent.upload_to_ipfs(data=os.urandom(1_500_000), pin=False)  # bytes: never a run's dataset
        with pytest.raises(Stop):
            agent.get_from_ipfs(cid, progress=stopping_at("download", 1))

    async def in_async() -> None:
        async with AsyncAgent(config) as a:
            with pytest.raises(Stop):
                await a.upload_data(run_id, "digits", progress=stopping_at("upload", 2))
            with pytest.raises(Stop):
                await a.upload_to_ipfs(path=folder, pin=False, progress=stopping_at("hash", 1))
            with pytest.raises(Stop):
                await a.get_from_ipfs(cid, progress=stopping_at("download", 1))

    asyncio.run(in_async())
    assert leftovers(stack.root / "coordinator") == []
    with Agent(config) as agent:  # nothing held: the same call without the callback succeeds
        up = agent.upload_data(run_id, "digits")
    assert run()["manifest_cid"] == up["manifest_cid"] and run()["shards"] == 2
