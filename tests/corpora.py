"""Words the tests' tiny text corpora are made of: a small vocabulary, so a BPE trained on a
few kilobytes of it has merges to learn and every test's corpus is written in a line."""

from __future__ import annotations

WORDS = (
    ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards", "hex", "jolly", "bakers"]
)  # fmt: skip
