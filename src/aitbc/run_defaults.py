"""The default training settings of a run, one value each.

``aitbc simulate``, ``aitbc distributed-training distribute`` (and ``demo``) and the SDK's
``start_training`` take their defaults from here, so a simulation with no flags plans the
same training as a live run with none. The coordinator's ``Distribute`` request body
takes its defaults from here too, so a client that omits a field gets what these name
(but ``DEADLINE``: an omitted deadline stays unset in the run's config, and the round
waits this long).

Ten rounds: enough for the bundled MLP on ``digits`` to pass 90% validation accuracy
with eight workers, and a live run's escrow (price x rounds) that stays small by default.
"""

from __future__ import annotations

import math
from typing import Final

ROUNDS = 10  # aggregation rounds
LOCAL_STEPS = 20  # H: inner optimizer steps per worker per round
BATCH_SIZE = 32  # samples per inner step
LR = 1e-3  # inner learning rate
INNER_OPT = "adamw"
OUTER = "fedavg"  # outer optimizer
# Robust rule spec. Centered clipping from the medoid with the auto radius, after the trend
# filter (at most f updates pointing against the model's last step are left out), with each
# update first scaled down to 1.5x the round's lower median norm and one clipping step
# (centered-clip's default is three). Why those two: on label-skewed shards honest updates
# point many ways and mostly cancel, so f attackers pulling one way each move the centre by
# up to the radius per step; three steps and a sign-flipper's 3x-median norm let them lead
# the model, and the trend then follows them (Dirichlet 0.3, seed 4: 76% of the run without
# the attackers). Scaled and in one step, each weighs as one honest update. On clean runs it
# matches the mean; the trend keeps IPM out, where the rules without it fall on heterogeneous
# data. It costs a Gram matrix and one product (about 3x a mean). See bench/RESULTS.md
# "Robustness" and docs/ARCHITECTURE.md.
AGGREGATOR = "trend+centered-clip:iters=1,norm=1.5"
# With a sparse codec (each update nonzero on 1-2% of the coordinates, mostly different
# ones) centered clipping is the mean, and the trend check is captured late in a run by an
# attacker whose top-k repeats: sparse-robust clips each update to the round's median norm,
# merges index-overlap copies, and drops up to f updates against the trend or repeating it
# (aitbc.core.aggregation.sparse). The simulator picks it when no aggregator is given.
SPARSE_AGGREGATOR = "sparse-robust"
SPARSE_CODECS = frozenset({"topk", "topk-int8", "sparseloco"})
COMPRESSION = "none"  # update codec spec
ERROR_FEEDBACK = False
MODE: Final = "sync"  # Final: typed as the literal, which the request body's mode field takes
# Seconds a round waits at most (sync: then it closes with the quorum, and a job that sent
# nothing for it loses its place; async: a buffer's time bound). Every run has one: without
# it one silent hired provider would hold a run at its round for ever. Ten minutes: far
# above the built-in models' rounds on a CPU at the default plan.
DEADLINE = 600.0
EVAL_EVERY = 1  # evaluate every N rounds (and after the last)
VERIFY_RATE = 0.0  # spot checks: the expected share of each update's local steps the coordinator re-runs
# Overlapping rounds: 0, each round trains from the model the previous round made; 1, a
# worker starts round r+1 as soon as it has sent round r, from the newest published model
# (one round older), and its update is applied to the newest one (one-step delay); 2, two
# rounds ahead, the next round's update sent before that round opens (two-step delay).
OVERLAP = 0
# The workers' inner steps: fp32, or bf16 (bfloat16 autocast on CPU and CUDA; parameters,
# gradients and optimizer state stay float32).
PRECISION: Final = "fp32"
PRECISIONS = ("fp32", "bf16")
# text:PATH datasets: bytes read at most (a longer corpus is cut, with a warning). 128 MiB:
# large enough for most folders, and one shard of it (x and y: 2 x 90%) still fits the
# coordinator's default largest blob (256 MiB). The stdlib corpus is a 4 MiB sample.
MAX_CORPUS_BYTES = 128 << 20
# The largest model a coordinator trains, in parameters, unless its operator sets another
# limit (``aitbc coordinator serve --max-params``): a run whose model counts more is refused
# at init (from the options alone) and again when its data is attached (counted exactly).
# A billion: about 20 GB of training state (weights, gradients, Adam's moments, a copy),
# which one 40-80 GB GPU holds with room for activations.
MAX_PARAMS = 1_000_000_000


def default_aggregator(compression: str) -> str:
    """The aggregator a run gets when it names none: :data:`SPARSE_AGGREGATOR` for a sparse
    codec spec (``sparseloco:density=0.02``), else :data:`AGGREGATOR`."""
    return SPARSE_AGGREGATOR if compression.partition(":")[0].strip() in SPARSE_CODECS else AGGREGATOR


# Seconds payments and refund (the SDK's and the CLI's) wait at most for an ended run's
# settlement: generous, a loaded two-core machine has taken minutes to settle a run's last
# rounds. Here, not in the SDK, so the command line has it without importing the SDK.
SETTLE_TIMEOUT = 600.0

# An EVM run's escrow (aitbc.chain.evm): seconds the coordinator may post nothing for it
# before its owner and providers can take their money back without it. The owner's client
# sets it at the deposit (distribute's --chain-timeout); the coordinator wants at least
# min_chain_timeout(deadline), so a round that takes its whole deadline, and the settling
# after it, never lets a healthy run time out.
CHAIN_TIMEOUT = 3600
MIN_CHAIN_TIMEOUT = 600


def min_chain_timeout(deadline: float | None) -> int:
    """The shortest on-chain timeout a run with round ``deadline`` (None: :data:`DEADLINE`)
    may have: four deadlines, and never under :data:`MIN_CHAIN_TIMEOUT`."""
    return max(MIN_CHAIN_TIMEOUT, math.ceil(4 * (DEADLINE if deadline is None else deadline)))
