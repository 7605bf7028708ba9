"""Benchmark: final accuracy for every attack x aggregator, 25% Byzantine, compressed,
on IID shards and on heterogeneous (Dirichlet) shards, over seeds, each cell against the
honest-absent run of its seed.

12 workers of which 3 are Byzantine (chosen by seed), MLP on digits, updates sent with
a compressing codec (int8 by default), 20 rounds of 20 local steps. The whole rule x
attack matrix runs once per sharding and seed (``--seeds``, default 0-4): IID, Dirichlet
alpha = 0.3 and the harder alpha = 0.1 (``aitbc.training.sharding``: each class is split
across workers by a Dirichlet draw, so a worker holds a few classes); the alpha = 0.1 row
runs the mean, the default rule and the rules that held best on 0.3.

The reference. Each rule's row has a clean run (all 12 workers honest) and an ``absent``
run (``--attack absent``: the 3 workers an attack takes, the same ones, take no part at
all, their shards untrained on): what the rule could reach if the attackers simply were
not there. A cell's figure is its accuracy over its own rule's absent accuracy on the same
seed, so data that leaves with the attackers (most on label-skewed shards, where they take
whole classes with them) is not counted against the rule. Printed per cell: the median
over the seeds and the worst seed. Targets: the default rule keeps >= 97% of the
honest-absent accuracy at the median under every attack and >= 95% on its worst seed
(Dirichlet 0.3; printed for every sharding); ``mean`` collapses under at least sign-flip.

The scaled-update provider (``scale:factor=F``: its honest update times F, a correctly
shaped update of huge but finite values) runs at 1e3, 1e10 and 3e38 under every rule on
IID shards, ``mean`` included: the norm bound (``aitbc.core.norms``, before any rule)
clips or rejects it, so each rule keeps its accuracy. ``--scaled`` runs only those (and
the references) under every rule.

``trend+centered-clip`` reads the one piece of state a rule may: the global model's last
step (``aitbc.core.aggregation.wrappers.trend``), which the simulator passes as the
coordinator does. Its ``f`` is the run's Byzantine count (3), in the absent run too (the
same run, less the attackers).

``centered-clip:start=previous`` is Karimireddy et al.'s stateful start: the clipping
starts from the run's last model step (the previous round's aggregate under fedavg at lr
1) instead of the medoid; the same ``reference`` the trend reads, so it needs no other
state.

Rows on their own: ``--aggregators 'SPEC;SPEC'`` (semicolons: specs hold commas) and
``--attacks a,b`` run only those cells (the references of each row always run), written
to ``results/robustness_rows.json`` (as is any run of other seeds or shardings than the
default's). With ``--merge`` they go into the existing ``results/robustness.json`` instead
(other cells kept as they were, each merge listed under ``merges``), and every table and
verdict is printed from the merged matrix, so its output replaces
``results/robustness.txt``. ``--report`` runs nothing and prints those tables again.
``--attacks ipm:evade=0.05`` (outside the default matrix) is a trend-aware IPM: the last
global update is public, so it keeps a small positive cosine with it and the trend lets
it through. ``--out PATH`` writes the JSON there instead (a smoke run's).

Parts run apart (two processes, one a core, or two machines): each with ``--out PART.json``
and its own ``--seeds``/``--shards``/``--aggregators``, then ``--combine A.json,B.json``
runs nothing, merges their cells (a later part's cell replaces an earlier one's) and
prints and writes the matrix as one run of them all would (``results/robustness.json``,
each part's arguments and machine listed under ``parts``). The parts must share rounds,
compression, workers and Byzantine count.

Usage: python bench/robustness.py [--quick] [--scaled] [--seeds 0-4] [--shards iid,0.3,0.1]
       [--compression int8] [--rounds 20] [--aggregators 'SPEC;SPEC'] [--attacks a,b]
       [--merge | --report | --combine A.json,B.json] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, SeedSpread, parse_seeds, part_paths, print_table, read_part, spread, write_json
from _sims import machine, simulate
from aitbc import run_defaults
from aitbc.errors import UsageError
from aitbc.sim.config import ABSENT

ATTACKS = ["sign-flip", "gaussian", "label-flip", "alie", "ipm", "free-rider"]
SCALED = ["scale:factor=1e3", "scale:factor=1e10", "scale:factor=3e38"]  # times an honest update
# adaptive attacks, outside the default matrix (``--attacks`` only): IPM that keeps a small
# positive cosine with the last global update, so the trend lets it through
ADAPTIVE = ["ipm:evade=0.05"]
AGGREGATORS = [
    "mean",
    "median",
    "trimmed-mean:beta=0.25",
    "krum",
    "multi-krum:m=6",
    "bulyan",
    "centered-clip",
    "geometric-median",
    "nnm+centered-clip",
    "nnm+trimmed-mean:beta=0.25",
    "bucketing:s=2+centered-clip",
    "bucketing:s=2+median",
    "trend+centered-clip",
    "centered-clip:start=previous",
    "trend+centered-clip:start=previous",
    run_defaults.AGGREGATOR,  # the default rule of runs
]
# Dirichlet 0.1, the harder row: the mean, the default and the rules that held best on 0.3
HARD_AGGREGATORS = [
    "mean",
    "trimmed-mean:beta=0.25",
    "centered-clip",
    "nnm+centered-clip",
    "bucketing:s=2+centered-clip",
    "trend+centered-clip",
    run_defaults.AGGREGATOR,
]
HARD_ALPHA = 0.1
SEEDS = "0-4"
SHARDS = "iid,0.3,0.1"
REFERENCES = ["clean", ABSENT]  # every row runs both on every seed
TARGET_MEDIAN, TARGET_WORST = 0.97, 0.95  # of the honest-absent accuracy
# seed -> shard label -> rule -> column (clean, absent, an attack) -> accuracy, or why it could not run
Matrix = dict[str, dict[str, dict[str, dict[str, float | str]]]]


def shard_label(alpha: float | None) -> str:
    return "iid" if alpha is None else f"dirichlet {alpha:g}"


def run_cell(shared: dict, agg: str, column: str, byzantine: int, alpha: float | None, seed: int) -> float | str:
    attack = None if column == "clean" else column
    try:
        r = simulate(
            **shared, seed=seed, alpha=alpha, aggregator=agg, attack=attack, byzantine=byzantine if attack else 0
        )
        return r.final_val_accuracy
    except UsageError as e:  # e.g. bulyan needs n >= 4f+3
        return f"n/a: {e}"


def fmt(v: float | str) -> str:
    return v if isinstance(v, str) and len(v) < 12 else "n/a" if isinstance(v, str) else f"{v:.3f}"


def kept(matrix: Matrix, label: str, agg: str, column: str) -> SeedSpread | None:
    """``column``'s accuracy over the same rule's honest-absent accuracy, over the seeds
    where both ran."""
    ratios = {}
    for seed, shards in matrix.items():
        row = shards.get(label, {}).get(agg, {})
        hit, ref = row.get(column), row.get(ABSENT)
        if isinstance(hit, float) and isinstance(ref, float) and ref > 0:
            ratios[int(seed)] = hit / ref
    return spread(ratios)


def accuracy(matrix: Matrix, label: str, agg: str, column: str) -> SeedSpread | None:
    values = {int(seed): shards.get(label, {}).get(agg, {}).get(column) for seed, shards in matrix.items()}
    return spread({s: v for s, v in values.items() if isinstance(v, float)})


def fmt_kept(k: SeedSpread | None) -> str:
    return "-" if k is None else f"{k.median:.1%} / {k.worst:.1%} s{k.worst_seed}"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds, aggregators and attacks")
    ap.add_argument("--scaled", action="store_true", help="only the scaled-update provider, under every rule (IID)")
    ap.add_argument("--seeds", default=SEEDS, help="e.g. 0-4 (the default) or 0,2: each cell runs on each")
    ap.add_argument("--shards", default=SHARDS, help="comma-separated: iid or a Dirichlet alpha")
    ap.add_argument("--aggregators", help="only these rows: specs separated by ';' (default: all)")
    ap.add_argument("--attacks", help="only these columns, comma-separated (references always run; default: all)")
    ap.add_argument("--merge", action="store_true", help="merge the cells run into results/robustness.json")
    ap.add_argument("--report", action="store_true", help="run nothing: print results/robustness.json's tables")
    ap.add_argument("--combine", help="run nothing: merge these parts' JSON files (comma-separated) into the matrix")
    ap.add_argument("--compression", default="int8")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--byzantine", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", type=Path, help="write the JSON here, not under bench/results/")
    args = ap.parse_args()
    try:
        args.seed_list = parse_seeds(args.seeds)
    except ValueError as e:
        ap.error(str(e))
    args.chosen_aggs = [a.strip() for a in args.aggregators.split(";") if a.strip()] if args.aggregators else None
    args.chosen_attacks = [a.strip() for a in args.attacks.split(",") if a.strip()] if args.attacks else None
    unknown = [a for a in args.chosen_attacks or [] if a not in [*ATTACKS, *SCALED, *ADAPTIVE]]
    if unknown:
        ap.error(f"unknown attack {unknown[0]!r}; allowed: {', '.join([*ATTACKS, *SCALED, *ADAPTIVE])}")
    args.merge = args.merge or args.report
    if args.merge and (args.quick or args.scaled or args.out):
        ap.error("--merge writes into the full matrix: not with --quick, --scaled or --out")
    if args.combine is not None:
        if args.merge or args.quick or args.scaled or args.chosen_aggs or args.chosen_attacks:
            ap.error(
                "--combine runs nothing: not with --merge, --report, --quick, --scaled, --aggregators or --attacks"
            )
        try:
            args.parts = part_paths(args.combine)
        except ValueError as e:
            ap.error(str(e))
    if args.quick:
        args.rounds = 5
    return args


def run_matrix(args: argparse.Namespace, matrix: Matrix) -> None:
    """Every chosen cell on every seed, into ``matrix``; each printed as it ends."""
    aggregators = AGGREGATORS[:4] if args.quick and not args.scaled else AGGREGATORS
    attacks = [] if args.scaled else ATTACKS[:2] if args.quick else ATTACKS
    shards = [None] if args.scaled else [None if s.strip() == "iid" else float(s) for s in args.shards.split(",")]
    shared = dict(
        model="mlp",
        dataset="digits",
        workers=args.workers,
        rounds=args.rounds,
        local_steps=20,
        compression=args.compression,
    )
    for seed in args.seed_list:
        for alpha in shards:
            label = shard_label(alpha)
            cols = [*attacks, *(SCALED if alpha is None else [])]
            chosen = args.chosen_attacks
            run_cols = [*REFERENCES, *(cols if chosen is None else [c for c in [*cols, *ADAPTIVE] if c in chosen])]
            rows = [a for a in aggregators if alpha != HARD_ALPHA or a in HARD_AGGREGATORS]
            if args.chosen_aggs is not None:
                rows = [a for a in args.chosen_aggs if alpha != HARD_ALPHA or a in rows]
            for agg in rows:
                cells = matrix.setdefault(str(seed), {}).setdefault(label, {}).setdefault(agg, {})
                for column in run_cols:
                    t = time.perf_counter()
                    cells[column] = acc = run_cell(shared, agg, column, args.byzantine, alpha, seed)
                    print(
                        f"  seed {seed} {label:13s} {agg:28s} {column:18s} {fmt(acc)}  ({time.perf_counter() - t:.0f} s)",
                        flush=True,
                    )


SHAPE = ("rounds", "compression", "workers", "byzantine")  # what merged cells must share


def _cells(part: dict[str, Any]) -> Matrix:
    """A part's cells; TypeError when a rule's row is not an object of columns."""
    cells: Matrix = part["by_seed"]
    if not all(
        isinstance(row, dict) for shards in cells.values() for rules in shards.values() for row in rules.values()
    ):
        raise TypeError("a cell row is not an object")
    return cells


def combine(args: argparse.Namespace) -> None:
    """Merge the parts' cells (later over earlier), print the tables and write the matrix."""
    matrix: Matrix = {}
    parts = []
    for path in args.parts:
        source, cells = read_part(path, args, SHAPE, _cells)
        for seed, shards in cells.items():
            for label, rules in shards.items():
                for agg, row in rules.items():
                    matrix.setdefault(seed, {}).setdefault(label, {}).setdefault(agg, {}).update(row)
        parts.append(source)
    verdicts = report(matrix, args)
    payload = {
        "machine": parts[0]["machine"],
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "parts")},
        "by_seed": matrix,
        "verdicts": verdicts,
        "default_rule": run_defaults.default_aggregator(args.compression),
        "parts": parts,
    }
    write_json("robustness", payload, path=args.out)


