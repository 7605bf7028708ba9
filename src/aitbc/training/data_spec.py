"""What a model needs to know about its data, fixed once per dataset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class DataSpec:
    """``task`` is ``classification`` (one label per sample) or ``language`` (next byte
    at every position). ``input_shape`` is one sample's shape; ``num_classes`` is the
    label count, or the vocabulary size (256 for bytes) for language data."""

    task: Literal["classification", "language"]
    input_shape: tuple[int, ...]
    num_classes: int
