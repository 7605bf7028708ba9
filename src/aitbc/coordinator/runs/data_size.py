"""What a run's manifest says of its data beyond the shards: the size measured as the data
was read, and its tokenizer's vocabulary. Older manifests have neither (None)."""

from __future__ import annotations

from typing import Any

from aitbc.replies.runs import MeasuredSize


def measured_size(manifest: dict[str, Any] | None) -> MeasuredSize | None:
    """The manifest's ``measured`` (checked when the manifest was attached)."""
    m = (manifest or {}).get("measured")
    return MeasuredSize.model_validate(m) if isinstance(m, dict) else None


def vocab_size(manifest: dict[str, Any] | None) -> int | None:
    """The data's tokenizer's vocabulary size; None for bytes and arrays."""
    t = (manifest or {}).get("tokenizer")
    return int(t["vocab_size"]) if isinstance(t, dict) else None
