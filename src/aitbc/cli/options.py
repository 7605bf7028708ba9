"""The training options that ``aitbc simulate`` and ``aitbc distributed-training
distribute`` (and ``init``, ``upload-data``, ``demo``) share, each declared once: the
flag and its help here, its default in :mod:`aitbc.run_defaults` (the one place a default
training lives). A command writes ``rounds: Rounds = defaults.ROUNDS``."""

from __future__ import annotations

from typing import Annotated

import typer

from aitbc import run_defaults

Rounds = Annotated[int, typer.Option(help="Aggregation rounds.")]
LocalSteps = Annotated[int, typer.Option(help="Inner steps per worker per round (H).")]
BatchSize = Annotated[int, typer.Option(help="Samples per inner step.")]
Lr = Annotated[float, typer.Option(help="Inner learning rate.")]
Outer = Annotated[str, typer.Option(help="Outer optimizer: fedavg or diloco.")]
OuterLr = Annotated[float | None, typer.Option(help="Outer learning rate (fedavg 1.0, diloco 0.7).")]
OuterMomentum = Annotated[float | None, typer.Option(help="diloco Nesterov momentum (0.9).")]
# No default: the codec picks it (run_defaults.default_aggregator), in simulate and in a live run
Aggregator = Annotated[
    str | None,
    typer.Option(
        "--aggregator",
        help=f"Aggregation rule spec, e.g. {run_defaults.AGGREGATOR} (the default), mean, median, "
        "trimmed-mean:beta=0.25, krum, nnm+centered-clip; with a sparse codec (topk, topk-int8, "
        "sparseloco) the default is sparse-robust.",
        show_default=False,
    ),
]
Compression = Annotated[
    str, typer.Option(help="Update codec spec, e.g. none, int8, topk:ratio=0.01, sign, powersgd:rank=4.")
]
ErrorFeedback = Annotated[
    bool,
    typer.Option("--error-feedback", help="Keep each worker's compression residual and add it to its next update."),
]
Mode = Annotated[str, typer.Option(help="Round mode: sync, async or gossip.")]
Topology = Annotated[
    str, typer.Option(help="gossip: who mixes with whom: ring, or random:K (K neighbours drawn each round).")
]
Buffer = Annotated[
    int | None,
    typer.Option(help="async: updates applied together, one new version each (default half the workers)."),
]
MaxStaleness = Annotated[
    int, typer.Option(help="async: drop (live: refuse) updates trained from a version more than S versions old.")
]
Staleness = Annotated[
    str,
    typer.Option(help="async: down-weighting of stale updates: constant, polynomial[:a=0.5], hinge[:a=10,b=4]."),
]
Deadline = Annotated[
    float | None,
    typer.Option(
        help="sync: seconds a round waits at most, then closes with the quorum; a worker that sent nothing "
        f"by then loses its place (default for a live run: {run_defaults.DEADLINE:g}; simulate: virtual seconds, "
        "none by default)."
    ),
]
Quorum = Annotated[
    int | None,
    typer.Option(help="sync: accepted updates a round needs to close at its deadline (default: --min-workers, or 1)."),
]
EvalEvery = Annotated[int, typer.Option(help="Evaluate every N rounds (and after the last).")]
Seed = Annotated[int, typer.Option(help="Seed of the data split, the initial model and the batches.")]
ModelOpt = Annotated[
    list[str] | None, typer.Option("--model-opt", help="Model option KEY=VALUE (repeatable), e.g. context=64.")
]
MaxBytes = Annotated[
    int,
    typer.Option(
        help="Text corpora (text files, .jsonl, .parquet, saved datasets): bytes to read at most; a longer corpus is cut, with a warning on stderr "
        "(stdlib is a 4 MiB sample)."
    ),
]
