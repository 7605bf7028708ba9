"""Assemble bench/RESULTS.md from the tables the benchmarks printed in one `make bench`.

Each benchmark's stdout was saved to bench/results/<name>.txt; its JSON (with the
machine it ran on) to bench/results/<name>.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BENCHES = [
    ("aggregation_speed", "Aggregation speed", "python bench/aggregation_speed.py"),
    ("aggregation_memory", "Aggregation memory (streamed from disk)", "python bench/aggregation_memory.py"),
    (
        "communication",
        "Communication",
        "python bench/communication.py (run as five parts, --seeds S --out S.json, then --combine)",
    ),
    # the headline SparseLoCo rows alone over seeds 0-4 (the whole matrix over five seeds is hours)
    (
        "communication_configs",
        "Communication over seeds 0-4: the SparseLoCo headline configurations",
        "python bench/communication.py --configs 'sparseloco H=20;sparseloco H=30;sparseloco H=50'",
    ),
    (
        "communication_llama",
        "Communication: SparseLoCo on a Llama of the transformer's size, seeds 0-4",
        "python bench/communication.py --tasks llama (five parts, --seeds S --out S.json, then --combine "
        "... --out bench/results/communication_llama.json)",
    ),
    ("sparse_robust", "Sparse + robust: SparseLoCo updates under attack", "python bench/sparse_robust.py"),
    (
        "sparse_robust_transformer",
        "Sparse + robust: the transformer",
        "python bench/sparse_robust.py --task transformer",
    ),
    (
        "robustness",
        "Robustness",
        "python bench/robustness.py (run as parts, --seeds/--shards ... --out PART.json, then --combine)",
    ),
    (
        "robustness_dirichlet01",
        "Robustness: the default rule on Dirichlet 0.1 shards over seeds 0-4",
        "python bench/robustness.py --shards 0.1 --aggregators 'trend+centered-clip:iters=1,norm=1.5' "
        "--out bench/results/robustness_dirichlet01.json",
    ),
    ("stragglers", "Stragglers", "python bench/stragglers.py"),
    ("coordinator_load", "Coordinator load", "python bench/coordinator_load.py"),
    ("live_utilization", "Live utilization", "python bench/live_utilization.py"),
    ("live_stragglers", "Live stragglers: sync, deadline, async, gossip", "python bench/live_stragglers.py"),
    (
        "live_stragglers_gossip",
        "Live stragglers: gossip (with the all-fast sync reference)",
        "python bench/live_stragglers.py --only gossip --repeats 5",
    ),
    (
        "live_stragglers_async",
        "Live stragglers: async (with the all-fast sync reference)",
        "python bench/live_stragglers.py --only async --repeats 5",
    ),
    ("live_large", "A large model live: round-time breakdown", "OMP_NUM_THREADS=1 python bench/live_large.py"),
    ("models", "Hugging Face models: live against the transformer, LoRA", "python bench/models.py"),
    ("overlap_loss", "Overlapping rounds: loss", "python bench/overlap_loss.py"),
    ("honest_runs", "Honest runs (false accusations)", "python bench/honest_runs.py"),
    ("verification", "Verification of work (spot checks)", "python bench/verification.py"),
    ("replay_drift", "Re-run drift across thread counts", "python bench/replay_drift.py"),
    ("metrics_scrape", "Metrics scrape cost", "python bench/metrics_scrape.py"),
    ("replica_takeover", "Replicated coordinators: takeover after SIGKILL", "python bench/replica_takeover.py"),
    ("peer_transport", "Peer transport: coordinator egress", "python bench/peer_transport.py"),
    # needs anvil (make anvil): not part of `make bench`
    ("chain_gas", "Gas on an EVM chain", "python bench/chain_gas.py"),
    # written only on a machine with a CUDA GPU (not part of `make bench`, which runs on CPUs)
    ("gpu", "GPU training throughput", "python bench/gpu.py"),
]


def main() -> None:
    parts = [
        "# Benchmark results",
        "",
        f"Gathered by `python bench/report.py` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}) from the "
        "tables each benchmark printed in its last run (`make bench` runs them all, then this; the summary dates "
        "each run). Each section holds the table the program printed and the command that printed it; the "
        "JSON beside it in `bench/results/` has every number. A target that is missed is "
        "reported as it is.",
        "",
    ]
    summary = HERE / "SUMMARY.md"  # hand-written verdicts of the last run, kept across regenerations
    if summary.exists():
        parts += [summary.read_text().rstrip(), ""]
    for name, title, command in BENCHES:
        txt, js = RESULTS / f"{name}.txt", RESULTS / f"{name}.json"
        parts += [f"## {title}", "", f"Command: `{command}`", ""]
        if js.exists():
            data = json.loads(js.read_text())
            m = data.get("machine")
            if m:
                parts += [
                    f"Machine: {m.get('cpu')}, {m.get('threads')} torch threads, torch {m.get('torch')}, "
                    f"Python {m.get('python')}, {m.get('date')}.",
                    "",
                ]
        parts += ["```", txt.read_text().rstrip() if txt.exists() else "(not run)", "```", ""]
    (HERE / "RESULTS.md").write_text("\n".join(parts))
    print(f"wrote {HERE / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
