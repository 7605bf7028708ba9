"""``powersgd``: rank-r factors per weight matrix (Vogels et al. 2019)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aitbc.core.compression import build_codec, decode, read_header
from aitbc.errors import UsageError


def low_rank(m: int, n: int, rank: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, rank, generator=g) @ torch.randn(rank, n, generator=g)  # (m, n), rank <= rank


@settings(max_examples=80, deadline=None)
@given(m=st.integers(1, 24), n=st.integers(1, 24), r=st.integers(1, 4), data=st.data())
def test_a_matrix_of_rank_at_most_r_comes_back_exactly(m, n, r, data):
    true_rank = data.draw(st.integers(0, r), label="true_rank")
    x = low_rank(m, n, true_rank, seed=data.draw(st.integers(0, 2**16), label="seed"))

    y = decode(build_codec("powersgd", {"rank": r}).encode(x))

    assert y.shape == (m, n)
    assert torch.linalg.norm(y - x) <= 1e-4 * torch.linalg.norm(x) + 1e-5


def test_layout_mixes_matrices_biases_and_conv_kernels():
    # Prepare: a (16, 12) weight, its bias, a (4, 2, 3) kernel viewed as (4, 6), a scalar
    layout = [(16, 12), (16,), (4, 2, 3), ()]
    w, b, k, s = low_rank(16, 12, 2, 0), torch.randn(16), low_rank(4, 6, 1, 1).reshape(4, 2, 3), torch.tensor(3.0)
    x = torch.cat([w.reshape(-1), b, k.reshape(-1), s.reshape(1)])  # (d,) as a worker sends it
    codec = build_codec("powersgd", {"rank": 2}, layout=layout)

    blob = codec.encode(x)
    y = decode(blob)

    header, payload = read_header(blob)
    assert header.meta == {"layout": [[16, 12], [16], [4, 2, 3], []]}
    assert len(payload) == 4 * (2 * (16 + 12) + 16 + 2 * (4 + 6) + 1)
    assert torch.allclose(y[:192], w.reshape(-1), atol=1e-4)
    assert torch.equal(y[192:208], b)  # 1-D parameters are sent dense
    assert torch.allclose(y[208:232], k.reshape(-1), atol=1e-4)
    assert y[232] == 3.0


def test_rank_at_least_min_dim_is_sent_dense():
    x = torch.randn(3, 40)

    blob = build_codec("powersgd", {"rank": 3}).encode(x)

    assert len(read_header(blob)[1]) == 4 * 120
    assert torch.equal(decode(blob), x)


def test_flat_update_without_layout_is_a_usage_error():
    with pytest.raises(UsageError, match="needs the model's parameter layout"):
        build_codec("powersgd").encode(torch.randn(100))


def test_layout_that_does_not_cover_the_update():
    with pytest.raises(UsageError, match="layout covers 12 values but the update has 13"):
        build_codec("powersgd", layout=[(3, 4)]).encode(torch.randn(13))


def test_warm_start_is_deterministic_and_converges():
    # a full-rank matrix with a decaying spectrum: repeated calls are subspace iteration
    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(40, 40, generator=g))
    v, _ = torch.linalg.qr(torch.randn(30, 30, generator=g))
    x = u[:, :30] @ torch.diag(0.7 ** torch.arange(30.0)) @ v.T  # (40, 30)
    a, b = build_codec("powersgd", {"rank": 2}), build_codec("powersgd", {"rank": 2})

    blobs_a = [a.encode(x) for _ in range(6)]
    blobs_b = [b.encode(x) for _ in range(6)]

    assert blobs_a == blobs_b  # same call sequence, same bytes
    errors = [torch.linalg.norm(decode(blob) - x).item() for blob in blobs_a]
    best = torch.linalg.norm(x - u[:, :2] @ torch.diag(0.7 ** torch.arange(2.0)) @ v[:, :2].T).item()
    assert errors[-1] <= errors[0] and errors[-1] <= best * 1.01


def test_without_warm_start_every_call_is_the_same():
    codec, x = build_codec("powersgd", {"rank": 2, "warm_start": "false"}), torch.randn(20, 10)

    assert codec.encode(x) == codec.encode(x)


def test_seed_changes_the_start_only():
    x = low_rank(20, 10, 1, 3)

    a = build_codec("powersgd", {"rank": 2, "seed": 1}).encode(x)
    b = build_codec("powersgd", {"rank": 2, "seed": 2}).encode(x)

    assert a != b
    assert torch.allclose(decode(a), decode(b), atol=1e-4)