def main() -> None:
    args = parse_args()
    if args.combine is not None:
        return combine(args)
    matrix: Matrix = {}
    previous: dict = {}
    if args.merge:
        previous = json.loads((RESULTS / "robustness.json").read_text())
        same = [previous["args"].get(k) == getattr(args, k) for k in SHAPE]
        if not all(same):
            raise SystemExit(
                "--merge needs the rounds, compression, workers and byzantine of the results it merges into"
            )
        # a file from before the seeds holds seed 0 alone, without absent runs
        matrix = previous.get("by_seed") or {"0": previous["accuracy"]}
    if not args.report:
        run_matrix(args, matrix)
    verdicts = report(matrix, args)
    if args.report:  # it ran nothing: the file stays as it is
        return
    payload: dict[str, Any] = {
        "machine": machine(),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "by_seed": matrix,
        "verdicts": verdicts,
        "default_rule": run_defaults.default_aggregator(args.compression),
    }
    if args.merge:  # the full run's machine and arguments, and each merge's after them
        payload["machine"], payload["args"] = previous["machine"], previous["args"]
        merges = previous.get("merges", [])
        payload["merges"] = [
            *merges,
            {"args": {k: v for k, v in vars(args).items() if k != "out"}, "machine": machine()},
        ]
    full = args.seed_list == parse_seeds(SEEDS) and args.shards == SHARDS and not args.quick
    full = full and args.chosen_aggs is None and args.chosen_attacks is None
    name = "robustness_scaled" if args.scaled else "robustness" if full or args.merge else "robustness_rows"
    write_json(name, payload, path=args.out)


