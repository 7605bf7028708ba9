"""Helpers shared by the benchmark programs: a rich table on stdout, JSON results under
``bench/results/<name>.json``, and figures over seeds (``--seeds 0-4``: the median and the
worst seed), and the parts of a matrix run apart (``--combine``)."""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

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


def write_json(name: str, payload: Mapping[str, Any], *, path: Path | None = None) -> Path:
    """Write ``payload`` to ``bench/results/<name>.json``, or to ``path`` (a smoke run's, kept
    out of the recorded results), with sorted keys and values that JSON cannot hold as
    strings; print and return the path."""
    if path is None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    print(f"wrote {path}")
    return path


def parse_seeds(text: str) -> list[int]:
    """``0-4``, ``0,2,5`` or ``1-3,7``: the seeds in order, each once; ValueError naming the
    part that is not a seed or a range of them."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        lo, dash, hi = part.partition("-")
        if not (lo.isdigit() and (not dash or hi.isdigit())) or (dash and int(hi) < int(lo)):
            raise ValueError(f"seeds: {part!r} is not a seed or a range of them (e.g. 0-4 or 0,2,5)")
        seeds += [s for s in range(int(lo), int(hi if dash else lo) + 1) if s not in seeds]
    return seeds


@dataclass(frozen=True, slots=True)
class SeedSpread:
    """One figure over seeds: its median, and its worst value and the seed that gave it."""

    median: float
    worst: float
    worst_seed: int
    seeds: int

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "worst": self.worst, "worst_seed": self.worst_seed, "seeds": self.seeds}


def spread(by_seed: Mapping[int, float], *, higher_is_better: bool = True) -> SeedSpread | None:
    """The median and the worst seed of ``by_seed`` (seed -> value); None when empty. The
    worst is the lowest value (``higher_is_better``) or the highest; ties go to the first seed."""
    if not by_seed:
        return None
    pick = min if higher_is_better else max
    worst_seed = pick(sorted(by_seed), key=lambda s: by_seed[s])
    return SeedSpread(statistics.median(by_seed.values()), by_seed[worst_seed], worst_seed, len(by_seed))


T = TypeVar("T")


def part_paths(text: str) -> list[Path]:
    """``--combine``'s comma-separated part files; ValueError naming what is wrong."""
    paths = [Path(p.strip()) for p in text.split(",") if p.strip()]
    if not paths:
        raise ValueError("--combine: name the parts' JSON files, comma-separated (e.g. --combine a.json,b.json)")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"--combine: no such file {missing[0]!r}")
    return paths


def read_part(
    path: Path, args: argparse.Namespace, shape: Sequence[str], unpack: Callable[[dict[str, Any]], T]
) -> tuple[dict[str, Any], T]:
    """One part a program wrote with ``--out``: where it came from (file, arguments, machine)
    and ``unpack`` of its JSON. SystemExit in one line when it is not such a part (its JSON
    or ``unpack`` fails) or ran with other ``shape`` flags than ``args``."""
    try:
        part = json.loads(path.read_text())
        got = unpack(part)
        source = {"file": path.name, "args": part["args"], "machine": part["machine"]}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise SystemExit(f"--combine: {path} is not a part written by this program with --out") from None
    other = [k for k in shape if source["args"].get(k) != getattr(args, k)]
    if other:
        raise SystemExit(
            f"--combine: {path} ran with other {', '.join(other)} than this run's "
            f"({', '.join(f'{k}={getattr(args, k)}' for k in other)}); pass the same flags"
        )
    return source, got
