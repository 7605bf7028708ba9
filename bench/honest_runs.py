"""Benchmark: false accusations in long honest runs, and cheaters still caught.

Each run plays synchronous rounds of the simulator's workers (the live run defaults: MLP on
digits, the same local trainer workers use, the run's aggregator and outer step) and
judges every round with exactly the coordinator's scoring (``coordinator.scoring.judge``:
held-out gain of each update alone, own shard vs others' data, kept share, copies,
alignments, each with its measured noise; then ``core.scoring.score_round``), pays
``price x quality`` as settlement does and moves reputation as settlement does (from 4.9).

Honest runs: 40+ rounds (to convergence), IID and Dirichlet non-IID shards, small shards
(16 workers: ~70 samples each). Targets: 0 flags per honest worker, >= 95% of the agreed
price paid to honest workers. Cheater runs (the last worker cheats): a free-rider (zero
update), a copier (sends worker 0's update), a label-flipper, and a wrong-shard trainer
(trains on worker 0's shard, non-IID): each must still be caught (flagged or unpaid).

``--task transformer``: a byte-level transformer on the stdlib corpus (context 64, as the
live benchmark's, d_model 64: each sample 64 loss terms), 2 and 4 workers, IID only (a Dirichlet
split is over labels; a sequence has none), no wrong-shard case (on IID shards another
worker's shard is as good as one's own). ``--score-terms 32768,8192`` scores each run at
each budget (``coordinator.config.Settings.score_terms``; 32768 terms at 64 a sample is
the 512 sequences scoring took before the budget). ``--scoring-cpu`` measures instead the
CPU seconds of one round's ``judge`` on the live benchmark's transformer (context 64,
d_model 128, 2 layers, 2 updates) at each budget.

Usage: python bench/honest_runs.py [--quick] [--rounds 40] [--seeds 2] [--task digits|transformer]
       [--score-terms 8192[,16384...]] [--scoring-cpu]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from _common import print_table, write_json
from _sims import machine
from aitbc.coordinator.config import Settings
from aitbc.coordinator.verification.scoring import SCORING, judge, kept_shares, mean_shares, score_batch
from aitbc.core.compression import decode as decode_update
from aitbc.core.scoring import reputation_update
from aitbc.sim.config import SimConfig
from aitbc.sim.runner import Simulation
from aitbc.training.checkpoint import load_shard

START_REPUTATION = 4.9
SCORE_SAMPLES = Settings.model_fields["score_samples"].default  # the coordinator's cap (512)
SCORE_TERMS = Settings.model_fields["score_terms"].default  # and its budget of loss terms (8192)
# name: the simulator's options (the rest are the live run's defaults)
TASKS: dict[str, dict[str, Any]] = {
    "digits": dict(model="mlp", dataset="digits"),
    "transformer": dict(
        model="transformer",
        dataset="stdlib",
        batch_size=32,  # the live benchmark's batch and lr (at lr 3e-3 an update alone overshoots)
        lr=1e-3,
        model_options={"context": 64, "d_model": 64, "n_layers": 2, "n_heads": 4},
        max_bytes=1 << 20,
    ),
}
# the live benchmark's transformer (bench/live_utilization.py), for --scoring-cpu
LIVE_TRANSFORMER = dict(
    model="transformer",
    dataset="stdlib",
    batch_size=32,
    lr=1e-3,
    model_options={"context": 64, "d_model": 128, "n_layers": 2},
    max_bytes=1 << 20,
    workers=2,
)


@dataclass
class Tally:
    flags: dict[str, int] = field(default_factory=dict)  # flag -> rounds it fired
    flagged_rounds: int = 0
    quality: float = 0.0  # sum over rounds
    rounds: int = 0
    reputation: float = START_REPUTATION

    def add(self, flags: tuple[str, ...], quality: float) -> None:
        for f in flags:
            self.flags[f] = self.flags.get(f, 0) + 1
        self.flagged_rounds += bool(flags)
        self.quality += quality
        self.rounds += 1
        self.reputation = reputation_update(self.reputation, quality)


def play(
    *,
    workers: int,
    rounds: int,
    alpha: float | None,
    seed: int,
    cheat: str | None,
    aggregator: str = "mean",
    task: str = "digits",
    terms: int = SCORE_TERMS,
) -> dict[str, Any]:
    """One run; the last worker plays ``cheat`` (None: everyone honest); each round scored on
    batches of ``terms`` loss terms, as the coordinator sizes them (``score_batch``)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = SimConfig(
            **TASKS[task],
            workers=workers,
            rounds=rounds,
            alpha=alpha,
            seed=seed,
            eval_samples=SCORE_SAMPLES,
            aggregator=aggregator,
        )
        sim = Simulation(cfg, home=Path(tmp) / "home", out_dir=Path(tmp) / "run")
        manifest = json.loads(sim.store.get_bytes(sim.manifest_cid))
        shards = [load_shard(sim.store.get_bytes(e["cid"])) for e in manifest["shards"]]  # the true labels
        samples = score_batch(sim.val_y[0].numel(), terms, SCORE_SAMPLES)
        cheater = workers - 1 if cheat else None
        if cheat == "label-flip":  # a sequence's targets are tokens: each mapped to another
            t = sim.trainers[workers - 1]
            t.y = max(int(sh[1].max()) for sh in shards) - t.y  # trains on flipped labels
        elif cheat == "wrong-shard":
            t = sim.trainers[workers - 1]
            t.x, t.y = shards[0]  # trains on worker 0's shard instead of its own
        tallies = [Tally() for _ in range(workers)]
        ids = list(range(workers))
        t0 = time.perf_counter()
        for r in range(1, rounds + 1):
            sent = sim.work(ids, dict.fromkeys(ids, sim.params), 0, count_bytes=False)
            updates = [decode_update(s.blob).to(torch.float32) for s in sent]
            if cheat == "free-rider":
                updates[workers - 1] = torch.zeros_like(updates[0])
            elif cheat == "copier":
                updates[workers - 1] = updates[0].clone()
            U = torch.stack(updates)  # (n, d)
            w = sim.samples.clone()
            judged = judge(
                sim.model,
                sim.params,
                U,
                ids,
                shards,
                [False] * workers,
                (sim.val_x, sim.val_y),
                kept_shares(sim.aggregator, U, w, r, sim.last_step),  # the trend the close compares with
                samples=samples,
                seed=seed * 1_000_003 + r,
                shares=mean_shares(w),  # each update's weight in the round's mean, as the live close's
            )
            for i, sc in enumerate(judged):
                tallies[i].add(sc.flags, sc.quality)
            ejected = any(sc.provable for sc in judged)  # a slash ejects: settlement would end its job
            sim.apply(
                [u for i, u in enumerate(updates) if not judged[i].provable],
                [float(w[i]) for i in range(len(updates)) if not judged[i].provable],
            )
            sim.round = r
            if ejected:
                break  # the honest rest of such a run is what the honest runs measure
        loss, acc = sim.evaluate(sim.params)
        honest = [t for i, t in enumerate(tallies) if i != cheater]
        return {
            "score_samples": samples,
            "seconds": round(time.perf_counter() - t0, 1),
            "final_val_loss": round(loss, 4),
            "final_val_acc": acc,
            "honest_flags_max": max(t.flagged_rounds for t in honest),
            "honest_flags_total": sum(t.flagged_rounds for t in honest),
            "honest_flag_kinds": _merge(t.flags for t in honest),
            "honest_pay_share_min": min(t.quality / t.rounds for t in honest),
            "honest_pay_share_mean": sum(t.quality / t.rounds for t in honest) / len(honest),
            "honest_reputation_min": min(t.reputation for t in honest),
            "honest_rounds": min(t.rounds for t in honest),
            "cheater": None
            if cheater is None
            else {
                "flagged_rounds": tallies[cheater].flagged_rounds,
                "flags": tallies[cheater].flags,
                "rounds": tallies[cheater].rounds,
                "pay_share": tallies[cheater].quality / tallies[cheater].rounds,
                "reputation": tallies[cheater].reputation,
            },
        }