def _row_order(agg: str) -> tuple[int, str]:
    return (AGGREGATORS.index(agg) if agg in AGGREGATORS else len(AGGREGATORS), agg)


def _shards(matrix: Matrix) -> list[str]:
    order = [shard_label(None), shard_label(0.3), shard_label(HARD_ALPHA)]
    labels = {label for shards in matrix.values() for label in shards}
    return sorted(labels, key=lambda s: (order.index(s) if s in order else len(order), s))


def report(matrix: Matrix, args: argparse.Namespace) -> dict[str, dict]:
    """Per sharding: the table of every rule (median and worst seed of its accuracy over its
    own honest-absent accuracy), then the verdicts; returns the verdicts."""
    seeds = ",".join(sorted(matrix, key=int))
    default = run_defaults.default_aggregator(args.compression)
    out: dict[str, dict] = {}
    for label in _shards(matrix):
        rules = sorted({a for shards in matrix.values() for a in shards.get(label, {})}, key=_row_order)
        present = {c for shards in matrix.values() for row in shards.get(label, {}).values() for c in row}
        cols = [c for c in [*ATTACKS, *SCALED, *ADAPTIVE] if c in present]
        print_table(
            f"robustness, {label} shards, seeds {seeds}: accuracy over the honest-absent run's, median / worst seed; "
            f"{args.byzantine} of {args.workers} Byzantine, compression {args.compression}, {args.rounds} rounds",
            ["aggregator", "clean acc", "absent acc", *cols],
            [
                [agg, *(_median(accuracy(matrix, label, agg, c)) for c in REFERENCES)]
                + [fmt_kept(kept(matrix, label, agg, c)) for c in cols]
                for agg in rules
            ],
        )
        out[label] = verdicts(matrix, label, rules, cols, default)
    return out


