"""docs/SDK.md is the generated API reference, up to date with the docstrings."""

from pathlib import Path

from aitbc_agent_sdk.operations import OPERATIONS
from aitbc_agent_sdk.reference import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "SDK.md"


def test_reference_is_generated_from_the_docstrings():
    text = render()
    assert all(f"### `{name}`" in text for name in OPERATIONS)
    assert DOC.read_text() == text, "docs/SDK.md is stale: run python -m aitbc_agent_sdk.reference > docs/SDK.md"
