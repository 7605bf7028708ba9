"""Split a dataset's training samples into shards, one per worker.

- IID (default): a seeded permutation cut into ``k`` near-equal parts.
- Label skew (``alpha``): for every class, the share each shard gets is drawn from a
  symmetric Dirichlet(alpha) (Hsu et al. 2019); smaller alpha is more skewed. Needs labels.

Every shard gets at least one sample; the split depends only on (labels, k, seed, alpha).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from aitbc.errors import UsageError

MAX_DIRICHLET_TRIES = 100


def shard_indices(
    n: int, k: int, *, seed: int, labels: Tensor | None = None, alpha: float | None = None
) -> list[Tensor]:
    """Indices of each of ``k`` shards over ``n`` samples (each sorted ascending)."""
    if k <= 0:
        raise UsageError(f"number of shards must be at least 1, got {k}")
    if n < k:
        raise UsageError(f"cannot split {n} samples into {k} non-empty shards; use at most {n} workers")
    if alpha is None:
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(n, generator=g)
        return [p.sort().values for p in torch.tensor_split(perm, k)]
    if not alpha > 0:
        raise UsageError(f"--alpha must be > 0 (smaller is more skewed), got {alpha}")
    if labels is None:
        raise UsageError("--alpha (label skew) needs a labelled dataset; language data is split IID")
    if labels.shape != (n,):
        raise UsageError(f"labels must have shape ({n},) to split {n} samples, got {tuple(labels.shape)}")
    return _dirichlet(labels.numpy(), k, seed, alpha)


def _dirichlet(labels: np.ndarray, k: int, seed: int, alpha: float) -> list[Tensor]:
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(MAX_DIRICHLET_TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(k)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            share = rng.dirichlet(np.full(k, alpha))  # (k,)
            cuts = (np.cumsum(share)[:-1] * len(idx)).astype(int)
            for s, chunk in enumerate(np.split(idx, cuts)):
                parts[s].append(chunk)
        shards = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(s) for s in shards) > 0:
            return [torch.from_numpy(s.astype(np.int64)) for s in shards]
    raise UsageError(
        f"could not draw {k} non-empty label-skewed shards with alpha={alpha} in "
        f"{MAX_DIRICHLET_TRIES} tries; raise --alpha or use fewer workers"
    )
