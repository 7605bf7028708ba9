"""The local EVM node: anvil started on a port the kernel picks, answering JSON-RPC with
funded accounts, and stopped leaving no process behind."""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest
from tests.chain.anvil import anvil_binary, running_anvil

from aitbc.chain.evm.client import EvmClient
from aitbc.chain.evm.node import DEV_CHAIN_ID, start_anvil
from aitbc.errors import AitbcError

pytestmark = pytest.mark.chain


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_two_nodes_start_answer_and_stop_leaving_no_process(tmp_path):
    with running_anvil(tmp_path / "a") as a, running_anvil(tmp_path / "b") as b:
        assert a.port != b.port
        for node in (a, b):
            with EvmClient(node.url) as client:
                assert client.chain_id == DEV_CHAIN_ID
                assert len(node.accounts) == 10
                assert client.balance(node.accounts[0].address) > 0
        pids, ports = [a.pid, b.pid], [a.port, b.port]
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not any(_listening(p) for p in ports)
    a.stop()  # again: nothing to do


def test_a_taken_port_fails_in_one_line_and_leaves_no_process(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        with pytest.raises(AitbcError) as failed:
            start_anvil(tmp_path, binary=anvil_binary(), port=port, timeout=60)
    assert "exited with status" in str(failed.value) and "Address already in use" in str(failed.value)
    assert "\n" not in str(failed.value)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_a_missing_binary_says_how_to_install_it(tmp_path):
    with pytest.raises(AitbcError, match="no anvil binary at"):
        start_anvil(tmp_path, binary=Path(tmp_path / "nowhere" / "anvil"))
