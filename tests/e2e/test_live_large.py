"""A large model live (issue 18 part 2): a byte-level transformer of over 25M parameters
(d_model 512, 8 blocks: a 100 MB float32 model, and 100 MB dense updates) trained by three
real worker processes against a real coordinator on loopback, the owner's CLI driving it.
Kept short (2 rounds of 1 local step on 2 sequences of 64 bytes, 8 validation samples):
what it checks is that every blob of that size moves, streamed to disk and checked against
its CID on both sides, and that the run completes with every round closed.

:func:`large_run` is also what ``bench/live_large.py`` runs (longer, timing each phase):
it returns each worker's per-round phases from their logs (download, compute, encode,
upload) and the coordinator's round closes and evaluations from its Prometheus metrics
(``aitbc_round_close_seconds``, ``aitbc_round_evaluation_seconds``), sampled while the
run trains so each round gets its own figure."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.long  # minutes: make test-long (CI runs it)

LARGE = {"d_model": 512, "n_layers": 8, "n_heads": 8, "context": 64}
MIN_PARAMS = 25_000_000
WORKERS = 3
# The coordinator's own per-round model work, made small: validation, the divergence guard
# and update scoring each run the 25M model forward on this many sequences.
SMALL_EVAL = {"AITBC_EVAL_SAMPLES": "8", "AITBC_GUARD_SAMPLES": "8", "AITBC_SCORE_SAMPLES": "8"}

_ROUND_LINE = re.compile(
    r"INFO aitbc\.worker: round (\d+)/\d+ of (\S+): (\d+) steps, loss \S+, update (\d+) bytes, ([0-9.]+) s "
    r"\([0-9.]+ s computing; download ([0-9.]+) s, compute ([0-9.]+) s, encode ([0-9.]+) s, upload ([0-9.]+) s\)"
)


def corpus(folder: Path) -> Path:
    """Real text, offline: the standard library's json package sources (about 60 KB)."""
    import json as stdlib_json

    folder.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(stdlib_json.__file__).parent.glob("*.py")):
        (folder / f.name).write_bytes(f.read_bytes())
    return folder


def worker_rounds(log: str, run_id: str) -> dict[int, dict[str, float]]:
    """round -> the phases one worker logged for it (seconds) and its update's bytes."""
    out: dict[int, dict[str, float]] = {}
    for m in _ROUND_LINE.finditer(log):
        if m.group(2) == run_id:
            keys = ("steps", "update_bytes", "total", "download", "compute", "encode", "upload")
            out[int(m.group(1))] = dict(zip(keys, (float(g) for g in m.groups()[2:]), strict=True))
    return out


def _histogram(text: str, name: str) -> tuple[float, float]:
    """(count, sum) of a histogram in a Prometheus text exposition."""
    found = {}
    for suffix in ("count", "sum"):
        m = re.search(rf"^{name}_{suffix} (\S+)$", text, re.M)
        found[suffix] = float(m.group(1)) if m else math.nan
    return found["count"], found["sum"]


class Closes:
    """Samples the coordinator's close and evaluation histograms while a run trains: each
    time a count moves by one, the sum moved by that observation's seconds. (Two in one
    interval are recorded as their mean, said by ``merged``.)"""

    NAMES = {"close": "aitbc_round_close_seconds", "evaluation": "aitbc_round_evaluation_seconds"}

    def __init__(self, url: str, interval: float = 0.2) -> None:
        self.url, self.interval = url, interval
        self.seen: dict[str, list[float]] = {k: [] for k in self.NAMES}
        self.merged = 0
        self.last: dict[str, tuple[float, float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Closes:
        self._sample()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self._sample()

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        try:
            text = httpx.get(f"{self.url}/metrics", timeout=10).text
        except httpx.TransportError:
            return
        for key, name in self.NAMES.items():
            count, total = _histogram(text, name)
            before = self.last.get(key)
            self.last[key] = (count, total)
            if before is None or count <= before[0]:
                continue
            n = int(count - before[0])
            self.merged += n - 1
            self.seen[key] += [(total - before[1]) / n] * n


class RssSampler:
    """Samples one process's resident memory (``VmRSS``) every ``interval`` seconds while
    a run trains: ``(monotonic seconds, bytes)``, to place the peak in a phase of a round."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        while True:
            rss = _status_bytes(self.pid, "VmRSS")
            if rss is not None:
                self.samples.append((time.time(), rss))
            if self.stop.wait(self.interval):
                return


def large_run(
    stack: Any,
    tmp: Path,
    *,
    rounds: int = 2,
    local_steps: int = 1,
    batch_size: int = 2,
    options: dict[str, int] | None = None,
    timeout: float = 600,
) -> dict[str, Any]:
    """Start a coordinator and three workers on ``stack``, train the large transformer on a
    small corpus for ``rounds`` rounds through the owner's CLI, wait for the run to end and
    return what was measured: the run, its rounds, each worker's phases per round, the
    coordinator's closes and evaluations, each process's peak resident memory."""
    stack.env.update(SMALL_EVAL)
    stack.start_coordinator(lease=15.0)
    for i in range(WORKERS):
        stack.start_worker(f"w{i}")
    stack.wait_offers(WORKERS, timeout=120)
    opts = options or LARGE
    model_opts = [a for k, v in opts.items() for a in ("--model-opt", f"{k}={v}")]
    baseline = _status_bytes(stack.procs["coordinator"].pid, "VmRSS")
    run_id = stack.init_run(*model_opts, model="transformer", workers=WORKERS)
    t0 = time.monotonic()
    with Closes(stack.url) as closes, RssSampler(stack.procs["coordinator"].pid) as rss:
        stack.start_run(
            run_id,
            workers=WORKERS,
            data=str(corpus(tmp / "corpus")),
            rounds=rounds,
            local_steps=local_steps,
            batch_size=batch_size,
            compression="none",
        )
        run = stack.wait_run(
            run_id, lambda r: r["status"] in ("complete", "failed", "cancelled"), timeout=timeout, what="run ended"
        )
        # the last round's evaluation is inside its close; the ones before by the books thread
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(closes.seen["evaluation"]) < rounds:
            time.sleep(0.2)
    wall = time.monotonic() - t0
    peak = {name: _status_bytes(p.pid, "VmHWM") for name, p in stack.procs.items()}
    return {
        "run_id": run_id,
        "run": run,
        "wall_seconds": wall,
        "rounds": [r for r in stack.api(f"/runs/{run_id}/rounds")["data"] if r["round"] > 0],
        "workers": {
            f"w{i}": worker_rounds((stack.root / f"w{i}.log").read_text(errors="replace"), run_id)
            for i in range(WORKERS)
        },
        "closes": closes.seen,
        "merged_samples": closes.merged,
        "peak_rss_bytes": peak,
        # the coordinator's resident memory before the run was made (its imports, its
        # workers' offers) and sampled while it trained: (unix seconds, bytes)
        "coordinator_baseline_rss": baseline,
        "coordinator_rss_samples": rss.samples,
    }


def _status_bytes(pid: int, key: str) -> int | None:
    """A memory figure of the process's ``/proc/PID/status`` (``VmHWM``: its resident-memory
    high-water mark; ``VmRSS``: its resident memory now), in bytes."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{key}:\s+(\d+) kB", status, re.M)
    return int(m.group(1)) * 1024 if m else None


