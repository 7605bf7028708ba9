"""A run started on the local stack stays reachable after `aitbc down` and `up`: `up` takes
its previous port again when free, and when it cannot, every command finds the run on the
stack's new coordinator, which is the same coordinator (same id, same database), and
remembers the new URL. A record naming another coordinator is never redirected."""

from __future__ import annotations

import json
import socket

import pytest

from aitbc import stack as stk


@pytest.fixture
def home_stack(aitbc):
    yield aitbc
    if stk.stack_file(aitbc.home).exists():
        stk.down(aitbc.home, grace=5.0)


def _up(aitbc) -> str:
    up = aitbc("up", "--workers", "1", "--json", timeout=180)
    assert up.returncode == 0, up.stderr
    return json.loads(up.stdout)["coordinator"]


def _down(aitbc) -> None:
    assert aitbc("down", timeout=60).returncode == 0


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_a_run_is_found_again_after_down_and_up(home_stack):
    aitbc, home = home_stack, home_stack.home
    first = _up(aitbc)
    assert aitbc("wallet", "create", "owner").returncode == 0
    init = aitbc(
        "distributed-training",
        "init",
        "--wallet",
        "owner",
        "--model-type",
        "mlp",
        "--dataset-size",
        "1MB",
        "--target-workers",
        "1",
        "--json",  # fmt: skip
    )
    assert init.returncode == 0, init.stderr
    run_id = json.loads(init.stdout)["training_id"]
    record = home / "runs" / f"{run_id}.json"
    coordinator_id = json.loads(record.read_text())["coordinator_id"]
    assert coordinator_id.startswith("coordinator_")

    # `up` after `down` takes the same port again.
    _down(aitbc)
    assert _up(aitbc) == first

    # The port is taken by something else: the stack moves, the run is found there.
    _down(aitbc)
    with socket.socket() as blocker:
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past its closed connections
        blocker.bind(("127.0.0.1", _port(first)))
        blocker.listen()
        moved = _up(aitbc)
        assert moved != first

        status = aitbc("distributed-training", "status", "--training-id", run_id, "--json")

        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["training_id"] == run_id
        assert json.loads(record.read_text()) == {
            "training_id": run_id,
            "wallet": "owner",
            "coordinator": moved,
            "coordinator_id": coordinator_id,
        }

    # A record of another coordinator (another id) under this run's id is not redirected to
    # the stack, though the stack has a run of that id: the command fails where it was sent.
    gone = "http://127.0.0.1:9"
    record.write_text(
        json.dumps({"training_id": run_id, "wallet": "owner", "coordinator": gone, "coordinator_id": "coordinator_x"})
    )

    other = aitbc("distributed-training", "status", "--training-id", run_id)

    assert other.returncode != 0
    assert f"coordinator at {gone} is unreachable" in other.stderr
    assert json.loads(record.read_text())["coordinator"] == gone
