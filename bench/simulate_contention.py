"""``aitbc simulate`` beside another CPU-bound process: torch's defaults against the CLI's
thread choice (aitbc.cli.simulate.torch_threads, OMP_WAIT_POLICY=PASSIVE).

torch starts one OpenMP thread per core and lets waiting threads spin. When another
process holds a core, each parallel op waits for a thread that is not scheduled, and a
newcomer's first ``simulate`` runs many times slower than the README says. This program
runs the README's digits simulation (fewer rounds) four ways:

    before: the simulation with torch's defaults (what ``aitbc simulate`` did),
    after:  ``aitbc simulate`` as shipped,

each alone and beside ``--competitors`` busy-looping processes, and prints wall seconds
(median of ``--repeat``) with the machine's load average at the start of each run (on a
shared machine "alone" is only as alone as the machine is).

    python bench/simulate_contention.py [--rounds 3] [--repeat 2] [--competitors 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import print_table, write_json

AITBC = Path(sys.executable).parent / "aitbc"
BUSY = "import time\nend = time.monotonic() + 900\nwhile time.monotonic() < end:\n    pass\n"  # one core, 100%
WORKLOAD = ["--model", "mlp", "--dataset", "digits", "--workers", "8", "--local-steps", "20", "--seed", "0"]


def _child(rounds: int, out: str) -> None:
    """The simulation exactly as ``aitbc simulate`` ran it before: no thread choice at all."""
    from aitbc.sim.config import SimConfig
    from aitbc.sim.runner import Simulation

    cfg = SimConfig(model="mlp", dataset="digits", workers=8, rounds=rounds, local_steps=20, seed=0)
    Simulation(cfg, home=Path(out), out_dir=Path(out) / "sim").run(lambda row: None)


def _run(kind: str, rounds: int, home: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    if kind == "before":
        cmd = [sys.executable, __file__, "--child", "--rounds", str(rounds), "--home", home]
    else:
        cmd = [str(AITBC), "simulate", *WORKLOAD, "--rounds", str(rounds), "--json", "--home", home]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--competitors", type=int, default=1)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--home", default="")
    args = ap.parse_args()
    if args.child:
        _child(args.rounds, args.home)
        return

    from aitbc.cli.simulate import torch_threads

    # Interleaved (before, after, before, after, ...): on a shared machine both meet the
    # same background load, which the table reports beside each median.
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for load in (0, args.competitors):
                for kind in ("before", "after"):
                    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(load)]
                    try:
                        time.sleep(0.5 if load else 0)
                        at = os.getloadavg()[0]
                        runs.setdefault((kind, load), []).append((_run(kind, args.rounds, tmp), at))
                    finally:
                        for p in procs:
                            p.kill()
                            p.wait()
    rows, results = [], []
    for (kind, load), got in runs.items():
        times = [t for t, _ in got]
        med = statistics.median(times)
        results.append(
            {"kind": kind, "competitors": load, "seconds": times, "median": med, "loadavg": [a for _, a in got]}
        )
        rows.append(
            (kind, load, f"{med:.1f}", " / ".join(f"{t:.1f}" for t in times), " / ".join(f"{a:.1f}" for _, a in got))
        )
    by = {(r["kind"], r["competitors"]): r["median"] for r in results}
    slow_before = by[("before", args.competitors)] / by[("before", 0)]
    slow_after = by[("after", args.competitors)] / by[("after", 0)]
    print_table(
        f"aitbc simulate (mlp, digits, 8 workers, {args.rounds} rounds x 20 steps): wall seconds",
        ["threads", "busy processes", "median s", "runs s", "load avg at each start"],
        rows,
    )
    print(
        f"slowdown beside {args.competitors} busy process(es): before {slow_before:.1f}x, after {slow_after:.1f}x; "
        f"after vs before under load: {by[('before', args.competitors)] / by[('after', args.competitors)]:.1f}x faster"
    )
    write_json(
        "simulate_contention",
        {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch_threads": torch_threads()},
            "rounds": args.rounds,
            "runs": results,
            "slowdown_before": slow_before,
            "slowdown_after": slow_after,
        },
    )


if __name__ == "__main__":
    main()
