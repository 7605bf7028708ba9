"""Benchmark: bytes each worker sends to reach the dense baseline's validation loss.

The dense baseline is synchronous data parallelism: one local step per round
(``local_steps=1``), fp32 updates, every step. Every other configuration runs on the same
seed and data until its validation loss is within 2% of the baseline's final loss, or
until it has taken ``max_factor`` times the baseline's inner steps. Reported: bytes sent
per worker to reach the target (real encoded bytes, headers included), and the reduction
against the baseline.

Configurations: DiLoCo (outer Nesterov) at several H with value codecs and top-k; plain
outer averaging (``fedavg``) at the same H, which separates the outer optimizer from the
local steps; and SparseLoCo (Sarfi et al. 2025): chunk-wise top-k at 2 bits
(``sparseloco``) with decayed error feedback (beta 0.95) as the outer momentum and plain
outer SGD (``fedavg``, lr 1).

Targets: transformer, SparseLoCo-class compression >= 3000x fewer bytes than dense at
equal loss (+2%), and lower loss than DiLoCo at equal rounds with fewer bytes (both run
the full step budget for that comparison); digits, >= 1000x, else the bytes-loss Pareto
frontier and the best reduction measured (printed either way). A third table runs robust
aggregation rules over SparseLoCo's sparse updates on digits and says what each does
with them.

The ``llama`` task (not in the default ``--tasks``) is the transformer's with a Llama of
about its size in its place (131,904 parameters against 134,912): ``--tasks llama --out
results/communication_llama.json`` runs it, a section of its own in ``RESULTS.md``.

Seeds (``--seeds``, default 0-4): every configuration runs on each, each seed with its own
dense baseline and target; a reduction is reported as the median over the seeds and the
worst seed (a miss counts as none), and so are the robust rules'. The equal-rounds
comparison is printed per seed; the bytes-loss frontier is the first seed's. ``--out
PATH`` writes the JSON there instead of ``bench/results/`` (a smoke run's).

Parts run apart (one process a core, or on two machines): each with ``--out PART.json`` and
its own ``--seeds`` or ``--tasks``, then ``--combine A.json,B.json`` runs nothing, merges
their rows and prints and writes them as one run of them all would
(``results/communication.json``, each part's arguments and machine under ``parts``). The
parts must share ``--max-factor``.

``--configs 'NAME;NAME'`` runs only the configurations whose label contains one of the
names (case-insensitive; semicolons, as labels hold commas: ``'sparseloco H=30, 1%'``), in
each task that has them, beside each seed's dense baseline (the target). The robust rules'
table is left out of such a run. A name that matches no configuration of the tasks run is
refused. Its JSON is ``communication_configs.json``.

Usage: python bench/communication.py [--quick] [--tasks digits,transformer,llama] [--seeds 0-4]
       [--configs 'NAME;NAME'] [--out PATH] [--combine A.json,B.json]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from _common import parse_seeds, part_paths, print_table, read_part, spread, write_json
from _sims import machine
from aitbc.core.compression import build_codec
from aitbc.core.compression.sparse import index_bits
from aitbc.core.compression.sparseloco import chunk_plan
from aitbc.sim.config import SimConfig
from aitbc.sim.runner import Simulation

TASKS: dict[str, tuple[dict[str, Any], int]] = {
    # name: (shared options, baseline steps). The rule is named, not the run default's, so
    # a change of default does not change this table (the robust rules have their own).
    "digits": (
        dict(model="mlp", dataset="digits", workers=8, batch_size=32, lr=1e-3, seed=0, aggregator="mean"),
        600,
    ),
    "transformer": (
        dict(
            model="transformer",
            dataset="stdlib",
            workers=4,
            batch_size=16,
            lr=3e-3,
            seed=0,
            aggregator="mean",
            model_options={"context": 32, "d_model": 64, "n_layers": 2, "n_heads": 4},
            max_bytes=1 << 20,
            eval_samples=128,
        ),
        300,
    ),
    # the transformer's task with a Llama of about its size (131K parameters against 135K):
    # only the architecture differs (bench/models.py's sparseloco part)
    "llama": (
        dict(
            model="hf:llama",
            dataset="stdlib",
            workers=4,
            batch_size=16,
            lr=3e-3,
            seed=0,
            aggregator="mean",
            model_options={
                "context": 32,
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 172,
                "max_position_embeddings": 32,
            },
            max_bytes=1 << 20,
            eval_samples=128,
        ),
        300,
    ),
}
TARGETS = {"digits": 1000, "transformer": 3000, "llama": 3000}

BETA = 0.95  # SparseLoCo's error-feedback decay


def sparseloco(h: int, density: float = 0.02, bits: int = 2, *, outer_lr: float = 1.0, **more: Any) -> dict[str, Any]:
    """SparseLoCo at H=``h``; ``outer_lr`` scales the averaged step (plain outer SGD). Sparse
    updates on mostly disjoint supports are each divided by n in the average, so a coordinate
    one worker sent moves by 1/n of it: an outer lr above 1 gives some of that back."""
    spec = f"sparseloco:density={density:g},bits={bits},error_feedback_decay={BETA:g}"
    label = f"sparseloco H={h}, {density:.0%}, {bits}-bit" + (f", outer lr {outer_lr:g}" if outer_lr != 1.0 else "")
    outer = {"outer_options": {"lr": outer_lr}} if outer_lr != 1.0 else {}
    return dict(label=label, local_steps=h, outer="fedavg", compression=spec, **outer, **more)


def diloco(h: int, codec: str = "none", ef: bool = False, **more: Any) -> dict[str, Any]:
    label = f"diloco H={h}, {codec}{' +EF' if ef else ''}"
    return dict(label=label, local_steps=h, outer="diloco", compression=codec, error_feedback=ef, **more)


def fedavg(h: int, **more: Any) -> dict[str, Any]:
    return dict(label=f"fedavg H={h}, none", local_steps=h, outer="fedavg", compression="none", **more)


# The earlier table's rows that said nothing new were dropped (fp16, int4 and powersgd at
# H=50 with and without EF all sat between int8 and sign); the kept DiLoCo rows are the
# reference points and the failures the issue names (top-k +EF diverging).
def configs(task: str, quick: bool) -> list[dict[str, Any]]:
    if task == "digits":
        if quick:
            return [diloco(10), fedavg(10), sparseloco(20)]
        return [
            diloco(10),
            diloco(50),
            diloco(50, "topk:ratio=0.01", ef=True),
            diloco(50, "sign"),
            fedavg(10),
            fedavg(50),
            sparseloco(10),
            sparseloco(20),
            sparseloco(30),
            sparseloco(30, density=0.01),
            sparseloco(50),
        ]
    if quick:
        return [diloco(50, full=True), sparseloco(50, full=True)]
    if task == "llama":  # the transformer's reference rows, its best SparseLoCo settings, and shorter H
        return [
            diloco(50, full=True),
            fedavg(50, full=True),
            sparseloco(50, full=True),
            sparseloco(50, density=0.01),
            sparseloco(20),
            sparseloco(10),
        ]
    return [
        diloco(50, full=True),  # full: no early stop, for the equal-rounds comparison
        diloco(100),
        diloco(100, "int8"),
        diloco(100, "sign"),
        diloco(50, "topk:ratio=0.01", ef=True),
        fedavg(50, full=True),
        sparseloco(50, full=True),
        sparseloco(50, density=0.01),
        # outer lr 2: chosen on seeds 5 and 6 (1, 2 and 3 tried), not on the seeds reported
        sparseloco(50, density=0.01, outer_lr=2),
        sparseloco(100),
    ]


# What each rule does with sparse updates (the third table). n updates, each nonzero on
# about a share p of the coordinates, mostly different ones.
RULES = {
    "mean": "sums every worker's coordinates: support up to n x p, each value / n",
    "median": "coordinate-wise median: zero wherever fewer than half the workers sent the coordinate",
    "trimmed-mean:beta=0.25": "drops the 2 largest and 2 smallest per coordinate of 8: a value sent by <= 2 workers is trimmed away",
    "centered-clip": "from the medoid update (one whole sparse update), adds the mean of the others' differences, each clipped to the rule's radius",
    "multi-krum:f=2": "averages the n-f updates nearest the others: whole sparse updates, fewer of them",
    "sparse-robust": "the mean of whole updates, each clipped to the median norm, index-overlap copies merged, up "
    "to f dropped against the last step or repeating it (the default for sparse codecs; "
    "bench/sparse_robust.py runs it under every attack over seeds)",
}
ATTACKS = [(None, 0), ("sign-flip", 2)]


def chosen_configs(tasks: list[str], quick: bool, names: str | None) -> dict[str, list[dict[str, Any]]]:
    """Each task's configurations, or only those whose label contains one of ``names``
    (';'-separated, case-insensitive); ValueError naming a name that matches none of them."""
    plans = {task: configs(task, quick) for task in tasks}
    if names is None:
        return plans
    typed = [n.strip() for n in names.split(";") if n.strip()]
    if not typed:
        raise ValueError("configs: no configuration named (e.g. --configs 'sparseloco H=30, 1%')")
    wanted = [n.lower() for n in typed]
    for name, as_typed in zip(wanted, typed, strict=True):
        if not any(name in c["label"].lower() for plan in plans.values() for c in plan):
            labels = "; ".join(dict.fromkeys(c["label"] for plan in plans.values() for c in plan))
            raise ValueError(f"configs: {as_typed!r} matches no configuration of {','.join(tasks)} (labels: {labels})")
    return {task: [c for c in plan if any(n in c["label"].lower() for n in wanted)] for task, plan in plans.items()}


def run(options: dict[str, Any]) -> tuple[Any, list[dict[str, Any]], float]:
    """One simulation: its result, its metrics rows, and its last aggregate's density."""
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulation(SimConfig(**options), home=Path(tmp) / "home", out_dir=Path(tmp) / "run")
        result = sim.run()
        rows = [json.loads(line) for line in Path(result.metrics_path).read_text().splitlines()]
        last = sim.previous_update
        density = float((last != 0).float().mean()) if last is not None else math.nan
    return result, rows, density