def model_params(stack: Any, cid: str, tmp: Path) -> int:
    """Parameters of the model blob ``cid``, downloaded (streamed, checked) and counted
    from its tensors' shapes."""
    from safetensors import safe_open

    from aitbc.client import CoordinatorClient
    from aitbc.storage.blobstore import LocalBlobStore

    store = LocalBlobStore(tmp / "fetched")
    with CoordinatorClient(stack.url) as c:
        c.download_blob(cid, store)
    with safe_open(str(store.dir / cid), framework="pt") as f:
        names = list(f.keys())  # a safe_open handle is not iterable
        return sum(math.prod(f.get_slice(k).get_shape()) for k in names)


def test_a_25m_parameter_transformer_trains_live_with_three_workers(stack, tmp_path):
    rounds = 2
    got = large_run(stack, tmp_path, rounds=rounds)
    run, run_id = got["run"], got["run_id"]
    logs = "\n".join(stack.log(n) for n in stack.procs)
    assert run["status"] == "complete", json.dumps(run)[:2000] + logs
    assert run["rounds_completed"] == rounds

    # Every round closed with all three updates accepted and an evaluated model.
    closed = got["rounds"]
    assert [r["round"] for r in closed] == list(range(1, rounds + 1))
    for r in closed:
        assert r["accepted"] == WORKERS and not r["skipped"], r
        assert r["closed_at"] >= r["started_at"] and math.isfinite(r["val_loss"]), r

    # The model trained is the large one: counted from the final checkpoint's own tensors.
    params = model_params(stack, closed[-1]["checkpoint_cid"], tmp_path)
    assert params >= MIN_PARAMS, params
    # Each worker sent each round's dense update (4 bytes a parameter and the safetensors
    # header) and logged every phase of it.
    for name, per_round in got["workers"].items():
        assert sorted(per_round) == list(range(1, rounds + 1)), (name, per_round, stack.log(name))
        for phases in per_round.values():
            assert phases["steps"] == 1
            assert 4 * params <= phases["update_bytes"] < 4 * params + 65536
            assert all(phases[k] >= 0 for k in ("download", "compute", "encode", "upload"))
    # The coordinator timed each close and each evaluation (its histograms counted them).
    text = httpx.get(f"{stack.url}/metrics", timeout=10).text
    assert _histogram(text, "aitbc_round_close_seconds")[0] == rounds
    assert _histogram(text, "aitbc_round_evaluation_seconds")[0] == rounds

    models_made = {r["checkpoint_cid"] for r in stack.api(f"/runs/{run_id}/rounds")["data"]}
    # The workers streamed their models to disk: the last two models are kept as files, no
    # temporary file is left, and no blob in any store is incomplete.
    for i in range(WORKERS):
        models = stack.root / f"w{i}" / "worker-models" / f"w{i}" / "blobs"
        kept = sorted(p.name for p in models.iterdir())
        assert len(kept) == rounds and not any(k.startswith(".") for k in kept), kept
        assert set(kept) <= models_made  # the global models of the rounds (round 0's is the initial one)
    blobs = stack.root / "coordinator" / "blobs"
    assert not [p.name for p in blobs.iterdir() if p.name.startswith(".tmp-")]