def _median(s: SeedSpread | None) -> str:
    return "-" if s is None else f"{s.median:.3f}"


def verdicts(matrix: Matrix, label: str, rules: list[str], cols: list[str], default: str) -> dict[str, dict]:
    """Per attack: the default rule's median and worst seed against the targets, and the
    rule with the best median; the mean's collapse under sign-flip and gaussian."""
    out: dict[str, dict] = {}
    if not any(
        isinstance(row.get(ABSENT), float) for shards in matrix.values() for row in shards.get(label, {}).values()
    ):
        print(f"{label}: no honest-absent runs in these results (written before --attack absent): run the seeds")
    for attack in cols:
        spreads = {agg: k for agg in rules if (k := kept(matrix, label, agg, attack)) is not None}
        if not spreads:
            continue
        best = max(spreads, key=lambda a: spreads[a].median)
        mine = spreads.get(default)
        meets = mine is not None and mine.median >= TARGET_MEDIAN and mine.worst >= TARGET_WORST
        out[attack] = {
            "default": None if mine is None else mine.as_dict(),
            "default_meets": meets,
            "best": best,
            "best_kept": spreads[best].as_dict(),
        }
        print(
            f"{label} {attack}: the default {default} keeps {fmt_kept(mine)} of the honest-absent accuracy "
            f"(median / worst seed; target {TARGET_MEDIAN:.0%} / {TARGET_WORST:.0%}: {'met' if meets else 'MISSED'}); "
            f"best median {best} {fmt_kept(spreads[best])}"
        )
    for attack in ("sign-flip", "gaussian"):
        acc = accuracy(matrix, label, "mean", attack)
        if acc is not None:
            print(
                f"{label} mean under {attack}: median {acc.median:.3f} ({'collapses' if acc.median < 0.5 else 'does NOT collapse'})"
            )
    return out


if __name__ == "__main__":
    main()
