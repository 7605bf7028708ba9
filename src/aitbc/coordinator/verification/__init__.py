"""Judging work and paying for it: spot checks of updates (replayed proofs), scoring a closed
round's contributions, and settlement (paying a scored round exactly once, slashing provable
misbehaviour). Imports ``workforce``, ``money``, ``live`` and below."""
