"""Benchmark: one slow worker in a live run -- sync, sync with a deadline, async.

Real processes on loopback (``aitbc coordinator serve`` and four ``aitbc worker start``,
``OMP_NUM_THREADS=1`` each; the owner's commands through the CLI, as tests/e2e does),
the digits MLP. One worker sleeps between its local steps (``--step-delay``) so that its
round takes about ``--slowdown`` (10) times a fast worker's: the delay is set from the
fast workers' measured compute seconds per step in the first all-fast run.

Configurations:

- all fast, sync: the reference (4 equal workers, every round waits for all four);
- one slow, sync: every round waits for the slow worker;
- one slow, sync + deadline: a round closes ``--deadline-factor`` x the all-fast round time
  after it opened, with a quorum of 3 (the slow worker's update is late, a straggler);
- one slow, async: ``--mode async --buffer K`` for each K of ``--buffers`` (default 2,
  half the workers and the run default), staleness ``polynomial`` (a=0.5), max
  staleness 4; rounds x 4 / K versions (as many updates as a sync run applies);
- one slow, gossip: ``--mode gossip --topology ring`` (every worker ``--listen``s and
  fetches its two neighbours' models peer to peer), ``--deadline`` as above: a worker waits
  at most that long for a neighbour's model of the round (then mixes its newest within max
  staleness 4), and the coordinator's record of a round closes then with a quorum of 3.
  Its validation loss is the consensus' (the run's rule over the round's published models).

Each configuration runs ``--repeats`` times (default 3), repeat ``i`` with run seed
``i`` (the initial model and the data order), the configurations of one repeat one
after another (so one repeat's reference and async runs see similar machine load).
Measured: the wall seconds from the run's start (``started_at``) until the first closed
round whose validation loss is at most ``--target`` (``GET /v1/runs/{id}/rounds``), and
that time over the same repeat's all-fast sync time; reported: the median ratio and its
range over the repeats. Target of issue 14: async and gossip at most 1.25x the all-fast sync
time, met "reliably" here when the worst repeat meets it. The machine is shared (2 cores, other
sessions' loads): the load average is recorded before and after.

Usage: python bench/live_stragglers.py [--repeats 3] [--rounds 7] [--local-steps 40] [--target 0.3] [--buffers 2]
       [--only gossip|async]  (the all-fast reference and that row only: live_stragglers_gossip, _async)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "e2e"))
sys.path.insert(0, str(HERE))

from _common import print_table, write_json  # noqa: E402
from _sims import machine  # noqa: E402
from conftest import Stack  # noqa: E402  (the e2e tests' process harness)

WORKERS = 4


def one_run(
    root: Path, label: str, *, seed: int, step_delay: float, rounds: int, local_steps: int, **dist: Any
) -> dict[str, Any]:
    root.mkdir(parents=True)
    stack = Stack(root, f"sqlite:///{root / 'coordinator.db'}")
    gossip = dist.get("mode") == "gossip"
    try:
        stack.start_coordinator()
        for i in range(WORKERS - 1):
            stack.start_worker(f"fast{i}", extra=_listen() if gossip else ())
        stack.start_worker("slow", step_delay=step_delay, extra=_listen() if gossip else ())
        stack.wait_offers(WORKERS)
        run_id = stack.init_run("--seed", str(seed), workers=WORKERS)
        stack.start_run(run_id, workers=WORKERS, rounds=rounds, local_steps=local_steps, aggregator="mean", **dist)
        run = stack.wait_run(run_id, lambda r: r["status"] in ("complete", "failed"), timeout=1800, what="the end")
        if run["status"] != "complete":
            raise RuntimeError(f"{label}: run {run['status']}: {run['error']}")
        recs = stack.api(f"/runs/{run_id}/rounds")["data"]
        slow_id = stack.worker_id("slow")
        ups = stack.rows(
            "SELECT worker_id, compute_seconds FROM updates WHERE run_id = :r AND status = 'accepted'", r=run_id
        )
        if gossip:  # records carry no compute seconds: the workers' own logs' round times
            ups = [(w, None) for w, _ in ups]
    finally:
        stack.close()
    fast = [c for w, c in ups if w != slow_id and c is not None]
    slow = [c for w, c in ups if w == slow_id and c is not None]
    return {
        "label": label,
        "seed": seed,
        "started_at": run["started_at"],
        "finished_at": run["finished_at"],
        "rounds": [(r["round"], r["closed_at"], r["val_loss"]) for r in recs],
        "fast_round_compute_s": sum(fast) / len(fast) if fast else None,
        "slow_round_compute_s": sum(slow) / len(slow) if slow else None,
        "slow_updates": len(slow),
        "updates": len(ups),
        "asynchronous": run.get("asynchronous"),
    }


def time_to(res: dict[str, Any], target: float) -> tuple[float | None, int | None]:
    for r, closed, loss in res["rounds"]:
        if r > 0 and loss is not None and loss <= target:
            return closed - res["started_at"], r
    return None, None


def _listen() -> tuple[str, ...]:
    from conftest import free_port

    return ("--listen", f"127.0.0.1:{free_port()}")


def configurations(args: argparse.Namespace, delay: float, deadline: float) -> list[tuple[str, str, dict[str, Any]]]:
    """(key, label, one_run options) of each configuration with the slow worker."""
    common = {"step_delay": delay, "local_steps": args.local_steps, "rounds": args.rounds}
    gossip = (
        "gossip",
        f"one slow, gossip ring (wait and record deadline {deadline:g} s, quorum 3)",
        {**common, "mode": "gossip", "topology": "ring", "deadline": deadline, "quorum": 3},
    )
    if args.only == "gossip":
        return [gossip]
    configs = (
        []
        if args.only == "async"
        else [
            ("sync", "one slow, sync", common),
            (
                "deadline",
                f"one slow, sync + deadline {deadline:g} s (quorum 3)",
                {**common, "deadline": deadline, "quorum": 3},
            ),
        ]
    )
    for k in args.buffers:
        async_opts = {"mode": "async", "buffer": k, "max_staleness": 4, "staleness": "polynomial:a=0.5"}
        versions = -(-args.rounds * WORKERS // k)  # as many updates as the sync runs apply
        configs.append(
            (
                f"async{k}",
                f"one slow, async (buffer {k}, max staleness 4)",
                {**common, **async_opts, "rounds": versions},
            )
        )
    return configs if args.only == "async" else [*configs, gossip]


def spread(values: list[float | None]) -> tuple[float | None, float | None, float | None]:
    """Median, min and max of ``values``; a repeat that never reached the target counts as
    infinitely slow (its median is None when half or more did not)."""
    xs = sorted(float("inf") if v is None else v for v in values)
    med = statistics.median(xs)
    return (
        (None if med == float("inf") else med),
        xs[0] if xs[0] != float("inf") else None,
        (None if xs[-1] == float("inf") else xs[-1]),
    )


def fmt(x: float | None, unit: str = "", digits: int = 2) -> str:
    return "not reached" if x is None else f"{x:.{digits}f}{unit}"


def summarize(key: str, runs: list[dict[str, Any]], refs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """One configuration over its repeats: each repeat's time to target and its ratio to that
    repeat's all-fast time; median and range."""
    times = [time_to(r, target)[0] for r in runs]
    ref_t = [time_to(r, target)[0] for r in refs]
    ratios = [None if t is None or not rt else t / rt for t, rt in zip(times, ref_t, strict=True)]
    slow = [
        r["slow_round_compute_s"] / r["fast_round_compute_s"]
        for r in runs
        if r["slow_round_compute_s"] and r["fast_round_compute_s"]
    ]
    return {
        "key": key,
        "label": runs[0]["label"],
        "seconds_to_target": times,
        "round_at_target": [time_to(r, target)[1] for r in runs],
        "vs_all_fast": ratios,
        "vs_all_fast_median_min_max": spread(ratios),
        "seconds_median_min_max": spread(times),
        "final_val_loss": [r["rounds"][-1][2] for r in runs],
        "updates": [r["updates"] for r in runs],
        "slow_updates": [r["slow_updates"] for r in runs],
        "slowdown": slow,
        "run_seconds": [r["finished_at"] - r["started_at"] for r in runs],
    }