def run_task(
    name: str, quick: bool, max_factor: float, *, seed: int = 0, plan: list[dict[str, Any]] | None = None
) -> tuple[list[dict[str, Any]], list[tuple[float, float]]]:
    """Task ``name``'s dense baseline and every configuration (or those of ``plan``) against
    its target, on ``seed``; the rows and the bytes-loss frontier."""
    shared, base_steps = TASKS[name]
    shared = {**shared, "seed": seed}
    if quick:
        base_steps //= 4
    workers = shared["workers"]
    t = time.perf_counter()
    base, base_rows, _ = run(dict(**shared, local_steps=1, rounds=base_steps, outer="fedavg", compression="none"))
    target = base.final_val_loss * 1.02
    per_worker = base.bytes_up / workers
    rows = [
        dict(
            task=name,
            seed=seed,
            config=f"dense baseline (H=1, fp32, {base_steps} steps)",
            h=1,
            rounds=base_steps,
            steps=base_steps,
            reached=True,
            val_loss=base.final_val_loss,
            bytes_per_worker=per_worker,
            bytes_total_per_worker=per_worker,
            reduction=1.0,
            compression_ratio=base.compression_ratio,
            curve=[(r["bytes_up"] / workers, r["val_loss"]) for r in base_rows],
            wall_s=time.perf_counter() - t,
        )
    ]
    for c in configs(name, quick) if plan is None else plan:
        c = dict(c)
        label, full = c.pop("label"), c.pop("full", False)
        rounds = max(1, math.ceil(max_factor * base_steps / c["local_steps"]))
        t = time.perf_counter()
        r, metrics, _ = run(dict(**shared, **c, rounds=rounds, target_loss=target, stop_at_target=not full))
        reached = r.bytes_to_target is not None
        sent = (r.bytes_to_target if reached else r.bytes_up) / workers
        rows.append(
            dict(
                task=name,
                seed=seed,
                config=label,
                h=c["local_steps"],
                rounds=r.rounds,
                steps=r.rounds * c["local_steps"],
                rounds_to_target=r.rounds_to_target,
                reached=reached,
                val_loss=r.final_val_loss,
                bytes_per_worker=sent,
                bytes_total_per_worker=r.bytes_up / workers,
                reduction=per_worker / sent if reached else None,
                compression_ratio=r.compression_ratio,
                curve=[(m["bytes_up"] / workers, m["val_loss"]) for m in metrics],
                wall_s=time.perf_counter() - t,
            )
        )
    return rows, pareto([p for row in rows for p in row["curve"]])


