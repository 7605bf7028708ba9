"""Every ``distributed-training`` command given a run id the coordinator does not know says
so in the same one line and exit code (1, naming the id and how to list runs), whether or
not it changes the run: a command that needs the owner's wallet asks for it only about a
run that exists (with --wallet NAME of a wallet that does not exist, too)."""

from __future__ import annotations

import pytest
from tests.e2e.conftest import Stack

UNKNOWN = "training_nope"
NOT_FOUND = f"error: no training run '{UNKNOWN}'; list runs with: aitbc distributed-training list"

# Each command with what it needs besides --training-id (checked before any request).
OWNERS = [  # these change the run: signed by the owner's wallet
    ("upload-data", "--data-path", "digits"),
    ("discover-workers", "--required-workers", "2"),
    ("distribute",),
    ("stop",),
    ("pause",),
    ("resume",),
]
READERS = [("monitor", "--once"), ("status",), ("results",), ("verify",), ("payments",)]


@pytest.fixture
def coordinator(stack: Stack) -> Stack:
    stack.start_coordinator()
    return stack


@pytest.mark.long  # twenty CLI processes and a coordinator: half a minute on a busy machine
def test_an_unknown_run_is_not_found_by_every_command(coordinator: Stack, tmp_path):
    stack = coordinator
    for name, *extra in OWNERS:
        r = stack.cli("distributed-training", name, "--training-id", UNKNOWN, *extra)
        assert (r.returncode, r.stderr.strip()) == (1, NOT_FOUND), (name, r.stdout)
    for name, *extra in OWNERS[:2]:  # a wallet named that does not exist: the run is what is missing first
        r = stack.cli("distributed-training", name, "--training-id", UNKNOWN, *extra, "--wallet", "nobody")
        assert (r.returncode, r.stderr.strip()) == (1, NOT_FOUND), (name, r.stdout)
    for name, *extra in (
        *READERS,
        ("download-model", "-o", str(tmp_path / "m.pt")),
        ("report", "-o", str(tmp_path / "report")),
    ):
        r = stack.cli("distributed-training", name, "--training-id", UNKNOWN, *extra)
        assert (r.returncode, r.stderr.strip()) == (1, NOT_FOUND), (name, r.stdout)
    # a run that exists, started elsewhere: the wallet is what is missing (a usage error)
    run_id = stack.init_run(workers=1)
    other_home = ("--home", str(tmp_path / "elsewhere"))
    r = stack.cli("distributed-training", "stop", "--training-id", run_id, *other_home)
    assert r.returncode == 2 and "pass --wallet NAME" in r.stderr, r.stderr