def _merge(dicts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


HONEST_CASES = {  # task: (name, workers, Dirichlet alpha or None for IID, aggregator)
    "digits": [
        ("2 workers, IID (the local stack)", 2, None, "mean"),
        ("4 workers, IID", 4, None, "mean"),
        ("4 workers, Dirichlet a=0.3", 4, 0.3, "mean"),
        ("4 workers, IID, trimmed-mean:beta=0.25", 4, None, "trimmed-mean:beta=0.25"),
        ("4 workers, IID, multi-krum:m=3", 4, None, "multi-krum:m=3"),
        ("16 workers (small shards), IID", 16, None, "mean"),
        ("16 workers (small shards), Dirichlet a=0.5", 16, 0.5, "mean"),
        # the default rule with the f a live run of 16 gets ((16 - 3) // 4): honest updates the
        # trend leaves out are kept 0, so this row says whether that ever flags one
        ("16 workers, Dirichlet a=0.5, trend:f=3+centered-clip", 16, 0.5, "trend:f=3+centered-clip"),
        ("4 workers, Dirichlet a=0.3, trend:f=1+centered-clip", 4, 0.3, "trend:f=1+centered-clip"),
    ],
    "transformer": [
        ("2 workers, IID (the live benchmark's count)", 2, None, "mean"),
        ("4 workers, IID", 4, None, "mean"),
        ("4 workers, IID, trend:f=1+centered-clip", 4, None, "trend:f=1+centered-clip"),
    ],
}
CHEAT_CASES = {  # task: (cheat, workers, alpha)
    "digits": [("free-rider", 4, None), ("copier", 4, None), ("label-flip", 4, None), ("wrong-shard", 4, 0.3)],
    "transformer": [("free-rider", 4, None), ("copier", 4, None), ("label-flip", 4, None)],
}


def scoring_cpu(budgets: list[int], repeats: int) -> list[dict[str, Any]]:
    """CPU seconds of one round's ``judge`` on the live benchmark's transformer (2 workers'
    updates after one round of training), at each budget: the median of ``repeats``."""
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulation(
            SimConfig(**LIVE_TRANSFORMER, rounds=1, seed=0, eval_samples=SCORE_SAMPLES, aggregator="mean"),
            home=Path(tmp) / "home",
            out_dir=Path(tmp) / "run",
        )
        manifest = json.loads(sim.store.get_bytes(sim.manifest_cid))
        shards = [load_shard(sim.store.get_bytes(e["cid"])) for e in manifest["shards"]]
        ids = list(range(len(shards)))
        sent = sim.work(ids, dict.fromkeys(ids, sim.params), 0, count_bytes=False)
        U = torch.stack([decode_update(x.blob).to(torch.float32) for x in sent])  # (n, d)
        out = []
        for terms in budgets:
            samples = score_batch(sim.val_y[0].numel(), terms, SCORE_SAMPLES)
            times = []
            for k in range(repeats):
                t0 = time.process_time()
                judge(
                    sim.model,
                    sim.params,
                    U,
                    ids,
                    shards,
                    [False] * len(ids),
                    (sim.val_x, sim.val_y),
                    [1.0] * len(ids),
                    samples=samples,
                    seed=k,
                    shares=mean_shares(sim.samples),
                )
                times.append(time.process_time() - t0)
            out.append(
                {
                    "score_terms": terms,
                    "score_samples": samples,
                    "cpu_seconds": sorted(times)[repeats // 2],
                    "cpu_seconds_all": [round(t, 3) for t in times],
                }
            )
            print(f"scoring CPU at {terms} terms ({samples} sequences): {out[-1]['cpu_seconds_all']} s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and seeds")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (small models: 1 is fastest)")
    ap.add_argument("--task", choices=sorted(TASKS), default="digits")
    ap.add_argument("--score-terms", default=str(SCORE_TERMS), help="loss-term budgets, comma-separated")
    ap.add_argument("--scoring-cpu", action="store_true", help="only the live transformer's scoring CPU a round")
    ap.add_argument("--repeats", type=int, default=3, help="--scoring-cpu: rounds judged per budget (median)")
    ap.add_argument("--out", type=Path, default=None, help="the JSON's path (default: bench/results/NAME.json)")
    args = ap.parse_args()
    rounds, seeds = (12, 1) if args.quick else (args.rounds, args.seeds)
    budgets = [int(b) for b in args.score_terms.split(",")]
    torch.set_num_threads(args.threads)
    if args.scoring_cpu:
        write_json("scoring_cpu", {"machine": machine(), "budgets": scoring_cpu(budgets, args.repeats)}, path=args.out)
        return
    results: dict[str, Any] = {
        "machine": machine(),
        "task": args.task,
        "rounds": rounds,
        "seeds": seeds,
        "scoring": {k: getattr(SCORING, k) for k in SCORING.__dataclass_fields__},
        "honest": [],
        "cheaters": [],
    }
    for terms in budgets:
        _honest(results, args.task, terms, rounds, seeds)
        _cheaters(results, args.task, terms, rounds)
    summary = {}
    for terms in budgets:
        honest = [h for h in results["honest"] if h["score_terms"] == terms]
        summary[str(terms)] = {
            "score_samples": honest[0]["score_samples"],
            "honest_flags_max": max(h["honest_flags_max"] for h in honest),
            "honest_pay_share_min": min(h["honest_pay_share_min"] for h in honest),
            "honest_worker_rounds": sum(h["workers"] * h["honest_rounds"] for h in honest),
            "cheaters_caught": all(_caught(c) for c in results["cheaters"] if c["score_terms"] == terms),
        }
        sm = summary[str(terms)]
        print(
            f"{terms} terms ({sm['score_samples']} samples a batch): honest max flags per worker "
            f"{sm['honest_flags_max']} (target 0), min pay share {100 * sm['honest_pay_share_min']:.1f}% "
            f"(target >= 95%) over {sm['honest_worker_rounds']} worker-rounds; cheaters caught: {sm['cheaters_caught']}"
        )
    # one budget: the summary as before (the digits run's JSON keeps its shape)
    results["summary"] = summary[str(budgets[0])] if len(budgets) == 1 else summary
    write_json("honest_runs" if args.task == "digits" else f"honest_runs_{args.task}", results, path=args.out)


def _caught(c: dict[str, Any]) -> bool:
    """Flagged in some round, or paid under half of the agreed price."""
    ch = c["cheater"]
    return ch["flagged_rounds"] > 0 or ch["pay_share"] < 0.5


def _honest(results: dict[str, Any], task: str, terms: int, rounds: int, seeds: int) -> None:
    rows = []
    for name, n, alpha, agg in HONEST_CASES[task]:
        for seed in range(seeds):
            res = play(
                workers=n, rounds=rounds, alpha=alpha, seed=seed, cheat=None, aggregator=agg, task=task, terms=terms
            )
            print(f"{name}, seed {seed}, {terms} terms: {res['seconds']} s", flush=True)
            results["honest"].append(
                {
                    "case": name,
                    "workers": n,
                    "alpha": alpha,
                    "aggregator": agg,
                    "seed": seed,
                    "score_terms": terms,
                    **res,
                }
            )
            rows.append(
                (
                    f"{name}, seed {seed}",
                    rounds,
                    res["final_val_loss"],
                    res["final_val_acc"],
                    res["honest_flags_max"],
                    f"{100 * res['honest_pay_share_min']:.1f}%",
                    f"{100 * res['honest_pay_share_mean']:.1f}%",
                    f"{res['honest_reputation_min']:.2f}",
                    res["seconds"],
                )
            )
    print_table(
        f"Honest runs ({task}, {terms} loss terms a scoring batch): flags per honest worker (target 0) and share "
        f"of the agreed price paid (target >= 95%), {rounds} rounds",
        ["run", "rounds", "val loss", "val acc", "flags/worker (max)", "pay min", "pay mean", "rep min", "s"],
        rows,
    )


def _cheaters(results: dict[str, Any], task: str, terms: int, rounds: int) -> None:
    rows = []
    for cheat, n, alpha in CHEAT_CASES[task]:
        res = play(workers=n, rounds=rounds, alpha=alpha, seed=0, cheat=cheat, task=task, terms=terms)
        print(f"{cheat}, {terms} terms: {res['seconds']} s", flush=True)
        results["cheaters"].append({"case": cheat, "workers": n, "alpha": alpha, "score_terms": terms, **res})
        c = res["cheater"]
        rows.append(
            (
                f"{cheat} ({n} workers, {'IID' if alpha is None else f'Dirichlet a={alpha}'})",
                ", ".join(f"{k} x{v}" for k, v in sorted(c["flags"].items())) or "none",
                f"{c['flagged_rounds']}/{c['rounds']}",
                f"{100 * c['pay_share']:.1f}%",
                f"{c['reputation']:.2f}",
                res["honest_flags_max"],
                f"{100 * res['honest_pay_share_min']:.1f}%",
            )
        )
    print_table(
        f"Cheaters are still caught ({task}, {terms} loss terms; the last worker cheats; a provable flag ejects it)",
        ["cheater", "its flags", "flagged rounds", "its pay", "its rep", "honest flags (max)", "honest pay min"],
        rows,
    )


if __name__ == "__main__":
    main()
