"""copies and alignments read from a ColumnSource (a round on disk) agree with the tensor."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aitbc.core.aggregation.streaming import TensorSource
from aitbc.core.scoring import alignments, copies


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), d=st.integers(1, 300), seed=st.integers(0, 10_000))
def test_copies_and_alignments_stream_as_in_memory(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n, d, generator=g) + torch.randn(1, d, generator=g)  # (n, d)
    if n >= 4:
        u[2] = 3.0 * u[0]  # a scaled copy
        u[3] = 0.0  # a free rider copies nothing
    src = TensorSource(u)
    assert copies(src) == copies(u)
    assert alignments(src) == pytest.approx(alignments(u), abs=1e-9)
