"""Output helpers shared by the benchmark programs: a rich table on stdout, JSON results
under ``bench/results/<name>.json``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).resolve().parent / "results"


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Print ``rows`` under ``columns``; the first column is left-aligned, the rest right."""
    table = Table(title=title)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*("-" if cell is None else str(cell) for cell in row))
    console = Console()
    if not console.is_terminal:  # piped to a file or a log: do not squeeze to 80 columns
        console = Console(width=200)
    console.print(table)


def write_json(name: str, payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` to ``bench/results/<name>.json`` (sorted keys, values that JSON
    cannot hold as strings); print and return the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    print(f"wrote {path}")
    return path
