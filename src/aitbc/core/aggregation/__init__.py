"""Aggregation rules over a round's updates, robust and not.

Shapes: ``n`` updates of ``d`` parameters; ``updates`` is ``(n, d)``, ``weights`` is
``(n,)`` (e.g. sample counts), and every rule returns ``(d,)``.

Entry points::

    aggregate(name, updates, weights=None, **params) -> Tensor              # (d,)
    aggregate_with_info(name, updates, weights=None, **params) -> (Tensor, AggregationInfo)
    parse_aggregator(spec, options=None, *, default_f=None) -> AggregatorPipeline
        pipeline(updates, weights=None, *, round_index=0, reference=None) -> Tensor
        pipeline.with_info(updates, weights=None, *, round_index=0, reference=None)
        pipeline.check(n)        # the conditions on n, before any round
    describe_aggregators() -> str   # rules, wrappers, options, defaults, for --help

Rules (``AGGREGATORS``): ``mean``, ``median``, ``trimmed-mean``, ``krum``, ``multi-krum``,
``bulyan``, ``centered-clip``, ``geometric-median``, ``sparse-robust`` (for sparse
updates: top-k and SparseLoCo codecs). Wrappers (``WRAPPERS``), composable
with any rule: ``nnm``, ``bucketing``, ``trend``. Each rule's module docstring gives its
paper, the condition it needs, and whether it uses ``weights``.

``reference`` is the one piece of state a round's aggregation may read: the global
model's last step (old minus new parameters, ``(d,)``), which ``trend`` compares each
update with and ``centered-clip:start=previous`` starts its clipping from (a rule reads it
when its config's ``reads_reference`` holds). The coordinator and the simulator pass it
(``pipeline.uses_reference`` says whether the spec reads it); everything else aggregates
a round on its own.

Spec grammar: ``[WRAPPER[:k=v,...]+]...RULE[:k=v,...]``, e.g. ``"nnm+centered-clip"``,
``"bucketing:s=2+krum:f=1"``. Wrappers run left to right on the updates, then the rule.

How options flow:

1. Each ``+``-separated part carries its own ``:k=v`` options (``parse_spec``).
2. ``params`` (the ``**params`` of :func:`aggregate`, the ``options`` of
   :func:`parse_aggregator`) go to the final rule. A key given both in the rule's part and
   in ``params`` is an error; an unknown key is an error naming the allowed ones.
3. ``f`` is the number of Byzantine updates, shared by the stages that take it: a wrapper
   that takes ``f`` (``nnm``) uses its own ``f`` if given, else the final rule's ``f``,
   else an ``f`` in ``params`` that the final rule does not take
   (``aggregate("nnm+centered-clip", u, f=2)``), else ``default_f``.
4. ``default_f`` (the run's attacker count, for a simulator) fills ``f`` in every stage
   that takes one and got none; stages without ``f`` ignore it.

Cost: no rule makes an ``(n, d)`` temporary; a wrapper makes one ``(k, d)`` mixture.
Distance rules use one Gram matrix (``_distances``); coordinate rules sort column blocks
with a sorting network on a few threads (``_sorting``). Each rule's time and memory
against ``mean`` are measured by ``bench/aggregation_speed.py`` (``bench/RESULTS.md``).

Streaming (``streaming.aggregate_stream(pipeline, source, weights, ...)``): the same
pipeline over a ``ColumnSource`` read one column block at a time, for rounds whose
``(n, d)`` float32 does not fit in memory (the coordinator spills them to disk past
``aggregation_memory_mb``). Coordinate rules run per block, bit for bit; distance rules,
``nnm`` and Bulyan's selection sum the ``(k, k)`` Gram matrix over blocks (float64),
decide in coefficient space exactly as in memory (Weiszfeld and centered clipping iterate
on ``(k,)`` and ``(k, k)`` tensors only: no pass per iteration), then read only the rows
with a non-zero coefficient; wrappers fold into one ``(k, n)`` mixing; ``trend`` sums each
update's dot with the reference and its norm. Every rule and wrapper has a streaming form
(checked at import); tests compare them with memory on random inputs. Memory: one block
(``BLOCK_BYTES``, 32 MiB, and its float64 copy), the ``(d,)`` result, the reference.

Order of checks on a call: shapes and finiteness of the updates and weights (NaN/Inf
rejected first), then the conditions on ``n`` (a wrapper may change ``n``: bucketing
passes ``ceil(n/s)`` bucket means on), then the arithmetic.
"""

from __future__ import annotations

from aitbc.core.aggregation import clipping as _clipping  # noqa: F401
from aitbc.core.aggregation import coordinate as _coordinate  # noqa: F401
from aitbc.core.aggregation import geomed as _geomed  # noqa: F401
from aitbc.core.aggregation import krum as _krum  # noqa: F401

# Rules and wrappers register themselves on import.
from aitbc.core.aggregation import mean as _mean  # noqa: F401
from aitbc.core.aggregation import sparse as _sparse  # noqa: F401
from aitbc.core.aggregation import wrappers as _wrappers  # noqa: F401
from aitbc.core.aggregation.base import (
    AGGREGATORS,
    WRAPPERS,
    AggregationInfo,
    Aggregator,
    Mixing,
    RuleConfig,
    Wrapper,
    WrapperConfig,
    check_updates,
    register,
    register_wrapper,
)
from aitbc.core.aggregation.pipeline import (
    AggregatorPipeline,
    aggregate,
    aggregate_with_info,
    describe_aggregators,
    describe_options,
    parse_aggregator,
)

__all__ = [
    "AGGREGATORS",
    "WRAPPERS",
    "AggregationInfo",
    "Aggregator",
    "AggregatorPipeline",
    "Mixing",
    "RuleConfig",
    "Wrapper",
    "WrapperConfig",
    "aggregate",
    "aggregate_with_info",
    "check_updates",
    "describe_aggregators",
    "describe_options",
    "parse_aggregator",
    "register",
    "register_wrapper",
]
