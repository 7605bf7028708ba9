"""Benchmark: verification of work in simulation -- are cheaters caught, honest workers never, at what cost?

16 workers train the bundled MLP on ``digits`` (H=20 local steps, committed every 2 steps:
10 intervals; batch 32, AdamW lr 1e-3; updates int8 without error feedback). In each
configuration 4 of them cheat in one way (aitbc.sim.verification.CHEATS) and the
coordinator's protocol verifies every update at rate r (0.05, 0.1, 0.25): the free start
check, r x 10 intervals replayed on average, and the update's encoding whenever the last
interval is chosen. A failed check ejects the worker. 50 rounds each, plus an all-honest run
per rate (the sanity figure: its validation accuracy) and one run with top-k 10% and error
feedback (the residual path). Targets: no honest worker ever fails a check; at r = 0.1 at
least 99% of cheaters of every kind are caught within 10 rounds; extra compute (replayed
steps / trained steps) at most 10% at r = 0.1.

With 4 cheaters a configuration, "caught within 10" moves in steps of 25%; the trials table
repeats every (rate, cheat) over more seeds (each run stops once its cheaters are caught,
at most 50 rounds) and reports the share of all those cheaters caught within 10 rounds.

Usage: python bench/verification.py [--quick] [--trials N] [--rounds N] [--seed S]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from _common import print_table, write_json
from _sims import machine
from aitbc.sim.verification import CHEATS, VerifyConfig, VerifyResult, run_verification

RATES = (0.05, 0.1, 0.25)
TARGET_RATE = 0.1
# (label, cheat, options): the kinds and variants, and one beyond the issue: a skipper
# that fakes only 1 interval of 10 (a cheater saving a share f of its work is caught with
# probability about f per checked interval; the 99% target is not claimed for it).
VARIANTS: list[tuple[str, str, dict[str, Any]]] = [(c, c, {}) for c in CHEATS] + [
    ("skip-1/10", "skip", {"skip_fraction": 0.1})
]
TARGET_KINDS = set(CHEATS)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _row(kind: str, label: str, r: VerifyResult) -> dict[str, Any]:
    n = len(r.cheaters)
    by = sorted(set(r.caught_by.values()))
    return {
        "config": label,
        "rate": r.config["rate"],
        "cheat": None if r.config["cheat"] is None else kind,
        "compression": r.config["compression"] + (" +ef" if r.config["error_feedback"] else ""),
        "cheaters": n,
        "caught_10": r.caught_within(10),
        "caught_50": r.caught_within(50),
        "mean_round": r.mean_detection_round,
        "caught_by": ",".join(by),
        "cheater_updates_accepted": r.cheater_updates_accepted,
        "false_accusations": len(r.false_accusations),
        "replay_share": r.replay_share,
        "wall_share": r.wall_share,
        "update_checks": r.update_checks,
        "final_val_accuracy": r.final_val_accuracy,
        "wall_s": r.wall_seconds,
        "result": r.to_json(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="12 rounds, r = 0.1 only, 1 trial (about 2 minutes)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per configuration (default 50; quick 12)")
    ap.add_argument("--trials", type=int, default=None, help="extra seeds per (rate, cheat) (default 6; quick 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    # One thread: the MLP is too small to gain from two, and on a shared 2-core machine two
    # threads contend (the simulated workers and verifier share the process: its re-runs are bit-exact).
    torch.set_num_threads(1)
    rounds = args.rounds or (12 if args.quick else 50)
    trials = args.trials if args.trials is not None else (1 if args.quick else 6)
    rates = (TARGET_RATE,) if args.quick else RATES
    base = dict(
        workers=16, cheaters=4, rounds=rounds, local_steps=20, batch_size=32, compression="int8", seed=args.seed
    )

    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for rate in rates:
        for label, cheat, opts in [("honest", None, {}), *VARIANTS]:
            r = run_verification(VerifyConfig(**{**base, **opts, "rate": rate, "cheat": cheat}))
            rows.append(_row(label, f"r={rate} {label}", r))
            print(f"  {rows[-1]['config']}: {rows[-1]['wall_s']:.1f} s", flush=True)
    ef = run_verification(
        VerifyConfig(
            **{**base, "rate": TARGET_RATE, "cheat": "skip", "compression": "topk:ratio=0.1"}, error_feedback=True
        )
    )
    rows.append(_row("skip", f"r={TARGET_RATE} skip topk+ef", ef))

    print_table(
        f"verification: 16 workers, 4 cheaters of one kind, {rounds} rounds, H=20 (10 intervals), seed {args.seed}",
        [
            "rate",
            "cheat",
            "codec",
            "caught <=10",
            f"caught <={rounds}",
            "mean round",
            "caught by",
            "cheats aggregated",
            "false accusations",
            "replayed/trained",
            "verify/train wall",
            "update checks",
            "val acc",
        ],
        [
            [
                f"{r['rate']:g}",
                r["cheat"] or "(honest)",
                r["compression"],
                f"{r['caught_10']}/{r['cheaters']}" if r["cheaters"] else "-",
                f"{r['caught_50']}/{r['cheaters']}" if r["cheaters"] else "-",
                "-" if r["mean_round"] is None else f"{r['mean_round']:.2f}",
                r["caught_by"] or "-",
                r["cheater_updates_accepted"],
                r["false_accusations"],
                _pct(r["replay_share"]),
                _pct(r["wall_share"]),
                r["update_checks"],
                "-" if r["final_val_accuracy"] is None else f"{r['final_val_accuracy']:.3f}",
            ]
            for r in rows
        ],
    )

    trial_rows: list[dict[str, Any]] = []
    if trials:
        for rate in rates:
            for label, cheat, opts in VARIANTS:
                caught10 = total = updates = caught_updates = false = 0
                rounds_caught: list[int] = []
                for k in range(trials):
                    seed = args.seed + 1 + k
                    r = run_verification(
                        VerifyConfig(
                            **{**base, **opts, "rate": rate, "cheat": cheat, "seed": seed, "stop_when_caught": True}
                        )
                    )
                    total += len(r.cheaters)
                    caught10 += r.caught_within(10)
                    updates += r.cheater_updates
                    caught_updates += len(r.caught_round)
                    false += len(r.false_accusations)
                    rounds_caught += list(r.caught_round.values())
                trial_rows.append(
                    {
                        "rate": rate,
                        "cheat": label,
                        "seeds": [args.seed + 1 + k for k in range(trials)],
                        "cheaters": total,
                        "caught_10": caught10,
                        "caught_10_share": caught10 / total,
                        "per_update_catch": caught_updates / updates if updates else None,
                        "mean_round": sum(rounds_caught) / len(rounds_caught) if rounds_caught else None,
                        "max_round": max(rounds_caught) if rounds_caught else None,
                        "false_accusations": false,
                    }
                )
            print(f"  trials at r={rate}: done", flush=True)
        print_table(
            f"verification trials: {trials} more seeds per row, 4 cheaters each, runs stop once all are caught",
            ["rate", "cheat", "cheaters", "caught <=10", "per-update catch", "mean round", "max round", "false acc."],
            [
                [
                    f"{t['rate']:g}",
                    t["cheat"],
                    t["cheaters"],
                    f"{t['caught_10']}/{t['cheaters']} ({_pct(t['caught_10_share'])})",
                    _pct(t["per_update_catch"]),
                    "-" if t["mean_round"] is None else f"{t['mean_round']:.2f}",
                    t["max_round"] if t["max_round"] is not None else "-",
                    t["false_accusations"],
                ]
                for t in trial_rows
            ],
        )

    # The targets.
    false_total = sum(r["false_accusations"] for r in rows) + sum(t["false_accusations"] for t in trial_rows)
    at = [r for r in rows if r["rate"] == TARGET_RATE and r["cheat"] in TARGET_KINDS and "+ef" not in r["compression"]]
    caught = {r["cheat"]: [r["caught_10"], r["cheaters"]] for r in at}
    for t in trial_rows:
        if t["rate"] == TARGET_RATE and t["cheat"] in TARGET_KINDS:
            caught[t["cheat"]][0] += t["caught_10"]
            caught[t["cheat"]][1] += t["cheaters"]
    worst = min(caught.items(), key=lambda kv: kv[1][0] / kv[1][1])
    share = worst[1][0] / worst[1][1]
    one = [r for r in rows if r["rate"] == TARGET_RATE and r["cheat"] == "skip-1/10"]
    one_t = [t for t in trial_rows if t["rate"] == TARGET_RATE and t["cheat"] == "skip-1/10"]
    one_caught = sum(r["caught_10"] for r in one) + sum(t["caught_10"] for t in one_t)
    one_of = sum(r["cheaters"] for r in one) + sum(t["cheaters"] for t in one_t)
    honest = next(r for r in rows if r["rate"] == TARGET_RATE and r["cheat"] is None)
    replay_max = max(r["replay_share"] for r in rows if r["rate"] == TARGET_RATE)
    print(
        f"false accusations of honest workers, all runs: {false_total} ({'meets' if false_total == 0 else 'MISSES'} 0)"
    )
    print(
        f"at r={TARGET_RATE}: worst kind {worst[0]!r} caught within 10 rounds {worst[1][0]}/{worst[1][1]} "
        f"({_pct(share)}; {'meets' if share >= 0.99 else 'MISSES'} >= 99%)"
    )
    if one_of:
        print(
            f"beyond the issue, at r={TARGET_RATE}: a skipper faking 1 interval of 10 caught within 10 rounds "
            f"{one_caught}/{one_of} ({_pct(one_caught / one_of)}; 1 - 0.9^10 = 65.1% expected)"
        )
    print(
        f"at r={TARGET_RATE}: replayed steps / trained steps at most {_pct(replay_max)} "
        f"({'meets' if replay_max <= 0.10 + 1e-9 else 'MISSES'} <= 10%); verification wall time / training wall time "
        f"{_pct(honest['wall_share'])} in the honest run"
    )
    print(
        f"honest run at r={TARGET_RATE}: validation accuracy {honest['final_val_accuracy']:.3f} after {rounds} rounds"
    )
    print(f"total wall: {time.perf_counter() - t0:.0f} s")
    write_json(
        "verification",
        {
            "machine": machine(),
            "args": vars(args),
            "rows": rows,
            "trials": trial_rows,
            "targets": {
                "false_accusations": false_total,
                "worst_kind_caught_10_at_target_rate": {"cheat": worst[0], "caught": worst[1][0], "of": worst[1][1]},
                "max_replay_share_at_target_rate": replay_max,
                "honest_wall_share_at_target_rate": honest["wall_share"],
                "skip_1_of_10_caught_10_at_target_rate": {"caught": one_caught, "of": one_of},
            },
        },
    )


if __name__ == "__main__":
    main()
