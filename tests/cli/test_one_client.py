"""One client: the command line talks to the coordinator only through the SDK's Agent (so
each request body and client-side rule is built once), and the training options that
``simulate``, ``distribute`` and ``demo`` share have one default each, the coordinator's
own and the SDK's ``start_training`` agreeing with it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest
import typer

from aitbc import run_defaults
from aitbc.cli.main import app
from aitbc.coordinator.schemas import Distribute
from aitbc_agent_sdk.operations import start_training

CLI = Path(__file__).resolve().parents[2] / "src" / "aitbc" / "cli"
SHARED = ["rounds", "local_steps", "batch_size", "lr", "outer", "outer_lr", "outer_momentum", "aggregator"]
SHARED += ["compression", "error_feedback"]
SHARED += ["mode", "deadline", "quorum", "eval_every", "buffer", "max_staleness", "staleness"]


def _params(*path: str) -> dict[str, Any]:
    """The parsed options of ``aitbc PATH...`` (typer's click objects, by name)."""
    cmd: Any = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return {p.name: p for p in cmd.params if p.name}


def test_no_command_builds_requests_itself():
    """Only the SDK speaks HTTP to the coordinator: no CLI module imports the low-level
    client or httpx (services.py may read the default coordinator URL)."""
    offenders = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "aitbc.client":
                names = {a.name for a in node.names} - {"coordinator_url"}
                if names:
                    offenders.append(f"{path.name}: aitbc.client.{', '.join(sorted(names))}")
            elif isinstance(node, ast.Import | ast.ImportFrom):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                offenders += [f"{path.name}: {m}" for m in mods if m.split(".")[0] == "httpx"]
    assert offenders == []


@pytest.mark.parametrize("name", SHARED)
def test_simulate_and_distribute_declare_shared_options_once(name):
    sim = _params("simulate")[name]
    dist = _params("distributed-training", "distribute")[name]
    assert sim.default == dist.default, (name, sim.default, dist.default)
    assert sim.opts == dist.opts and sim.help == dist.help  # one declaration, not two alike


def test_every_client_leaves_the_aggregator_to_the_codec():
    """simulate, distribute, demo, the SDK and the coordinator's request body name no rule:
    the codec picks it (``run_defaults.default_aggregator``), so a live run with a sparse
    codec gets sparse-robust as a simulation does."""
    for path in [("simulate",), ("distributed-training", "distribute"), ("demo",)]:
        option = _params(*path)["aggregator"]
        assert option.default is None and option.opts == ["--aggregator"], path
        assert "sparse-robust" in (option.help or "") and run_defaults.AGGREGATOR in (option.help or ""), path
    assert Distribute.model_fields["aggregator"].default is None
    assert inspect.signature(start_training).parameters["aggregator"].default is None
    assert run_defaults.default_aggregator(run_defaults.COMPRESSION) == run_defaults.AGGREGATOR
    assert run_defaults.default_aggregator("sparseloco:density=0.02,bits=2") == run_defaults.SPARSE_AGGREGATOR


def test_defaults_agree_with_the_coordinator_and_the_sdk():
    dist = _params("distributed-training", "distribute")
    sdk = inspect.signature(start_training).parameters
    for name in ("rounds", "local_steps", "batch_size", "lr", "outer", "compression", "eval_every"):
        expected = getattr(run_defaults, name.upper())
        assert dist[name].default == expected, name
        assert Distribute.model_fields[name].default == expected, name  # a client that omits it gets the same
        assert sdk[name].default == expected, name
    assert Distribute.model_fields["inner_opt"].default == sdk["inner_opt"].default == run_defaults.INNER_OPT
    assert Distribute.model_fields["error_feedback"].default is sdk["error_feedback"].default is False
    assert Distribute.model_fields["mode"].default == dist["mode"].default == run_defaults.MODE
    demo = _params("demo")
    assert (demo["rounds"].default, demo["local_steps"].default) == (run_defaults.ROUNDS, run_defaults.LOCAL_STEPS)
    assert _params("distributed-training", "upload-data")["max_bytes"].default == run_defaults.MAX_CORPUS_BYTES
    assert _params("simulate")["max_bytes"].default == run_defaults.MAX_CORPUS_BYTES
