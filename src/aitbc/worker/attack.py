"""Testing only (``aitbc worker start --attack SPEC``): a worker that behaves as a Byzantine
one, so the robust rules can be shown to hold against a real process."""

from __future__ import annotations

import torch
from torch import Tensor

from aitbc.core.attacks import AttackView, build_attack
from aitbc.core.options import parse_spec


class Attacker:
    """What a Byzantine worker sends instead of its update (a :mod:`aitbc.core.attacks` spec)."""

    def __init__(self, spec: str) -> None:
        self.attack = build_attack(*parse_spec(spec, what="attack"))
        self.generator = torch.Generator().manual_seed(0)

    @property
    def flips_labels(self) -> bool:
        return self.attack.flips_labels

    def craft(self, own: Tensor) -> Tensor:
        """The ``(d,)`` update it sends in place of its own ``own``."""
        view = AttackView(
            own=own, honest=own.new_zeros(0, own.numel()), previous=None, n=1, f=1, generator=self.generator
        )
        return self.attack.craft(view)
