"""Agent and AsyncAgent: the same public methods, the same signatures, all awaitable."""

from __future__ import annotations

import inspect

import pytest

from aitbc_agent_sdk import Agent, AgentConfig, AsyncAgent, InvalidArgument, OPERATIONS


def _public(cls) -> dict[str, inspect.Signature]:
    return {n: inspect.signature(getattr(cls, n)) for n in dir(cls)
            if not n.startswith("_") and callable(getattr(cls, n))}


def test_same_methods_and_signatures():
    sync, asyn = _public(Agent), _public(AsyncAgent)
    assert sync.keys() == asyn.keys()
    assert sync == asyn
    assert set(OPERATIONS) <= sync.keys()
    for name in ("start", "stop", "initialize_distributed_training", "upload_to_ipfs", "create_data_shards",
                 "get_training_status", "discover_gpu_workers", "start_training", "get_worker_progress", "get_worker_job", "negotiate_worker_contract",
                 "get_all_workers", "get_active_workers", "get_available_workers", "get_all_checkpoints",
                 "verify_checkpoint", "get_training_progress", "wait_for_completion", "get_results",
                 "get_payments", "process_payment", "refund_payments", "ping_worker", "fund_wallet", "get_balance"):
        assert name in sync, name


def test_every_async_method_is_a_coroutine_function():
    for name in _public(AsyncAgent):
        assert inspect.iscoroutinefunction(getattr(AsyncAgent, name)), name
    for name in _public(Agent):
        assert not inspect.iscoroutinefunction(getattr(Agent, name)), name


def test_config_refuses_other_networks(tmp_path):
    for net in ("mainnet", "testnet"):
        with pytest.raises(InvalidArgument, match="local ledger only"):
            AgentConfig(name="a", blockchain_network=net, home=tmp_path)


def test_config_coordinator_url_from_stack(tmp_path, monkeypatch):
    monkeypatch.delenv("AITBC_COORDINATOR", raising=False)
    (tmp_path / "stack.json").write_text('{"coordinator": "http://127.0.0.1:9999/"}')
    assert AgentConfig(name="a", home=tmp_path).resolved_coordinator_url == "http://127.0.0.1:9999"
    monkeypatch.setenv("AITBC_COORDINATOR", "http://127.0.0.1:1234")
    assert AgentConfig(name="a", home=tmp_path).resolved_coordinator_url == "http://127.0.0.1:1234"
    assert AgentConfig(name="a", home=tmp_path, coordinator_url="http://h:1").resolved_coordinator_url == "http://h:1"


def test_unreachable_coordinator(tmp_path):
    import socket

    from aitbc_agent_sdk import CoordinatorUnreachable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = Agent(AgentConfig(name="a", home=tmp_path, wallet_name="w", coordinator_url=f"http://127.0.0.1:{port}"))
    with pytest.raises(CoordinatorUnreachable, match="unreachable"):
        agent.start()
