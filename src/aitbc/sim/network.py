"""Virtual workers' hardware: compute speed and link, and what a round costs in time.

A worker's round, as the live system runs it: download the global model, run ``H``
local steps, upload the update. Its virtual duration is

    latency + bytes_down / bandwidth + H * step_seconds / speed + latency + bytes_up / bandwidth

with ``step_seconds`` from the model's training FLOPs (6 per parameter per token,
Kaplan et al. 2020) on a reference device of ``ref_tflops`` at speed 1.0, plus a fixed
per-step overhead (kernel launches, optimizer, data loading) that dominates for tiny
models: no real GPU steps faster than about a millisecond. Byte counts
are the real sizes of the serialized blobs, never a formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aitbc.errors import UsageError


@dataclass(frozen=True, slots=True)
class WorkerProfile:
    speed: float  # relative compute speed, 1.0 = reference device
    bandwidth_mbps: float  # link bandwidth, megabits per second, each direction
    latency_ms: float  # one-way latency per transfer

    def transfer_seconds(self, nbytes: int) -> float:
        return self.latency_ms / 1e3 + nbytes * 8 / (self.bandwidth_mbps * 1e6)

    def compute_seconds(self, steps: int, step_seconds: float) -> float:
        return steps * step_seconds / self.speed


def parse_per_worker(spec: str, n: int, *, flag: str, minimum: float = 0.0, inclusive: bool = False) -> list[float]:
    """``"1"`` -> n copies; ``"1,1,1,0.1"`` -> exactly one value per worker."""
    try:
        values = [float(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} {spec!r} must be numbers separated by commas, e.g. 1,1,1,0.1") from None
    if len(values) == 1:
        values = values * n
    if len(values) != n:
        raise UsageError(f"{flag} gives {len(values)} values for {n} workers; give one value or exactly {n}")
    for v in values:
        ok = (v >= minimum if inclusive else v > minimum) and math.isfinite(v)
        if not ok:
            raise UsageError(f"{flag} values must be {'>=' if inclusive else '>'} {minimum:g}, got {v:g}")
    return values


def build_profiles(n: int, *, speeds: str, bandwidth: str, latency: str) -> list[WorkerProfile]:
    s = parse_per_worker(speeds, n, flag="--speeds")
    b = parse_per_worker(bandwidth, n, flag="--bandwidth")
    lat = parse_per_worker(latency, n, flag="--latency", inclusive=True)
    return [WorkerProfile(speed=si, bandwidth_mbps=bi, latency_ms=li) for si, bi, li in zip(s, b, lat)]


def step_seconds(n_params: int, tokens_per_step: int, ref_tflops: float, overhead_ms: float) -> float:
    return 6.0 * n_params * tokens_per_step / (ref_tflops * 1e12) + overhead_ms / 1e3