def wire_bytes(task: str) -> dict[str, Any]:
    """Where one SparseLoCo update's bytes go for ``task``'s model (2%, 2-bit, chunk 4096),
    from a real encoding: header, per-chunk scales, value codes, Elias-Fano indices."""
    shared, _ = TASKS[task]
    with tempfile.TemporaryDirectory() as tmp:
        d = Simulation(SimConfig(**shared, rounds=1), home=Path(tmp) / "home", out_dir=Path(tmp) / "run").d
    codec = build_codec("sparseloco", {"density": 0.02, "bits": 2})
    blob = codec.encode(torch.randn(d, generator=torch.Generator().manual_seed(0)))
    full, k, tail, k_tail = chunk_plan(d, 4096, 0.02)
    kept = full * k + k_tail
    out = dict(
        d=d,
        kept=kept,
        blob=len(blob),
        header=len(blob) - codec.expected_bytes(d),
        scales=4 * 2 * (full + (tail > 0)),
        codes=-(-kept * 2 // 8),
        indices=-(-index_bits(d, kept) // 8),
    )
    assert out["header"] + out["scales"] + out["codes"] + out["indices"] == len(blob)
    return out


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (bytes, loss) points no other point beats on both, by bytes ascending."""
    front: list[tuple[float, float]] = []
    for b, loss in sorted(points):
        if not front or loss < front[-1][1]:
            front.append((b, loss))
    return front


def robust_rules(
    quick: bool, max_factor: float, target: float, base_bytes: float, *, seed: int = 0
) -> list[dict[str, Any]]:
    """SparseLoCo (H=30, 2%) on digits under each robust rule, without attackers and with 2
    of 8 sending sign-flipped updates (plain codec): what each rule makes of sparse updates
    that hit different coordinates, on ``seed``."""
    shared, base_steps = TASKS["digits"]
    shared = {**shared, "seed": seed}
    if quick:
        base_steps //= 4
    c = sparseloco(30)
    c.pop("label")
    out = []
    for (attack, byzantine), rule in ((a, r) for a in ATTACKS for r in RULES):
        t = time.perf_counter()
        rounds = max(1, math.ceil(max_factor * base_steps / c["local_steps"]))
        opts = dict(**{**shared, "aggregator": rule}, **c, rounds=rounds, target_loss=target, stop_at_target=True)
        r, _, density = run(dict(**opts, attack=attack, byzantine=byzantine))
        reached = r.bytes_to_target is not None
        out.append(
            dict(
                seed=seed,
                rule=rule,
                attack="none" if attack is None else f"{attack}, {byzantine} of {shared['workers']}",
                effect=RULES[rule],
                rounds=r.rounds,
                reached=reached,
                val_loss=r.final_val_loss,
                reduction=base_bytes / (r.bytes_to_target / shared["workers"]) if reached else None,
                aggregate_density=density,
                skipped=r.skipped_rounds,
                wall_s=time.perf_counter() - t,
            )
        )
    return out


def mib(b: float) -> str:
    return f"{b / 2**20:.3f}"


def reduction_spread(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task and configuration: the median and worst seed of the reduction (a miss counts
    as 0) and of the final val loss, and how many seeds reached the target."""
    out = []
    for key in dict.fromkeys((r["task"], r["config"]) for r in rows):
        mine = [r for r in rows if (r["task"], r["config"]) == key]
        red = spread({r["seed"]: r["reduction"] or 0.0 for r in mine})
        loss = spread({r["seed"]: r["val_loss"] for r in mine}, higher_is_better=False)
        assert red is not None and loss is not None  # each key has a row
        out.append(
            dict(task=key[0], config=key[1], seeds=len(mine), reached=sum(r["reached"] for r in mine))
            | dict(reduction=red.as_dict(), val_loss=loss.as_dict())
        )
    return out


def fmt_reduction(x: float) -> str:
    return "miss" if x == 0 else f"{x:.0f}x"


def print_rows(rows: list[dict[str, Any]], summary: list[dict[str, Any]], seeds: list[int]) -> None:
    print_table(
        "communication: bytes per worker to reach the dense baseline's loss (+2%)",
        ["task", "seed", "configuration", "inner steps", "val loss", "reached", "MiB sent/worker", "codec ratio"]
        + ["reduction", "wall s"],
        [
            [
                r["task"],
                r["seed"],
                r["config"],
                r["steps"],
                f"{r['val_loss']:.4f}",
                "yes" if r["reached"] else "no",
                mib(r["bytes_per_worker"]),
                f"{r['compression_ratio']:.1f}x",
                "-" if r["reduction"] is None else f"{r['reduction']:.0f}x",
                f"{r['wall_s']:.0f}",
            ]
            for r in rows
        ],
    )
    print("MiB sent/worker: to the first evaluation at the target (the whole run where it was not reached).")
    print_table(
        f"communication over seeds {','.join(map(str, seeds))}: reduction against dense at equal loss (+2%), "
        "median and worst seed (a miss counts as none)",
        ["task", "configuration", "reached", "reduction median", "reduction worst (seed)", "val loss median"],
        [
            [s["task"], s["config"], f"{s['reached']}/{s['seeds']}", fmt_reduction(s["reduction"]["median"])]
            + [f"{fmt_reduction(s['reduction']['worst'])} (s{s['reduction']['worst_seed']})"]
            + [f"{s['val_loss']['median']:.4f}"]
            for s in summary
        ],
    )


def task_verdict(
    task: str, rows: list[dict[str, Any]], summary: list[dict[str, Any]], front: list[tuple[float, float]]
) -> dict[str, Any]:
    """Print and return ``task``'s verdicts: the best configuration and the best SparseLoCo
    one by median reduction against the target, the equal-rounds comparison per seed, one
    update's bytes on the wire, and the first seed's bytes-loss frontier."""
    mine = [s for s in summary if s["task"] == task][1:]  # past the dense baseline
    goal = TARGETS[task]

    def best(of: list[dict[str, Any]]) -> dict[str, Any] | None:
        return max(
            (s for s in of if s["reduction"]["median"] > 0), key=lambda s: s["reduction"]["median"], default=None
        )

    top, top_sl = best(mine), best([s for s in mine if s["config"].startswith("sparseloco")])
    if top is None:
        print(f"{task}: no configuration reached the baseline's loss at the median (MISSES the {goal}x target)")
    else:
        print(f"{task}: best overall {top['config']}: {top['reduction']['median']:.0f}x fewer bytes (median)")
    if top_sl is not None:
        red = top_sl["reduction"]
        verdict = "meets" if red["median"] >= goal else "MISSES"
        print(
            f"{task}: best SparseLoCo-class {top_sl['config']}: {red['median']:.0f}x fewer bytes than dense at equal "
            f"loss (+2%), median over {top_sl['seeds']} seeds ({verdict} the {goal}x target); worst seed "
            f"{fmt_reduction(red['worst'])} (seed {red['worst_seed']})"
        )
    out: dict[str, Any] = dict(
        target=goal,
        best=None if top is None else top["config"],
        best_reduction=None if top is None else top["reduction"],
        best_sparseloco=None if top_sl is None else top_sl["config"],
        best_sparseloco_reduction=None if top_sl is None else top_sl["reduction"],
        equal_rounds=equal_rounds(task, rows),
    )
    w = wire_bytes(task)
    print(
        f"{task}: one sparseloco update (d={w['d']}, 2%, 2-bit) is {w['blob']} bytes on the wire: header "
        f"{w['header']}, chunk scales {w['scales']}, value codes {w['codes']}, indices {w['indices']} "
        f"({8 * w['indices'] / w['kept']:.2f} bits for each of {w['kept']} indices; fp32 would be {4 * w['d']} bytes)"
    )
    out["sparseloco_wire_bytes"] = w
    base = next(r for r in rows if r["task"] == task)
    shown = front if len(front) <= 12 else [front[round(i * (len(front) - 1) / 11)] for i in range(12)]
    print(
        f"{task}: bytes-loss Pareto frontier over every evaluation of every run, seed {base['seed']} "
        f"(MiB/worker -> val loss; target {base['val_loss'] * 1.02:.4f}): "
        + ", ".join(f"{mib(b)} -> {loss:.4f}" for b, loss in shown)
    )
    return out


def equal_rounds(task: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per seed: the full-budget DiLoCo and SparseLoCo runs at the same H, printed."""
    out = []
    for d_row in (r for r in rows if r["task"] == task and r["config"] == f"diloco H={r['h']}, none"):
        s_row = next(
            (
                r
                for r in rows
                if r["task"] == task
                and r["seed"] == d_row["seed"]
                and r["config"] == f"sparseloco H={d_row['h']}, 2%, 2-bit"
            ),
            None,
        )
        if s_row is None or s_row["rounds"] != d_row["rounds"]:
            continue
        lower = s_row["val_loss"] < d_row["val_loss"]
        fewer = s_row["bytes_total_per_worker"] < d_row["bytes_total_per_worker"]
        print(
            f"{task} seed {d_row['seed']}: equal rounds ({d_row['rounds']} of H={d_row['h']}): SparseLoCo val loss "
            f"{s_row['val_loss']:.4f} vs DiLoCo {d_row['val_loss']:.4f}, "
            f"{mib(s_row['bytes_total_per_worker'])} vs {mib(d_row['bytes_total_per_worker'])} MiB/worker "
            f"({d_row['bytes_total_per_worker'] / s_row['bytes_total_per_worker']:.0f}x fewer): "
            f"{'lower loss with fewer bytes (as the paper)' if lower and fewer else 'NOT lower loss with fewer bytes'}"
        )
        out.append(
            dict(
                seed=d_row["seed"],
                rounds=d_row["rounds"],
                sparseloco_loss=s_row["val_loss"],
                diloco_loss=d_row["val_loss"],
                sparseloco_bytes=s_row["bytes_total_per_worker"],
                diloco_bytes=d_row["bytes_total_per_worker"],
                lower_loss_fewer_bytes=lower and fewer,
            )
        )
    return out


def run_rules(rows: list[dict[str, Any]], args: argparse.Namespace, seeds: list[int]) -> list[dict[str, Any]]:
    """The robust rules over SparseLoCo's sparse updates on digits, each seed against its own
    dense baseline."""
    rules: list[dict[str, Any]] = []
    for seed in seeds:
        base = next(r for r in rows if r["task"] == "digits" and r["seed"] == seed)
        rules += robust_rules(args.quick, args.max_factor, base["val_loss"] * 1.02, base["bytes_per_worker"], seed=seed)
    return rules


def print_rules(rules: list[dict[str, Any]], seeds: list[int]) -> None:
    """The robust rules' rows per seed, then the median and worst seed per rule and attack."""
    print_table(
        "robust rules over SparseLoCo's sparse updates (digits, 8 workers, H=30, 2%, 2-bit)",
        ["rule", "attack", "seed", "rounds", "val loss", "reached", "reduction"] + ["aggregate density", "wall s"],
        [
            [
                r["rule"],
                r["attack"],
                r["seed"],
                r["rounds"],
                f"{r['val_loss']:.4f}",
                "yes" if r["reached"] else "no",
                "-" if r["reduction"] is None else f"{r['reduction']:.0f}x",
                f"{r['aggregate_density']:.4f}",
                f"{r['wall_s']:.0f}",
            ]
            for r in rules
        ],
    )
    keys = dict.fromkeys((r["rule"], r["attack"]) for r in rules)
    spreads = {
        k: spread({r["seed"]: r["reduction"] or 0.0 for r in rules if (r["rule"], r["attack"]) == k}) for k in keys
    }
    print_table(
        f"robust rules over sparse updates, seeds {','.join(map(str, seeds))}: reduction median and worst seed",
        ["rule", "attack", "reduction median", "reduction worst (seed)"],
        [
            [k[0], k[1], fmt_reduction(v.median), f"{fmt_reduction(v.worst)} (s{v.worst_seed})"]
            for k, v in spreads.items()
            if v is not None
        ],
    )
    print("aggregate density: share of coordinates the last round's aggregate moved (each update: ~2%).")
    print("What each rule does with sparse updates (n = 8, each nonzero on ~2% of coordinates, mostly different ones):")
    for rule, effect in RULES.items():
        print(f"  {rule}: {effect}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs and few configurations (smoke test)")
    ap.add_argument("--tasks", default="digits,transformer")
    ap.add_argument("--max-factor", type=float, default=3.0, help="step budget relative to the baseline")
    ap.add_argument("--seeds", default="0-4", help="e.g. 0-4 (the default), 0,2 or 3")
    ap.add_argument("--configs", help="only configurations whose label contains one of these, ';'-separated")
    ap.add_argument("--out", type=Path, help="write the JSON here, not under bench/results/")
    ap.add_argument("--combine", help="run nothing: merge these parts' JSON files (comma-separated) and report them")
    args = ap.parse_args()
    if args.combine is not None:
        try:
            paths = part_paths(args.combine)
        except ValueError as e:
            ap.error(str(e))
        if args.configs is not None:
            ap.error("--combine runs nothing: not with --configs")
        return combine(args, paths)
    tasks = args.tasks.split(",")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        ap.error(f"tasks: {', '.join(unknown)} not one of {', '.join(TASKS)}")
    try:
        seeds = parse_seeds(args.seeds)
        plans = chosen_configs(tasks, args.quick, args.configs)
    except ValueError as e:
        ap.error(str(e))
    for task in [t for t in tasks if not plans[t]]:
        print(f"{task}: no configuration matches --configs {args.configs!r}; not run")
    tasks = [t for t in tasks if plans[t]]
    torch.manual_seed(0)
    rows: list[dict[str, Any]] = []
    fronts: dict[str, list[tuple[float, float]]] = {}
    for seed in seeds:
        for task in tasks:
            task_rows, front = run_task(task, args.quick, args.max_factor, seed=seed, plan=plans[task])
            rows += task_rows
            fronts.setdefault(task, front)  # the first seed's
    rules = run_rules(rows, args, seeds) if "digits" in tasks and args.configs is None else []
    for r in rows:
        r.pop("curve")
    payload = report(rows, fronts, rules, seeds, tasks)
    payload |= {"machine": machine(), "args": vars(args)}
    write_json("communication" if args.configs is None else "communication_configs", payload, path=args.out)


def report(
    rows: list[dict[str, Any]],
    fronts: dict[str, list[tuple[float, float]]],
    rules: list[dict[str, Any]],
    seeds: list[int],
    tasks: list[str],
) -> dict[str, Any]:
    """Print every table and verdict of these rows; the payload's results."""
    summary = reduction_spread(rows)
    print_rows(rows, summary, seeds)
    verdicts = {task: task_verdict(task, rows, summary, fronts[task]) for task in tasks}
    if rules:
        print_rules(rules, seeds)
    return {
        "rows": rows,
        "summary": summary,
        "verdicts": verdicts,
        "pareto": {k: [list(p) for p in v] for k, v in fronts.items()},
        "robust_rules": rules,
    }


SHAPE = ("max_factor", "quick")  # what combined parts must share


def _keyed(part: dict[str, Any]) -> tuple[dict[tuple, dict[str, Any]], dict[tuple, dict[str, Any]], dict[str, Any]]:
    """A part's rows by (task, seed, configuration), its robust rules' by (rule, attack, seed),
    and its frontiers; KeyError or TypeError when a row lacks what this program writes."""
    rows = {(r["task"], r["seed"], r["config"]): r for r in part["rows"]}
    rules = {(r["rule"], r["attack"], r["seed"]): r for r in part.get("robust_rules", [])}
    return rows, rules, dict(part["pareto"])


def combine(args: argparse.Namespace, paths: list[Path]) -> None:
    """Merge parts written with ``--out`` (a later part's row for the same task, seed and
    configuration, or rule and attack, replaces an earlier one's), print and write them as one
    run of them all."""
    rows: dict[tuple, dict[str, Any]] = {}
    rules: dict[tuple, dict[str, Any]] = {}
    fronts: dict[str, tuple[int, list[tuple[float, float]]]] = {}
    parts = []
    for path in paths:
        source, (part_rows, part_rules, pareto) = read_part(path, args, SHAPE, _keyed)
        rows |= part_rows
        rules |= part_rules
        first = min((seed for _, seed, _ in part_rows), default=0)
        for task, front in pareto.items():  # the frontier of the lowest seed run
            if task not in fronts or first < fronts[task][0]:
                fronts[task] = (first, [tuple(p) for p in front])
        parts.append(source)
    ordered = sorted(rows.values(), key=lambda r: r["seed"])  # stable: each part's own order within a seed
    seeds = sorted({r["seed"] for r in ordered})
    tasks = [t for t in TASKS if any(r["task"] == t for r in ordered)]
    payload = report(
        ordered, {t: f for t, (_, f) in fronts.items()}, sorted(rules.values(), key=lambda r: r["seed"]), seeds, tasks
    )
    payload |= {
        "machine": parts[0]["machine"],
        "args": vars(args) | {"combine": [str(p) for p in paths]},
        "parts": parts,
    }
    write_json("communication", payload, path=args.out)


if __name__ == "__main__":
    main()
