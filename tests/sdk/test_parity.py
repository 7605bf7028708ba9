"""Agent and AsyncAgent: the same public methods, the same signatures, all awaitable."""

from __future__ import annotations

import inspect

import pytest

from aitbc_agent_sdk import OPERATIONS, Agent, AgentConfig, AsyncAgent, InvalidArgument


def _public(cls) -> dict[str, inspect.Signature]:
    return {
        n: inspect.signature(getattr(cls, n)) for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))
    }


def test_same_methods_and_signatures():
    sync, asyn = _public(Agent), _public(AsyncAgent)
    assert sync.keys() == asyn.keys()
    assert sync == asyn
    assert set(OPERATIONS) <= sync.keys()
    for name in (
        "start",
        "stop",
        "initialize_distributed_training",
        "upload_to_ipfs",
        "create_data_shards",
        "get_training_status",
        "discover_gpu_workers",
        "start_training",
        "get_worker_progress",
        "get_worker_job",
        "negotiate_worker_contract",
        "get_all_workers",
        "get_active_workers",
        "get_available_workers",
        "get_all_checkpoints",
        "verify_checkpoint",
        "get_training_progress",
        "wait_for_completion",
        "get_results",
        "get_payments",
        "process_payment",
        "refund_payments",
        "ping_worker",
        "fund_wallet",
        "get_balance",
        "update_training_phase",
        "send_training_job",
        "collect_checkpoint",
        "federated_average",
        "save_training_results",
        "mark_worker_failed",
        "find_replacement_worker",
        "reassign_job",
        "request_checkpoint_resend",
        "add_worker",
        "remove_worker",
        "reduce_worker_workload",
        "reassign_partial_work",
    ):
        assert name in sync, name


# The documentation's calls, parameter by parameter (leading parameters, in order).
DOCUMENTED = {
    "initialize_distributed_training": ["model_type", "dataset_size", "target_workers"],
    "upload_to_ipfs": ["path", "data", "pin"],
    "get_training_status": ["training_id"],
    "discover_gpu_workers": ["min_gpu", "required_workers"],
    "negotiate_worker_contract": ["worker_id", "training_id", "price"],
    "create_data_shards": ["training_id", "num_shards"],
    "send_training_job": ["worker_id", "training_id", "shard_id", "config"],
    "get_worker_progress": ["job_id"],
    "collect_checkpoint": ["worker_id", "job_id"],
    "federated_average": ["checkpoints", "weights"],
    "refund_payments": ["training_id"],
    "process_payment": ["worker_id", "contract_id", "amount"],
    "ping_worker": ["worker_id"],
    "mark_worker_failed": ["worker_id"],
    "get_worker_job": ["worker_id"],
    "find_replacement_worker": ["gpu_type"],
    "reassign_job": ["job_id", "new_worker_id"],
    "verify_checkpoint": ["checkpoint"],
    "request_checkpoint_resend": ["worker_id"],
    "get_training_progress": ["training_id"],
}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_documented_parameters(name):
    for cls in (Agent, AsyncAgent):
        params = [p for p in inspect.signature(getattr(cls, name)).parameters if p != "self"]
        assert params[: len(DOCUMENTED[name])] == DOCUMENTED[name], (cls.__name__, name, params)


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


def test_read_only_agent_reads_but_signs_nothing(tmp_path):
    agent = Agent(AgentConfig(name="a", home=tmp_path, wallet_name=None, coordinator_url="http://127.0.0.1:9"))
    with pytest.raises(InvalidArgument, match="read-only") as e:
        agent.stop_training("training_1")  # refused here, before any request (nothing listens on port 9)
    assert e.value.code == "no_wallet"
    with pytest.raises(InvalidArgument, match="read-only"):
        agent.get_balance()  # needs the wallet's address
    assert not (tmp_path / "wallets").exists()


def test_sdk_errors_are_the_projects_errors():
    """The CLI drives the SDK: its errors print as one line and exit 1, or 2 for a usage error."""
    from aitbc.errors import AitbcError
    from aitbc_agent_sdk import AgentError, Conflict, CoordinatorUnreachable

    assert issubclass(AgentError, AitbcError)
    assert Conflict("bad_state", "not now").exit_code == CoordinatorUnreachable("x", "y").exit_code == 1
    assert InvalidArgument("bad_argument", "no").exit_code == 2
