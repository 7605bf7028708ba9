"""discover-workers' table at 80 columns, as the README's workflow prints it into a pipe:
every address whole, every word whole (a GPU class folded as 'RTX409' / '0', 'params'
as 'param' / 's', when the columns could not all fit), each line within 80 columns."""

from __future__ import annotations

import io

from rich.console import Console

from aitbc.cli.training.hiring import offers_table

OFFERS = [
    ("ait1dc5403d8887cb753834b8c4619ced82a9611667a", "RTX4090", 1.6, 0.99),
    ("ait1007ed4114917dca68964d348006caa587cd16d22", "RTX3090", 1.2, 0.97),
    ("ait1a9d15135f6a714b04a13852bc02935fd144f80e9", "A100", 2.5, 0.95),
]


def _shown(width: int) -> str:
    res = {
        "ranked": [
            {
                "worker_id": w,
                "gpu_type": gpu,
                "max_params": 862_000_000,
                "price": price,
                "reputation": 3.0,
                "availability": avail,
                "score": 0.5,
                "hired": True,
            }
            for w, gpu, price, avail in OFFERS
        ]
    }
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(offers_table(res, "training_a33e75f2e571", "RTX3090", console=console))
    return console.file.getvalue()


def test_the_offers_table_keeps_every_word_whole_at_80_columns():
    text = _shown(80)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), text
    words = {w for line in lines for w in line.replace("│", " ").replace("┃", " ").split()}
    for worker, gpu, price, _ in OFFERS:
        assert {worker, gpu, f"{price:.2f}", "yes"} <= words, text
    assert "price/round" in words and "hired" in words


def test_a_wide_terminal_shows_every_column():
    text = _shown(200)
    for header in ("#", "worker", "GPU", "max params", "price/round", "reputation", "availability", "score", "hired"):
        assert header in text, text
    assert "862M" in text
