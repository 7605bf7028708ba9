"""This process's place in a data-parallel group (:mod:`aitbc.training.parallel` starts
the group): what :class:`~aitbc.training.local.LocalTrainer` needs of it to train its slice
of each global batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn


@dataclass
class Group:
    """This process's place in a data-parallel group."""

    rank: int
    world: int
    device: torch.device
    control: Any  # the gloo process group commands, tensors and batch statistics go over

    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` under DDP (its construction is a collective: every rank calls it)."""
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def share(self, idx: Tensor) -> tuple[Tensor, float, int]:
        """This rank's contiguous slice of a global batch ``idx``, the weight of its mean
        loss (its share of the batch, times the world: DDP divides the summed gradients by
        the world) and how many samples are its own. A rank with no sample (a batch smaller
        than the world) runs one sample at weight 0, so every rank joins the all-reduce."""
        n = idx.numel()
        lo, hi = n * self.rank // self.world, n * (self.rank + 1) // self.world
        if hi == lo:
            return idx[:1], 0.0, 0
        return idx[lo:hi], (hi - lo) * self.world / n, hi - lo

    def batch_stats(self, loss: Tensor, right: int, mine: int, n: int) -> tuple[Tensor, int]:
        """The global batch's mean loss and correct predictions from every rank's own."""
        t = torch.tensor([float(loss) * mine, float(right if mine else 0)], dtype=torch.float64)
        dist.all_reduce(t, group=self.control)
        return t[0] / n, int(t[1])
