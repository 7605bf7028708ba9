"""A real anvil for the chain tests, started by the test on a port the kernel picks.

Without anvil installed (``make anvil``) a test is skipped with the reason, unless
``AITBC_REQUIRE_ANVIL=1`` (``make test-chain``, so CI) makes that a failure."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aitbc.chain.evm.node import AnvilNode, find_anvil, start_anvil
from aitbc.errors import AitbcError


def anvil_binary() -> Path:
    try:
        return find_anvil()
    except AitbcError as e:
        if os.environ.get("AITBC_REQUIRE_ANVIL") == "1":
            pytest.fail(str(e))
        pytest.skip(str(e))


@contextmanager
def running_anvil(workdir: Path) -> Iterator[AnvilNode]:
    node = start_anvil(workdir, binary=anvil_binary())
    try:
        yield node
    finally:
        node.stop()