def table_row(sm: dict[str, Any]) -> tuple[Any, ...]:
    med, lo, hi = sm["vs_all_fast_median_min_max"]
    smed, slo, shi = sm["seconds_median_min_max"]
    worst = None if any(v is None for v in sm["vs_all_fast"]) else hi
    return (
        sm["label"],
        f"{fmt(smed, digits=1)} ({fmt(slo, digits=1)}-{fmt(shi, digits=1)})",
        ",".join("-" if r is None else str(r) for r in sm["round_at_target"]),
        f"{fmt(med, 'x')} ({fmt(lo, 'x')}-{fmt(worst, 'x')})",
        ",".join(f"{x:.3f}" for x in sm["final_val_loss"]),
        ",".join(str(x) for x in sm["updates"]),
        ",".join(str(x) for x in sm["slow_updates"]),
        ",".join(f"{x:.1f}x" for x in sm["slowdown"]) or "-",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each configuration (run seeds 0..N-1)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--local-steps", type=int, default=40)
    ap.add_argument("--target", type=float, default=0.3, help="validation loss to reach")
    ap.add_argument("--slowdown", type=float, default=10.0)
    ap.add_argument("--deadline-factor", type=float, default=1.5)
    ap.add_argument(
        "--buffers",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[2],
        help="async buffer sizes to run (the first is the verdict's: 2 = half the workers, the default K)",
    )
    ap.add_argument(
        "--only",
        choices=["gossip", "async"],
        help="run only the all-fast reference and this row (async: each of --buffers)",
    )
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    os.environ["OMP_NUM_THREADS"] = "1"
    t0 = time.time()
    load_before = os.getloadavg()
    refs: list[dict[str, Any]] = []
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="aitbc-live-stragglers-") as tmp:
        base = Path(tmp)
        delay = deadline = 0.0
        configs: list[tuple[str, str, dict[str, Any]]] = []
        for rep in range(args.repeats):
            ref = one_run(
                base / f"fast-{rep}",
                "all fast, sync",
                seed=rep,
                step_delay=0.0,
                rounds=args.rounds,
                local_steps=args.local_steps,
            )
            refs.append(ref)
            if rep == 0:  # the slow worker's delay and the deadline, from the first reference
                per_step = ref["fast_round_compute_s"] / args.local_steps
                delay = (args.slowdown - 1) * per_step  # the slow worker's extra seconds a step
                closes = [c for _, c, _ in ref["rounds"][1:]]
                deadline = round(max(0.1, args.deadline_factor * (closes[-1] - ref["started_at"]) / len(closes)), 2)
                configs = configurations(args, delay, deadline)
            for key, label, opts in configs:
                runs.setdefault(key, []).append(one_run(base / f"{key}-{rep}", label, seed=rep, **opts))
    load_after = os.getloadavg()
    summaries = [summarize("fast", refs, refs, args.target)]
    summaries += [summarize(key, runs[key], refs, args.target) for key, _, _ in configs]
    rows = [table_row(sm) for sm in summaries]
    print_table(
        f"live stragglers: wall seconds to validation loss {args.target}, {WORKERS} workers (digits MLP, "
        f"{args.local_steps} local steps), one ~{args.slowdown:g}x slower; median (min-max) of {args.repeats} "
        f"repeats (run seeds 0-{args.repeats - 1}), each against its own repeat's all-fast sync run",
        (
            "configuration",
            "s to target",
            "round/version at target",
            "vs all fast",
            "final val loss",
            "updates applied",
            "from slow",
            "slow/fast compute",
        ),
        rows,
    )
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}")
    by_key = {key: sm for (key, _, _), sm in zip(configs, summaries[1:], strict=True)}
    verdicts = []
    if args.only != "gossip":
        verdicts.append(mode_verdict(f"async (buffer {args.buffers[0]})", by_key[f"async{args.buffers[0]}"]))
    if args.only != "async":
        verdicts.append(mode_verdict("gossip (ring)", by_key["gossip"]))
    verdict = "; ".join(verdicts)
    print(verdict)
    write_json(
        "live_stragglers" if args.only is None else f"live_stragglers_{args.only}",
        {
            "machine": machine(),
            "args": vars(args),
            "deadline_s": deadline,
            "step_delay_s": delay,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "summaries": summaries,
            "runs": {"fast": refs, **runs},
            "verdict": verdict,
            "wall_s": time.time() - t0,
        },
    )


def mode_verdict(name: str, sm: dict[str, Any]) -> str:
    """Met when every repeat reached the target within 1.25x its all-fast time."""
    ratios = sm["vs_all_fast"]
    med, lo, hi = sm["vs_all_fast_median_min_max"]
    met = sum(r is not None and r <= 1.25 for r in ratios)
    return (
        f"{name} reached the target at a median {fmt(med, 'x')} the all-fast sync time "
        f"(repeats: {', '.join(fmt(r, 'x') for r in ratios)}; target <= 1.25x): met in {met} of {len(ratios)} "
        + ("(met reliably)" if met == len(ratios) else "(MISSED: not reliably met)")
    )


if __name__ == "__main__":
    main()
