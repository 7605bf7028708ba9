"""A round's batches as a function of the job's seed and the round (so a verifier can
re-run any stretch of a round: :mod:`aitbc.training.proof`)."""

from __future__ import annotations

import hashlib
import struct

import torch
from torch import Tensor


def data_seed(job_seed: int, round: int) -> int:
    """The round's data-order seed: a job's batches in round ``round`` are a function of
    its seed and the round only, so a verifier can replay any stretch of them."""
    h = hashlib.sha256(struct.pack("<qq", int(job_seed) & (2**63 - 1), int(round))).digest()
    return int.from_bytes(h[:8], "little") & (2**63 - 1)


class BatchOrder:
    """The batch walk of one round: reshuffled epochs of the shard from ``seed``
    (``torch.randperm`` with a seeded generator), ``batch`` indices a step."""

    def __init__(self, n: int, batch_size: int, seed: int | None = None, generator: torch.Generator | None = None):
        if n < 1:
            raise ValueError(f"a shard needs at least one sample, got {n}")
        self.n, self.b = n, min(batch_size, n)
        self.gen = generator if generator is not None else torch.Generator().manual_seed(int(seed or 0))
        self.order = torch.empty(0, dtype=torch.long)
        self.pos = 0

    def next(self) -> Tensor:
        """The next step's sample indices ``(b,)``."""
        if self.pos + self.b > len(self.order):
            self.order, self.pos = torch.randperm(self.n, generator=self.gen), 0
        idx = self.order[self.pos : self.pos + self.b]
        self.pos += self.b
        return idx

    def skip(self, steps: int) -> None:
        for _ in range(steps):
            self.next()


def step_seed(seed: int, step: int) -> int:
    """The RNG seed of one step (dropout), from the round's data seed and the step."""
    return (seed * 1_000_003 + step) & (2**63 - 1)
